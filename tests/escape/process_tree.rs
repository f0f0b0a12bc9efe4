//! Every descendant of a started process dies with it, with its session and with the server.

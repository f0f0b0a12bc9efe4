//! A sandboxed process keeps no capability, even when the server runs as root.

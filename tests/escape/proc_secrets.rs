//! Sandboxed processes cannot read the server's or other sessions' secrets through `/proc`.

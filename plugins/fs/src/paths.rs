//! Wire paths of `fs/*` requests (PROTOCOL §5.1) as host paths, and host paths as the
//! native text quoted in error messages (§5.4).

use std::path::{Path, PathBuf};

use exec_server_core::proto::path::parse_path;
use exec_server_core::proto::RpcError;

/// Parses a `path`-typed member: -32602 `invalid path`, or -32600 for another OS's URI.
pub(crate) fn host_path(value: &str) -> Result<PathBuf, RpcError> {
    parse_path(value).map_err(|e| e.into_rpc(value))
}

/// The native form of a path for messages; bytes that are not UTF-8 become U+FFFD.
pub(crate) fn native(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// A host path in a helper request (SANDBOX.md §4.4). Native text when it is UTF-8, so
/// that `..` keeps the kernel's meaning (a `file:` URI would drop dot segments lexically);
/// a `file:` URI otherwise, which is byte-exact.
pub(crate) fn helper_path(path: &Path) -> String {
    match path.to_str() {
        Some(text) => text.to_owned(),
        None => exec_server_core::proto::path::to_file_uri(path),
    }
}

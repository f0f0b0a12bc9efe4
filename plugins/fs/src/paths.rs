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

/// A host path in a helper request (SANDBOX.md §4.4), named byte for byte: native text
/// when it is UTF-8, so that `..` keeps the kernel's meaning; otherwise a `file:` URI in
/// which no `.` or `..` is resolved (see `to_wire_path`).
pub(crate) fn helper_path(path: &Path) -> String {
    exec_server_core::proto::path::to_wire_path(path)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::os::unix::ffi::{OsStrExt, OsStringExt};

    use super::*;

    /// A host path reaches the fs helper byte for byte (the `paths` fuzz target checks
    /// `to_wire_path` for this). `file:///t/link%2F..%2F%FF` is the host path
    /// `/t/link/../\xff`, which went to the helper as `file:///t/link/../%FF`; the helper
    /// resolved that URI's dot segments lexically and acted on `/t/\xff`, not on what `..`
    /// names after the link.
    #[test]
    fn helper_paths_name_exactly_the_host_path() {
        let path = host_path("file:///t/link%2F..%2F%FF").unwrap();
        assert_eq!(path.as_os_str().as_bytes(), b"/t/link/../\xff");
        for path in [
            path,
            PathBuf::from(OsString::from_vec(b"/t/./\xff/".to_vec())),
            PathBuf::from("/t/link/../x"),
        ] {
            let sent = helper_path(&path);
            let received = host_path(&sent).unwrap();
            assert_eq!(
                received.as_os_str().as_bytes(),
                path.as_os_str().as_bytes(),
                "{sent}"
            );
        }
    }
}

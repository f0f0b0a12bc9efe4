//! JSON-RPC errors and the catalogue of stable error messages (PROTOCOL §2.8, §10.2).
//!
//! Every message the spec names has exactly one constructor here, so its text lives in one
//! place. Plugins build their errors through these constructors.

use std::fmt;

use serde::Serialize;
use serde_json::Value;

/// Error codes used by the protocol.
pub mod code {
    /// Invalid request: handshake, session, validation and permission errors.
    pub const INVALID_REQUEST: i64 = -32600;
    /// Unknown or disabled method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Params that do not decode or fail validation.
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal and OS errors.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// Filesystem *not found* and unknown file handles.
    pub const NOT_FOUND: i64 = -32004;
    /// `resumeSessionId` names a session attached to another connection.
    pub const SESSION_ATTACHED: i64 = -32010;
}

/// An error object: `{"code", "data"?, "message"}` (members in that order on the wire).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RpcError {
    pub code: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    pub message: String,
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for RpcError {}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            data: None,
            message: message.into(),
        }
    }

    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_REQUEST, message)
    }

    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_PARAMS, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(code::INTERNAL_ERROR, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(code::NOT_FOUND, message)
    }

    /// Marks the error as caused by the sandbox: `data: {"sandboxDenied": true}`.
    pub fn with_sandbox_denied(mut self) -> Self {
        self.data = Some(serde_json::json!({ "sandboxDenied": true }));
        self
    }

    /// True when `data.sandboxDenied` is set.
    pub fn is_sandbox_denied(&self) -> bool {
        self.data
            .as_ref()
            .and_then(|d| d.get("sandboxDenied"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    // ---- envelope and dispatch (§2) -------------------------------------------------

    /// id -1 reply for a malformed message; `prefix` names the connection (§2.6).
    pub fn malformed(prefix: &str, detail: impl fmt::Display) -> Self {
        Self::invalid_request(format!("{prefix}: {detail}"))
    }

    pub fn unknown_notification(method: &str) -> Self {
        Self::invalid_request(format!("unknown notification method `{method}`"))
    }

    pub fn initialized_before_initialize() -> Self {
        Self::invalid_request("client must call initialize before sending initialized")
    }

    pub fn session_resumed_elsewhere() -> Self {
        Self::invalid_request("session has been resumed by another connection")
    }

    pub fn unknown_method(method: &str) -> Self {
        Self::new(code::METHOD_NOT_FOUND, format!("unknown method `{method}`"))
    }

    pub fn method_disabled(method: &str) -> Self {
        Self::new(
            code::METHOD_NOT_FOUND,
            format!("method `{method}` is disabled on this server"),
        )
    }

    pub fn response_too_large(size: usize, limit: usize) -> Self {
        Self::internal(format!(
            "response of {size} bytes exceeds the maximum message size of {limit} bytes"
        ))
    }

    // ---- handshake and sessions (§3) -------------------------------------------------

    pub fn initialize_twice() -> Self {
        Self::invalid_request("initialize may only be sent once per connection")
    }

    pub fn unknown_session(id: &str) -> Self {
        Self::invalid_request(format!("unknown session id {id}"))
    }

    pub fn session_attached(id: &str) -> Self {
        Self::new(
            code::SESSION_ATTACHED,
            format!("session {id} is already attached to another connection"),
        )
    }

    pub fn not_initialized(family: &str) -> Self {
        Self::invalid_request(format!(
            "client must call initialize before using {family} methods"
        ))
    }

    pub fn not_initialized_notification(family: &str) -> Self {
        Self::invalid_request(format!(
            "client must send initialized before using {family} methods"
        ))
    }

    // ---- processes (§4) --------------------------------------------------------------

    pub fn empty_argv() -> Self {
        Self::invalid_params("argv must not be empty")
    }

    pub fn invalid_cwd(value: &str, reason: impl fmt::Display) -> Self {
        Self::invalid_params(format!(
            "cwd URI `{value}` is not valid on this exec-server host: {reason}"
        ))
    }

    pub fn zero_start_size() -> Self {
        Self::invalid_params("size rows and cols must be greater than zero")
    }

    pub fn invalid_env_name(name: &str) -> Self {
        Self::invalid_params(format!("invalid environment variable name `{name}`"))
    }

    pub fn env_value_nul(name: &str) -> Self {
        Self::invalid_params(format!("environment variable `{name}` contains a NUL byte"))
    }

    pub fn process_sandbox_prepare(reason: impl fmt::Display) -> Self {
        Self::invalid_params(format!("failed to prepare process sandbox: {reason}"))
    }

    pub fn sandbox_intent_unenforceable() -> Self {
        Self::invalid_params("sandbox intent cannot be enforced on this executor")
    }

    pub fn process_exists(id: &str) -> Self {
        Self::invalid_request(format!("process {id} already exists"))
    }

    pub fn spawn_failed(os_error: impl fmt::Display) -> Self {
        Self::internal(format!("failed to spawn process: {os_error}"))
    }

    pub fn launcher_exited(status: impl fmt::Display) -> Self {
        Self::internal(format!(
            "sandbox launcher exited before reporting: {status}"
        ))
    }

    pub fn launcher_timed_out(ms: u64) -> Self {
        Self::internal(format!("sandbox launcher timed out after {ms} ms"))
    }

    pub fn start_cancelled(id: &str) -> Self {
        Self::invalid_request(format!("process {id} start was cancelled"))
    }

    pub fn unknown_process(id: &str) -> Self {
        Self::invalid_request(format!("unknown process id {id}"))
    }

    pub fn process_starting(id: &str) -> Self {
        Self::invalid_request(format!("process id {id} is starting"))
    }

    pub fn empty_write_id() -> Self {
        Self::invalid_params("writeId must not be empty")
    }

    pub fn stdin_write_failed() -> Self {
        Self::internal("failed to write to process stdin")
    }

    pub fn signal_failed(os_error: impl fmt::Display) -> Self {
        Self::internal(format!("failed to signal process: {os_error}"))
    }

    pub fn zero_resize() -> Self {
        Self::invalid_params("rows and cols must be greater than zero")
    }

    pub fn no_tty(id: &str) -> Self {
        Self::invalid_request(format!("process {id} does not have a tty"))
    }

    pub fn resize_failed(os_error: impl fmt::Display) -> Self {
        Self::internal(format!("failed to resize process terminal: {os_error}"))
    }

    // ---- filesystem (§5) -------------------------------------------------------------

    pub fn invalid_path(value: &str, reason: impl fmt::Display) -> Self {
        Self::invalid_params(format!("invalid path `{value}`: {reason}"))
    }

    /// A path spelled as text whose directory also holds a name that is not UTF-8 and
    /// reads the same (docs/SECURITY.md, "Name fidelity"): acting on it could act on the
    /// other file, the one a lossy listing showed.
    pub fn ambiguous_path(path: &str) -> Self {
        Self::invalid_params(format!(
            "ambiguous path {path}: a name that is not UTF-8 reads the same; \
             address it by its file: URI"
        ))
    }

    /// A well-formed `file:` URI of another OS's convention (§5.1).
    pub fn foreign_os_uri(uri: &str) -> Self {
        Self::invalid_request(foreign_os_reason(uri))
    }

    pub fn fs_sandbox_unenforceable() -> Self {
        Self::invalid_request("filesystem sandbox cannot be enforced on this executor")
    }

    pub fn sandboxed_streaming_refused() -> Self {
        Self::invalid_request("streaming file reads do not support platform sandboxing")
    }

    pub fn is_symlink(path: &str) -> Self {
        Self::invalid_request(format!("path `{path}` is a symbolic link"))
    }

    pub fn file_too_large(limit: u64) -> Self {
        Self::invalid_request(format!("file is too large to read: limit is {limit} bytes"))
    }

    pub fn not_a_file(path: &str) -> Self {
        Self::invalid_request(format!("path `{path}` is not a file"))
    }

    pub fn write_file_bad_base64(reason: impl fmt::Display) -> Self {
        Self::invalid_request(format!(
            "fs/writeFile requires valid base64 dataBase64: {reason}"
        ))
    }

    pub fn too_many_directory_entries(n: usize, limit: usize) -> Self {
        Self::internal(format!(
            "fs/readDirectory returned {n} entries; limit is {limit}"
        ))
    }

    pub fn walk_limits_zero() -> Self {
        Self::invalid_request("filesystem walk limits must be greater than zero")
    }

    pub fn walk_limits_exceed(depth: usize, directories: usize, entries: usize) -> Self {
        Self::invalid_request(format!(
            "filesystem walk limits exceed maximums: depth={depth}, directories={directories}, entries={entries}"
        ))
    }

    pub fn copy_requires_recursive() -> Self {
        Self::invalid_request("fs/copy requires recursive: true when sourcePath is a directory")
    }

    pub fn copy_into_itself() -> Self {
        Self::invalid_request("fs/copy cannot copy a directory to itself or one of its descendants")
    }

    pub fn copy_unsupported_type() -> Self {
        Self::invalid_request("fs/copy only supports regular files, directories, and symlinks")
    }

    pub fn handle_id_too_long() -> Self {
        Self::invalid_request("file handle ID must not exceed 32 bytes")
    }

    pub fn handle_exists(id: &str) -> Self {
        Self::invalid_request(format!("file handle `{id}` already exists"))
    }

    /// A session at the limit of one of its quotas (fair share): names what is counted,
    /// the limit, and the configuration key that sets it.
    pub fn quota_exceeded(what: &str, limit: usize, key: &str) -> Self {
        Self::invalid_request(format!(
            "session quota reached: at most {limit} {what} at once ({key})"
        ))
    }

    /// An in-process `fs/*` operation that did not finish within `fs.operation_timeout_ms`
    /// (it may have been partly done: a write partly written, a copy partly made).
    pub fn fs_operation_timed_out(method: &str, ms: u64) -> Self {
        Self::internal(format!(
            "{method} timed out after {ms} ms (fs.operation_timeout_ms)"
        ))
    }

    /// Work holding a shared fs slot (a worker thread, a sandbox helper) wrote to a FIFO
    /// or device whose reader did not take the data within `ms`: it stops waiting so that
    /// a peer cannot keep the slot from other sessions (what was written stays written).
    pub fn fs_reader_stalled(method: &str, ms: u64) -> Self {
        Self::internal(format!(
            "{method}: the reader of the FIFO or device did not take the data within {ms} ms \
             (a write that holds a shared fs slot waits no longer for its reader)"
        ))
    }

    /// A read holding a shared fs slot needed room in the connection's outbound budget for
    /// more of its answer, and none was free within `ms`: the client had not taken enough
    /// of its earlier answers.
    pub fn answer_room_stalled(method: &str, ms: u64) -> Self {
        Self::internal(format!(
            "{method}: no room for the rest of this answer within {ms} ms: the client had not \
             read enough of its earlier answers (connection.outbound_queue_bytes; a read that \
             holds a shared fs slot waits no longer)"
        ))
    }

    /// A charge the descriptor budget refused (fair share): names what was refused, the
    /// limit that refused it (the session's maximum, or the guarantee every other session
    /// keeps) and the key that sets it.
    pub fn descriptor_budget(what: &str, limit: u64, key: &str) -> Self {
        Self::invalid_request(format!(
            "descriptor budget reached: {what} does not fit within {limit} file descriptors ({key})"
        ))
    }

    /// A charge to the server's inotify watch budget that does not fit its share.
    pub fn watch_budget(what: &str, limit: u64, key: &str) -> Self {
        Self::invalid_request(format!(
            "watch budget reached: {what} does not fit within {limit} inotify watches ({key})"
        ))
    }

    pub fn too_many_handles(limit: usize) -> Self {
        Self::invalid_request(format!(
            "at most {limit} file handles may be open per connection"
        ))
    }

    pub fn block_len_out_of_range(max: usize) -> Self {
        Self::invalid_request(format!(
            "file read block length must be between 1 and {max}"
        ))
    }

    pub fn write_block_len_out_of_range(max: usize) -> Self {
        Self::invalid_request(format!(
            "file write block length must be between 1 and {max}"
        ))
    }

    /// `fs/writeBlock` whose `offset + len(chunk)` passes 2^63 − 1.
    pub fn write_range_too_large() -> Self {
        Self::invalid_request("file write range exceeds the signed 64-bit file offset limit")
    }

    pub fn unknown_handle(id: &str) -> Self {
        Self::not_found(format!("unknown file handle `{id}`"))
    }

    /// Maps an OS error per §5.3: not found → -32004, permission denied or invalid input →
    /// -32600, anything else → -32603; the message is the OS error text.
    pub fn from_io(err: &std::io::Error) -> Self {
        use std::io::ErrorKind;
        let message = io_error_text(err);
        match err.kind() {
            ErrorKind::NotFound => Self::not_found(message),
            ErrorKind::PermissionDenied | ErrorKind::InvalidInput => Self::invalid_request(message),
            _ => Self::internal(message),
        }
    }
}

/// The reason text of a foreign-OS `file:` URI (§5.1): `'<uri>' is invalid on '<os>'`.
pub fn foreign_os_reason(uri: &str) -> String {
    format!("'{uri}' is invalid on '{}'", std::env::consts::OS)
}

/// `<description> (os error <errno>)` for OS errors, the plain text otherwise.
pub fn io_error_text(err: &std::io::Error) -> String {
    // std's Display already has this form for OS errors; custom errors carry their text.
    err.to_string()
}

/// Which request family reports a sandbox policy error (SANDBOX.md §2.7): `fs/*` answers
/// -32600, `process/start` -32602. Shape errors are -32602 for both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxRequest {
    Fs,
    Process,
}

impl SandboxRequest {
    /// The code of a policy error (as opposed to a shape error) for this request family.
    pub fn policy_error_code(self) -> i64 {
        match self {
            Self::Fs => code::INVALID_REQUEST,
            Self::Process => code::INVALID_PARAMS,
        }
    }
}

// ---- the `sandbox` member (SANDBOX.md §2, §5.6, §12.2) ------------------------------

impl RpcError {
    pub fn sandbox_needs_one_shape() -> Self {
        Self::invalid_params("sandbox must contain either permissions or sandboxPolicy")
    }

    pub fn sandbox_and_top_level_policy() -> Self {
        Self::invalid_params("sandbox and sandboxPolicy must not both be present")
    }

    /// A snake_case policy member sent in camelCase (SANDBOX.md §2.2).
    pub fn sandbox_member_casing(camel: &str, snake: &str) -> Self {
        Self::invalid_params(format!(
            "sandbox member `{camel}` must be spelled `{snake}`"
        ))
    }

    pub fn glob_pattern_requires_deny() -> Self {
        Self::invalid_params("glob_pattern entries only support deny access")
    }

    /// Only `fs/*` can meet this: `process/start` always has its request's `cwd`.
    pub fn sandbox_requires_cwd() -> Self {
        Self::invalid_request("file system sandbox context with dynamic permissions requires cwd")
    }

    pub fn invalid_sandbox_path_uri(request: SandboxRequest, reason: impl fmt::Display) -> Self {
        Self::new(
            request.policy_error_code(),
            format!("invalid sandbox permission path URI: {reason}"),
        )
    }

    pub fn sandbox_workspace_root_not_native(
        request: SandboxRequest,
        reason: impl fmt::Display,
    ) -> Self {
        Self::new(
            request.policy_error_code(),
            format!(
                "file system sandbox workspace root is not native to this exec-server host: {reason}"
            ),
        )
    }

    pub fn invalid_project_roots_subpath(request: SandboxRequest, subpath: &str) -> Self {
        Self::new(
            request.policy_error_code(),
            format!("invalid project_roots subpath {subpath}"),
        )
    }

    pub fn fs_sandbox_prepare(reason: impl fmt::Display) -> Self {
        Self::invalid_request(format!("failed to prepare fs sandbox: {reason}"))
    }

    /// A user-space refusal of the fs helper (SANDBOX.md §5.6); `path` is the resolved path.
    pub fn sandbox_read_denied(path: &str) -> Self {
        Self::invalid_request(format!(
            "read access to {path} is not permitted by the filesystem sandbox"
        ))
        .with_sandbox_denied()
    }

    /// A user-space refusal of the fs helper (SANDBOX.md §5.6); `path` is the resolved path.
    pub fn sandbox_write_denied(path: &str) -> Self {
        Self::invalid_request(format!(
            "write access to {path} is not permitted by the filesystem sandbox"
        ))
        .with_sandbox_denied()
    }
}

// ---- the fs sandbox helper (SANDBOX.md §4, §7.2) -------------------------------------

impl RpcError {
    /// The helper received a request that still carries a sandbox (§4.4).
    pub fn direct_operation_with_sandbox() -> Self {
        Self::invalid_request("direct filesystem operations do not accept sandbox context")
    }

    pub fn fs_helper_spawn_failed(os_error: impl fmt::Display) -> Self {
        Self::internal(format!("failed to spawn fs sandbox helper: {os_error}"))
    }

    /// `status` is the standard library's display of the exit status; `stderr` the capped,
    /// trimmed stderr text.
    pub fn fs_helper_failed(status: impl fmt::Display, stderr: &str) -> Self {
        Self::internal(format!(
            "fs sandbox helper failed with status {status}: {stderr}"
        ))
    }

    pub fn fs_helper_timed_out(ms: u64) -> Self {
        Self::internal(format!("fs sandbox helper timed out after {ms} ms"))
    }

    pub fn fs_helper_message(reason: impl fmt::Display) -> Self {
        Self::internal(format!(
            "failed to encode or decode fs sandbox helper message: {reason}"
        ))
    }

    pub fn fs_helper_unexpected_response(expected: &str, got: &str) -> Self {
        Self::internal(format!(
            "unexpected fs sandbox helper response: expected {expected}, got {got}"
        ))
    }

    pub fn fs_helper_no_response() -> Self {
        Self::internal("fs sandbox helper closed stdout without responding")
    }

    pub fn fs_helper_response_too_large(limit: u64) -> Self {
        Self::internal(format!("fs sandbox helper response exceeded {limit} bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_object_member_order_is_code_data_message() {
        let err = RpcError::invalid_request("nope").with_sandbox_denied();
        assert_eq!(
            serde_json::to_string(&err).unwrap(),
            r#"{"code":-32600,"data":{"sandboxDenied":true},"message":"nope"}"#
        );
    }

    #[test]
    fn io_errors_map_by_kind() {
        let nf = std::io::Error::from_raw_os_error(libc_enoent());
        assert_eq!(RpcError::from_io(&nf).code, code::NOT_FOUND);
        assert!(RpcError::from_io(&nf).message.ends_with("(os error 2)"));
        let denied = std::io::Error::from_raw_os_error(13);
        assert_eq!(RpcError::from_io(&denied).code, code::INVALID_REQUEST);
        let exists = std::io::Error::from_raw_os_error(17);
        assert_eq!(RpcError::from_io(&exists).code, code::INTERNAL_ERROR);
    }

    fn libc_enoent() -> i32 {
        2
    }
}

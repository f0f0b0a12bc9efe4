//! [`ExecServerError`]: everything a call, a connect or a process handle can fail with.

use std::time::Duration;

use exec_server_proto::error::code;
use exec_server_proto::RpcError;
use serde::Deserialize;
use serde_json::Value;

/// The error of every fallible operation of this crate.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExecServerError {
    /// The transport could not be opened (spawn failure, refused connection, HTTP error on
    /// the WebSocket upgrade, …).
    #[error("failed to connect to exec-server: {0}")]
    Connect(String),
    /// The server answered the WebSocket upgrade with an HTTP error status: `401` for a
    /// missing or wrong credential, `503`/`429` when it stayed busy through the retries.
    /// `body` is the start of the answer's text, which says why.
    #[error(
        "failed to connect to exec-server: {url}: the server refused the WebSocket upgrade with HTTP {status}{}",
        if .body.is_empty() { String::new() } else { format!(" ({})", .body) }
    )]
    Refused {
        url: String,
        status: u16,
        body: String,
    },
    /// A connect or `initialize` step did not finish in time.
    #[error("{what} timed out after {} ms", .after.as_millis())]
    Timeout { what: &'static str, after: Duration },
    /// The server answered the request with a JSON-RPC error.
    #[error("{0}")]
    Rpc(RpcError),
    /// The connection was lost after the request was sent and the request is not one that
    /// can be repeated safely, so whether it took effect is unknown (for example `fs/open`,
    /// whose handle belongs to the lost connection).
    #[error("the connection was lost before `{method}` was answered")]
    Disconnected { method: String },
    /// The session could not be resumed after the connection was lost; every process
    /// handle of the client ends with this error and every later call fails with it.
    #[error("exec-server session lost: {0}")]
    SessionLost(String),
    /// The server sent something this client cannot interpret.
    #[error("unexpected answer from exec-server: {0}")]
    Protocol(String),
    /// A request was refused locally before anything was sent.
    #[error("{0}")]
    InvalidRequest(String),
    /// The client was closed.
    #[error("the exec-server client was closed")]
    Closed,
}

impl ExecServerError {
    /// The server's error object, when the server answered with one.
    pub fn rpc(&self) -> Option<&RpcError> {
        match self {
            Self::Rpc(error) => Some(error),
            _ => None,
        }
    }

    /// The JSON-RPC error code, when the server answered with an error.
    pub fn code(&self) -> Option<i64> {
        self.rpc().map(|e| e.code)
    }

    /// True for -32010: the session is still attached to a connection the server has not
    /// yet seen end (PROTOCOL §3.4, the -32010 race).
    pub fn is_session_attached(&self) -> bool {
        self.code() == Some(code::SESSION_ATTACHED)
    }
}

impl From<RpcError> for ExecServerError {
    fn from(error: RpcError) -> Self {
        Self::Rpc(error)
    }
}

/// An error object as received: `{"code", "message", "data"?}`; unknown members ignored.
#[derive(Debug, Deserialize)]
pub(crate) struct WireError {
    code: i64,
    #[serde(default)]
    message: String,
    #[serde(default)]
    data: Option<Value>,
}

impl From<WireError> for RpcError {
    fn from(wire: WireError) -> Self {
        RpcError {
            code: wire.code,
            data: wire.data,
            message: wire.message,
        }
    }
}

//! What one audit event says, and its JSON line (schema `exec-server.audit/v1`,
//! docs/AUDIT.md).

use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::time::SystemTime;

use exec_server_proto::clock::rfc3339_micros;
use exec_server_proto::{RequestId, RpcError};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The schema every line names; a change that is not an addition bumps it.
pub const SCHEMA: &str = "exec-server.audit/v1";

/// How much an event records (Kubernetes' None / Metadata / Request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Not recorded.
    None,
    /// Who, what, when, the target (paths, process ids) and the outcome.
    Metadata,
    /// Also what the request asked for: argv, cwd, variable names, sizes, the policy.
    Request,
}

/// Who an event happened for: what the server knows of the connection.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Who {
    /// `stdio`, `websocket`, `relay` or `in-process`.
    pub transport: &'static str,
    /// The peer's address, for transports that have one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthIdentity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relay: Option<RelayIdentity>,
}

impl Who {
    /// The server itself (start-up, configuration).
    pub fn server() -> Self {
        Self {
            transport: "server",
            ..Self::default()
        }
    }
}

/// How the connection authenticated, and as whom.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthIdentity {
    /// `none`, `capability-token`, `signed-bearer-token`, `noise`.
    pub mode: &'static str,
    /// A name that identifies the credential without revealing it: `sha256:<16 hex>` of a
    /// capability token, a JWT's `sub`, a Noise peer's public key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// A JWT's `iss`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
}

/// The rendezvous route a relay stream came through.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RelayIdentity {
    /// The environment (executor registration) the harness reached.
    pub environment: String,
    /// The rendezvous the executor is registered with.
    pub rendezvous: String,
    /// The stream id within the executor's socket.
    pub stream: String,
    /// The Noise suite of the stream.
    pub suite: &'static str,
}

/// How a request ended.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// `ok` or `error`.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<i64>,
    /// The error's message, as the client was given it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The sandbox refused it (`data.sandboxDenied`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub sandbox_denied: bool,
}

impl Outcome {
    pub fn ok() -> Self {
        Self {
            status: "ok",
            code: None,
            message: None,
            sandbox_denied: false,
        }
    }

    pub fn of<T>(result: &Result<T, RpcError>) -> Self {
        match result {
            Ok(_) => Self::ok(),
            Err(error) => Self::error(error),
        }
    }

    /// The outcome of a request answered with `error`. The message is what the client was
    /// given, bounded ([`super::bound::message`]): a decoder's quote of a refused value is
    /// left out.
    pub fn error(error: &RpcError) -> Self {
        let invalid_params = error.code == RpcError::invalid_params("").code;
        Self {
            status: "error",
            code: Some(error.code),
            message: Some(super::bound::message(&error.message, invalid_params)),
            sandbox_denied: error.is_sandbox_denied(),
        }
    }

    /// A refusal that is not a JSON-RPC error (an HTTP status, a closed stream).
    pub fn refused(message: &str) -> Self {
        Self {
            status: "error",
            code: None,
            message: Some(super::bound::message(message, false)),
            sandbox_denied: false,
        }
    }
}

/// One event before it is written.
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: &'static str,
    pub level: Level,
    pub session: Option<String>,
    pub who: std::sync::Arc<Who>,
    pub traceparent: Option<String>,
    pub method: Option<String>,
    pub request_id: Option<RequestId>,
    /// `received` (before a changing method runs) or `completed`; request events only.
    pub stage: Option<&'static str>,
    pub outcome: Option<Outcome>,
    /// The event's own members (paths, sizes, argv…), as the level allows.
    pub details: Map<String, Value>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Line<'a> {
    schema: &'static str,
    seq: u64,
    time: String,
    kind: &'a str,
    level: Level,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<&'a str>,
    who: &'a Who,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<&'a RequestId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stage: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<&'a Outcome>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    details: &'a Map<String, Value>,
}

impl Event {
    /// An event of `kind` with no request, stage or outcome.
    pub fn new(
        kind: &'static str,
        level: Level,
        who: std::sync::Arc<Who>,
        details: Map<String, Value>,
    ) -> Self {
        Self {
            kind,
            level,
            session: None,
            who,
            traceparent: None,
            method: None,
            request_id: None,
            stage: None,
            outcome: None,
            details,
        }
    }

    /// The event's JSON line (no newline), numbered `seq`. JSON escapes every control
    /// character, so nothing in an event can start a line of its own.
    pub fn encode(&self, seq: u64) -> String {
        let line = Line {
            schema: SCHEMA,
            seq,
            time: rfc3339_micros(SystemTime::now()),
            kind: self.kind,
            level: self.level,
            session: self.session.as_deref(),
            who: &self.who,
            traceparent: self.traceparent.as_deref(),
            method: self.method.as_deref(),
            request_id: self.request_id.as_ref(),
            stage: self.stage,
            outcome: self.outcome.as_ref(),
            details: &self.details,
        };
        serde_json::to_string(&line).expect("an audit event always serializes")
    }
}

/// A host path as an audit value: its text when it is UTF-8, else
/// `{"base64": "<its bytes>"}`, so two paths are never written alike.
pub fn path_value(path: &Path) -> Value {
    match path.to_str() {
        Some(text) => Value::String(text.to_owned()),
        None => {
            let bytes = path.as_os_str().as_bytes();
            serde_json::json!({ "base64": exec_server_proto::bytes::encode_base64(bytes) })
        }
    }
}

//! `initialize` and `initialized` (PROTOCOL §3.1–§3.2, CODEX-0169 §2.2), and the
//! `session/close` extension that ends a session.

use serde::{Deserialize, Serialize};

use crate::environment::EnvironmentInfo;

/// Method name of the handshake request.
pub const INITIALIZE: &str = "initialize";
/// Method name of the handshake notification.
pub const INITIALIZED: &str = "initialized";
/// [ext] A client that is done ends its session at once (processes killed, state freed)
/// and the connection closes after the answer, instead of leaving a detached session to
/// expire. Answered `{}`.
pub const SESSION_CLOSE: &str = "session/close";

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    pub client_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_session_id: Option<String>,
    /// Extensions whose notifications the client understands (`["search"]`). A server
    /// sends an extension's notifications only to connections that name it here, because
    /// reference clients drop the connection on a notification they do not know. Unknown
    /// names are ignored.
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub extensions: Vec<String>,
}

/// `null` means the same as a missing member (PROTOCOL §0.3).
fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    pub session_id: String,
    /// What `environment/info` answers on this connection; absent when that method is not
    /// available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_info: Option<EnvironmentInfo>,
}

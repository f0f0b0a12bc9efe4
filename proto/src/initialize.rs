//! `initialize` and `initialized` (PROTOCOL §3.1–§3.2).

use serde::{Deserialize, Serialize};

/// Method name of the handshake request.
pub const INITIALIZE: &str = "initialize";
/// Method name of the handshake notification.
pub const INITIALIZED: &str = "initialized";

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    pub client_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_session_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    pub session_id: String,
}

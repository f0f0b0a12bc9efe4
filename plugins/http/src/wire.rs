//! The `http/*` messages on the wire (CODEX-NETWORK.md §2): method names, params, results,
//! the body-delta notification, and the error each refusal answers with.

use exec_server_core::proto::bytes::Base64;
use exec_server_core::proto::RpcError;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The family label of gating errors.
pub const FAMILY_LABEL: &str = "http";
/// Makes one HTTP request for the client.
pub const REQUEST: &str = "http/request";
/// One piece of a streamed response body (notification).
pub const BODY_DELTA: &str = "http/request/bodyDelta";

/// Largest decoded body piece of one `http/request/bodyDelta`: the codex client refuses
/// larger ones.
pub const MAX_DELTA_BYTES: usize = 1024 * 1024;

/// `http/request` params. Unknown members are ignored, as codex does.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RequestParams {
    pub(crate) method: String,
    pub(crate) url: String,
    #[serde(default)]
    pub(crate) headers: Vec<HeaderParam>,
    #[serde(default)]
    pub(crate) body_base64: Option<String>,
    /// Absent or `null`: no deadline at all.
    #[serde(default)]
    pub(crate) timeout_ms: Option<u64>,
    #[serde(default)]
    pub(crate) redirect_policy: Option<RedirectPolicy>,
    /// Required even for a buffered request.
    pub(crate) request_id: String,
    #[serde(default)]
    pub(crate) stream_response: bool,
}

/// One request header: `value` is required, and with `valueEnvVar` it is the prefix of
/// the executor's variable's value.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HeaderParam {
    pub(crate) name: String,
    pub(crate) value: String,
    #[serde(default)]
    pub(crate) value_env_var: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RedirectPolicy {
    Follow,
    Stop,
}

/// One response header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct HeaderOut {
    pub(crate) name: String,
    pub(crate) value: String,
}

/// `http/request` result: the whole body, or `""` when it is streamed.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RequestResult {
    pub(crate) status: u16,
    pub(crate) headers: Vec<HeaderOut>,
    /// A JSON string written as it is: base64 needs no escaping, and serde_json scanning a
    /// whole body for escapes costs more than encoding it.
    pub(crate) body_base64: Box<RawValue>,
}

/// `http/request/bodyDelta`: every member is always written (`error: null`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BodyDelta<'a> {
    pub(crate) request_id: &'a str,
    pub(crate) seq: u64,
    pub(crate) delta_base64: Base64<'a>,
    pub(crate) done: bool,
    pub(crate) error: Option<&'a str>,
}

pub(crate) fn invalid_method() -> RpcError {
    RpcError::invalid_params("http/request method is invalid: invalid HTTP method")
}

pub(crate) fn invalid_url(error: impl std::fmt::Display) -> RpcError {
    RpcError::invalid_params(format!("http/request url is invalid: {error}"))
}

pub(crate) fn unsupported_scheme(scheme: &str) -> RpcError {
    RpcError::invalid_params(format!(
        "http/request only supports http and https URLs, got {scheme}"
    ))
}

pub(crate) fn invalid_body(error: impl std::fmt::Display) -> RpcError {
    RpcError::invalid_params(error.to_string())
}

pub(crate) fn stream_id_active(id: &str) -> RpcError {
    RpcError::invalid_params(format!(
        "http/request streamResponse requestId `{id}` is already active"
    ))
}

pub(crate) fn too_many_streams(limit: usize) -> RpcError {
    RpcError::internal(format!(
        "http/request: {limit} streamed responses are already active on this connection \
         (http.max_streams_per_connection)"
    ))
}

pub(crate) fn invalid_header_name() -> RpcError {
    RpcError::invalid_params("http/request header name is invalid: invalid HTTP header name")
}

pub(crate) fn invalid_header_value(name: &str) -> RpcError {
    RpcError::invalid_params(format!(
        "http/request header value is invalid for {name}: failed to parse header value"
    ))
}

pub(crate) fn env_var_missing(name: &str, var: &str) -> RpcError {
    RpcError::invalid_params(format!(
        "http/request header {name} requires executor environment variable {var}"
    ))
}

pub(crate) fn env_var_empty(name: &str, var: &str) -> RpcError {
    RpcError::invalid_params(format!(
        "http/request header {name} requires a non-empty executor environment variable {var}"
    ))
}

pub(crate) fn env_var_denied(name: &str, var: &str) -> RpcError {
    RpcError::invalid_params(format!(
        "http/request header {name} cannot use executor environment variable {var}"
    ))
}

/// A target the operator's `[http]` table does not allow (this server's own refusal).
pub(crate) fn target_refused(why: &str) -> RpcError {
    RpcError::invalid_params(format!("http/request target is not allowed: {why}"))
}

/// The request could not be sent, or its answer's head could not be read.
pub(crate) fn failed(what: impl std::fmt::Display) -> RpcError {
    RpcError::internal(format!("http/request failed: {what}"))
}

pub(crate) fn timed_out() -> RpcError {
    failed("route-aware request timed out")
}

pub(crate) fn too_many_redirects() -> RpcError {
    failed("too many redirects")
}

pub(crate) fn sending_failed(url: &str) -> RpcError {
    failed(format!("error sending request for url ({url})"))
}

/// What a body that could not be read (cut short, corrupt, too slow) is called, alone in
/// a terminal delta and after the prefix in a buffered answer.
pub(crate) const BODY_ERROR: &str = "error decoding response body";

pub(crate) fn body_failed() -> RpcError {
    RpcError::internal(format!(
        "failed to read http/request response body: {BODY_ERROR}"
    ))
}

pub(crate) fn body_too_large(limit: u64) -> RpcError {
    RpcError::internal(format!(
        "failed to read http/request response body: it is larger than {limit} bytes \
         (http.max_buffered_body_bytes; ask for streamResponse)"
    ))
}

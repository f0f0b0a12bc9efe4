//! The registry HTTP API as a client (RELAY §7): the `register`, `connect` and `validate`
//! calls over HTTP/1.1 (reqwest, with TLS for `https` registries), response checks, error
//! bodies and the retry classification of §7.6.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use reqwest::header;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::endpoint::check_ws_url;
pub use crate::endpoint::{check_environment_id, redact_url, BaseUrl};
use crate::noise::{suite_by_profile, NoisePublicKey, MAX_AUTHORIZATION_BYTES};
use crate::tls::TlsTrust;

/// Largest error body shown (then ` [truncated]`).
const MAX_SHOWN_ERROR_BODY: usize = 4_096;
/// Largest response body read.
const MAX_RESPONSE_BODY: usize = 1024 * 1024;
/// The header that names the stream a `validate` call is for (CODEX-0169 §4.2).
pub const STREAM_ID_HEADER: &str = "x-codex-noise-stream-id";

/// A secret string whose `Debug` never shows it (the configuration's own type, so a token
/// read at start-up is handed on as is).
pub use exec_server_config::SecretString;

/// A registry call that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("invalid environment id: {0}")]
    InvalidEnvironmentId(String),
    #[error("relay registry request failed: {0}")]
    Transport(String),
    #[error("relay registry request timed out")]
    Timeout,
    #[error("relay registry answered with a redirect ({0}), which is not followed")]
    Redirect(u16),
    #[error("relay registry answered {status}{}: {}", code.as_deref().map(|c| format!(" {c}")).unwrap_or_default(), status_meaning(*.status, .message))]
    Status {
        status: u16,
        code: Option<String>,
        message: String,
        retry_after: Option<u64>,
    },
    #[error("{0}")]
    BadResponse(String),
}

/// The registry's own message, or what the status means when it sent none (an empty
/// `registry answered 404:` tells nobody anything).
fn status_meaning(status: u16, message: &str) -> String {
    if !message.trim().is_empty() {
        return message.to_owned();
    }
    match status {
        401 => "the bearer token was not accepted (check the token file or variable)".into(),
        403 => "the token may not make this call for this environment".into(),
        404 => "no such endpoint or environment: check that the URL is the registry's base URL and that the environment is registered".into(),
        408 | 504 => "the registry timed out".into(),
        429 => "too many requests; retry later".into(),
        500..=599 => "the registry failed; retry later".into(),
        _ => "no reason given".into(),
    }
}

impl RegistryError {
    /// Transient per §7.6: transport errors, timeouts, 408, 409, 429 and 5xx.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Transport(_) | Self::Timeout => true,
            Self::Status { status, .. } => {
                matches!(status, 408 | 409 | 429) || (500..600).contains(status)
            }
            _ => false,
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status {
                retry_after: Some(s),
                ..
            } => Some(Duration::from_secs(*s)),
            _ => None,
        }
    }

    pub fn is_auth_failure(&self) -> bool {
        matches!(self.status(), Some(401 | 403))
    }
}

/// The client of one registry.
#[derive(Clone)]
pub struct RegistryClient {
    base: BaseUrl,
    token: SecretString,
    timeout: Duration,
    allow_insecure: bool,
    /// Built once with the TLS configuration; each call opens a fresh connection (no idle
    /// pool). Holds why it could not be built, reported by every call.
    http: Result<reqwest::Client, String>,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("base", &self.base)
            .field("token", &self.token)
            .finish()
    }
}

/// `register` answer (§7.3).
#[derive(Clone, Deserialize)]
pub struct Registration {
    pub environment_id: String,
    pub url: String,
    pub security_profile: String,
    pub executor_registration_id: String,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("environment_id", &self.environment_id)
            .field("url", &redact_url(&self.url))
            .field("executor_registration_id", &self.executor_registration_id)
            .finish()
    }
}

/// `connect` answer: the connect bundle (§7.4). Its URL and authorisation are secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectBundle {
    pub environment_id: String,
    pub url: String,
    pub security_profile: String,
    pub executor_registration_id: String,
    pub executor_public_key: NoisePublicKey,
    pub harness_key_authorization: SecretString,
}

impl std::fmt::Debug for ConnectBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectBundle")
            .field("environment_id", &self.environment_id)
            .field("url", &redact_url(&self.url))
            .field("executor_registration_id", &self.executor_registration_id)
            .field("executor_public_key", &self.executor_public_key)
            .field("harness_key_authorization", &"<redacted>")
            .finish()
    }
}

fn check_common(
    requested: &str,
    environment_id: &str,
    profile: &str,
    url: &str,
    registration_id: &str,
    allow_insecure: bool,
) -> Result<(), RegistryError> {
    if environment_id != requested {
        return Err(RegistryError::BadResponse(
            "relay registry returned a different environment id".into(),
        ));
    }
    if suite_by_profile(profile).is_none() {
        return Err(RegistryError::BadResponse(format!(
            "relay registry returned the unsupported security profile `{}`",
            crate::proto::truncate_for_log(profile)
        )));
    }
    check_ws_url(url, allow_insecure).map_err(RegistryError::BadResponse)?;
    if registration_id.trim().is_empty() || registration_id.len() > 256 {
        return Err(RegistryError::BadResponse(
            "relay registry returned an invalid executor registration id".into(),
        ));
    }
    Ok(())
}

impl RegistryClient {
    /// A client that trusts the system's root certificates.
    pub fn new(
        base: BaseUrl,
        token: SecretString,
        timeout: Duration,
        allow_insecure: bool,
    ) -> Self {
        Self::with_trust(base, token, timeout, allow_insecure, &TlsTrust::system())
    }

    /// A client whose `https` connections trust what `trust` says (a CA file besides the
    /// system's roots).
    pub fn with_trust(
        base: BaseUrl,
        token: SecretString,
        timeout: Duration,
        allow_insecure: bool,
        trust: &TlsTrust,
    ) -> Self {
        let tls = if base.is_tls() {
            trust.client_config()
        } else {
            crate::tls::untrusting_config()
        };
        // Redirects are errors (§7.6) and no proxy from the environment is used: the
        // registry is reached the way its URL says.
        let http = reqwest::Client::builder()
            .use_preconfigured_tls((*tls).clone())
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(0)
            .user_agent(concat!("exec-server/", env!("CARGO_PKG_VERSION")))
            .build();
        Self {
            base,
            token,
            timeout,
            allow_insecure,
            http: http.map_err(|e| format!("cannot build the HTTP client: {e}")),
        }
    }

    pub fn base(&self) -> &BaseUrl {
        &self.base
    }

    /// `POST …/register` (§7.3).
    pub async fn register(
        &self,
        environment_id: &str,
        key: &NoisePublicKey,
        name: Option<&str>,
    ) -> Result<Registration, RegistryError> {
        let mut body = json!({
            "security_profile": key.suite().security_profile(),
            "executor_public_key": key.to_json(),
        });
        if let Some(name) = name {
            body["name"] = name.into();
        }
        let value = self.post(environment_id, "register", &body, true).await?;
        let reg: Registration = serde_json::from_value(value).map_err(|e| {
            RegistryError::BadResponse(format!(
                "relay registry returned a malformed register answer: {e}"
            ))
        })?;
        check_common(
            environment_id,
            &reg.environment_id,
            &reg.security_profile,
            &reg.url,
            &reg.executor_registration_id,
            self.allow_insecure,
        )?;
        Ok(reg)
    }

    /// `POST …/connect` (§7.4).
    pub async fn connect(
        &self,
        environment_id: &str,
        harness_key: &NoisePublicKey,
    ) -> Result<ConnectBundle, RegistryError> {
        let body = json!({ "harness_public_key": harness_key.to_json() });
        let value = self.post(environment_id, "connect", &body, true).await?;
        parse_bundle(environment_id, &value, self.allow_insecure)
    }

    /// `POST …/validate` (§7.5) for the stream `stream_id`, named in the
    /// `x-codex-noise-stream-id` header as codex does. `Ok(true)` only for a 200 whose
    /// `valid` is `true`.
    pub async fn validate(
        &self,
        environment_id: &str,
        registration_id: &str,
        harness_key: &NoisePublicKey,
        authorization: &str,
        stream_id: &str,
    ) -> Result<bool, RegistryError> {
        let body = json!({
            "executor_registration_id": registration_id,
            "harness_public_key": harness_key.to_json(),
            "harness_key_authorization": authorization,
        });
        let value = self
            .post_with(environment_id, "validate", &body, false, Some(stream_id))
            .await?;
        Ok(value.get("valid") == Some(&Value::Bool(true)))
    }

    async fn post(
        &self,
        environment_id: &str,
        call: &str,
        body: &Value,
        show_error_body: bool,
    ) -> Result<Value, RegistryError> {
        self.post_with(environment_id, call, body, show_error_body, None)
            .await
    }

    async fn post_with(
        &self,
        environment_id: &str,
        call: &str,
        body: &Value,
        show_error_body: bool,
        stream_id: Option<&str>,
    ) -> Result<Value, RegistryError> {
        check_environment_id(environment_id).map_err(RegistryError::InvalidEnvironmentId)?;
        let url = self.base.endpoint(environment_id, call);
        let body = serde_json::to_vec(body).expect("JSON serializes");
        let http = self
            .http
            .as_ref()
            .map_err(|e| RegistryError::Transport(e.clone()))?;
        let exchange = post_json(http, url, self.token.expose(), body, stream_id);
        let (status, retry_after, bytes) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| RegistryError::Timeout)??;
        if (300..400).contains(&status) {
            return Err(RegistryError::Redirect(status));
        }
        if status != 200 {
            let (code, message) = error_body(&bytes, show_error_body, self.token.expose());
            return Err(RegistryError::Status {
                status,
                code,
                message,
                retry_after,
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            RegistryError::BadResponse(format!("relay registry returned invalid JSON: {e}"))
        })
    }
}

/// Parses and checks a connect bundle (§7.4).
pub fn parse_bundle(
    requested: &str,
    value: &Value,
    allow_insecure: bool,
) -> Result<ConnectBundle, RegistryError> {
    let text = |name: &str| -> Result<String, RegistryError> {
        value
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                RegistryError::BadResponse(format!("relay registry answer lacks `{name}`"))
            })
    };
    let bundle_env = text("environment_id")?;
    let url = text("url")?;
    let profile = text("security_profile")?;
    let reg = text("executor_registration_id")?;
    check_common(requested, &bundle_env, &profile, &url, &reg, allow_insecure)?;
    let key = value
        .get("executor_public_key")
        .ok_or_else(|| {
            RegistryError::BadResponse("relay registry answer lacks `executor_public_key`".into())
        })
        .and_then(|k| {
            NoisePublicKey::from_json(k).map_err(|e| {
                RegistryError::BadResponse(format!(
                    "relay registry returned a bad executor key: {e}"
                ))
            })
        })?;
    if key.suite().security_profile() != profile {
        return Err(RegistryError::BadResponse(format!(
            "relay registry returned an executor key of the suite `{}` for the security profile `{}`",
            key.suite_name(),
            crate::proto::truncate_for_log(&profile)
        )));
    }
    let authz = text("harness_key_authorization")?;
    if authz.trim().is_empty() || authz.len() > MAX_AUTHORIZATION_BYTES {
        return Err(RegistryError::BadResponse(
            "relay registry returned an invalid harness key authorization".into(),
        ));
    }
    Ok(ConnectBundle {
        environment_id: bundle_env,
        url,
        security_profile: profile,
        executor_registration_id: reg,
        executor_public_key: key,
        harness_key_authorization: SecretString::new(authz),
    })
}

/// `error.code` and a shown message from an error body (§7.6).
/// The code and the message of an error answer, as an error may quote them: the message
/// bounded, with control and invisible characters escaped (a registry's text cannot forge
/// a log line), and the bearer token this client sent replaced, should the registry echo
/// the request back.
fn error_body(bytes: &[u8], show: bool, token: &str) -> (Option<String>, String) {
    let parsed: Option<Value> = serde_json::from_slice(bytes).ok();
    let code = parsed
        .as_ref()
        .and_then(|v| v["error"]["code"].as_str())
        .map(crate::proto::truncate_for_log);
    if !show {
        return (code, "(body not shown)".into());
    }
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    if !token.is_empty() {
        text = text.replace(token, "<redacted>");
    }
    let shown = exec_server_proto::log_text::prefix(&text, MAX_SHOWN_ERROR_BODY);
    let mut message = exec_server_proto::log_text::printable(shown);
    if shown.len() < text.len() {
        message.push_str(" [truncated]");
    }
    (code, message)
}

/// One POST with a JSON body; the status, `Retry-After` and at most
/// [`MAX_RESPONSE_BODY`] bytes of the answer.
async fn post_json(
    http: &reqwest::Client,
    url: url::Url,
    token: &str,
    body: Vec<u8>,
    stream_id: Option<&str>,
) -> Result<(u16, Option<u64>, Bytes), RegistryError> {
    // The headers codex 0.169.0 sends (CODEX-0169 §4.2).
    let mut request = http
        .post(url)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "*/*");
    if let Some(stream_id) = stream_id {
        request = request.header(STREAM_ID_HEADER, stream_id);
    }
    let mut response = request.body(body).send().await.map_err(transport_error)?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    let too_large = || RegistryError::Transport("the response body is too large".into());
    if response
        .content_length()
        .is_some_and(|len| len > MAX_RESPONSE_BODY as u64)
    {
        return Err(too_large());
    }
    let mut bytes = BytesMut::new();
    while let Some(chunk) = response.chunk().await.map_err(transport_error)? {
        if bytes.len() + chunk.len() > MAX_RESPONSE_BODY {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok((status, retry_after, bytes.freeze()))
}

/// A transport failure with its causes (reqwest's own text names only the step).
fn transport_error(error: reqwest::Error) -> RegistryError {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    RegistryError::Transport(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_checks() {
        let good = json!({
            "environment_id": "e",
            "url": "ws://127.0.0.1:1/ws/environment/e?role=harness",
            "security_profile": "noise_ik_v1",
            "executor_registration_id": "reg-1",
            "executor_public_key": {"suite": "Noise_IK_25519_AESGCM_SHA256", "x25519_public_key": "3p7bfXt9wbTTW2HC7OQ1Nz+DQ8hbeGdNrfx+FG+IK08="},
            "harness_key_authorization": "v1.secret",
        });
        let bundle = parse_bundle("e", &good, false).unwrap();
        assert!(!format!("{bundle:?}").contains("secret"));
        assert!(!format!("{bundle:?}").contains("role=harness"));
        let with = |k: &str, v: Value| {
            let mut b = good.clone();
            b[k] = v;
            parse_bundle("e", &b, false)
        };
        assert_eq!(
            with("environment_id", json!("other"))
                .unwrap_err()
                .to_string(),
            "relay registry returned a different environment id"
        );
        // The profile must name a suite this build speaks; the key is checked by its own
        // suite tag.
        assert!(with("security_profile", json!("noise_xx_v1")).is_err());
        assert!(with("url", json!("https://127.0.0.1/x")).is_err());
        assert!(with("url", json!("wss:///x")).is_err());
        assert!(with("url", json!("ws://example.com/x")).is_err());
        assert!(with("executor_registration_id", json!("  ")).is_err());
        assert!(with("harness_key_authorization", json!("a".repeat(4097))).is_err());
    }

    #[test]
    fn a_status_without_a_message_says_what_it_means() {
        let status = |status, message: &str| RegistryError::Status {
            status,
            code: None,
            message: message.into(),
            retry_after: None,
        };
        let not_found = status(404, "").to_string();
        assert!(
            not_found.starts_with("relay registry answered 404: no such endpoint or environment"),
            "{not_found}"
        );
        assert!(not_found.contains("registry's base URL"), "{not_found}");
        assert!(status(401, " ")
            .to_string()
            .contains("bearer token was not accepted"));
        assert_eq!(
            status(403, "role viewer").to_string(),
            "relay registry answered 403: role viewer"
        );
    }

    #[test]
    fn retry_classification() {
        let status = |s| RegistryError::Status {
            status: s,
            code: None,
            message: String::new(),
            retry_after: None,
        };
        for s in [500, 503, 408, 429, 409] {
            assert!(status(s).is_retryable(), "{s}");
        }
        for s in [400, 401, 403, 404, 413] {
            assert!(!status(s).is_retryable(), "{s}");
        }
        assert!(RegistryError::Timeout.is_retryable());
        assert!(!RegistryError::Redirect(302).is_retryable());
        let long = "x".repeat(5000);
        let (_, shown) = error_body(long.as_bytes(), true, "tok");
        assert!(shown.ends_with(" [truncated]") && shown.len() == 4096 + 12);
        let (_, hidden) = error_body(b"{\"authz\":\"v1.secret\"}", false, "tok");
        let echoed = b"refused\n2026-01-01T00:00:00Z  INFO forged\necho: Bearer relay-secret-tok";
        let (_, forged) = error_body(echoed, true, "relay-secret-tok");
        assert!(
            !forged.contains('\n') && !forged.contains("relay-secret-tok"),
            "{forged}"
        );
        assert!(forged.contains("Bearer <redacted>"), "{forged}");
        assert!(!hidden.contains("secret"));
        assert!(!format!("{:?}", SecretString::new("tok")).contains("tok"));
    }
}

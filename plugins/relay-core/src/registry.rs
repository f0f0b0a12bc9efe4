//! The registry HTTP API as a client (RELAY §7): environment id rules and path encoding,
//! base URLs, the `register`, `connect` and `validate` calls over plain HTTP/1.1 (hyper),
//! response checks, error bodies and the retry classification of §7.6.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::noise::{NoisePublicKey, MAX_AUTHORIZATION_BYTES, SECURITY_PROFILE_V1};

/// Largest error body shown (then ` [truncated]`).
const MAX_SHOWN_ERROR_BODY: usize = 4_096;
/// Largest response body read.
const MAX_RESPONSE_BODY: usize = 1024 * 1024;

/// A secret string whose `Debug` never shows it (the configuration's own type, so a token
/// read at start-up is handed on as is).
pub use exec_server_config::SecretString;

/// `environment_id` rules of §7.2, checked before any request.
pub fn check_environment_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 256 {
        return Err("must be 1 to 256 bytes".into());
    }
    if id == "." || id == ".." {
        return Err("must not be `.` or `..`".into());
    }
    if id.chars().any(|c| (c as u32) < 0x20 || c as u32 == 0x7f) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

/// Percent-encodes one path segment (§7.2): everything outside `A–Z a–z 0–9 - . _ ~`.
pub fn encode_segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes `%XX` escapes of a path segment; `None` when malformed or not UTF-8.
pub fn decode_segment(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A parsed `http(s)://` or `ws(s)://` URL: scheme, host, port, path and query.
#[derive(Clone, PartialEq, Eq)]
pub struct BaseUrl {
    pub scheme: String,
    /// As written, IPv6 in brackets.
    pub host: String,
    pub port: u16,
    /// Without trailing `/` for base URLs; may be empty.
    pub path: String,
    pub query: Option<String>,
}

impl std::fmt::Debug for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.redacted())
    }
}

impl BaseUrl {
    /// Parses any absolute URL of the four schemes (no userinfo, no fragment).
    pub fn parse_any(url: &str) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| format!("`{}` is not an absolute URL", redact_url(url)))?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" | "ws" => 80,
            "https" | "wss" => 443,
            _ => return Err(format!("unsupported URL scheme `{scheme}`")),
        };
        if rest.contains('#') {
            return Err("a URL must not contain a fragment".into());
        }
        let (before_query, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q.to_owned())),
            None => (rest, None),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => (&before_query[..i], &before_query[i..]),
            None => (before_query, ""),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err("a URL needs a host and no user information".into());
        }
        let (host, port) = if let Some(end) = authority.strip_prefix('[').and_then(|a| a.find(']'))
        {
            let host = &authority[..end + 2];
            let rest = &authority[end + 2..];
            let port = match rest.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| "invalid port".to_owned())?,
                None if rest.is_empty() => default_port,
                None => return Err("invalid host".into()),
            };
            (host.to_owned(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_owned(),
                    p.parse().map_err(|_| "invalid port".to_owned())?,
                ),
                None => (authority.to_owned(), default_port),
            }
        };
        if host.is_empty() {
            return Err("a URL needs a host".into());
        }
        Ok(Self {
            scheme,
            host,
            port,
            path: path.to_owned(),
            query,
        })
    }

    /// A registry base URL (§7.1): `http`/`https`, no query, trailing `/` removed, and
    /// `http` only to loopback hosts unless `allow_insecure`.
    pub fn parse(url: &str, allow_insecure: bool) -> Result<Self, String> {
        let mut base = Self::parse_any(url)?;
        if base.scheme != "http" && base.scheme != "https" {
            return Err("must be an http:// or https:// URL".into());
        }
        if base.query.is_some() {
            return Err("must not contain a query".into());
        }
        if base.scheme == "http" && !allow_insecure && !is_loopback_host(&base.host) {
            return Err(
                "must use https unless the host is a loopback address (or relay.allow_insecure = true)"
                    .into(),
            );
        }
        if base.scheme == "https" {
            return Err(
                "https registries need TLS, which this build does not include; terminate TLS in a local proxy or use http on loopback"
                    .into(),
            );
        }
        base.path = base.path.trim_end_matches('/').to_owned();
        Ok(base)
    }

    /// True when plain `ws://`/`http://` may be used with this host.
    pub fn insecure_allowed(&self, allow_insecure: bool) -> bool {
        allow_insecure || is_loopback_host(&self.host)
    }

    /// The URL without its query string, for logs.
    pub fn redacted(&self) -> String {
        format!("{}://{}:{}{}", self.scheme, self.host, self.port, self.path)
    }

    pub fn full(&self) -> String {
        let mut s = format!("{}://{}:{}{}", self.scheme, self.host, self.port, self.path);
        if let Some(q) = &self.query {
            s.push('?');
            s.push_str(q);
        }
        s
    }

    fn endpoint_path(&self, environment_id: &str, call: &str) -> String {
        format!(
            "{}/cloud/environment/{}/{call}",
            self.path,
            encode_segment(environment_id)
        )
    }

    /// The endpoint URL of `call` for an environment (§7.1).
    pub fn endpoint(&self, environment_id: &str, call: &str) -> String {
        format!(
            "{}://{}:{}{}",
            self.scheme,
            self.host,
            self.port,
            self.endpoint_path(environment_id, call)
        )
    }
}

/// Strips the query of a URL for logs and errors.
pub fn redact_url(url: &str) -> &str {
    url.split('?').next().unwrap_or(url)
}

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
    #[error("relay registry answered {status}{}: {message}", code.as_deref().map(|c| format!(" {c}")).unwrap_or_default())]
    Status {
        status: u16,
        code: Option<String>,
        message: String,
        retry_after: Option<u64>,
    },
    #[error("{0}")]
    BadResponse(String),
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

/// Checks a handed-out WebSocket URL: `wss`, or `ws` under the loopback/insecure rule.
fn check_ws_url(url: &str, allow_insecure: bool) -> Result<(), String> {
    let parsed = BaseUrl::parse_any(url)
        .map_err(|e| format!("relay registry returned an invalid url: {e}"))?;
    match parsed.scheme.as_str() {
        "wss" => Ok(()),
        "ws" if parsed.insecure_allowed(allow_insecure) => Ok(()),
        other => Err(format!(
            "relay registry returned a url with scheme `{other}`; expected wss"
        )),
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
    if profile != SECURITY_PROFILE_V1 {
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
    pub fn new(
        base: BaseUrl,
        token: SecretString,
        timeout: Duration,
        allow_insecure: bool,
    ) -> Self {
        Self {
            base,
            token,
            timeout,
            allow_insecure,
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
            "security_profile": SECURITY_PROFILE_V1,
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

    /// `POST …/validate` (§7.5). `Ok(true)` only for a 200 whose `valid` is `true`.
    pub async fn validate(
        &self,
        environment_id: &str,
        registration_id: &str,
        harness_key: &NoisePublicKey,
        authorization: &str,
    ) -> Result<bool, RegistryError> {
        let body = json!({
            "executor_registration_id": registration_id,
            "harness_public_key": harness_key.to_json(),
            "harness_key_authorization": authorization,
        });
        let value = self.post(environment_id, "validate", &body, false).await?;
        Ok(value.get("valid") == Some(&Value::Bool(true)))
    }

    async fn post(
        &self,
        environment_id: &str,
        call: &str,
        body: &Value,
        show_error_body: bool,
    ) -> Result<Value, RegistryError> {
        check_environment_id(environment_id).map_err(RegistryError::InvalidEnvironmentId)?;
        let path = self.base.endpoint_path(environment_id, call);
        let body = serde_json::to_vec(body).expect("JSON serializes");
        let exchange = post_json(&self.base, &path, self.token.expose(), body);
        let (status, retry_after, bytes) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| RegistryError::Timeout)??;
        if (300..400).contains(&status) {
            return Err(RegistryError::Redirect(status));
        }
        if status != 200 {
            let (code, message) = error_body(&bytes, show_error_body);
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
fn error_body(bytes: &[u8], show: bool) -> (Option<String>, String) {
    let parsed: Option<Value> = serde_json::from_slice(bytes).ok();
    let code = parsed
        .as_ref()
        .and_then(|v| v["error"]["code"].as_str())
        .map(|c| crate::proto::truncate_for_log(c).to_owned());
    if !show {
        return (code, "(body not shown)".into());
    }
    let text = String::from_utf8_lossy(bytes);
    let message = if text.len() > MAX_SHOWN_ERROR_BODY {
        let mut end = MAX_SHOWN_ERROR_BODY;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{} [truncated]", &text[..end])
    } else {
        text.into_owned()
    };
    (code, message)
}

/// One POST with a JSON body over a fresh HTTP/1.1 connection.
async fn post_json(
    base: &BaseUrl,
    path: &str,
    token: &str,
    body: Vec<u8>,
) -> Result<(u16, Option<u64>, Bytes), RegistryError> {
    let host = base.host.trim_start_matches('[').trim_end_matches(']');
    let stream = tokio::net::TcpStream::connect((host, base.port))
        .await
        .map_err(|e| RegistryError::Transport(e.to_string()))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| RegistryError::Transport(e.to_string()))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = hyper::Request::post(path)
        .header(header::HOST, format!("{}:{}", base.host, base.port))
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .header(
            header::USER_AGENT,
            concat!("exec-server/", env!("CARGO_PKG_VERSION")),
        )
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| RegistryError::Transport(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| RegistryError::Transport(e.to_string()))?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    let bytes = Limited::new(response.into_body(), MAX_RESPONSE_BODY)
        .collect()
        .await
        .map_err(|e| RegistryError::Transport(e.to_string()))?
        .to_bytes();
    Ok((status, retry_after, bytes))
}

/// The body of a registry error answer (§7.6).
pub fn error_json(code: &str, message: &str) -> Value {
    json!({"error": {"code": code, "message": message}})
}

/// Serializable helpers shared with the service.
#[derive(Debug, Serialize)]
pub struct ValidAnswer {
    pub valid: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_encoding_vectors() {
        assert_eq!(encode_segment("env-1"), "env-1");
        assert_eq!(encode_segment("team/name?# %"), "team%2Fname%3F%23%20%25");
        assert_eq!(encode_segment("ümlaut"), "%C3%BCmlaut");
        assert_eq!(encode_segment("a.b"), "a.b");
        assert_eq!(encode_segment("A~z_9"), "A~z_9");
        for bad in [".", "..", "", "a\nb"] {
            assert!(check_environment_id(bad).is_err(), "{bad:?}");
        }
        assert!(check_environment_id(&"x".repeat(257)).is_err());
        assert_eq!(
            decode_segment("team%2Fname%3F%23%20%25").unwrap(),
            "team/name?# %"
        );
        let base = BaseUrl::parse_any("https://relay.example.com/registry/").unwrap();
        let mut base = base;
        base.path = base.path.trim_end_matches('/').to_owned();
        assert_eq!(
            base.endpoint("team/name", "register"),
            "https://relay.example.com:443/registry/cloud/environment/team%2Fname/register"
        );
    }

    #[test]
    fn base_url_rules() {
        assert!(BaseUrl::parse("http://127.0.0.1:8080", false).is_ok());
        assert!(BaseUrl::parse("http://localhost:8080/x/", false).is_ok());
        assert!(BaseUrl::parse("http://[::1]:8080", false).is_ok());
        assert!(BaseUrl::parse("http://example.com", false).is_err());
        assert!(BaseUrl::parse("http://example.com", true).is_ok());
        assert!(BaseUrl::parse("http://127.0.0.1:1/?q=1", false).is_err());
        assert!(BaseUrl::parse("ftp://127.0.0.1", false).is_err());
        assert_eq!(
            BaseUrl::parse("http://127.0.0.1:9/a//", false)
                .unwrap()
                .path,
            "/a"
        );
    }

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
        assert!(with("security_profile", json!("noise_hybrid_ik_v1")).is_err());
        assert!(with("url", json!("https://127.0.0.1/x")).is_err());
        assert!(with("url", json!("wss:///x")).is_err());
        assert!(with("url", json!("ws://example.com/x")).is_err());
        assert!(with("executor_registration_id", json!("  ")).is_err());
        assert!(with("harness_key_authorization", json!("a".repeat(4097))).is_err());
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
        let (_, shown) = error_body(long.as_bytes(), true);
        assert!(shown.ends_with(" [truncated]") && shown.len() == 4096 + 12);
        let (_, hidden) = error_body(b"{\"authz\":\"v1.secret\"}", false);
        assert!(!hidden.contains("secret"));
        assert!(!format!("{:?}", SecretString::new("tok")).contains("tok"));
    }
}

//! Registry and rendezvous URLs (RELAY §7.1, §7.2, §8.4), parsed with the `url` crate: the
//! registry base URL and its endpoints, the rules for handed-out WebSocket URLs, the
//! `environment_id` rules and its path-segment encoding, and redaction for logs.

use std::net::IpAddr;

use url::{Host, Url};

/// A URL the relay refuses, with the reason in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("`{0}` is not an absolute URL")]
    NotAbsolute(String),
    #[error("unsupported URL scheme `{0}`")]
    UnsupportedScheme(String),
    #[error("a URL must not contain a fragment")]
    Fragment,
    #[error("a URL needs a host and no user information")]
    Authority,
    #[error("must be an http:// or https:// URL")]
    NotHttp,
    #[error("must not contain a query")]
    Query,
    #[error(
        "must use https unless the host is a loopback address (or relay.allow_insecure = true)"
    )]
    Insecure,
}

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

/// Percent-encodes one path segment (§7.2): every byte outside `A–Z a–z 0–9 - . _ ~`, with
/// uppercase hex. (The `url` crate's own segment encoding leaves more characters as they
/// are, so the relay keeps this stricter one.)
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

/// Decodes `%XX` escapes of a path segment or query value; `None` when an escape is
/// malformed or the result is not UTF-8.
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

/// Strips the query of a URL for logs and errors (signed URLs carry their credentials
/// there).
pub fn redact_url(url: &str) -> &str {
    url.split('?').next().unwrap_or(url)
}

/// `localhost`, `127.0.0.0/8` and `::1`.
fn is_loopback(host: Option<Host<&str>>) -> bool {
    match host {
        Some(Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(Host::Ipv4(ip)) => exec_server_proto::net::is_loopback(IpAddr::V4(ip)),
        Some(Host::Ipv6(ip)) => exec_server_proto::net::is_loopback(IpAddr::V6(ip)),
        None => false,
    }
}

/// Parses an absolute `http(s)://` or `ws(s)://` URL with a host, no user information and
/// no fragment.
fn parse_absolute(text: &str) -> Result<Url, UrlError> {
    // The text may come from a registry: quoted bounded and escaped.
    let not_absolute =
        || UrlError::NotAbsolute(exec_server_proto::log_text::quoted(redact_url(text)));
    let (scheme, rest) = text.split_once("://").ok_or_else(not_absolute)?;
    let scheme = scheme.to_ascii_lowercase();
    if !matches!(scheme.as_str(), "http" | "https" | "ws" | "wss") {
        return Err(UrlError::UnsupportedScheme(
            exec_server_proto::log_text::quoted(&scheme),
        ));
    }
    // The URL standard reads `http:///host` as `http://host`; the relay wants the
    // authority where it is written.
    if rest.is_empty() || rest.starts_with(['/', '\\', '?', '#']) {
        return Err(UrlError::Authority);
    }
    let url = Url::parse(text).map_err(|_| not_absolute())?;
    if url.fragment().is_some() {
        return Err(UrlError::Fragment);
    }
    if url.host().is_none() || !url.username().is_empty() || url.password().is_some() {
        return Err(UrlError::Authority);
    }
    Ok(url)
}

/// A registry base URL (§7.1): `http` or `https`, no query, trailing `/` removed, and
/// `http` only to loopback hosts unless `allow_insecure`.
#[derive(Clone, PartialEq, Eq)]
pub struct BaseUrl {
    url: Url,
}

impl std::fmt::Debug for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.redacted())
    }
}

impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl BaseUrl {
    pub fn parse(text: &str, allow_insecure: bool) -> Result<Self, UrlError> {
        let mut url = parse_absolute(text)?;
        match url.scheme() {
            "https" => {}
            "http" if allow_insecure || is_loopback(url.host()) => {}
            "http" => return Err(UrlError::Insecure),
            _ => return Err(UrlError::NotHttp),
        }
        if url.query().is_some() {
            return Err(UrlError::Query);
        }
        let path = url.path().trim_end_matches('/').to_owned();
        url.set_path(&path);
        Ok(Self { url })
    }

    /// True for an `https` registry.
    pub fn is_tls(&self) -> bool {
        self.url.scheme() == "https"
    }

    /// The port it names, or its scheme's (80, 443).
    pub fn port(&self) -> Option<u16> {
        self.url.port_or_known_default()
    }

    /// True when its host is a loopback address or `localhost`.
    pub fn is_loopback_host(&self) -> bool {
        is_loopback(self.url.host())
    }

    /// The base URL as text, without a trailing `/`.
    pub fn redacted(&self) -> String {
        self.url.as_str().trim_end_matches('/').to_owned()
    }

    /// The endpoint of `call` for an environment (§7.1, §7.2):
    /// `{base}/cloud/environment/{encoded id}/{call}`.
    pub fn endpoint(&self, environment_id: &str, call: &str) -> Url {
        let mut url = self.url.clone();
        let path = format!(
            "{}/cloud/environment/{}/{call}",
            self.url.path().trim_end_matches('/'),
            encode_segment(environment_id)
        );
        url.set_path(&path);
        url
    }
}

/// Checks a WebSocket URL a registry handed out (§7.3): `wss`, or `ws` to a loopback host
/// or with `allow_insecure`.
pub fn check_ws_url(text: &str, allow_insecure: bool) -> Result<Url, String> {
    let url =
        parse_absolute(text).map_err(|e| format!("relay registry returned an invalid url: {e}"))?;
    match url.scheme() {
        "wss" => Ok(url),
        "ws" if allow_insecure || is_loopback(url.host()) => Ok(url),
        other => Err(format!(
            "relay registry returned a url with scheme `{other}`; expected wss"
        )),
    }
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
        let base = BaseUrl::parse("https://relay.example.com/registry/", false).unwrap();
        assert_eq!(
            base.endpoint("team/name", "register").as_str(),
            "https://relay.example.com/registry/cloud/environment/team%2Fname/register"
        );
        let root = BaseUrl::parse("http://127.0.0.1:8080/", false).unwrap();
        assert_eq!(
            root.endpoint("env-1", "connect").as_str(),
            "http://127.0.0.1:8080/cloud/environment/env-1/connect"
        );
    }

    #[test]
    fn base_url_rules() {
        assert!(BaseUrl::parse("http://127.0.0.1:8080", false).is_ok());
        assert!(BaseUrl::parse("http://localhost:8080/x/", false).is_ok());
        assert!(BaseUrl::parse("http://[::1]:8080", false).is_ok());
        assert!(BaseUrl::parse("https://relay.example.com", false).is_ok());
        assert_eq!(
            BaseUrl::parse("http://example.com", false),
            Err(UrlError::Insecure)
        );
        assert!(BaseUrl::parse("http://example.com", true).is_ok());
        assert_eq!(
            BaseUrl::parse("http://127.0.0.1:1/?q=1", false),
            Err(UrlError::Query)
        );
        assert_eq!(
            BaseUrl::parse("ftp://127.0.0.1", false),
            Err(UrlError::UnsupportedScheme("ftp".into()))
        );
        assert_eq!(
            BaseUrl::parse("ws://127.0.0.1", false),
            Err(UrlError::NotHttp)
        );
        assert_eq!(
            BaseUrl::parse("http://user@127.0.0.1", false),
            Err(UrlError::Authority)
        );
        assert_eq!(
            BaseUrl::parse("http://127.0.0.1/#x", false),
            Err(UrlError::Fragment)
        );
        assert!(BaseUrl::parse("127.0.0.1:8080", false).is_err());
        assert_eq!(
            BaseUrl::parse("http://127.0.0.1:9/a//", false)
                .unwrap()
                .redacted(),
            "http://127.0.0.1:9/a"
        );
    }

    #[test]
    fn handed_out_websocket_urls() {
        assert!(check_ws_url(
            "wss://relay.example.com/ws/environment/e?role=harness",
            false
        )
        .is_ok());
        assert!(check_ws_url("ws://127.0.0.1:1/ws/environment/e", false).is_ok());
        assert!(check_ws_url("ws://example.com/x", true).is_ok());
        assert!(check_ws_url("ws://example.com/x", false).is_err());
        assert!(check_ws_url("https://127.0.0.1/x", false).is_err());
        assert!(check_ws_url("wss:///x", false).is_err());
        let refused = check_ws_url("wss://relay.example.com/x?sig=secret#f", false).unwrap_err();
        assert!(!refused.contains("secret"), "{refused}");
    }
}

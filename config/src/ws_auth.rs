//! How WebSocket upgrades are authenticated (CODEX-0169 §3): the `[websocket]` keys
//! resolved into one [`WebsocketAuth`].
//!
//! * capability token: a shared token, kept only as its SHA-256 digest, given as a token
//!   (`websocket.bearer_token`, `CODEX_EXEC_SERVER_CONNECTION_TOKEN`), a token file
//!   (`websocket.bearer_token_file`) or the digest itself (`websocket.token_sha256`);
//! * signed bearer token: an HS256 JWT checked with the secret in
//!   `websocket.shared_secret_file`, against `issuer`, `audience` and
//!   `max_clock_skew_seconds`.
//!
//! Our older bearer-token keys are the capability-token mode under another name.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::Zeroize as _;

use crate::secret::{read_secret_file, SecretString};
use crate::source::{ConfigError, ConfigSource};

/// `websocket.auth` / `--ws-auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WsAuthMode {
    CapabilityToken,
    SignedBearerToken,
}

/// Shortest HS256 secret accepted, in bytes (codex's rule).
pub const MIN_SHARED_SECRET_BYTES: usize = 32;

/// Default `websocket.max_clock_skew_seconds`.
pub const DEFAULT_MAX_CLOCK_SKEW_SECONDS: u64 = 30;

/// The HS256 secret: never printed, zeroed when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedSecret(Vec<u8>);

impl SharedSecret {
    /// The secret's bytes, for the signature check only.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for SharedSecret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for SharedSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(crate::REDACTED)
    }
}

/// The authentication every WebSocket upgrade (and `/metrics`) must pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WebsocketAuth {
    /// No authentication.
    #[default]
    None,
    /// `Authorization: Bearer <token>` whose SHA-256 is `digest`.
    CapabilityToken { digest: [u8; 32] },
    /// `Authorization: Bearer <HS256 JWT>`.
    SignedBearerToken {
        secret: SharedSecret,
        issuer: Option<String>,
        audience: Option<String>,
        max_clock_skew_seconds: u64,
    },
}

impl WebsocketAuth {
    pub fn is_none(&self) -> bool {
        matches!(self, Self::None)
    }
}

/// SHA-256 of a capability token.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A `--ws-token-sha256` / `websocket.token_sha256` value: 64 hex digits, any case,
/// surrounding whitespace ignored.
pub fn parse_token_sha256(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(digest)
}

/// The keys of `[websocket]` that decide authentication, as decoded.
pub struct AuthKeys<'a> {
    pub auth: Option<WsAuthMode>,
    /// The resolved shared token (inline, variable or file).
    pub token: Option<&'a SecretString>,
    pub token_sha256: Option<&'a str>,
    pub shared_secret_file: Option<&'a Path>,
    pub issuer: Option<&'a str>,
    pub audience: Option<&'a str>,
    pub max_clock_skew_seconds: u64,
}

/// Resolves and checks the authentication keys; errors name the key.
pub fn resolve(source: &ConfigSource, keys: AuthKeys<'_>) -> Result<WebsocketAuth, ConfigError> {
    let issuer = non_blank(keys.issuer).map(str::to_owned);
    let audience = non_blank(keys.audience).map(str::to_owned);
    let token_sha256 = non_blank(keys.token_sha256);
    let jwt_keys_set = keys.shared_secret_file.is_some()
        || issuer.is_some()
        || audience.is_some()
        || keys.max_clock_skew_seconds != DEFAULT_MAX_CLOCK_SKEW_SECONDS;
    let token_keys_set = keys.token.is_some() || token_sha256.is_some();
    if keys.max_clock_skew_seconds > i64::MAX as u64 {
        return Err(source.invalid(
            "websocket.max_clock_skew_seconds",
            format!(
                "must fit in a signed 64-bit integer, got {}",
                keys.max_clock_skew_seconds
            ),
        ));
    }
    let mode = match keys.auth {
        Some(mode) => mode,
        None if jwt_keys_set => {
            return Err(source.invalid(
                "websocket.shared_secret_file",
                "and websocket.issuer, websocket.audience and websocket.max_clock_skew_seconds require websocket.auth = \"signed-bearer-token\"",
            ))
        }
        None if token_keys_set => WsAuthMode::CapabilityToken,
        None => return Ok(WebsocketAuth::None),
    };
    match mode {
        WsAuthMode::CapabilityToken => {
            if jwt_keys_set {
                return Err(source.invalid(
                    "websocket.auth",
                    "is \"capability-token\", which takes no websocket.shared_secret_file, websocket.issuer, websocket.audience or websocket.max_clock_skew_seconds",
                ));
            }
            let digest = match (keys.token, token_sha256) {
                (Some(_), Some(_)) => {
                    return Err(source.invalid(
                        "websocket.token_sha256",
                        "cannot be combined with a bearer token (websocket.bearer_token, websocket.bearer_token_file or CODEX_EXEC_SERVER_CONNECTION_TOKEN); set only one",
                    ))
                }
                (Some(token), None) => token_digest(token.expose()),
                (None, Some(hex)) => parse_token_sha256(hex).ok_or_else(|| {
                    source.invalid(
                        "websocket.token_sha256",
                        "must be a 64-character hex SHA-256 digest",
                    )
                })?,
                (None, None) => {
                    return Err(source.invalid(
                        "websocket.auth",
                        "is \"capability-token\", which needs websocket.bearer_token_file, websocket.token_sha256, websocket.bearer_token or CODEX_EXEC_SERVER_CONNECTION_TOKEN",
                    ))
                }
            };
            Ok(WebsocketAuth::CapabilityToken { digest })
        }
        WsAuthMode::SignedBearerToken => {
            if token_keys_set {
                return Err(source.invalid(
                    "websocket.auth",
                    "is \"signed-bearer-token\", which takes no bearer token or websocket.token_sha256",
                ));
            }
            let key = "websocket.shared_secret_file";
            let Some(path) = keys.shared_secret_file else {
                return Err(source.invalid(
                    "websocket.auth",
                    "is \"signed-bearer-token\", which needs websocket.shared_secret_file",
                ));
            };
            let secret = read_shared_secret(path).map_err(|e| source.invalid(key, e))?;
            Ok(WebsocketAuth::SignedBearerToken {
                secret,
                issuer,
                audience,
                max_clock_skew_seconds: keys.max_clock_skew_seconds,
            })
        }
    }
}

/// Whitespace-only means unset, as for codex's flags.
fn non_blank(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

/// Reads an HS256 secret file: owner-only, trimmed, at least
/// [`MIN_SHARED_SECRET_BYTES`] bytes.
pub fn read_shared_secret(path: &Path) -> Result<SharedSecret, String> {
    let bytes = read_secret_file(path).map_err(|e| e.describe(path))?;
    let secret = SharedSecret(bytes.trim_ascii().to_vec());
    drop(SharedSecret(bytes));
    if secret.0.is_empty() {
        return Err(format!(
            "is refused: websocket auth secret {} must not be empty",
            path.display()
        ));
    }
    if secret.0.len() < MIN_SHARED_SECRET_BYTES {
        return Err(format!(
            "is refused: signed websocket bearer secret {} must be at least {MIN_SHARED_SECRET_BYTES} bytes",
            path.display()
        ));
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_in_any_case_and_nothing_else() {
        let digest = token_digest("tok");
        let hex: String = digest.iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(parse_token_sha256(&format!("  {hex}\n")), Some(digest));
        assert_eq!(parse_token_sha256(&hex.to_lowercase()), Some(digest));
        assert_eq!(parse_token_sha256(&hex[..62]), None);
        assert_eq!(parse_token_sha256(&format!("{}zz", &hex[..62])), None);
    }
}

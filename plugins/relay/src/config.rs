//! The `[relay]` table (RELAY §9.2) and its older `[remote]` alias, registered as
//! configuration sections so the tables are known, validated at start-up and printed by
//! `exec-server config`.

use std::path::PathBuf;

use exec_server_core::config::secret::{check_secret_file_mode, read_token_file};
use exec_server_core::config::{secret_env, ConfigError, ConfigSource, SecretString};
use exec_server_core::ConfigSection;
use exec_server_relay_core::tls::TlsTrust;
use serde::{Deserialize, Serialize};

/// Default variable holding the executor's bearer token.
pub const DEFAULT_TOKEN_ENV: &str = secret_env::RELAY_TOKEN_ENV;
/// The variable an older reference generation used.
pub const LEGACY_TOKEN_ENV: &str = secret_env::LEGACY_RELAY_TOKEN_ENV;

exec_server_core::inventory::submit! {
    ConfigSection {
        name: "relay",
        summary: "remote mode: serve harness streams through a rendezvous (relay.url + relay.environment_id)",
        decode: exec_server_core::typed_section::<RelayConfig>,
        switched_by: "the relay transport runs when `relay.url` is set and not otherwise",
    }
}

exec_server_core::inventory::submit! {
    ConfigSection {
        name: "remote",
        summary: "older name of the [relay] table (url, environment_id, name, reconnect backoff in seconds)",
        decode: exec_server_core::typed_section::<RemoteAliasConfig>,
        switched_by: "the relay transport runs when `remote.url` (or `relay.url`) is set and not otherwise",
    }
}

/// `[relay]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelayConfig {
    pub url: Option<String>,
    #[serde(alias = "executor_id")]
    pub environment_id: Option<String>,
    pub name: Option<String>,
    /// The suite the executor registers with: `noise_hybrid_ik_v1` (codex's, the default)
    /// or `noise_ik_v1`.
    pub security_profile: String,
    pub token_env: String,
    /// Read the bearer token from the first line of stdin (`--registration-bearer-stdin`).
    pub token_stdin: bool,
    pub token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub allow_insecure: bool,
    pub request_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub validate_timeout_ms: u64,
    pub reconnect_initial_backoff_ms: u64,
    pub reconnect_max_backoff_ms: u64,
    pub stable_session_ms: u64,
    pub resume_grace_ms: u64,
    pub ping_interval_ms: u64,
    pub pong_timeout_ms: u64,
    pub handshake_timeout_ms: u64,
    pub max_streams: usize,
    pub max_pending_validations: usize,
    /// Failed handshakes on one rendezvous connection after which the executor logs a
    /// warning (and again at each doubling). A failed handshake only ever resets its own
    /// stream; the older name `max_failed_handshakes` closed the connection and is still
    /// accepted, with this meaning.
    #[serde(alias = "max_failed_handshakes")]
    pub warn_failed_handshakes: usize,
    pub inbound_queue_messages: usize,
    pub inbound_queue_bytes: usize,
    /// Forward mode (`exec-server forward --connect`): each stream is copied to its own
    /// WebSocket to this `ws://` or `wss://` exec-server instead of being served here.
    pub forward_url: Option<String>,
    /// Bearer token for the forward destination's upgrade (owner-only file), for a
    /// destination that requires one (`--ws-auth capability-token`).
    pub forward_bearer_token_file: Option<PathBuf>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            url: None,
            environment_id: None,
            name: None,
            security_profile: exec_server_relay_core::noise::DEFAULT_SUITE
                .security_profile()
                .to_owned(),
            token_env: DEFAULT_TOKEN_ENV.to_owned(),
            token_stdin: false,
            token_file: None,
            ca_file: None,
            allow_insecure: false,
            request_timeout_ms: 10_000,
            connect_timeout_ms: 10_000,
            validate_timeout_ms: 10_000,
            reconnect_initial_backoff_ms: 1_000,
            reconnect_max_backoff_ms: 30_000,
            stable_session_ms: 30_000,
            resume_grace_ms: 30_000,
            ping_interval_ms: 30_000,
            pong_timeout_ms: 60_000,
            handshake_timeout_ms: 15_000,
            max_streams: 128,
            max_pending_validations: 32,
            warn_failed_handshakes: 8,
            inbound_queue_messages: 128,
            inbound_queue_bytes: 16_777_216,
            forward_url: None,
            forward_bearer_token_file: None,
        }
    }
}

/// Why there is no bearer token for remote mode (§9.1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("invalid config: relay.token_file {0}")]
    File(String),
    #[error("relay.token_file {} is empty", .0.display())]
    EmptyFile(PathBuf),
    #[error("remote mode needs a bearer token: set {0} (or relay.token_file)")]
    Missing(String),
    /// codex's own text for the same mistake (CODEX-0169 §4.8).
    #[error("expected a newline-terminated registration bearer of at most 16 KiB on stdin")]
    Stdin,
    #[error("cannot read the registration bearer from stdin: {0}")]
    StdinRead(String),
}

/// Longest bearer `--registration-bearer-stdin` reads, as codex (CODEX-0169 §4.8).
pub const MAX_STDIN_BEARER: usize = 16 * 1024;

/// Reads one newline-terminated bearer of at most [`MAX_STDIN_BEARER`] bytes from `input`.
/// Nothing past the newline is read; the buffer is wiped.
pub fn read_bearer_line(input: &mut impl std::io::BufRead) -> Result<SecretString, TokenError> {
    use std::io::{BufRead as _, Read as _};
    let mut line = zeroize::Zeroizing::new(Vec::with_capacity(256));
    input
        .take(MAX_STDIN_BEARER as u64 + 2)
        .read_until(b'\n', &mut line)
        .map_err(|e| TokenError::StdinRead(e.to_string()))?;
    if line.last() != Some(&b'\n') {
        return Err(TokenError::Stdin);
    }
    let text = std::str::from_utf8(&line).map_err(|_| TokenError::Stdin)?;
    let token = text.trim();
    if token.is_empty() || token.len() > MAX_STDIN_BEARER {
        return Err(TokenError::Stdin);
    }
    Ok(SecretString::new(token))
}

/// `[remote]`: the reference's older table, accepted as an alias of `[relay]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RemoteAliasConfig {
    pub url: Option<String>,
    pub environment_id: Option<String>,
    pub name: Option<String>,
    pub reconnect_initial_backoff_sec: Option<u64>,
    pub reconnect_max_backoff_sec: Option<u64>,
}

impl RelayConfig {
    /// Reads `[relay]`, fills keys it leaves unset from `[remote]`, and checks it.
    pub fn load(source: &ConfigSource) -> Result<Self, ConfigError> {
        let mut relay: RelayConfig = source.section("relay")?;
        let remote: RemoteAliasConfig = source.section("remote")?;
        let defaults = RelayConfig::default();
        let merge = |key: &str, relay_set: bool, remote_set: bool| -> bool {
            if relay_set && remote_set {
                tracing::warn!("relay.{key} and remote.{key} are both set; [relay] wins");
            }
            !relay_set && remote_set
        };
        if merge("url", relay.url.is_some(), remote.url.is_some()) {
            relay.url = remote.url.clone();
        }
        if merge(
            "environment_id",
            relay.environment_id.is_some(),
            remote.environment_id.is_some(),
        ) {
            relay.environment_id = remote.environment_id.clone();
        }
        if merge("name", relay.name.is_some(), remote.name.is_some()) {
            relay.name = remote.name.clone();
        }
        if let Some(secs) = remote.reconnect_initial_backoff_sec {
            if relay.reconnect_initial_backoff_ms == defaults.reconnect_initial_backoff_ms {
                relay.reconnect_initial_backoff_ms = secs * 1000;
            }
        }
        if let Some(secs) = remote.reconnect_max_backoff_sec {
            if relay.reconnect_max_backoff_ms == defaults.reconnect_max_backoff_ms {
                relay.reconnect_max_backoff_ms = secs * 1000;
            }
        }
        let positive = [
            ("relay.request_timeout_ms", relay.request_timeout_ms),
            ("relay.connect_timeout_ms", relay.connect_timeout_ms),
            ("relay.validate_timeout_ms", relay.validate_timeout_ms),
            (
                "relay.reconnect_initial_backoff_ms",
                relay.reconnect_initial_backoff_ms,
            ),
            (
                "relay.reconnect_max_backoff_ms",
                relay.reconnect_max_backoff_ms,
            ),
            ("relay.resume_grace_ms", relay.resume_grace_ms),
            ("relay.ping_interval_ms", relay.ping_interval_ms),
            ("relay.pong_timeout_ms", relay.pong_timeout_ms),
            ("relay.handshake_timeout_ms", relay.handshake_timeout_ms),
            ("relay.max_streams", relay.max_streams as u64),
            (
                "relay.max_pending_validations",
                relay.max_pending_validations as u64,
            ),
            (
                "relay.warn_failed_handshakes",
                relay.warn_failed_handshakes as u64,
            ),
            (
                "relay.inbound_queue_messages",
                relay.inbound_queue_messages as u64,
            ),
            (
                "relay.inbound_queue_bytes",
                relay.inbound_queue_bytes as u64,
            ),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(source.invalid(key, "must be greater than zero, got 0"));
            }
        }
        match (&relay.url, &relay.environment_id) {
            (Some(_), None) => {
                return Err(source.invalid(
                    "relay.url",
                    "is set without relay.environment_id (--environment-id)",
                ))
            }
            (None, Some(_)) => {
                return Err(source.invalid(
                    "relay.environment_id",
                    "is set without relay.url (--remote)",
                ))
            }
            _ => {}
        }
        if let Some(id) = &relay.environment_id {
            if let Err(problem) = exec_server_relay_core::endpoint::check_environment_id(id) {
                return Err(source.invalid("relay.environment_id", problem));
            }
        }
        if let Some(url) = &relay.url {
            exec_server_relay_core::endpoint::BaseUrl::parse(url, relay.allow_insecure)
                .map_err(|problem| source.invalid("relay.url", problem.to_string()))?;
        }
        if exec_server_relay_core::noise::suite_by_profile(&relay.security_profile).is_none() {
            return Err(source.invalid(
                "relay.security_profile",
                format!(
                    "must be one of {}, got `{}`",
                    exec_server_relay_core::noise::SUITES
                        .iter()
                        .map(|s| format!("`{}`", s.security_profile()))
                        .collect::<Vec<_>>()
                        .join(", "),
                    relay.security_profile
                ),
            ));
        }
        if relay.token_stdin && relay.token_file.is_some() {
            return Err(source.invalid(
                "relay.token_stdin",
                "and relay.token_file are mutually exclusive",
            ));
        }
        if let Some(path) = &relay.token_file {
            check_secret_file_mode(path)
                .map_err(|e| source.invalid("relay.token_file", e.describe(path)))?;
        }
        relay.check_forward(source)?;
        Ok(relay)
    }

    /// What `https` registries and `wss` rendezvous sockets trust: the system's roots, plus
    /// `ca_file`'s certificates when it is set. A file that cannot be used is a start-up
    /// error naming the key.
    pub fn tls_trust(&self) -> Result<TlsTrust, String> {
        TlsTrust::with_ca_file(self.ca_file.as_deref())
            .map_err(|e| format!("invalid config: relay.ca_file {e}"))
    }

    fn check_forward(&self, source: &ConfigSource) -> Result<(), ConfigError> {
        if let Some(url) = &self.forward_url {
            if self.url.is_none() {
                return Err(
                    source.invalid("relay.forward_url", "is set without relay.url (--remote)")
                );
            }
            crate::forward::check_destination(url)
                .map_err(|problem| source.invalid("relay.forward_url", problem))?;
        } else if self.forward_bearer_token_file.is_some() {
            return Err(source.invalid(
                "relay.forward_bearer_token_file",
                "is set without relay.forward_url (--connect)",
            ));
        }
        if let Some(path) = &self.forward_bearer_token_file {
            check_secret_file_mode(path)
                .map_err(|e| source.invalid("relay.forward_bearer_token_file", e.describe(path)))?;
        }
        Ok(())
    }

    /// Forward mode's destination, with its bearer read from its file; `None` when
    /// streams are served here.
    pub fn forward_target(
        &self,
        max_message_bytes: usize,
        trust: &TlsTrust,
    ) -> Result<Option<crate::forward::ForwardTarget>, String> {
        let Some(url) = &self.forward_url else {
            return Ok(None);
        };
        let bearer = match &self.forward_bearer_token_file {
            None => None,
            Some(path) => {
                let token = read_token_file(path).map_err(|e| {
                    format!(
                        "invalid config: relay.forward_bearer_token_file {}",
                        e.describe(path)
                    )
                })?;
                if token.is_empty() {
                    return Err(format!(
                        "relay.forward_bearer_token_file {} is empty",
                        path.display()
                    ));
                }
                Some(token)
            }
        };
        crate::forward::ForwardTarget::new(url, bearer, max_message_bytes, trust.clone())
            .map(Some)
            .map_err(str::to_owned)
    }

    /// True when remote mode is switched on.
    pub fn enabled(&self) -> bool {
        self.url.is_some() && self.environment_id.is_some()
    }

    /// The bearer token: the first line of stdin with `token_stdin` (read once, at
    /// start-up), else from `token_file` (owner-only), the variable `token_env`, then the
    /// legacy variable (§9.1). The variables were taken out of the environment at
    /// start-up ([`secret_env`]); their captured values are used.
    pub fn bearer_token(&self) -> Result<SecretString, TokenError> {
        if self.token_stdin {
            return read_bearer_line(&mut std::io::stdin().lock());
        }
        if let Some(path) = &self.token_file {
            let token = read_token_file(path).map_err(|e| TokenError::File(e.describe(path)))?;
            if token.is_empty() {
                return Err(TokenError::EmptyFile(path.clone()));
            }
            return Ok(token);
        }
        for name in [self.token_env.as_str(), LEGACY_TOKEN_ENV] {
            if let Some(token) = secret_env::secret_variable(name) {
                let token = SecretString::new(token.expose().trim());
                if !token.is_empty() {
                    return Ok(token);
                }
            }
        }
        Err(TokenError::Missing(self.token_env.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdin_bearer_is_one_bounded_newline_terminated_line() {
        let read = |bytes: &[u8]| read_bearer_line(&mut std::io::Cursor::new(bytes.to_vec()));
        assert_eq!(read(b"tok\nrest").unwrap().expose(), "tok");
        assert_eq!(read(b"  tok \r\n").unwrap().expose(), "tok");
        assert!(matches!(read(b"tok"), Err(TokenError::Stdin)));
        assert!(matches!(read(b"\n"), Err(TokenError::Stdin)));
        assert!(matches!(read(b""), Err(TokenError::Stdin)));
        let mut long = vec![b'a'; MAX_STDIN_BEARER];
        long.push(b'\n');
        assert!(read(&long).is_ok());
        let mut longer = vec![b'a'; MAX_STDIN_BEARER + 1];
        longer.push(b'\n');
        assert!(matches!(read(&longer), Err(TokenError::Stdin)));
    }
}

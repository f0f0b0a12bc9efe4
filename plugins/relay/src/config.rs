//! The `[relay]` table (RELAY §9.2) and its older `[remote]` alias, registered as
//! configuration sections so the tables are known, validated at start-up and printed by
//! `exec-server config`.

use std::path::PathBuf;

use exec_server_core::config::secret::{check_secret_file_mode, read_token_file};
use exec_server_core::config::{secret_env, ConfigError, ConfigSource, SecretString};
use exec_server_core::ConfigSection;
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
    pub token_env: String,
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
    pub max_failed_handshakes: usize,
    pub inbound_queue_messages: usize,
    pub inbound_queue_bytes: usize,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            url: None,
            environment_id: None,
            name: None,
            token_env: DEFAULT_TOKEN_ENV.to_owned(),
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
            max_failed_handshakes: 8,
            inbound_queue_messages: 128,
            inbound_queue_bytes: 16_777_216,
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
                "relay.max_failed_handshakes",
                relay.max_failed_handshakes as u64,
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
        if let Some(path) = &relay.token_file {
            check_secret_file_mode(path)
                .map_err(|e| source.invalid("relay.token_file", e.describe(path)))?;
        }
        Ok(relay)
    }

    /// True when remote mode is switched on.
    pub fn enabled(&self) -> bool {
        self.url.is_some() && self.environment_id.is_some()
    }

    /// The bearer token, from `token_file` (owner-only), the variable `token_env`, then
    /// the legacy variable (§9.1). The variables were taken out of the environment at
    /// start-up ([`secret_env`]); their captured values are used.
    pub fn bearer_token(&self) -> Result<SecretString, TokenError> {
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

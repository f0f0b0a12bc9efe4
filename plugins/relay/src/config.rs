//! The `[relay]` table (RELAY §9.2), the `[remote]` alias table and the `[rendezvous]`
//! table (§8.3, §8.9), registered as plugins without methods so the tables are known,
//! validated at start-up and printed by `exec-server config`.

use std::path::PathBuf;

use exec_server_core::config::secret::{check_secret_file_mode, read_token_file};
use exec_server_core::config::{secret_env, ConfigError, ConfigSource, SecretString, REDACTED};
use exec_server_core::{Install, InstallError, Plugin};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Default variable holding the executor's bearer token.
pub const DEFAULT_TOKEN_ENV: &str = secret_env::RELAY_TOKEN_ENV;
/// The variable an older reference generation used.
pub const LEGACY_TOKEN_ENV: &str = secret_env::LEGACY_RELAY_TOKEN_ENV;

exec_server_core::inventory::submit! {
    Plugin {
        name: "relay",
        summary: "remote mode: serve harness streams through a rendezvous (relay.url + relay.environment_id)",
        methods: &[],
        config: Some(exec_server_core::typed_section::<RelayConfig>),
        install: install_nothing,
    }
}

exec_server_core::inventory::submit! {
    Plugin {
        name: "remote",
        summary: "older name of the [relay] table (url, environment_id, name, reconnect backoff in seconds)",
        methods: &[],
        config: Some(exec_server_core::typed_section::<RemoteAliasConfig>),
        install: install_nothing,
    }
}

exec_server_core::inventory::submit! {
    Plugin {
        name: "rendezvous",
        summary: "the self-hosted registry and rendezvous service (`exec-server rendezvous`)",
        methods: &[],
        config: Some(rendezvous_section),
        install: install_nothing,
    }
}

fn install_nothing(_: &mut Install<'_>) -> Result<(), InstallError> {
    Ok(())
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
            if let Err(problem) = crate::registry::check_environment_id(id) {
                return Err(source.invalid("relay.environment_id", problem));
            }
        }
        if let Some(url) = &relay.url {
            crate::registry::BaseUrl::parse(url, relay.allow_insecure)
                .map_err(|problem| source.invalid("relay.url", problem))?;
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
    pub fn bearer_token(&self) -> Result<SecretString, String> {
        if let Some(path) = &self.token_file {
            let token = read_token_file(path)
                .map_err(|e| format!("invalid config: relay.token_file {}", e.describe(path)))?;
            if token.is_empty() {
                return Err(format!("relay.token_file {} is empty", path.display()));
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
        Err(format!(
            "remote mode needs a bearer token: set {} (or relay.token_file)",
            self.token_env
        ))
    }
}

/// Role a rendezvous token grants (§8.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenRole {
    Executor,
    Harness,
    Any,
}

/// One `[[rendezvous.tokens]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    pub name: String,
    pub sha256: String,
    pub role: TokenRole,
    #[serde(default = "all_environments")]
    pub environments: Vec<String>,
    /// This tenant's environments; unset: `rendezvous.max_environments_per_tenant`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_environments: Option<usize>,
    /// Harness sockets open to this tenant's environments; unset:
    /// `rendezvous.max_harness_sockets_per_tenant`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_harness_sockets: Option<usize>,
}

fn all_environments() -> Vec<String> {
    vec!["*".to_owned()]
}

/// `[rendezvous]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RendezvousConfig {
    pub listen: String,
    pub public_url: Option<String>,
    pub base_path: String,
    pub signing_key_file: Option<PathBuf>,
    pub allow_insecure: bool,
    pub tls_cert_file: String,
    pub tls_key_file: String,
    pub executor_url_ttl_secs: u64,
    pub harness_url_ttl_secs: u64,
    pub authorization_ttl_secs: u64,
    pub grace_secs: u64,
    pub registration_ttl_secs: u64,
    /// A registration whose executor has not attached within this is deleted.
    pub attach_timeout_secs: u64,
    pub max_environments: usize,
    /// Default limit of environments per tenant (tokens sharing a `name`).
    pub max_environments_per_tenant: usize,
    pub max_harness_sockets_per_environment: usize,
    /// Default limit of harness sockets open to one tenant's environments.
    pub max_harness_sockets_per_tenant: usize,
    pub max_parked_streams_per_environment: usize,
    /// Largest registry request body; larger ones are refused with 413.
    pub max_request_body_bytes: usize,
    pub rate_limit_per_tenant_per_sec: u32,
    pub rate_limit_per_tenant_burst: u32,
    pub rate_limit_per_ip_per_sec: u32,
    pub rate_limit_per_ip_burst: u32,
    pub tokens: Vec<TokenConfig>,
}

impl Default for RendezvousConfig {
    fn default() -> Self {
        Self {
            listen: "http://127.0.0.1:0".to_owned(),
            public_url: None,
            base_path: String::new(),
            signing_key_file: None,
            allow_insecure: false,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            executor_url_ttl_secs: 3_600,
            harness_url_ttl_secs: 60,
            authorization_ttl_secs: 60,
            grace_secs: 30,
            registration_ttl_secs: 600,
            attach_timeout_secs: 60,
            max_environments: 10_000,
            max_environments_per_tenant: 1_000,
            max_harness_sockets_per_environment: 256,
            max_harness_sockets_per_tenant: 4_096,
            max_parked_streams_per_environment: 256,
            max_request_body_bytes: 65_536,
            rate_limit_per_tenant_per_sec: 200,
            rate_limit_per_tenant_burst: 1_000,
            rate_limit_per_ip_per_sec: 100,
            rate_limit_per_ip_burst: 500,
            tokens: Vec::new(),
        }
    }
}

impl RendezvousConfig {
    pub fn load(source: &ConfigSource) -> Result<Self, ConfigError> {
        let config: RendezvousConfig = source.section("rendezvous")?;
        let positive = [
            ("rendezvous.attach_timeout_secs", config.attach_timeout_secs),
            (
                "rendezvous.max_environments_per_tenant",
                config.max_environments_per_tenant as u64,
            ),
            (
                "rendezvous.max_harness_sockets_per_tenant",
                config.max_harness_sockets_per_tenant as u64,
            ),
            (
                "rendezvous.max_request_body_bytes",
                config.max_request_body_bytes as u64,
            ),
            (
                "rendezvous.rate_limit_per_tenant_per_sec",
                u64::from(config.rate_limit_per_tenant_per_sec),
            ),
            (
                "rendezvous.rate_limit_per_tenant_burst",
                u64::from(config.rate_limit_per_tenant_burst),
            ),
            (
                "rendezvous.rate_limit_per_ip_per_sec",
                u64::from(config.rate_limit_per_ip_per_sec),
            ),
            (
                "rendezvous.rate_limit_per_ip_burst",
                u64::from(config.rate_limit_per_ip_burst),
            ),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(source.invalid(key, "must be greater than zero, got 0"));
            }
        }
        for (i, token) in config.tokens.iter().enumerate() {
            if token.sha256.len() != 64 || !token.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(source.invalid(
                    &format!("rendezvous.tokens.{i}.sha256"),
                    "must be 64 hex digits",
                ));
            }
            let limits = [
                ("max_environments", token.max_environments),
                ("max_harness_sockets", token.max_harness_sockets),
            ];
            for (field, value) in limits {
                if value == Some(0) {
                    return Err(source.invalid(
                        &format!("rendezvous.tokens.{i}.{field}"),
                        "must be greater than zero, got 0",
                    ));
                }
            }
            // Tokens with one name are one tenant with one set of limits.
            let earlier = config.tokens[..i].iter().position(|t| t.name == token.name);
            if let Some(j) = earlier {
                let first = &config.tokens[j];
                for (field, mine, theirs) in [
                    (
                        "max_environments",
                        token.max_environments,
                        first.max_environments,
                    ),
                    (
                        "max_harness_sockets",
                        token.max_harness_sockets,
                        first.max_harness_sockets,
                    ),
                ] {
                    if mine.is_some() && theirs.is_some() && mine != theirs {
                        return Err(source.invalid(
                            &format!("rendezvous.tokens.{i}.{field}"),
                            format!(
                                "differs from rendezvous.tokens.{j}.{field}; tokens named `{}` are one tenant with one limit",
                                token.name
                            ),
                        ));
                    }
                }
            }
        }
        if !config.base_path.is_empty() && !config.base_path.starts_with('/') {
            return Err(source.invalid("rendezvous.base_path", "must start with `/`"));
        }
        if let Some(path) = &config.signing_key_file {
            check_secret_file_mode(path)
                .map_err(|e| source.invalid("rendezvous.signing_key_file", e.describe(path)))?;
        }
        Ok(config)
    }
}

/// The printed `[rendezvous]` table: token digests are shown as `<redacted>`.
fn rendezvous_section(source: &ConfigSource, _table: &str) -> Result<Value, ConfigError> {
    let config = RendezvousConfig::load(source)?;
    let mut value = serde_json::to_value(&config).expect("the config serializes");
    if let Some(tokens) = value["tokens"].as_array_mut() {
        for token in tokens {
            token["sha256"] = REDACTED.into();
        }
    }
    Ok(value)
}

//! The `[rendezvous]` table (RELAY §8.3, §8.9), registered as a configuration section so
//! the table is known, validated at start-up and printed (token digests redacted) by
//! `exec-server config`.

use std::path::PathBuf;

use exec_server_core::config::secret::check_secret_file_mode;
use exec_server_core::config::{ConfigError, ConfigSource, REDACTED};
use exec_server_core::ConfigSection;
use serde::{Deserialize, Serialize};
use serde_json::Value;

exec_server_core::inventory::submit! {
    ConfigSection {
        name: "rendezvous",
        summary: "the self-hosted registry and rendezvous service (`exec-server rendezvous`)",
        decode: rendezvous_section,
        switched_by: "the rendezvous service runs only as `exec-server rendezvous`, never inside `exec-server serve`",
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

impl TokenRole {
    /// The name a configuration gives it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Executor => "executor",
            Self::Harness => "harness",
            Self::Any => "any",
        }
    }
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

/// The smallest `rendezvous.socket_queue_bytes`: one frame of the largest size a socket
/// accepts (RELAY §2.4).
pub const MIN_SOCKET_QUEUE_BYTES: usize = exec_server_relay_core::proto::MAX_WS_MESSAGE_BYTES;

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
    /// Where the registry state lives: `memory` (this process) or a Redis URL
    /// (`redis://host:port/db`, `unix:///path/redis.sock`) shared by several nodes.
    pub store: String,
    /// This node's own public URL, where harnesses reach the environments whose executor
    /// sockets it holds (with a shared store); default: `public_url`.
    pub node_url: Option<String>,
    /// How long a node's word that it holds an executor socket lasts in a shared store;
    /// a node that stops renewing it (killed, cut off) loses its environments after this.
    pub node_lease_secs: u64,
    /// Accept any bearer token, as one tenant with every role, instead of
    /// `rendezvous.tokens` (`--insecure-no-auth`): for trying remote mode on one machine.
    /// Loopback listeners only; refused together with tokens.
    pub insecure_no_auth: bool,
    /// Bytes queued towards one socket at most; frames beyond are dropped (endpoints
    /// retransmit), so a peer that does not read costs the service this much, not what
    /// its peers send.
    pub socket_queue_bytes: usize,
    /// A socket whose peer has taken nothing for this long (a write stalled on its full
    /// TCP window) is closed and its queue freed.
    pub stalled_peer_timeout_ms: u64,
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
            store: "memory".to_owned(),
            node_url: None,
            node_lease_secs: 15,
            insecure_no_auth: false,
            socket_queue_bytes: 8 * 1024 * 1024,
            stalled_peer_timeout_ms: 30_000,
        }
    }
}

/// Largest accepted lifetime or time-out in seconds (ten years).
const MAX_LIFETIME_SECS: u64 = 10 * 365 * 24 * 3600;

/// What is wrong with a token digest that is not 64 hex digits; a pasted `sha256sum` line
/// (`<digest>  -` or `<digest>  file`) is recognised and the fix named.
fn sha256_problem(text: &str) -> &'static str {
    let trimmed = text.trim();
    let first = trimmed.split_whitespace().next().unwrap_or_default();
    let digest_first = first.len() == 64 && first.bytes().all(|b| b.is_ascii_hexdigit());
    if digest_first && first.len() < trimmed.len() {
        "must be 64 hex digits; this looks like a whole `sha256sum` line: keep only the 64 hex digits before the spaces"
    } else if digest_first {
        "must be 64 hex digits, without the spaces around them"
    } else {
        "must be 64 hex digits (the SHA-256 of the token, as `printf %s TOKEN | sha256sum` prints it)"
    }
}

impl RendezvousConfig {
    pub fn load(source: &ConfigSource) -> Result<Self, ConfigError> {
        let config: RendezvousConfig = source.section("rendezvous")?;
        let positive = [
            ("rendezvous.attach_timeout_secs", config.attach_timeout_secs),
            ("rendezvous.node_lease_secs", config.node_lease_secs),
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
            (
                "rendezvous.stalled_peer_timeout_ms",
                config.stalled_peer_timeout_ms,
            ),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(source.invalid(key, "must be greater than zero, got 0"));
            }
        }
        // Lifetimes are added to the clock (`now + ttl`): a bound keeps every sum far from
        // overflowing, so no URL or authorization is born expired (or panics the service).
        let lifetimes = [
            (
                "rendezvous.executor_url_ttl_secs",
                config.executor_url_ttl_secs,
            ),
            (
                "rendezvous.harness_url_ttl_secs",
                config.harness_url_ttl_secs,
            ),
            (
                "rendezvous.authorization_ttl_secs",
                config.authorization_ttl_secs,
            ),
            ("rendezvous.grace_secs", config.grace_secs),
            (
                "rendezvous.registration_ttl_secs",
                config.registration_ttl_secs,
            ),
            ("rendezvous.attach_timeout_secs", config.attach_timeout_secs),
            ("rendezvous.node_lease_secs", config.node_lease_secs),
        ];
        for (key, value) in lifetimes {
            if value > MAX_LIFETIME_SECS {
                return Err(source.invalid(
                    key,
                    format!("must be at most {MAX_LIFETIME_SECS} (ten years), got {value}"),
                ));
            }
        }
        if config.socket_queue_bytes < MIN_SOCKET_QUEUE_BYTES {
            return Err(source.invalid(
                "rendezvous.socket_queue_bytes",
                format!(
                    "must hold at least one largest frame ({MIN_SOCKET_QUEUE_BYTES} bytes), got {}",
                    config.socket_queue_bytes
                ),
            ));
        }
        if config.insecure_no_auth && !config.tokens.is_empty() {
            return Err(source.invalid(
                "rendezvous.insecure_no_auth",
                "cannot be combined with rendezvous.tokens: with tokens, only they are accepted",
            ));
        }
        for (i, token) in config.tokens.iter().enumerate() {
            if token.sha256.len() != 64 || !token.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(source.invalid(
                    &format!("rendezvous.tokens.{i}.sha256"),
                    sha256_problem(&token.sha256),
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
        if config.store != "memory" && !crate::store_url::is_redis_url(&config.store) {
            let problem = if config.store.starts_with("rediss://") {
                "TLS to Redis is not included in this build; use redis:// (on a private network or a tunnel) or unix://".to_owned()
            } else {
                format!(
                    "must be `memory` or a Redis URL (redis://host:port/db, unix:///path), got `{}`",
                    crate::store_url::redacted_url(&config.store)
                )
            };
            return Err(source.invalid("rendezvous.store", problem));
        }
        if !config.base_path.is_empty() && !config.base_path.starts_with('/') {
            return Err(source.invalid("rendezvous.base_path", "must start with `/`"));
        }
        if let Some(path) = &config.signing_key_file {
            check_secret_file_mode(path)
                .map_err(|e| source.invalid("rendezvous.signing_key_file", e.describe(path)))?;
        }
        if !config.tls_key_file.is_empty() {
            let path = std::path::Path::new(&config.tls_key_file);
            check_secret_file_mode(path)
                .map_err(|e| source.invalid("rendezvous.tls_key_file", e.describe(path)))?;
        }
        Ok(config)
    }
}

/// The printed `[rendezvous]` table: token digests are shown as `<redacted>`.
fn rendezvous_section(source: &ConfigSource, _table: &str) -> Result<Value, ConfigError> {
    let config = RendezvousConfig::load(source)?;
    let mut value = serde_json::to_value(&config).expect("the config serializes");
    // A Redis URL may carry a password.
    value["store"] = crate::store_url::redacted_url_or_memory(&config.store).into();
    if let Some(tokens) = value["tokens"].as_array_mut() {
        for token in tokens {
            token["sha256"] = REDACTED.into();
        }
    }
    Ok(value)
}

//! The tables the server core reads, with the defaults of PROTOCOL §7.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::secret::{read_token_file, SecretString};
use crate::source::{ConfigError, ConfigSource};
use crate::ws_auth::{self, AuthKeys, WebsocketAuth, WsAuthMode, DEFAULT_MAX_CLOCK_SKEW_SECONDS};

pub use crate::variables::CONNECTION_TOKEN_ENV;

/// Names of the core tables; any other top-level table must belong to a plugin.
pub const CORE_TABLES: &[&str] = &[
    "server",
    "limits",
    "websocket",
    "listener",
    "dispatch",
    "connection",
    "session",
    "methods",
    "plugins",
];

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerTable {
    /// Listener URLs; empty means the default (`ws://127.0.0.1:0` unless remote mode is on).
    pub listen: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsTable {
    pub max_message_bytes: usize,
    pub max_json_values: usize,
}

impl Default for LimitsTable {
    fn default() -> Self {
        Self {
            max_message_bytes: 64 * 1024 * 1024,
            max_json_values: 262_144,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebsocketTable {
    pub max_frame_bytes: usize,
    pub ping_interval_ms: u64,
    /// Shared secret required on the upgrade; also read from `CODEX_EXEC_SERVER_CONNECTION_TOKEN`
    /// or from `bearer_token_file`. Prints as `<redacted>`.
    pub bearer_token: Option<SecretString>,
    /// File holding the bearer token (owner-only mode, whitespace trimmed); `--ws-token-file`.
    pub bearer_token_file: Option<PathBuf>,
    /// `capability-token` or `signed-bearer-token`; unset means capability-token when a
    /// token is configured, no authentication otherwise. `--ws-auth`.
    pub auth: Option<WsAuthMode>,
    /// SHA-256 of the capability token, 64 hex digits; `--ws-token-sha256`.
    pub token_sha256: Option<String>,
    /// HS256 secret of signed bearer tokens (owner-only, at least 32 bytes);
    /// `--ws-shared-secret-file`.
    pub shared_secret_file: Option<PathBuf>,
    /// Required `iss` of signed bearer tokens; `--ws-issuer`.
    pub issuer: Option<String>,
    /// Required `aud` of signed bearer tokens; `--ws-audience`.
    pub audience: Option<String>,
    /// Clock skew allowed for `exp` and `nbf`; `--ws-max-clock-skew-seconds`.
    pub max_clock_skew_seconds: u64,
    /// Serve a listener off loopback without authentication (refused at start otherwise);
    /// `--dangerously-listen-without-auth`.
    pub dangerously_listen_without_auth: bool,
}

impl Default for WebsocketTable {
    fn default() -> Self {
        Self {
            max_frame_bytes: 16 * 1024 * 1024,
            ping_interval_ms: 30_000,
            bearer_token: None,
            bearer_token_file: None,
            auth: None,
            token_sha256: None,
            shared_secret_file: None,
            issuer: None,
            audience: None,
            max_clock_skew_seconds: DEFAULT_MAX_CLOCK_SKEW_SECONDS,
            dangerously_listen_without_auth: false,
        }
    }
}

/// `[listener]`: what an unauthenticated peer may hold on a network listener (the WebSocket
/// transport and the rendezvous service) before it is cut off.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenerTable {
    /// Time allowed for a request's head (request line and headers), from the connection's
    /// start or the end of the previous request.
    pub header_read_timeout_ms: u64,
    /// Time a connection may stay open before it is upgraded to a WebSocket; connections
    /// that never upgrade (health probes, registry calls) are closed after it too.
    pub upgrade_timeout_ms: u64,
    /// Open connections, upgraded or not; beyond it new ones are closed at once.
    pub max_connections: usize,
    /// Connections whose request head has not arrived; at the cap the oldest one is closed.
    pub max_pending_connections: usize,
    /// Connections whose request head has not arrived, from one peer address (IPv6: one /64); at the cap the
    /// peer's oldest one is closed.
    pub max_pending_per_peer: usize,
    /// File descriptors kept free for the server's own work: a connection whose descriptor
    /// would eat into them is closed right after accept. 0 switches the reserve off.
    pub fd_reserve: usize,
}

impl Default for ListenerTable {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: 10_000,
            upgrade_timeout_ms: 30_000,
            max_connections: 4096,
            max_pending_connections: 512,
            max_pending_per_peer: 64,
            fd_reserve: 256,
        }
    }
}

impl ListenerTable {
    /// Extracts and validates `[listener]`.
    pub fn from_source(source: &ConfigSource) -> Result<Self, ConfigError> {
        let mut table: Self = source.section("listener")?;
        // A default never blocks lowering another key: an unset pending cap follows a
        // lower connection cap, an unset per-peer cap a lower pending cap.
        if !source.is_set("listener.max_pending_connections") {
            table.max_pending_connections =
                table.max_pending_connections.min(table.max_connections);
        }
        if !source.is_set("listener.max_pending_per_peer") {
            table.max_pending_per_peer = table
                .max_pending_per_peer
                .min(table.max_pending_connections);
        }
        source.require_positive(
            "listener",
            &[
                ("header_read_timeout_ms", table.header_read_timeout_ms),
                ("upgrade_timeout_ms", table.upgrade_timeout_ms),
                ("max_connections", table.max_connections as u64),
                (
                    "max_pending_connections",
                    table.max_pending_connections as u64,
                ),
                ("max_pending_per_peer", table.max_pending_per_peer as u64),
            ],
        )?;
        if table.max_pending_per_peer > table.max_pending_connections {
            return Err(source.invalid(
                "listener.max_pending_per_peer",
                format!(
                    "must not exceed listener.max_pending_connections ({}), got {}",
                    table.max_pending_connections, table.max_pending_per_peer
                ),
            ));
        }
        if table.max_pending_connections > table.max_connections {
            return Err(source.invalid(
                "listener.max_pending_connections",
                format!(
                    "must not exceed listener.max_connections ({}), got {}",
                    table.max_connections, table.max_pending_connections
                ),
            ));
        }
        Ok(table)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatchTable {
    pub max_in_flight: usize,
    pub max_waiting_reads: usize,
}

impl Default for DispatchTable {
    fn default() -> Self {
        Self {
            max_in_flight: 64,
            max_waiting_reads: 1024,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConnectionTable {
    pub outbound_queue_messages: usize,
    /// Bytes of encoded messages the outbound queue holds for one peer, including the
    /// bytes that running requests have reserved for their answers (a message larger than
    /// this is admitted alone, once the queue is empty). At most `u32::MAX`.
    pub outbound_queue_bytes: usize,
    /// A peer whose transport has accepted none of the data waiting for it for this long
    /// is disconnected and what the server held for it is freed.
    pub stalled_peer_timeout_ms: u64,
    /// After a stdio peer's end of input: how long requests already received may take to
    /// be answered and running processes to finish before the server exits.
    pub stdio_drain_ms: u64,
}

impl Default for ConnectionTable {
    fn default() -> Self {
        Self {
            outbound_queue_messages: 128,
            outbound_queue_bytes: 16 * 1024 * 1024,
            stalled_peer_timeout_ms: 30_000,
            stdio_drain_ms: 5_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionTable {
    pub detached_ttl_ms: u64,
}

impl Default for SessionTable {
    fn default() -> Self {
        Self {
            detached_ttl_ms: 30_000,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct MethodsTable {
    /// Exact method names and `family/*` patterns.
    pub disabled: Vec<String>,
}

/// `[plugins.<name>]`: the operator's switch for one plugin.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PluginSwitch {
    pub enabled: bool,
}

impl Default for PluginSwitch {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// Everything the core reads, validated.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CoreConfig {
    pub server: ServerTable,
    pub limits: LimitsTable,
    pub websocket: WebsocketTable,
    pub listener: ListenerTable,
    pub dispatch: DispatchTable,
    pub connection: ConnectionTable,
    pub session: SessionTable,
    pub methods: MethodsTable,
    pub plugins: BTreeMap<String, PluginSwitch>,
    /// How WebSocket upgrades and `/metrics` are authenticated, resolved from `[websocket]`.
    #[serde(skip)]
    pub websocket_auth: WebsocketAuth,
}

impl CoreConfig {
    /// Extracts and validates the core tables. `connection_token_env` is the value of
    /// `CODEX_EXEC_SERVER_CONNECTION_TOKEN`, captured at start-up
    /// ([`crate::secret_env::secret_variable`]; passed in so tests need not touch the
    /// process environment).
    pub fn from_source(
        source: &ConfigSource,
        connection_token_env: Option<SecretString>,
    ) -> Result<Self, ConfigError> {
        let mut config = Self {
            server: source.section("server")?,
            limits: source.section("limits")?,
            websocket: source.section("websocket")?,
            listener: ListenerTable::from_source(source)?,
            dispatch: source.section("dispatch")?,
            connection: source.section("connection")?,
            session: source.section("session")?,
            methods: source.section("methods")?,
            plugins: source.section("plugins")?,
            websocket_auth: WebsocketAuth::None,
        };
        let limits = &config.limits;
        source.require_positive(
            "limits",
            &[
                ("max_message_bytes", limits.max_message_bytes as u64),
                ("max_json_values", limits.max_json_values as u64),
            ],
        )?;
        source.require_positive(
            "websocket",
            &[
                ("max_frame_bytes", config.websocket.max_frame_bytes as u64),
                ("ping_interval_ms", config.websocket.ping_interval_ms),
            ],
        )?;
        source.require_positive(
            "dispatch",
            &[("max_in_flight", config.dispatch.max_in_flight as u64)],
        )?;
        source.require_positive(
            "connection",
            &[
                (
                    "outbound_queue_messages",
                    config.connection.outbound_queue_messages as u64,
                ),
                (
                    "outbound_queue_bytes",
                    config.connection.outbound_queue_bytes as u64,
                ),
                (
                    "stalled_peer_timeout_ms",
                    config.connection.stalled_peer_timeout_ms,
                ),
            ],
        )?;
        // The budget is counted in semaphore permits, taken at most `u32::MAX` at a time.
        if u32::try_from(config.connection.outbound_queue_bytes).is_err() {
            return Err(source.invalid(
                "connection.outbound_queue_bytes",
                format!("must be at most {}", u32::MAX),
            ));
        }
        source.require_positive(
            "session",
            &[("detached_ttl_ms", config.session.detached_ttl_ms)],
        )?;
        config.websocket.bearer_token = resolve_bearer_token(
            source,
            config.websocket.bearer_token.take(),
            config.websocket.bearer_token_file.as_deref(),
            connection_token_env,
        )?;
        let websocket = &config.websocket;
        config.websocket_auth = ws_auth::resolve(
            source,
            AuthKeys {
                auth: websocket.auth,
                token: websocket.bearer_token.as_ref(),
                token_sha256: websocket.token_sha256.as_deref(),
                shared_secret_file: websocket
                    .shared_secret_file
                    .as_deref()
                    .filter(|p| !p.as_os_str().is_empty()),
                issuer: websocket.issuer.as_deref(),
                audience: websocket.audience.as_deref(),
                max_clock_skew_seconds: websocket.max_clock_skew_seconds,
            },
        )?;
        Ok(config)
    }

    /// The effective configuration as JSON; secrets print as `<redacted>`.
    pub fn to_redacted_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("config always serializes")
    }
}

/// The one bearer token from its three mutually exclusive sources (an inline value and the
/// variable may both be set when they agree, as PROTOCOL §1.3.2 allows).
fn resolve_bearer_token(
    source: &ConfigSource,
    configured: Option<SecretString>,
    file: Option<&std::path::Path>,
    from_env: Option<SecretString>,
) -> Result<Option<SecretString>, ConfigError> {
    let configured = configured.filter(|t| !t.is_empty());
    let from_env = from_env.filter(|t| !t.is_empty());
    let file = file.filter(|path| !path.as_os_str().is_empty());
    let token = match (file, configured, from_env) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err(source.invalid(
                "websocket.bearer_token_file",
                format!(
                    "cannot be combined with websocket.bearer_token or {CONNECTION_TOKEN_ENV}; set only one"
                ),
            ))
        }
        (Some(path), None, None) => {
            let key = "websocket.bearer_token_file";
            let token = read_token_file(path).map_err(|e| source.invalid(key, e.describe(path)))?;
            if token.is_empty() {
                return Err(source.invalid(key, format!("{} is empty", path.display())));
            }
            Some(token)
        }
        (None, Some(a), Some(b)) if a != b => {
            return Err(source.invalid(
                "websocket.bearer_token",
                format!("differs from the value of {CONNECTION_TOKEN_ENV}; set only one"),
            ))
        }
        (None, Some(a), _) => Some(a),
        (None, None, b) => b,
    };
    if let Some(token) = &token {
        if !token.expose().bytes().all(|b| b.is_ascii_graphic()) {
            return Err(source.invalid(
                "websocket.bearer_token",
                "must consist of visible ASCII characters",
            ));
        }
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_protocol() {
        let c = CoreConfig::from_source(&ConfigSource::from_toml_str(""), None).unwrap();
        assert_eq!(c.limits.max_message_bytes, 67_108_864);
        assert_eq!(c.limits.max_json_values, 262_144);
        assert_eq!(c.websocket.max_frame_bytes, 16_777_216);
        assert_eq!(c.websocket.ping_interval_ms, 30_000);
        assert_eq!(c.dispatch.max_in_flight, 64);
        assert_eq!(c.dispatch.max_waiting_reads, 1024);
        assert_eq!(c.connection.outbound_queue_messages, 128);
        assert_eq!(c.connection.outbound_queue_bytes, 16 * 1024 * 1024);
        assert_eq!(c.connection.stalled_peer_timeout_ms, 30_000);
        assert_eq!(c.session.detached_ttl_ms, 30_000);
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = CoreConfig::from_source(
            &ConfigSource::from_toml_str("[methods]\ndisable = [\"fs/*\"]\n"),
            None,
        )
        .unwrap_err();
        assert!(
            err.0
                .starts_with("invalid config: unknown key methods.disable"),
            "{err}"
        );
    }

    #[test]
    fn type_errors_name_the_key() {
        let err = CoreConfig::from_source(
            &ConfigSource::from_toml_str("[session]\ndetached_ttl_ms = \"soon\"\n"),
            None,
        )
        .unwrap_err();
        assert!(
            err.0
                .starts_with("invalid config: session.detached_ttl_ms: "),
            "{err}"
        );
    }

    #[test]
    fn zero_limits_are_refused() {
        let err = CoreConfig::from_source(
            &ConfigSource::from_toml_str("[dispatch]\nmax_in_flight = 0\n"),
            None,
        )
        .unwrap_err();
        assert!(
            err.0
                .starts_with("invalid config: dispatch.max_in_flight must be greater than zero"),
            "{err}"
        );
    }

    fn token(config: &CoreConfig) -> Option<&str> {
        config
            .websocket
            .bearer_token
            .as_ref()
            .map(SecretString::expose)
    }

    #[test]
    fn bearer_token_sources_must_agree() {
        let source = ConfigSource::from_toml_str("[websocket]\nbearer_token = \"a\"\n");
        assert!(CoreConfig::from_source(&source, Some(SecretString::new("b"))).is_err());
        let c = CoreConfig::from_source(&source, Some(SecretString::new("a"))).unwrap();
        assert_eq!(token(&c), Some("a"));
        assert_eq!(
            c.to_redacted_json()["websocket"]["bearer_token"],
            crate::REDACTED
        );
        let env_only = CoreConfig::from_source(
            &ConfigSource::from_toml_str(""),
            Some(SecretString::new("t")),
        );
        assert_eq!(token(&env_only.unwrap()), Some("t"));
        let bad = ConfigSource::from_toml_str("[websocket]\nbearer_token = \"a b\"\n");
        assert!(CoreConfig::from_source(&bad, None).is_err());
        let number = ConfigSource::from_toml_str("[websocket]\nbearer_token = 987654321\n");
        let error = CoreConfig::from_source(&number, None).unwrap_err();
        assert!(
            error
                .0
                .starts_with("invalid config: websocket.bearer_token: must be a string"),
            "{error}"
        );
        assert!(!error.0.contains("987654321"), "{error}");
    }

    #[test]
    fn the_bearer_token_file_is_exclusive_and_mode_checked() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "file-token\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let toml = format!(
            "[websocket]\nbearer_token_file = {:?}\n",
            path.to_str().unwrap()
        );
        let source = ConfigSource::from_toml_str(&toml);
        let config = CoreConfig::from_source(&source, None).unwrap();
        assert_eq!(token(&config), Some("file-token"));

        let error = CoreConfig::from_source(&source, Some(SecretString::new("env"))).unwrap_err();
        assert!(
            error
                .0
                .starts_with("invalid config: websocket.bearer_token_file cannot be combined with"),
            "{error}"
        );
        let both = ConfigSource::from_toml_str(&format!("{toml}bearer_token = \"x\"\n"));
        assert!(CoreConfig::from_source(&both, None).is_err());

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = CoreConfig::from_source(&source, None).unwrap_err();
        let shown = path.display();
        assert!(
            error.0.starts_with(&format!(
                "invalid config: websocket.bearer_token_file {shown} is readable or writable by group or others (mode 0644); fix it with `chmod 600 {shown}`"
            )),
            "{error}"
        );
        assert!(!error.0.contains("file-token"), "{error}");

        std::fs::write(&path, " \n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let error = CoreConfig::from_source(&source, None).unwrap_err();
        assert!(error.0.contains("is empty"), "{error}");
    }

    #[test]
    fn listener_limits_are_positive_and_nested() {
        let c = CoreConfig::from_source(&ConfigSource::from_toml_str(""), None).unwrap();
        assert_eq!(c.listener, ListenerTable::default());
        for (toml, key) in [
            (
                "header_read_timeout_ms = 0",
                "listener.header_read_timeout_ms",
            ),
            ("upgrade_timeout_ms = 0", "listener.upgrade_timeout_ms"),
            (
                "max_pending_per_peer = 600",
                "listener.max_pending_per_peer",
            ),
            (
                "max_pending_connections = 5000",
                "listener.max_pending_connections",
            ),
        ] {
            let source = ConfigSource::from_toml_str(&format!("[listener]\n{toml}\n"));
            let error = CoreConfig::from_source(&source, None).unwrap_err();
            assert!(
                error.0.starts_with(&format!("invalid config: {key} ")),
                "{toml}: {error}"
            );
        }
        let off = ConfigSource::from_toml_str("[listener]\nfd_reserve = 0\n");
        assert_eq!(
            CoreConfig::from_source(&off, None)
                .unwrap()
                .listener
                .fd_reserve,
            0
        );
    }
}

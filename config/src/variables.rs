//! The environment variables exec-server reads: the scheme that maps a configuration key to
//! its `EXEC_SERVER_<TABLE>__<KEY>` variable, and the fixed names of secret variables. A
//! leaf: the loader (`source`) and the secret capture (`secret_env`) both build on it.

/// Prefix of configuration environment variables.
pub const ENV_PREFIX: &str = "EXEC_SERVER_";
/// Separator between levels in configuration environment variables.
pub const ENV_SEPARATOR: &str = "__";

/// Environment variable that can carry the WebSocket bearer token (PROTOCOL §1.3.2).
pub const CONNECTION_TOKEN_ENV: &str = "CODEX_EXEC_SERVER_CONNECTION_TOKEN";
/// The executor's relay bearer token (RELAY.md §9.1), unless `relay.token_env` names another.
pub const RELAY_TOKEN_ENV: &str = "EXEC_SERVER_RELAY_TOKEN";
/// The relay bearer token under the name an older reference generation used.
pub const LEGACY_RELAY_TOKEN_ENV: &str = "CODEX_EXEC_SERVER_REMOTE_BEARER_TOKEN";
/// The rendezvous signing key, base64 (RELAY.md §8.4).
pub const RENDEZVOUS_SIGNING_KEY_ENV: &str = "EXEC_SERVER_RENDEZVOUS_SIGNING_KEY";

/// The environment variable that sets configuration key `key` (`websocket.bearer_token` →
/// `EXEC_SERVER_WEBSOCKET__BEARER_TOKEN`).
pub fn config_variable(key: &str) -> String {
    let levels: Vec<String> = key.split('.').map(str::to_ascii_uppercase).collect();
    format!("{ENV_PREFIX}{}", levels.join(ENV_SEPARATOR))
}

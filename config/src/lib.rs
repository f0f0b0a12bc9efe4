//! exec-server configuration (PROTOCOL §7).
//!
//! Two phases, as in ripgrep: [`ConfigSource::load`] gathers the layers without side
//! effects — defaults < the `--config` TOML file < `EXEC_SERVER_<TABLE>__<KEY>` environment
//! variables < command-line flags — and the typed views ([`CoreConfig`] here, each plugin's
//! own section through [`ConfigSource::section`]) are derived from it. Every error is one
//! line that starts with `invalid config: `, names the key and ends with where the value
//! came from.
//!
//! * [`core`] — the tables the server core reads (`server`, `limits`, `websocket`, …).
//! * [`source`] — layering, provenance and error formatting.
//! * [`secret`] — the redacting [`SecretString`] and the mode-checked token file reader.
//! * [`secret_env`] — secrets taken from the environment once, then erased from it.
//! * [`ws_auth`] — how WebSocket upgrades are authenticated (capability token, HS256 JWT).
//! * [`suggest`] — the nearest known key for an unknown one ("did you mean").
//! * [`variables`] — the environment variables read: the configuration variable scheme and
//!   the fixed names of secret variables.

pub mod core;
pub mod secret;
pub mod secret_env;
pub mod source;
pub mod suggest;
pub mod variables;
pub mod ws_auth;

pub use crate::core::{CoreConfig, ListenerTable, PluginSwitch};
pub use crate::secret::SecretString;
pub use crate::source::{CliOverrides, ConfigError, ConfigSource, REDACTED};
pub use crate::ws_auth::{WebsocketAuth, WsAuthMode};

//! The `http/*` plugin: `http/request`, an HTTP request the executor makes for its client
//! (CODEX-NETWORK.md §2), answered whole or streamed as `http/request/bodyDelta`
//! notifications. codex clients use it for the HTTP MCP servers that belong to the
//! executor, with `valueEnvVar` headers whose secrets stay on the executor
//! (`httpHeaderEnvVars`).
//!
//! * `wire` — method names, params, results, the delta notification, error texts.
//! * `config` — the `[http]` table: reachable targets, trust, limits.
//! * `state` — the settings and the shared HTTP client.
//! * `targets` — the operator's limits on schemes, hosts and address ranges.
//! * `headers` — request headers (with `valueEnvVar`), response headers.
//! * `redirect` — the next request after a 3xx.
//! * `exchange` — sending, hop by hop.
//! * `body` — buffered bodies and the delta stream.
//! * `streams` — the streamed responses running on a connection.
//! * `request` — the `http/request` handler.

mod audit;
mod body;
mod config;
mod exchange;
mod headers;
mod redirect;
mod request;
mod state;
mod streams;
mod targets;
mod wire;

use std::path::PathBuf;
use std::sync::Arc;

use exec_server_core::proto::environment::capability;
use exec_server_core::{checked_section, Install, InstallError, MethodDecl, Plugin};
use serde::Deserialize;

use crate::state::HttpState;

pub use config::HttpConfig;
pub use wire::{BODY_DELTA, FAMILY_LABEL, REQUEST};

exec_server_core::inventory::submit! {
    Plugin {
        name: "http",
        summary: "HTTP requests made by the executor for its client (http/request, streamed as http/request/bodyDelta)",
        methods: &[MethodDecl { name: REQUEST, family: FAMILY_LABEL }],
        config: Some(checked_section::<HttpConfig>),
        install,
    }
}

/// The one `[relay]` key this plugin reads: the CA file its `https` trust defaults to.
#[derive(Debug, Default, Deserialize)]
struct RelayTrust {
    #[serde(default)]
    ca_file: Option<PathBuf>,
}

fn install(install: &mut Install<'_>) -> Result<(), InstallError> {
    let config: HttpConfig = install.checked_config()?;
    let relay: RelayTrust = install.config_source().section("relay").unwrap_or_default();
    let ca_file = match (config.ca_file.clone(), relay.ca_file) {
        (Some(own), _) => Some((own, "http.ca_file")),
        (None, Some(relay)) => Some((relay, "relay.ca_file")),
        (None, None) => None,
    };
    let state = Arc::new(HttpState::new(config, ca_file).map_err(InstallError)?);
    install.method_with(REQUEST, &state, request::handle);
    install.capability(capability::HTTP_HEADER_ENV_VARS, &[REQUEST]);
    audit::declare(install);
    Ok(())
}

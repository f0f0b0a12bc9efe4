//! `environmentConfig/read` (CODEX-0169 §2.5): selected keys of the executor's own codex
//! configuration layers, so a harness can merge executor-local settings (`mcp_servers`)
//! without reading whole files.
//!
//! * `layers` — which files form the config and requirements stacks, in precedence order,
//!   and reading them within the size limit.
//! * `select` — keeping only the requested key paths of one parsed layer.
//! * `wire` — params, result and the error texts.

mod layers;
mod select;
mod wire;

use std::path::PathBuf;
use std::sync::Arc;

use exec_server_core::proto::path::{parse_path, to_file_uri};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;

pub use layers::{codex_home, CodexLayout, DEFAULT_SYSTEM_DIR};
pub use wire::{ConfigReadParams, ConfigReadResult, Layer, LayerStack};

/// The method name.
pub const METHOD: &str = "environmentConfig/read";

/// What a read needs from `[environment]`.
#[derive(Debug, Clone)]
pub struct ReadSettings {
    /// Where the system layers are (`environment.codex_system_dir`).
    pub system_dir: PathBuf,
    /// Largest layer file read.
    pub max_file_bytes: u64,
}

/// Answers one `environmentConfig/read`.
pub async fn handle(
    settings: Arc<ReadSettings>,
    _cx: Call,
    params: ConfigReadParams,
) -> Result<ConfigReadResult, RpcError> {
    let cwd = parse_path(&params.cwd).map_err(|e| e.into_rpc(&params.cwd))?;
    wire::check_paths(&params)?;
    let layout = CodexLayout::from_environment(&settings.system_dir)?;
    tokio::task::spawn_blocking(move || read(&layout, &settings, cwd, &params))
        .await
        .map_err(|e| RpcError::internal(format!("environmentConfig/read failed: {e}")))?
}

/// Reads and selects every layer; runs on a blocking thread.
pub fn read(
    layout: &CodexLayout,
    limits: &ReadSettings,
    cwd: PathBuf,
    params: &ConfigReadParams,
) -> Result<ConfigReadResult, RpcError> {
    let config = layers::config_layers(layout, &cwd, limits)?;
    let requirements = layers::requirements_layers(layout, limits)?;
    Ok(ConfigReadResult {
        user_home_dir: layout.user_home.as_deref().map(to_file_uri),
        codex_home_dir: to_file_uri(&layout.codex_home),
        hostname: crate::host::hostname(),
        config: select::stack(config, &params.config_paths),
        requirements: select::stack(requirements, &params.requirements_paths),
    })
}

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
use exec_server_core::{Call, SlottedThreads};

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
    /// Layer files one read loads in all.
    pub max_total_bytes: u64,
}

/// The method's state: its settings and the threads its reads run on.
#[derive(Debug)]
pub struct Reads {
    pub settings: ReadSettings,
    threads: SlottedThreads,
}

/// Reads of all sessions at once, and of one session.
const THREADS_TOTAL: usize = 2;
const THREADS_PER_SESSION: usize = 1;

impl Reads {
    pub fn new(settings: ReadSettings) -> Self {
        Self {
            settings,
            threads: SlottedThreads::new("environment-config", THREADS_TOTAL, THREADS_PER_SESSION),
        }
    }
}

/// Answers one `environmentConfig/read`: the layers are read in the session's share of
/// the method's threads, and the answer waits for its room in the connection's outbound
/// budget (its size is known only once the layers are read; each is at most
/// `environment.config_max_file_bytes`).
pub async fn handle(
    reads: Arc<Reads>,
    cx: Call,
    params: ConfigReadParams,
) -> Result<ConfigReadResult, RpcError> {
    let cwd = parse_path(&params.cwd).map_err(|e| e.into_rpc(&params.cwd))?;
    wire::check_paths(&params)?;
    let layout = CodexLayout::from_environment(&reads.settings.system_dir)?;
    let worker = Arc::clone(&reads);
    let session = cx.session().id().to_owned();
    let result = reads
        .threads
        .run(&session, move || {
            let result = read(&layout, &worker.settings, cwd, &params)?;
            let size = serde_json::to_vec(&result).map_or(0, |json| json.len());
            Ok((result, size))
        })
        .await
        .unwrap_or_else(|| Err(RpcError::internal("environmentConfig/read failed")));
    let (result, size) = result?;
    if !cx.reserve_response_bytes(size).await {
        return Err(RpcError::internal("the connection closed"));
    }
    Ok(result)
}

/// Reads and selects every layer; runs on a blocking thread.
pub fn read(
    layout: &CodexLayout,
    limits: &ReadSettings,
    cwd: PathBuf,
    params: &ConfigReadParams,
) -> Result<ConfigReadResult, RpcError> {
    let budget = layers::LayerBudget::new(limits);
    let config = layers::config_layers(layout, &cwd, &budget)?;
    let requirements = layers::requirements_layers(layout, &budget)?;
    Ok(ConfigReadResult {
        user_home_dir: layout.user_home.as_deref().map(to_file_uri),
        codex_home_dir: to_file_uri(&layout.codex_home),
        hostname: crate::host::hostname(),
        config: select::stack(config, &params.config_paths),
        requirements: select::stack(requirements, &params.requirements_paths),
    })
}

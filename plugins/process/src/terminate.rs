//! `process/terminate` (PROTOCOL §4.10).

use std::sync::Arc;

use exec_server_core::proto::process::{TerminateParams, TerminateResult};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;

use crate::table::Lookup;
use crate::ProcessPlugin;

pub(crate) async fn terminate(
    plugin: Arc<ProcessPlugin>,
    cx: Call,
    params: TerminateParams,
) -> Result<TerminateResult, RpcError> {
    let table = crate::table(&plugin, &cx);
    let running = match table.lookup(&params.process_id) {
        Lookup::Unknown => false,
        // The pending process/start then fails with "start was cancelled". If the start
        // completed in between, the next lookup sees it started.
        Lookup::Starting if table.cancel_start(&params.process_id) => true,
        Lookup::Starting => match table.lookup(&params.process_id) {
            Lookup::Started(process) => kill(&process),
            _ => false,
        },
        Lookup::Started(process) => kill(&process),
    };
    Ok(TerminateResult { running })
}

/// Kills the process and every descendant (even after the close: a daemon may have closed
/// its output and still run); returns whether the process itself was running.
fn kill(process: &crate::managed::ManagedProcess) -> bool {
    let running = process.exit_code().is_none();
    process.kill_tree();
    running
}

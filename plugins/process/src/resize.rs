//! `process/resize` (PROTOCOL §4.9).

use std::sync::Arc;

use exec_server_core::proto::bytes::Empty;
use exec_server_core::proto::error::io_error_text;
use exec_server_core::proto::process::{ResizeParams, TerminalSize};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;

use crate::table::Lookup;
use crate::ProcessPlugin;

pub(crate) async fn resize(
    plugin: Arc<ProcessPlugin>,
    cx: Call,
    params: ResizeParams,
) -> Result<Empty, RpcError> {
    if params.rows == 0 || params.cols == 0 {
        return Err(RpcError::zero_resize());
    }
    let process = match crate::table(&plugin, &cx).lookup(&params.process_id) {
        Lookup::Unknown => return Err(RpcError::unknown_process(&params.process_id)),
        Lookup::Starting => return Err(RpcError::process_starting(&params.process_id)),
        Lookup::Started(process) => process,
    };
    if !process.has_terminal() {
        return Err(RpcError::no_tty(&params.process_id));
    }
    if process.exit_code().is_some() {
        return Ok(Empty {});
    }
    let size = TerminalSize {
        rows: params.rows,
        cols: params.cols,
    };
    process
        .resize(size)
        .map(|()| Empty {})
        .map_err(|e| RpcError::resize_failed(io_error_text(&e)))
}

//! `process/write` (PROTOCOL §4.7).

use std::sync::Arc;

use exec_server_core::proto::bytes::decode_base64;
use exec_server_core::proto::process::{WriteParams, WriteResult, WriteStatus};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;

use crate::managed::StdinMode;
use crate::table::Lookup;
use crate::ProcessPlugin;

pub(crate) async fn write(
    _plugin: Arc<ProcessPlugin>,
    cx: Call,
    params: WriteParams,
) -> Result<WriteResult, RpcError> {
    if params.write_id.as_deref() == Some("") {
        return Err(RpcError::empty_write_id());
    }
    let data = decode_base64(&params.chunk).map_err(|e| RpcError::invalid_params(e.to_string()))?;
    let process = match crate::table(&cx).lookup(&params.process_id) {
        Lookup::Unknown => return Ok(WriteStatus::UnknownProcess.into()),
        Lookup::Starting => return Ok(WriteStatus::Starting.into()),
        Lookup::Started(process) => process,
    };
    if process.stdin_mode == StdinMode::Closed {
        return Ok(WriteStatus::StdinClosed.into());
    }
    process.write(&data, params.write_id.as_deref()).await?;
    Ok(WriteStatus::Accepted.into())
}

//! `process/write` (PROTOCOL §4.7). The bytes of a write count against the session's
//! pending-write quota until every one of them is handed to the OS: a child that never
//! reads its stdin cannot make the server hold unbounded data for it.

use std::sync::Arc;

use exec_server_core::proto::bytes::decode_base64;
use exec_server_core::proto::process::{WriteParams, WriteResult, WriteStatus};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;

use crate::admission::PENDING_WRITE_BYTES;
use crate::managed::StdinMode;
use crate::table::Lookup;
use crate::ProcessPlugin;

pub(crate) async fn write(
    plugin: Arc<ProcessPlugin>,
    cx: Call,
    params: WriteParams,
) -> Result<WriteResult, RpcError> {
    let WriteParams {
        process_id,
        chunk,
        write_id,
    } = params;
    if write_id.as_deref() == Some("") {
        return Err(RpcError::empty_write_id());
    }
    let data = decode_base64(&chunk).map_err(|e| RpcError::invalid_params(e.to_string()))?;
    // Only the decoded bytes are held while the write waits.
    drop(chunk);
    let process = match crate::table(&plugin, &cx).lookup(&process_id) {
        Lookup::Unknown => return Ok(WriteStatus::UnknownProcess.into()),
        Lookup::Starting => return Ok(WriteStatus::Starting.into()),
        Lookup::Started(process) => process,
    };
    if process.stdin_mode == StdinMode::Closed {
        return Ok(WriteStatus::StdinClosed.into());
    }
    let _pending = PENDING_WRITE_BYTES.acquire(
        cx.session(),
        plugin.config.max_pending_write_bytes_per_session,
        data.len(),
    )?;
    process.write(&data, write_id.as_deref()).await?;
    Ok(WriteStatus::Accepted.into())
}

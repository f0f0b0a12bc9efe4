//! `process/write` (PROTOCOL §4.7) and the `process/closeStdin` extension. The bytes of a write count against the session's
//! pending-write quota until every one of them is handed to the OS: a child that never
//! reads its stdin cannot make the server hold unbounded data for it.

use std::sync::Arc;

use exec_server_core::proto::bytes::decode_base64;
use exec_server_core::proto::process::{
    CloseStdinParams, CloseStdinResult, WriteParams, WriteResult, WriteStatus,
};
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
    if !process.write(&data, write_id.as_deref()).await? {
        return Ok(WriteStatus::StdinClosed.into());
    }
    Ok(WriteStatus::Accepted.into())
}

/// [ext] `process/closeStdin`: the child reads end of input once every earlier write is
/// in.
pub(crate) async fn close_stdin(
    plugin: Arc<ProcessPlugin>,
    cx: Call,
    params: CloseStdinParams,
) -> Result<CloseStdinResult, RpcError> {
    let process = match crate::table(&plugin, &cx).lookup(&params.process_id) {
        Lookup::Unknown => return Ok(status(WriteStatus::UnknownProcess)),
        Lookup::Starting => return Ok(status(WriteStatus::Starting)),
        Lookup::Started(process) => process,
    };
    if process.stdin_mode == StdinMode::Closed || !process.close_stdin().await? {
        return Ok(status(WriteStatus::StdinClosed));
    }
    Ok(status(WriteStatus::Accepted))
}

fn status(status: WriteStatus) -> CloseStdinResult {
    CloseStdinResult { status }
}

//! `process/read` (PROTOCOL §4.5): retained output and exit/close state, optionally
//! long-polling for news without holding a `dispatch.max_in_flight` slot.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use exec_server_core::proto::bytes::base64_json;
use exec_server_core::proto::process::{ReadChunk, ReadParams, ReadResult};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use serde::{Serialize, Serializer};
use tokio::time::Instant;

use crate::retention::Snapshot;
use crate::table::Lookup;
use crate::ProcessPlugin;

/// Chunk bytes in a result, shared with the retention buffer until the response is
/// serialized (see `exec_server_core::proto::bytes::base64_json`).
#[derive(Debug, Clone)]
pub struct WireBytes(pub Bytes);

impl Serialize for WireBytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        base64_json(&self.0).serialize(s)
    }
}

pub(crate) async fn read(
    plugin: Arc<ProcessPlugin>,
    mut cx: Call,
    params: ReadParams,
) -> Result<ReadResult<WireBytes>, RpcError> {
    let process = match crate::table(&plugin, &cx).lookup(&params.process_id) {
        Lookup::Unknown => return Err(RpcError::unknown_process(&params.process_id)),
        Lookup::Starting => return Err(RpcError::process_starting(&params.process_id)),
        Lookup::Started(process) => process,
    };
    let after_seq = params.after_seq.unwrap_or(0);
    let wait_ms = params.wait_ms.unwrap_or(0).min(plugin.config.max_wait_ms);
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let mut changes = process.subscribe();
    let mut parked = None;
    loop {
        changes.borrow_and_update();
        let snapshot = process.snapshot(after_seq, params.max_bytes);
        if snapshot.has_news(after_seq) || Instant::now() >= deadline {
            return Ok(into_result(snapshot));
        }
        if parked.is_none() {
            // Waiting reads do not count against dispatch.max_in_flight; when too many
            // already wait, answer now as if waitMs were 0 (§2.9).
            match cx.park() {
                Some(permit) => parked = Some(permit),
                None => return Ok(into_result(snapshot)),
            }
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    tokio::time::sleep_until(deadline).await;
                }
            }
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

fn into_result(snapshot: Snapshot) -> ReadResult<WireBytes> {
    ReadResult {
        chunks: snapshot
            .chunks
            .into_iter()
            .map(|c| ReadChunk {
                seq: c.seq,
                stream: c.stream,
                chunk: WireBytes(c.data),
            })
            .collect(),
        next_seq: snapshot.next_seq,
        exited: snapshot.exit_code.is_some(),
        exit_code: snapshot.exit_code,
        closed: snapshot.closed,
        failure: None,
        sandbox_denied: snapshot.sandbox_denied,
    }
}

//! Room for large answers, reserved before they are made (SECURITY.md, "bytes held for a
//! peer"): a request whose answer is large first waits for that many bytes of its
//! connection's outbound budget ([`Call::reserve_response_bytes`]), then does the work. A
//! peer that stops reading its answers so makes its later requests wait holding nothing,
//! instead of each holding a whole encoded answer.

use std::path::PathBuf;
use std::sync::Arc;

use exec_server_core::proto::fs::{ReadBlockParams, ReadBlockResult, READ_FILE};
use exec_server_core::proto::RpcError;
use exec_server_core::{AnswerRoom, Call};

use crate::blocking::{Deadline, PEER_WAIT_IN_SLOT};
use crate::payload::Base64Bytes;
use crate::routing::FsState;

/// The length of the base64 of `bytes` bytes, padded.
pub(crate) fn base64_len(bytes: u64) -> usize {
    usize::try_from(bytes.div_ceil(3).saturating_mul(4)).unwrap_or(usize::MAX)
}

/// `fs/readBlock`: the block's base64 is reserved from the requested length before it is
/// read (the length is checked against `fs.max_read_block_bytes` first, so nothing larger
/// is reserved).
pub(crate) async fn handle_read_block(
    config: Arc<FsState>,
    cx: Call,
    params: ReadBlockParams,
) -> Result<ReadBlockResult<Base64Bytes>, RpcError> {
    if params.len > 0 && params.len <= config.max_read_block_bytes {
        cx.reserve_response_bytes(base64_len(params.len as u64))
            .await;
    }
    crate::handles::handle_read_block(config, cx, params).await
}

/// `fs/readFile`: the file's size, read on a worker thread, gives the answer's size, which
/// is reserved before the file is read. Only an estimate: the file may change before it is
/// read, and procfs and sysfs report 0 for files with content, so the reader grows the
/// reservation before it encodes more than it covers ([`FileAnswerRoom::cover`]). A path
/// that cannot be looked at reserves nothing; the read itself reports why.
pub(crate) async fn reserve_for_file(
    config: &FsState,
    cx: &Call,
    path: Result<PathBuf, RpcError>,
    follow_symlinks: bool,
) -> FileAnswerRoom {
    let mut room = FileAnswerRoom {
        room: cx.answer_room(),
        runtime: tokio::runtime::Handle::current(),
        covered: 0,
    };
    let Ok(path) = path else { return room };
    let limit = config.max_read_file_bytes;
    let size = config
        .pool
        .run(cx.session(), READ_FILE, move |_| {
            Ok(regular_file_size(&path, follow_symlinks))
        })
        .await;
    if let Ok(Some(size)) = size {
        let size = size.min(limit);
        if cx.reserve_response_bytes(base64_len(size)).await {
            room.covered = size;
        }
    }
    room
}

/// Bytes of file a [`FileAnswerRoom`] covers at a time beyond its first reservation.
const COVER_STEP_BYTES: u64 = 1 << 20;

/// The room reserved for an `fs/readFile` answer that a worker thread makes: every byte
/// of file it encodes is covered by room reserved first, so a file whose size said
/// nothing or that grew cannot make answers nobody reserved room for (64 pipelined reads
/// of a 5 MB procfs file held 540 MiB for a peer that did not read them).
#[derive(Debug)]
pub(crate) struct FileAnswerRoom {
    room: AnswerRoom,
    runtime: tokio::runtime::Handle,
    /// Bytes of file the reservation covers.
    covered: u64,
}

impl FileAnswerRoom {
    /// Makes sure the first `total` bytes of file (at most `limit`) are covered, reserving
    /// at least [`COVER_STEP_BYTES`] more when they are not. Blocks the worker thread it
    /// runs on while the peer makes no room, no longer than a wait for a peer in a slot
    /// may last ([`Deadline::for_peer_in_slot`]).
    pub(crate) fn cover(
        &mut self,
        total: u64,
        limit: u64,
        deadline: &Deadline,
    ) -> Result<(), RpcError> {
        if total <= self.covered {
            return Ok(());
        }
        let target = total
            .max(self.covered.saturating_add(COVER_STEP_BYTES))
            .min(limit.max(total));
        let more = base64_len(target) - base64_len(self.covered);
        let wait = deadline.for_peer_in_slot();
        let stalled = || {
            if wait.instant() == deadline.instant() {
                // The operation's own deadline came first.
                deadline.missed()
            } else {
                let ms = u64::try_from(PEER_WAIT_IN_SLOT.as_millis()).unwrap_or(u64::MAX);
                RpcError::answer_room_stalled(READ_FILE, ms)
            }
        };
        let left = wait.remaining().ok_or_else(stalled)?;
        let room = &self.room;
        // The timer is made inside the runtime, where `block_on` polls it.
        let reserve = async { tokio::time::timeout(left, room.reserve_more(more)).await };
        match self.runtime.block_on(reserve) {
            Ok(true) => {
                self.covered = target;
                Ok(())
            }
            // The peer took nothing in time, or the connection is gone.
            Ok(false) | Err(_) => Err(stalled()),
        }
    }
}

/// The size of the regular file at `path`; `None` for anything else. Only a stat: nothing
/// is opened (a FIFO would block) and nothing it tells reaches the client.
fn regular_file_size(path: &std::path::Path, follow_symlinks: bool) -> Option<u64> {
    let metadata = if follow_symlinks {
        std::fs::metadata(path)
    } else {
        std::fs::symlink_metadata(path)
    };
    metadata.ok().filter(|m| m.is_file()).map(|m| m.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_lengths_are_padded_quads() {
        assert_eq!(base64_len(0), 0);
        assert_eq!(base64_len(1), 4);
        assert_eq!(base64_len(3), 4);
        assert_eq!(base64_len(4), 8);
        assert_eq!(base64_len(2 * 1024 * 1024), 2_796_204);
    }
}

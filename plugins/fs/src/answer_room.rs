//! Room for large answers, reserved before they are made (SECURITY.md, "bytes held for a
//! peer"): a request whose answer is large first waits for that many bytes of its
//! connection's outbound budget ([`Call::reserve_response_bytes`]), then does the work. A
//! peer that stops reading its answers so makes its later requests wait holding nothing,
//! instead of each holding a whole encoded answer.

use std::path::PathBuf;
use std::sync::Arc;

use exec_server_core::proto::fs::{ReadBlockParams, ReadBlockResult, READ_FILE};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;

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
/// read, and the answer then waits for the difference when it is queued. A path that
/// cannot be looked at reserves nothing; the read itself reports why.
pub(crate) async fn reserve_for_file(
    config: &FsState,
    cx: &Call,
    path: Result<PathBuf, RpcError>,
    follow_symlinks: bool,
) {
    let Ok(path) = path else { return };
    let limit = config.max_read_file_bytes;
    let size = config
        .pool
        .run(cx.session(), READ_FILE, move |_| {
            Ok(regular_file_size(&path, follow_symlinks))
        })
        .await;
    if let Ok(Some(size)) = size {
        cx.reserve_response_bytes(base64_len(size.min(limit))).await;
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

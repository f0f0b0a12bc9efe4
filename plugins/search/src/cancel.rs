//! `search/cancel`: stops a search of this session and answers once its `search/done` is
//! queued, so nothing about that search follows the answer.
//!
//! An id that is not running (never started, already done, or another session's) is not
//! an error: the search may have finished while the cancel was on its way, and the caller
//! wants the same thing either way — no more notifications for that id.

use exec_server_core::proto::RpcError;
use exec_server_core::Call;

use crate::table::SessionSearches;
use crate::wire::{CancelParams, CancelResult};

pub(crate) async fn handle(cx: Call, params: CancelParams) -> Result<CancelResult, RpcError> {
    let search = cx
        .session()
        .existing_state::<SessionSearches>()
        .and_then(|searches| searches.get(&params.search_id));
    if let Some(search) = search {
        search.stop.cancel();
        search.done_queued.cancelled().await;
    }
    Ok(CancelResult {})
}

//! `search/start`: validates the request, answers `{searchId}` at once, and streams the
//! results.
//!
//! A search first takes its place in the session's table (unique id, the session's quota),
//! then waits for one of the search threads all sessions share (`state`). On that thread
//! it checks its root — a root that cannot be reached is the request's error — and then
//! searches.
//!
//! Two parts run per search. The search thread (see `engine`) sends matches
//! into a bounded channel of [`MATCH_QUEUE_CAPACITY`]. The forwarding task waits until the
//! `search/start` response is queued, then turns each match into a `search/match` with
//! `Session::notify`, which waits for room in the client's outbound queue; so a client
//! that reads slowly fills the channel and the search thread waits. Finally it sends the
//! one `search/done`.
//!
//! A notification that cannot be delivered (`notify` returns `false`: the session is
//! detached or its connection went away) stops the search: its results would be lost, and
//! a search nobody reads should not keep a thread busy. No `search/done` is sent then.

use std::path::PathBuf;
use std::sync::Arc;

use exec_server_core::proto::path::parse_path;
use exec_server_core::proto::RpcError;
use exec_server_core::{Call, ResponseQueued, Session};
use exec_server_sandbox::policy::{decide_fs, SandboxDecision};
use tokio::sync::{mpsc, oneshot};

use crate::config::SearchConfig;
use crate::engine::{build_matcher, build_overrides, FoundMatch, SearchEnd, SearchJob};
use crate::state::SearchState;
use crate::table::{RunningSearch, SessionSearches};
use crate::wire::{
    self, empty_search_id, max_results_out_of_range, search_id_too_long, DoneNotification,
    MatchNotification, StartParams, StartResult, DONE, EXTENSION, MATCH, MAX_SEARCH_ID_BYTES,
};

/// Matches buffered between the search thread and the forwarding task. With the client's
/// outbound queue, this bounds what one search holds in memory.
pub(crate) const MATCH_QUEUE_CAPACITY: usize = 64;

pub(crate) async fn handle(
    state: Arc<SearchState>,
    cx: Call,
    params: StartParams,
) -> Result<StartResult, RpcError> {
    // Results arrive only as notifications, which a connection that did not opt in never
    // gets: refuse instead of searching for nobody.
    if !cx.client_accepts(EXTENSION) {
        return Err(wire::extension_not_accepted());
    }
    let root = parse_path(&params.path).map_err(|e| e.into_rpc(&params.path))?;
    let job = validate(&state, root, &params)?;
    // No helper process can confine a search, so a policy that needs enforcement is
    // refused rather than ignored.
    match decide_fs(params.sandbox.as_ref(), params.sandbox_policy.as_ref())? {
        SandboxDecision::Unsandboxed => {}
        SandboxDecision::Enforce(_) => return Err(RpcError::fs_sandbox_unenforceable()),
    }

    let session = cx.session();
    let searches = session.state(SessionSearches::default);
    let search = searches
        .register(session, &params.search_id, state.max_concurrent_searches)
        .await?;
    let registration = Registration {
        searches,
        search,
        search_id: params.search_id.clone(),
        started: false,
    };
    let thread_slot = state.slots.acquire(session.id()).await;
    let (found_tx, found_rx) = mpsc::channel(MATCH_QUEUE_CAPACITY);
    let (root_tx, root_checked) = oneshot::channel();
    let (end_tx, thread) = oneshot::channel();
    let stop = registration.search.stop.clone();
    state.threads.spawn(thread_slot, move || {
        // A root that does not exist or cannot be reached is the request's error (mapped
        // like `fs/*` errors), not a search that ends at once.
        let root = std::fs::metadata(&job.root).map_err(|e| RpcError::from_io(&e));
        let reachable = root.is_ok();
        let _ = root_tx.send(root.map(drop));
        if reachable {
            let _ = end_tx.send(job.run(&stop, &found_tx));
        }
    });
    root_checked
        .await
        .unwrap_or_else(|_| Err(RpcError::internal("search task failed")))?;
    let (searches, search) = registration.started();
    tokio::spawn(forward(Forwarding {
        session: Arc::clone(session),
        searches,
        search,
        search_id: params.search_id.clone(),
        response_queued: cx.response_queued(),
        found: found_rx,
        thread,
    }));
    Ok(StartResult {
        search_id: params.search_id,
    })
}

/// A search registered in its session's table that has not been answered yet: if the
/// request fails or is abandoned (its connection closed while it waited for a thread),
/// the registration is given back, freeing the id and the quota.
struct Registration {
    searches: Arc<SessionSearches>,
    search: Arc<RunningSearch>,
    search_id: String,
    started: bool,
}

impl Registration {
    /// The search runs: from now on the forwarding task finishes it.
    fn started(mut self) -> (Arc<SessionSearches>, Arc<RunningSearch>) {
        self.started = true;
        (Arc::clone(&self.searches), Arc::clone(&self.search))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.started {
            // A thread that already began has nobody to report to.
            self.search.stop.cancel();
            self.searches.finish(&self.search_id, &self.search);
        }
    }
}

/// Checks everything that needs no file system access, in the order the errors are
/// reported.
fn validate(
    config: &SearchConfig,
    root: PathBuf,
    params: &StartParams,
) -> Result<SearchJob, RpcError> {
    if params.search_id.is_empty() {
        return Err(empty_search_id());
    }
    if params.search_id.len() > MAX_SEARCH_ID_BYTES {
        return Err(search_id_too_long());
    }
    let max_results = params.max_results.unwrap_or(config.max_results_default);
    if max_results == 0 || max_results > config.max_results_limit {
        return Err(max_results_out_of_range(config.max_results_limit));
    }
    let matcher = build_matcher(
        &params.pattern,
        params.regex.unwrap_or(false),
        params.case_insensitive.unwrap_or(false),
    )?;
    let overrides = build_overrides(
        &root,
        params.include.as_deref().unwrap_or_default(),
        params.exclude.as_deref().unwrap_or_default(),
    )?;
    Ok(SearchJob {
        root,
        matcher,
        overrides,
        respect_gitignore: params.respect_gitignore.unwrap_or(true),
        max_results,
        max_line_bytes: config.max_line_bytes,
        max_file_bytes: config.max_file_bytes,
    })
}

/// What the forwarding task of one search owns.
struct Forwarding {
    session: Arc<Session>,
    searches: Arc<SessionSearches>,
    search: Arc<RunningSearch>,
    search_id: String,
    /// Notifications must follow the `search/start` response.
    response_queued: ResponseQueued,
    found: mpsc::Receiver<FoundMatch>,
    /// How the search thread ended; closed without a value if it panicked.
    thread: oneshot::Receiver<SearchEnd>,
}

/// Why the forwarding loop ended.
#[derive(Debug, PartialEq, Eq)]
enum LoopEnd {
    /// The search thread closed the channel: every match it found was sent.
    Drained,
    /// The search was cancelled.
    Stopped,
    /// A notification could not be delivered.
    Undeliverable,
}

async fn forward(mut f: Forwarding) {
    f.response_queued.wait().await;
    let mut sent: u64 = 0;
    let loop_end = loop {
        // Once stopped, matches still buffered are dropped: nothing follows a cancel but
        // `search/done`.
        let found = tokio::select! {
            biased;
            () = f.search.stop.cancelled() => break LoopEnd::Stopped,
            found = f.found.recv() => found,
        };
        let Some(found) = found else {
            break LoopEnd::Drained;
        };
        let notification = MatchNotification {
            search_id: &f.search_id,
            path: &found.path,
            line_number: found.line_number,
            line: &found.line,
            start: found.start,
            end: found.end,
            line_truncated: found.line_truncated,
        };
        // Waiting for room in the outbound queue ends early on a cancel; an unfinished
        // send sends nothing, so `sent` stays exact.
        let delivered = tokio::select! {
            biased;
            () = f.search.stop.cancelled() => break LoopEnd::Stopped,
            delivered = f.session.notify(MATCH, &notification) => delivered,
        };
        if !delivered {
            f.search.stop.cancel();
            break LoopEnd::Undeliverable;
        }
        sent += 1;
    };
    // Closing the channel releases a search thread that waits for room in it.
    drop(f.found);
    let end = f.thread.await.unwrap_or_else(|_| SearchEnd {
        error: Some("search task failed".to_owned()),
        ..SearchEnd::default()
    });
    f.search.set_finishing();
    if loop_end != LoopEnd::Undeliverable {
        let cancelled = loop_end == LoopEnd::Stopped || end.cancelled;
        let done = DoneNotification {
            search_id: &f.search_id,
            matches: sent,
            truncated: end.truncated && !cancelled,
            cancelled,
            error: end.error,
        };
        f.session.notify(DONE, &done).await;
    }
    f.searches.finish(&f.search_id, &f.search);
}

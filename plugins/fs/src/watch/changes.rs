//! `fs/watch` / `fs/unwatch` **[ext]**: change events of one file or directory (its
//! entries, not deeper), sent as `fs/changed` notifications to connections that opted in
//! to the `fsWatch` extension. Events are gathered for `fs.watch_debounce_ms` after the
//! first one and sent together, each `(path, kind)` once; a window holds at most
//! [`MAX_CHANGES_PER_NOTIFICATION`] changes, and says `truncated` when more happened.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use exec_server_core::fair_budget::BudgetLease;
use exec_server_core::proto::bytes::Empty;
use exec_server_core::proto::fs::MAX_HANDLE_ID_BYTES;
use exec_server_core::proto::path::{parse_path, to_file_uri};
use exec_server_core::proto::RpcError;
use exec_server_core::{Call, Session};
use rustix::fs::inotify::{ReadFlags, WatchFlags};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Notify;

use super::{budget, refuse_enforced_sandbox, AbortOnDrop, WatchSession};
use crate::inotify::{KernelWatch, RawEvent, Sink};
use crate::routing::FsState;

/// The extension a connection lists in `initialize.params.extensions` to get `fs/changed`.
pub const EXTENSION: &str = "fsWatch";
pub const WATCH: &str = "fs/watch";
pub const UNWATCH: &str = "fs/unwatch";
/// Server → client notification of `fs/watch`.
pub const CHANGED: &str = "fs/changed";

/// Distinct changes one notification carries; more in one window set `truncated`.
pub const MAX_CHANGES_PER_NOTIFICATION: usize = 256;

const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF);

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WatchParams {
    pub(crate) watch_id: String,
    pub(crate) path: String,
    #[serde(default)]
    pub(crate) sandbox: Option<Value>,
    #[serde(default)]
    pub(crate) sandbox_policy: Option<Value>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WatchResult {
    pub(crate) watch_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UnwatchParams {
    pub(crate) watch_id: String,
}

/// The params of `fs/changed`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Changed<'a> {
    watch_id: &'a str,
    changes: Vec<Change>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
struct Change {
    path: String,
    kind: ChangeKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
enum ChangeKind {
    Create,
    Modify,
    Remove,
    Rename,
}

pub(crate) fn watch_exists(id: &str) -> RpcError {
    RpcError::invalid_request(format!("watch `{id}` already exists"))
}

fn watch_id_length() -> RpcError {
    RpcError::invalid_request(format!(
        "watchId must be between 1 and {MAX_HANDLE_ID_BYTES} bytes"
    ))
}

fn extension_not_accepted() -> RpcError {
    RpcError::invalid_request(format!(
        "fs/watch sends `fs/changed` notifications, which this connection did not opt in to; list `{EXTENSION}` in initialize.params.extensions"
    ))
}

pub(crate) async fn handle_watch(
    state: Arc<FsState>,
    cx: Call,
    params: WatchParams,
) -> Result<WatchResult, RpcError> {
    // Changes arrive only as notifications: refuse instead of watching for nobody.
    if !cx.client_accepts(EXTENSION) {
        return Err(extension_not_accepted());
    }
    check_watch_id(&params.watch_id)?;
    let path = parse_path(&params.path).map_err(|e| e.into_rpc(&params.path))?;
    refuse_enforced_sandbox(
        &state,
        params.sandbox.as_ref(),
        params.sandbox_policy.as_ref(),
    )?;
    let session = cx.session();
    let watches = session.state(WatchSession::default);
    if watches.has_change(&params.watch_id) {
        return Err(watch_exists(&params.watch_id));
    }
    let budget = state.max_watches_per_session;
    if watches.kernel_watches() >= budget {
        return Err(RpcError::quota_exceeded(
            "file system watches",
            budget,
            "fs.max_watches_per_session",
        ));
    }
    std::fs::metadata(&path).map_err(|e| RpcError::from_io(&e))?;
    let charged = budget::charge(session.id(), 1, "an fs/watch watch")?;
    let hub = state.inotify().map_err(|e| RpcError::from_io(&e))?;
    let pending = Arc::new(Pending::default());
    let sink: Sink = {
        let (pending, base) = (Arc::clone(&pending), path.clone());
        Arc::new(move |event: &RawEvent| pending.record(&base, event))
    };
    let kernel = hub
        .add(&path, MASK, sink)
        .map_err(|e| RpcError::from_io(&e))?;
    let task = tokio::spawn(send_batches(
        Arc::downgrade(session),
        params.watch_id.clone(),
        Arc::clone(&pending),
        Duration::from_millis(state.watch_debounce_ms),
    ));
    let watch = ChangeWatch {
        _kernel: kernel,
        _charged: charged,
        _task: AbortOnDrop(task.abort_handle()),
    };
    watches.insert_change(&params.watch_id, watch)?;
    Ok(WatchResult {
        watch_id: params.watch_id,
    })
}

pub(crate) async fn handle_unwatch(
    _state: Arc<FsState>,
    cx: Call,
    params: UnwatchParams,
) -> Result<Empty, RpcError> {
    check_watch_id(&params.watch_id)?;
    let removed = cx
        .session()
        .existing_state::<WatchSession>()
        .and_then(|watches| watches.remove_change(&params.watch_id));
    drop(removed);
    Ok(Empty {})
}

fn check_watch_id(id: &str) -> Result<(), RpcError> {
    if id.is_empty() || id.len() > MAX_HANDLE_ID_BYTES {
        return Err(watch_id_length());
    }
    Ok(())
}

/// A live `fs/watch` watch: one kernel watch and the task that sends its batches.
#[derive(Debug)]
pub(crate) struct ChangeWatch {
    _kernel: KernelWatch,
    /// Its part of the server's watch budget.
    _charged: BudgetLease,
    _task: AbortOnDrop,
}

/// Changes recorded since the last notification.
#[derive(Debug, Default)]
struct Pending {
    batch: Mutex<Batch>,
    arrived: Notify,
}

#[derive(Debug, Default)]
struct Batch {
    changes: Vec<Change>,
    seen: HashSet<Change>,
    truncated: bool,
}

impl Pending {
    /// Records `event` on the watch of `base` (called on the reactor: no waiting).
    fn record(&self, base: &Path, event: &RawEvent) {
        let change = if event.overflowed() {
            None
        } else {
            let Some(kind) = kind_of(event.flags) else {
                return;
            };
            let path: PathBuf = match &event.name {
                Some(name) => base.join(name),
                None => base.to_path_buf(),
            };
            Some(Change {
                path: to_file_uri(&path),
                kind,
            })
        };
        let mut batch = self.batch.lock().unwrap_or_else(|p| p.into_inner());
        match change {
            None => batch.truncated = true,
            Some(change) if batch.seen.contains(&change) => {}
            Some(_) if batch.changes.len() >= MAX_CHANGES_PER_NOTIFICATION => {
                batch.truncated = true;
            }
            Some(change) => {
                batch.seen.insert(change.clone());
                batch.changes.push(change);
            }
        }
        drop(batch);
        self.arrived.notify_one();
    }

    fn take(&self) -> Batch {
        std::mem::take(&mut *self.batch.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn kind_of(flags: ReadFlags) -> Option<ChangeKind> {
    if flags.intersects(ReadFlags::CREATE) {
        Some(ChangeKind::Create)
    } else if flags.intersects(ReadFlags::DELETE | ReadFlags::DELETE_SELF) {
        Some(ChangeKind::Remove)
    } else if flags.intersects(ReadFlags::MOVED_FROM | ReadFlags::MOVED_TO | ReadFlags::MOVE_SELF) {
        Some(ChangeKind::Rename)
    } else if flags.intersects(ReadFlags::MODIFY | ReadFlags::ATTRIB) {
        Some(ChangeKind::Modify)
    } else {
        None
    }
}

/// After the first change of a window, waits `debounce` and sends what the window
/// gathered; waits for room in the client's queue (back-pressure) meanwhile changes keep
/// gathering, bounded.
async fn send_batches(
    session: Weak<Session>,
    id: String,
    pending: Arc<Pending>,
    debounce: Duration,
) {
    loop {
        pending.arrived.notified().await;
        tokio::time::sleep(debounce).await;
        let batch = pending.take();
        if batch.changes.is_empty() && !batch.truncated {
            continue;
        }
        let Some(session) = session.upgrade() else {
            return;
        };
        session
            .notify_with(CHANGED, || Changed {
                watch_id: &id,
                changes: batch.changes,
                truncated: batch.truncated,
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_keeps_each_change_once_and_is_bounded() {
        let pending = Pending::default();
        let base = Path::new("/w");
        let event = |flags, name: &str| RawEvent {
            flags,
            name: Some(name.into()),
        };
        pending.record(base, &event(ReadFlags::CREATE, "a"));
        pending.record(base, &event(ReadFlags::CREATE, "a"));
        pending.record(base, &event(ReadFlags::MODIFY, "a"));
        let batch = pending.take();
        assert_eq!(batch.changes.len(), 2);
        assert!(!batch.truncated);
        for i in 0..MAX_CHANGES_PER_NOTIFICATION + 5 {
            pending.record(base, &event(ReadFlags::CREATE, &format!("f{i}")));
        }
        let batch = pending.take();
        assert_eq!(batch.changes.len(), MAX_CHANGES_PER_NOTIFICATION);
        assert!(batch.truncated);
        assert!(pending.take().changes.is_empty());
    }
}

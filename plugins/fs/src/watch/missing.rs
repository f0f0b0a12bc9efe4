//! `fs/watchMissing` and `fs/missingChanged` (codex 0.169.0): tell the client, once, when
//! any of a set of missing paths comes into existence or one present path changes.
//!
//! A missing path is watched at its nearest existing ancestor for the creation (or
//! arrival) of the next component on the way to it, and for that ancestor going away; a
//! present path for changes of its own metadata or content and for going away; and the
//! mount table for any change. The first of these sends one `fs/missingChanged` and ends
//! the watch. Spurious notifications are harmless (the client only re-runs discovery);
//! missed ones are not, so doubt counts as a change.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Weak};

use exec_server_core::fair_budget::BudgetLease;
use exec_server_core::proto::fs::{WatchMissingParams, WatchMissingResult, MISSING_CHANGED};
use exec_server_core::proto::path::parse_path;
use exec_server_core::proto::RpcError;
use exec_server_core::{Call, Session};
use exec_server_sandbox::placeholders;
use rustix::fs::inotify::{ReadFlags, WatchFlags};
use serde_json::json;
use tokio::sync::Notify;

use super::{budget, refuse_enforced_sandbox, AbortOnDrop, WatchSession};
use crate::inotify::{KernelWatch, RawEvent, Sink};
use crate::routing::FsState;

/// Most `missing` paths one request may name (codex's limit).
pub(crate) const MAX_MISSING_PATHS: usize = 64;

/// A missing path's nearest existing ancestor: the next component arriving, or the
/// ancestor itself going away.
const ANCESTOR_MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR);

/// The present path's own metadata or content changing, or the path going away.
const PRESENT_MASK: WatchFlags = WatchFlags::ATTRIB
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::DONT_FOLLOW);

/// Events that end what a watch descriptor watches.
const GONE: ReadFlags = ReadFlags::DELETE_SELF
    .union(ReadFlags::MOVE_SELF)
    .union(ReadFlags::IGNORED)
    .union(ReadFlags::UNMOUNT);

pub(crate) async fn handle(
    state: Arc<FsState>,
    cx: Call,
    params: WatchMissingParams,
) -> Result<WatchMissingResult, RpcError> {
    refuse_enforced_sandbox(
        &state,
        params.sandbox.as_ref(),
        params.sandbox_policy.as_ref(),
    )?;
    // A path that is not one is an error of the params, before anything changes.
    let paths = parse_paths(&params)?;
    let session = cx.session();
    let watches = session.state(WatchSession::default);
    // Ids only go up; a stale id changes nothing, not even the current watch.
    if !watches.take_missing_id(params.watch_id) {
        return Ok(WatchMissingResult { watching: false });
    }
    // The previous watch ends now, whatever this request answers.
    drop(watches.replace_missing(None));
    let Some(plan) = paths.and_then(plan) else {
        return Ok(WatchMissingResult { watching: false });
    };
    let budget = state.max_watches_per_session;
    if watches.kernel_watches() + plan.watches.len() > budget {
        tracing::info!(
            budget,
            "fs/watchMissing needs more watches than fs.max_watches_per_session leaves"
        );
        return Ok(WatchMissingResult { watching: false });
    }
    let charged = match budget::charge(session.id(), plan.watches.len(), "an fs/watchMissing") {
        Ok(charged) => charged,
        Err(refusal) => {
            tracing::info!(
                "fs/watchMissing refused by the watch budget: {}",
                refusal.message
            );
            return Ok(WatchMissingResult { watching: false });
        }
    };
    let Some(watch) = start(&state, session, params.watch_id, &plan, charged) else {
        return Ok(WatchMissingResult { watching: false });
    };
    // Anything that appeared while the watches were being placed fires at once.
    if plan.changed_since_checked() {
        watch.fired.notify_one();
    }
    if !watches.install_missing(watch) {
        return Ok(WatchMissingResult { watching: false });
    }
    Ok(WatchMissingResult { watching: true })
}

/// What a request asks to watch, once it passed codex's checks.
struct Plan {
    /// Every missing path.
    missing: Vec<PathBuf>,
    /// `(path, mask, next components)` per kernel watch: the names whose arrival in a
    /// watched ancestor matters (`None` for the present path).
    watches: Vec<(PathBuf, WatchFlags, Option<Vec<OsString>>)>,
    present: Option<PathBuf>,
}

impl Plan {
    /// Whether a missing path exists or the present one is gone now.
    fn changed_since_checked(&self) -> bool {
        self.missing.iter().any(|p| exists(p)) || self.present.as_ref().is_some_and(|p| !exists(p))
    }
}

/// A request's `(missing, present)` as host paths.
type Paths = (Vec<PathBuf>, Option<PathBuf>);

/// The request's paths; `None` when one names another host (never watchable), an error
/// when one is not a path at all.
fn parse_paths(params: &WatchMissingParams) -> Result<Option<Paths>, RpcError> {
    let texts = params.missing.iter().chain(params.present.iter());
    if texts.clone().any(|text| names_another_host(text)) {
        return Ok(None);
    }
    let mut paths = texts
        .map(|text| parse_path(text).map_err(|e| e.into_rpc(text)))
        .collect::<Result<Vec<PathBuf>, RpcError>>()?;
    let present = params.present.is_some().then(|| paths.pop()).flatten();
    Ok(Some((paths, present)))
}

/// Codex's checks: `None` for every case it answers `watching: false`.
fn plan((missing, present): Paths) -> Option<Plan> {
    if missing.is_empty() || missing.len() > MAX_MISSING_PATHS {
        return None;
    }
    let mut ancestors: Vec<(PathBuf, Vec<OsString>)> = Vec::new();
    for path in &missing {
        if exists(path) || path.starts_with("/proc") {
            return None;
        }
        // Below an existing non-directory, a path can never appear.
        let (ancestor, next) = nearest_existing_ancestor(path)?;
        match ancestors.iter_mut().find(|(p, _)| *p == ancestor) {
            Some((_, names)) if names.contains(&next) => {}
            Some((_, names)) => names.push(next),
            None => ancestors.push((ancestor, vec![next])),
        }
    }
    let mut watches: Vec<_> = ancestors
        .into_iter()
        .map(|(path, names)| (path, ANCESTOR_MASK, Some(names)))
        .collect();
    if let Some(present) = &present {
        if !exists(present) {
            return None;
        }
        watches.push((present.clone(), PRESENT_MASK, None));
    }
    Some(Plan {
        missing,
        watches,
        present,
    })
}

/// A `file:` URI with a host other than the local one: never watchable.
fn names_another_host(text: &str) -> bool {
    let Some(rest) = text
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case("file://"))
        .map(|_| &text[7..])
    else {
        return false;
    };
    let host = &rest[..rest.find('/').unwrap_or(rest.len())];
    !host.is_empty() && !host.eq_ignore_ascii_case("localhost")
}

/// `lstat` succeeds: a dangling link counts as existing. A carve-out placeholder the
/// server holds for a sandboxed process does not: the name is only taken inside the
/// sandbox (see `exec_server_sandbox::placeholders`).
fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok() && !placeholders::is_held(path)
}

/// The nearest existing ancestor of a missing `path` and the component below it on the
/// way to `path`; `None` when that ancestor is not a directory.
fn nearest_existing_ancestor(path: &Path) -> Option<(PathBuf, OsString)> {
    let mut child = path;
    while let Some(parent) = child.parent() {
        match std::fs::metadata(parent) {
            Ok(metadata) if metadata.is_dir() => {
                let next = match child.components().next_back() {
                    Some(Component::Normal(name)) => name.to_os_string(),
                    _ => return None,
                };
                return Some((parent.to_path_buf(), next));
            }
            Ok(_) => return None,
            Err(_) => child = parent,
        }
    }
    None
}

/// A live `fs/watchMissing` watch: its kernel watches and the task that sends its one
/// notification.
#[derive(Debug)]
pub(crate) struct MissingWatch {
    pub(crate) id: u64,
    /// Kernel watches held (each counts against `fs.max_watches_per_session`).
    pub(crate) kernel: Vec<KernelWatch>,
    /// Their part of the server's watch budget.
    _charged: BudgetLease,
    fired: Arc<Notify>,
    _task: AbortOnDrop,
}

/// Places the kernel watches of `plan` and starts the task that notifies; `None` when the
/// kernel refused a watch (the client then keeps discovering live).
fn start(
    state: &FsState,
    session: &Arc<Session>,
    id: u64,
    plan: &Plan,
    charged: BudgetLease,
) -> Option<MissingWatch> {
    let hub = match state.inotify() {
        Ok(hub) => hub,
        Err(e) => {
            tracing::warn!(error = %e, "metadata watch unavailable; retaining live discovery");
            return None;
        }
    };
    let fired = Arc::new(Notify::new());
    let mut kernel = Vec::with_capacity(plan.watches.len());
    for (path, mask, next) in &plan.watches {
        let sink: Sink = {
            let fired = Arc::clone(&fired);
            let next = next.clone();
            let dir = path.clone();
            Arc::new(move |event: &RawEvent| {
                if triggers(event, next.as_deref()) && arrived(&dir, event) {
                    fired.notify_one();
                }
            })
        };
        match hub.add(path, *mask, sink) {
            Ok(watch) => kernel.push(watch),
            Err(e) => {
                tracing::warn!(path = ?path, error = %e,
                    "metadata watch unavailable; retaining live discovery");
                return None;
            }
        }
    }
    let task = tokio::spawn(notify_once(
        Arc::downgrade(session),
        id,
        Arc::clone(&fired),
        hub.mount_changes(),
    ));
    Some(MissingWatch {
        id,
        kernel,
        _charged: charged,
        fired,
        _task: AbortOnDrop(task.abort_handle()),
    })
}

/// Whether `event` on a watch means the watched set may have changed. `next` are the
/// components whose arrival matters in a watched ancestor (`None`: the present path).
fn triggers(event: &RawEvent, next: Option<&[OsString]>) -> bool {
    if event.overflowed() || event.flags.intersects(GONE) {
        return true;
    }
    match (next, &event.name) {
        // An ancestor: only the next component arriving.
        (Some(next), Some(name)) => {
            next.contains(name)
                && event
                    .flags
                    .intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO)
        }
        (Some(_), None) => false,
        // The present path: its own changes, not its children's.
        (None, None) => event
            .flags
            .intersects(ReadFlags::ATTRIB | ReadFlags::MODIFY),
        (None, Some(_)) => false,
    }
}

/// Whether the name an event in `dir` reports is there now, as [`exists`] sees it: a
/// carve-out placeholder only a sandboxed process sees as taken, or a name that came and
/// went before the event was read, did not appear for the client.
fn arrived(dir: &Path, event: &RawEvent) -> bool {
    event
        .name
        .as_ref()
        .is_none_or(|name| exists(&dir.join(name)))
}

/// Waits for the first change, sends the one notification, and ends the watch.
async fn notify_once(
    session: Weak<Session>,
    id: u64,
    fired: Arc<Notify>,
    mut mounts: tokio::sync::watch::Receiver<u64>,
) {
    tokio::select! {
        () = fired.notified() => {}
        Ok(()) = mounts.changed() => {}
    }
    let Some(session) = session.upgrade() else {
        return;
    };
    session
        .notify(MISSING_CHANGED, &json!({ "watchId": id }))
        .await;
    let ended = session
        .existing_state::<WatchSession>()
        .and_then(|watches| watches.finish_missing(id));
    // Dropping the watch aborts this task: nothing may follow.
    drop(ended);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_other_than_the_local_one_are_recognised() {
        assert!(names_another_host("file://host/x"));
        assert!(names_another_host("FILE://host"));
        assert!(!names_another_host("file:///x"));
        assert!(!names_another_host("file://localhost/x"));
        assert!(!names_another_host("/x"));
    }

    #[test]
    fn the_nearest_existing_ancestor_must_be_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let (ancestor, next) = nearest_existing_ancestor(&dir.path().join("a/b/c")).unwrap();
        assert_eq!(
            (ancestor.as_path(), next.to_str().unwrap()),
            (dir.path(), "a")
        );
        std::fs::write(dir.path().join("f"), b"").unwrap();
        assert!(nearest_existing_ancestor(&dir.path().join("f/child")).is_none());
    }

    #[test]
    fn only_the_next_component_or_the_ancestor_going_away_triggers() {
        let event = |flags, name: Option<&str>| RawEvent {
            flags,
            name: name.map(OsString::from),
        };
        let names = [OsString::from(".git")];
        let next = Some(&names[..]);
        assert!(triggers(&event(ReadFlags::CREATE, Some(".git")), next));
        assert!(triggers(&event(ReadFlags::MOVED_TO, Some(".git")), next));
        assert!(!triggers(&event(ReadFlags::CREATE, Some("k.tmp")), next));
        assert!(triggers(&event(ReadFlags::DELETE_SELF, None), next));
        assert!(triggers(&event(ReadFlags::QUEUE_OVERFLOW, None), next));
        assert!(triggers(&event(ReadFlags::ATTRIB, None), None));
        assert!(!triggers(&event(ReadFlags::CREATE, Some("child")), None));
        assert!(!triggers(&event(ReadFlags::MODIFY, Some("child")), None));
    }
}

//! Watching the file system: `fs/watchMissing` (codex 0.169.0, `missing`) and our `fs/watch`
//! / `fs/unwatch` extension (`changes`), on the plugin's one inotify instance (`inotify`).
//!
//! Watches are session state: they survive a resume on a new connection, count against
//! `fs.max_watches_per_session` kernel watches and the server-wide watch budget
//! ([`budget`]), and are all released when the session ends
//! ([`WatchSession::session_ended`]).
//!
//! Watching reveals that paths exist and change, which a sandbox policy may deny: no
//! helper process can hold a watch, so a `sandbox` that needs enforcement is refused, as
//! `search/start` does.

pub(crate) mod budget;
pub(crate) mod changes;
pub(crate) mod missing;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use exec_server_core::proto::RpcError;
use exec_server_core::SessionState;
use exec_server_sandbox::policy::SandboxDecision;
use serde_json::Value;

use crate::inotify::Inotify;
use crate::routing::FsState;
use changes::ChangeWatch;
use missing::MissingWatch;

/// Refuses a `sandbox` (or legacy `sandboxPolicy`) that needs enforcement.
pub(crate) fn refuse_enforced_sandbox(
    state: &FsState,
    sandbox: Option<&Value>,
    top_level_policy: Option<&Value>,
) -> Result<(), RpcError> {
    match state.sandbox.decide_fs(sandbox, top_level_policy)? {
        SandboxDecision::Unsandboxed => Ok(()),
        SandboxDecision::Enforce(_) => Err(RpcError::fs_sandbox_unenforceable()),
    }
}

/// Aborts a task when its owner goes.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The watches of one session.
#[derive(Debug, Default)]
pub(crate) struct WatchSession {
    inner: Mutex<Watches>,
}

#[derive(Debug, Default)]
struct Watches {
    /// The highest `fs/watchMissing` id seen: ids only go up.
    highest_missing_id: Option<u64>,
    /// At most one `fs/watchMissing` watch at a time.
    missing: Option<MissingWatch>,
    /// `fs/watch` watches by client id.
    changes: HashMap<String, ChangeWatch>,
    /// Set when the session ended: nothing is installed any more.
    ended: bool,
}

impl WatchSession {
    /// Records `id` if it is higher than every id seen; false (and nothing changes) if not.
    pub(crate) fn take_missing_id(&self, id: u64) -> bool {
        let mut watches = self.lock();
        if watches
            .highest_missing_id
            .is_some_and(|highest| id <= highest)
        {
            return false;
        }
        watches.highest_missing_id = Some(id);
        true
    }

    /// Puts `watch` in place of the current missing-path watch; returns the old one (to be
    /// dropped outside the lock).
    pub(crate) fn replace_missing(&self, watch: Option<MissingWatch>) -> Option<MissingWatch> {
        std::mem::replace(&mut self.lock().missing, watch)
    }

    /// Installs `watch` unless the session ended or a newer request came meanwhile; false
    /// if it was not installed (it is dropped, which releases it).
    pub(crate) fn install_missing(&self, watch: MissingWatch) -> bool {
        let mut watches = self.lock();
        if watches.ended || watches.highest_missing_id != Some(watch.id) {
            drop(watches);
            drop(watch);
            return false;
        }
        let old = watches.missing.replace(watch);
        drop(watches);
        drop(old);
        true
    }

    /// Takes the missing-path watch `id` out, if it is still the current one.
    pub(crate) fn finish_missing(&self, id: u64) -> Option<MissingWatch> {
        let mut watches = self.lock();
        if watches.missing.as_ref().is_some_and(|w| w.id == id) {
            watches.missing.take()
        } else {
            None
        }
    }

    /// Adds an `fs/watch` watch; the error if the id is taken or the session ended.
    pub(crate) fn insert_change(&self, id: &str, watch: ChangeWatch) -> Result<(), RpcError> {
        let mut watches = self.lock();
        if watches.ended {
            return Err(RpcError::invalid_request("the session has ended"));
        }
        if watches.changes.contains_key(id) {
            return Err(changes::watch_exists(id));
        }
        watches.changes.insert(id.to_owned(), watch);
        Ok(())
    }

    /// Whether an `fs/watch` id is taken.
    pub(crate) fn has_change(&self, id: &str) -> bool {
        self.lock().changes.contains_key(id)
    }

    /// Removes an `fs/watch` watch (returned, to be dropped outside the lock).
    pub(crate) fn remove_change(&self, id: &str) -> Option<ChangeWatch> {
        self.lock().changes.remove(id)
    }

    /// Kernel watches this session holds.
    pub(crate) fn kernel_watches(&self) -> usize {
        let watches = self.lock();
        watches.missing.as_ref().map_or(0, |w| w.kernel.len()) + watches.changes.len()
    }

    fn lock(&self) -> MutexGuard<'_, Watches> {
        // Every update is one field assignment or map operation.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl SessionState for WatchSession {
    /// Releases every kernel watch and stops every task of the session.
    fn session_ended(&self) {
        let (missing, changes) = {
            let mut watches = self.lock();
            watches.ended = true;
            (watches.missing.take(), std::mem::take(&mut watches.changes))
        };
        drop(missing);
        drop(changes);
    }
}

/// `inotify` instance access for the handlers.
impl FsState {
    /// The plugin's inotify instance, created on first use.
    pub(crate) fn inotify(&self) -> std::io::Result<Arc<Inotify>> {
        let mut slot = self.inotify.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(hub) = &*slot {
            return Ok(Arc::clone(hub));
        }
        let hub = Inotify::start()?;
        *slot = Some(Arc::clone(&hub));
        Ok(hub)
    }
}

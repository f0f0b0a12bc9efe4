//! Serving fs helpers between requests: each kept for exactly one session and one policy.
//!
//! The key is the whole point. A helper confined itself for the policy on its command line
//! before it read anything, so a request under that same policy gets exactly the
//! confinement a fresh helper would apply; and a helper is only ever handed requests of the
//! session it was started for, so whatever one request leaves in it (memory, a crash, a
//! hang) concerns that session alone — the same client that sent the request. Session ids
//! are unguessable and never reused, and a session's helpers are killed when it ends.
//!
//! Bounded in number (`total`, and `per_session` for one session: the oldest goes) and in
//! time: a helper waits at most `reuse_for`; a sweep kills the ones past it, and each helper
//! also exits on its own a little later (`--serve`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use exec_server_core::metrics::{self, Gauge};
use tokio::time::Instant;

/// What can be kept: a helper that can tell whether it still runs (and is killed when
/// dropped). The pool knows nothing else of it, so it does not depend on the runner.
pub(crate) trait Kept: std::fmt::Debug + Send + 'static {
    fn is_running(&mut self) -> bool;
}

/// Whose requests a helper may serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HelperKey {
    session: Arc<str>,
    /// The policy in its helper form (§4.3), exactly as on the helper's command line.
    policy: Arc<str>,
}

impl HelperKey {
    pub(crate) fn new(session: &str, policy_json: String) -> Self {
        Self {
            session: session.into(),
            policy: policy_json.into(),
        }
    }

    pub(crate) fn policy(&self) -> &str {
        &self.policy
    }
}

/// Helpers that answered and wait for their key's next request.
pub(crate) struct IdleHelpers<H> {
    total: usize,
    per_session: usize,
    reuse_for: Duration,
    state: Mutex<State<H>>,
    /// `exec_server_fs_helpers_idle`.
    idle: Gauge,
}

#[derive(Debug)]
struct State<H> {
    /// Oldest first.
    waiting: VecDeque<Waiting<H>>,
    /// Whether a sweep task runs (it stops when nothing waits).
    sweeping: bool,
}

impl<H> Default for State<H> {
    fn default() -> Self {
        Self {
            waiting: VecDeque::new(),
            sweeping: false,
        }
    }
}

#[derive(Debug)]
struct Waiting<H> {
    key: HelperKey,
    helper: H,
    since: Instant,
}

impl<H> std::fmt::Debug for IdleHelpers<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdleHelpers")
            .field("total", &self.total)
            .field("per_session", &self.per_session)
            .field("reuse_for", &self.reuse_for)
            .finish_non_exhaustive()
    }
}

impl<H: Kept> IdleHelpers<H> {
    pub(crate) fn new(total: usize, per_session: usize, reuse_for: Duration) -> Arc<Self> {
        Arc::new(Self {
            total,
            per_session,
            reuse_for,
            state: Mutex::default(),
            idle: metrics::gauge(
                "exec_server_fs_helpers_idle",
                "Confined fs helpers waiting for their session's next request.",
                &[],
            ),
        })
    }

    /// The helper that waited least for `key`, if one still runs. Helpers found dead on
    /// the way are dropped.
    pub(crate) fn take(&self, key: &HelperKey) -> Option<H> {
        let mut gone = Vec::new();
        let mut state = self.lock();
        gone.extend(state.take_expired(self.reuse_for));
        let mut found = None;
        while let Some(position) = state.waiting.iter().rposition(|w| w.key == *key) {
            let mut waiting = state.waiting.remove(position).expect("the position exists");
            if waiting.helper.is_running() {
                found = Some(waiting.helper);
                break;
            }
            gone.push(waiting);
        }
        self.idle.set(state.waiting.len() as i64);
        drop(state);
        drop(gone);
        found
    }

    /// Keeps `helper` for `key`'s next request, within the bounds.
    pub(crate) fn put(self: &Arc<Self>, key: HelperKey, helper: H) {
        if self.total == 0 || self.per_session == 0 || self.reuse_for.is_zero() {
            return;
        }
        let mut gone = Vec::new();
        let mut state = self.lock();
        gone.extend(state.take_expired(self.reuse_for));
        let session = key.session.clone();
        state.waiting.push_back(Waiting {
            key,
            helper,
            since: Instant::now(),
        });
        if state.count(&session) > self.per_session {
            let oldest = state.waiting.iter().position(|w| w.key.session == session);
            gone.extend(oldest.and_then(|i| state.waiting.remove(i)));
        }
        while state.waiting.len() > self.total {
            gone.extend(state.waiting.pop_front());
        }
        if !state.sweeping {
            state.sweeping = true;
            tokio::spawn(sweep(Arc::downgrade(self), self.reuse_for));
        }
        self.idle.set(state.waiting.len() as i64);
        drop(state);
        drop(gone);
    }

    /// Kills every helper kept for `session`.
    pub(crate) fn forget_session(&self, session: &str) {
        let mut state = self.lock();
        let (gone, kept) = std::mem::take(&mut state.waiting)
            .into_iter()
            .partition(|w| &*w.key.session == session);
        state.waiting = kept;
        self.idle.set(state.waiting.len() as i64);
        drop(state);
        drop::<VecDeque<Waiting<H>>>(gone);
    }

    /// How many helpers wait.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().waiting.len()
    }

    fn lock(&self) -> MutexGuard<'_, State<H>> {
        self.state.lock().expect("idle helpers lock")
    }
}

impl<H> State<H> {
    /// Removes the helpers that waited `reuse_for` or longer (they are killed when the
    /// caller drops them, outside the lock).
    fn take_expired(&mut self, reuse_for: Duration) -> Vec<Waiting<H>> {
        let mut expired = Vec::new();
        // Oldest first: the expired ones are at the front.
        while self
            .waiting
            .front()
            .is_some_and(|w| w.since.elapsed() >= reuse_for)
        {
            expired.extend(self.waiting.pop_front());
        }
        expired
    }

    fn count(&self, session: &str) -> usize {
        self.waiting
            .iter()
            .filter(|w| &*w.key.session == session)
            .count()
    }
}

/// Kills helpers as they pass `reuse_for`, until none waits.
async fn sweep<H: Kept>(pool: Weak<IdleHelpers<H>>, reuse_for: Duration) {
    loop {
        tokio::time::sleep(reuse_for).await;
        let Some(pool) = pool.upgrade() else { return };
        let mut state = pool.lock();
        let expired = state.take_expired(reuse_for);
        let done = state.waiting.is_empty();
        if done {
            state.sweeping = false;
        }
        pool.idle.set(state.waiting.len() as i64);
        drop(state);
        drop(expired);
        if done {
            return;
        }
    }
}

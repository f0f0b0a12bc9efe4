//! Fair slots: a bounded number of places for one kind of expensive work (a blocking file
//! operation, a sandbox helper process, a search thread), shared by every session so that
//! no session can take them all.
//!
//! A session holds at most `per_session` slots at once and all sessions together at most
//! `total`. A request that finds no slot waits in its session's queue; whenever a slot
//! frees, the next session in turn — round-robin over the sessions that are waiting and
//! below their own share — gets it. So a session's queue of hundreds delays only that
//! session: another session's single request waits for the next slot that frees, not for
//! the queue. Waiting is cancelled by dropping the future (the request was abandoned).
//!
//! A [`SlotPermit`] is held as long as the work runs, even when its request was answered
//! early: work stuck in the kernel past its deadline still occupies a thread, so it keeps
//! counting (against its session's share and the total) until it really returns.
//!
//! `/metrics` shows, per pool: its limit, slots in use, requests waiting, work that ran past
//! its deadline and still runs (`overdue`), and the deadlines missed.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::metrics::{self, Counter, Gauge};

/// A pool of slots shared fairly by sessions.
#[derive(Clone)]
pub struct FairSlots {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FairSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairSlots")
            .field("pool", &self.shared.pool)
            .field("total", &self.shared.total)
            .field("per_session", &self.shared.per_session)
            .finish_non_exhaustive()
    }
}

struct Shared {
    pool: &'static str,
    total: usize,
    per_session: usize,
    state: Mutex<State>,
    metrics: SlotMetrics,
}

#[derive(Default)]
struct State {
    /// Slots held by all sessions together.
    running: usize,
    /// Sessions that hold a slot or wait for one; removed when they do neither.
    sessions: HashMap<Arc<str>, SessionSlots>,
    /// Sessions that wait and are below their share, in the order they get the next slot.
    /// A session is here at most once, exactly when its `in_turns` is set.
    turns: VecDeque<Arc<str>>,
}

#[derive(Default)]
struct SessionSlots {
    running: usize,
    waiting: VecDeque<Arc<Waiter>>,
    in_turns: bool,
}

/// One request waiting for a slot. `granted` is only changed under the state lock.
#[derive(Default)]
struct Waiter {
    granted: std::sync::atomic::AtomicBool,
    wake: Notify,
}

struct SlotMetrics {
    running: Gauge,
    queued: Gauge,
    overdue: Gauge,
    timeouts: Counter,
}

impl FairSlots {
    /// `pool` is the metric label (`fs_blocking`, `fs_helpers`, …); both limits are at
    /// least 1.
    pub fn new(pool: &'static str, total: usize, per_session: usize) -> Self {
        let labels = [("pool", pool)];
        metrics::gauge(
            "exec_server_fair_slots_limit",
            "Slots of a fair-share pool (work of all sessions running at once).",
            &labels,
        )
        .set(i64::try_from(total).unwrap_or(i64::MAX));
        Self {
            shared: Arc::new(Shared {
                pool,
                total: total.max(1),
                per_session: per_session.max(1),
                state: Mutex::new(State::default()),
                metrics: SlotMetrics {
                    running: metrics::gauge(
                        "exec_server_fair_slots_running",
                        "Slots of a fair-share pool in use, overdue work included.",
                        &labels,
                    ),
                    queued: metrics::gauge(
                        "exec_server_fair_slots_queued",
                        "Requests waiting for a slot of a fair-share pool.",
                        &labels,
                    ),
                    overdue: metrics::gauge(
                        "exec_server_fair_slots_overdue",
                        "Work whose request was answered at its deadline but which still runs (stuck in the kernel) and holds its slot.",
                        &labels,
                    ),
                    timeouts: metrics::counter(
                        "exec_server_fair_slots_timeouts_total",
                        "Work that did not finish by its deadline.",
                        &labels,
                    ),
                },
            }),
        }
    }

    /// Waits for a slot for `session`, taking turns with the other sessions' waiting
    /// requests. Dropping the future before it resolves gives up the place in the queue.
    pub async fn acquire(&self, session: &str) -> SlotPermit {
        let mut wait = {
            let mut guard = self.shared.lock();
            let state = &mut *guard;
            let key = state.key(session);
            let total = self.shared.total;
            let per_session = self.shared.per_session;
            let below_total = state.running < total;
            let entry = state.sessions.entry(Arc::clone(&key)).or_default();
            if below_total && entry.running < per_session && entry.waiting.is_empty() {
                entry.running += 1;
                state.running += 1;
                self.shared.metrics.running.inc();
                return self.permit(key);
            }
            let waiter = Arc::new(Waiter::default());
            entry.waiting.push_back(Arc::clone(&waiter));
            if entry.running < per_session && !entry.in_turns {
                entry.in_turns = true;
                state.turns.push_back(Arc::clone(&key));
            }
            self.shared.metrics.queued.inc();
            Wait {
                shared: &self.shared,
                session: key,
                waiter,
                settled: false,
            }
        };
        wait.waiter.wake.notified().await;
        // Only a grant wakes a waiter.
        debug_assert!(wait.waiter.granted.load(Ordering::SeqCst));
        wait.settled = true;
        self.permit(Arc::clone(&wait.session))
    }

    fn permit(&self, session: Arc<str>) -> SlotPermit {
        SlotPermit {
            shared: Arc::clone(&self.shared),
            session,
            progress: Arc::new(AtomicU8::new(RUNNING)),
        }
    }

    /// Slots held now, by all sessions.
    pub fn running(&self) -> usize {
        self.shared.lock().running
    }

    /// Requests waiting now.
    pub fn queued(&self) -> usize {
        let state = self.shared.lock();
        state.sessions.values().map(|s| s.waiting.len()).sum()
    }

    /// Slots `session` holds now.
    pub fn held_by(&self, session: &str) -> usize {
        let state = self.shared.lock();
        state.sessions.get(session).map_or(0, |s| s.running)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is complete before the lock is released; a panic cannot leave a
        // half-done one.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives `session`'s slot back and hands free slots to the sessions in turn.
    fn release(&self, state: &mut State, session: &Arc<str>) {
        state.running -= 1;
        self.metrics.running.dec();
        let per_session = self.per_session;
        if let Some(entry) = state.sessions.get_mut(session) {
            entry.running -= 1;
            if !entry.waiting.is_empty() && entry.running < per_session && !entry.in_turns {
                entry.in_turns = true;
                state.turns.push_back(Arc::clone(session));
            }
            if entry.running == 0 && entry.waiting.is_empty() {
                state.sessions.remove(session);
            }
        }
        self.dispatch(state);
    }

    /// Grants free slots, one per session in turn.
    fn dispatch(&self, state: &mut State) {
        while state.running < self.total {
            let Some(key) = state.turns.pop_front() else {
                break;
            };
            let Some(entry) = state.sessions.get_mut(&key) else {
                continue;
            };
            entry.in_turns = false;
            let Some(waiter) = entry.waiting.pop_front() else {
                continue;
            };
            entry.running += 1;
            if !entry.waiting.is_empty() && entry.running < self.per_session {
                entry.in_turns = true;
                state.turns.push_back(key);
            }
            state.running += 1;
            self.metrics.queued.dec();
            self.metrics.running.inc();
            waiter.granted.store(true, Ordering::SeqCst);
            // Stored if the waiter is not polling yet, so the wake is never lost.
            waiter.wake.notify_one();
        }
    }
}

impl State {
    /// The shared key of `session`, reusing the map's copy when there is one.
    fn key(&self, session: &str) -> Arc<str> {
        self.sessions
            .get_key_value(session)
            .map_or_else(|| Arc::from(session), |(key, _)| Arc::clone(key))
    }
}

/// A request's place in a session's queue; leaving it (dropping the future) gives the
/// place up, or the slot back when it was granted meanwhile.
struct Wait<'a> {
    shared: &'a Shared,
    session: Arc<str>,
    waiter: Arc<Waiter>,
    /// The slot was taken over by a permit.
    settled: bool,
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        if self.waiter.granted.load(Ordering::SeqCst) {
            self.shared.release(state, &self.session);
            return;
        }
        self.shared.metrics.queued.dec();
        let Some(entry) = state.sessions.get_mut(&self.session) else {
            return;
        };
        entry
            .waiting
            .retain(|queued| !Arc::ptr_eq(queued, &self.waiter));
        if entry.waiting.is_empty() {
            let was_in_turns = std::mem::take(&mut entry.in_turns);
            let unused = entry.running == 0;
            if was_in_turns {
                state.turns.retain(|key| key != &self.session);
            }
            if unused {
                state.sessions.remove(&self.session);
            }
        }
    }
}

const RUNNING: u8 = 0;
const OVERDUE: u8 = 1;
const RETURNED: u8 = 2;

/// One slot, held while the work runs; given back when dropped.
pub struct SlotPermit {
    shared: Arc<Shared>,
    session: Arc<str>,
    /// [`RUNNING`], [`OVERDUE`] once its deadline passed, [`RETURNED`] once dropped.
    progress: Arc<AtomicU8>,
}

impl std::fmt::Debug for SlotPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotPermit")
            .field("pool", &self.shared.pool)
            .finish_non_exhaustive()
    }
}

impl SlotPermit {
    /// A handle that reports this permit's deadline as missed, usable after the permit
    /// itself moved into the work.
    pub fn deadline(&self) -> DeadlineReport {
        DeadlineReport {
            shared: Arc::clone(&self.shared),
            progress: Arc::clone(&self.progress),
        }
    }
}

impl Drop for SlotPermit {
    fn drop(&mut self) {
        if self.progress.swap(RETURNED, Ordering::SeqCst) == OVERDUE {
            self.shared.metrics.overdue.dec();
        }
        let mut state = self.shared.lock();
        self.shared.release(&mut state, &self.session);
    }
}

/// Reports that the work holding a [`SlotPermit`] missed its deadline.
#[derive(Clone)]
pub struct DeadlineReport {
    shared: Arc<Shared>,
    progress: Arc<AtomicU8>,
}

impl DeadlineReport {
    /// Counts the missed deadline; while the permit is still held its work counts as
    /// overdue until it returns.
    pub fn missed(&self) {
        self.shared.metrics.timeouts.inc();
        if self
            .progress
            .compare_exchange(RUNNING, OVERDUE, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.shared.metrics.overdue.inc();
        }
    }
}

#[cfg(test)]
#[path = "fair_slots_tests.rs"]
mod tests;

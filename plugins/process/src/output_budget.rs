//! The retained output of all processes together (fair share): a session's processes may
//! hold at most `process.max_retained_output_bytes_per_session` between them, and all
//! sessions together at most `process.retained_output_budget_bytes`. Output is never
//! refused and no process ever waits for room: when a recorded chunk takes a session over
//! its cap, the oldest chunks of that session's largest holder are evicted; when it takes
//! the server over its budget, the oldest chunks of the largest holder of the session that
//! holds the most are. Eviction only leaves a gap in `seq`, as PROTOCOL §4.6 describes for
//! the per-process limits; exit and close state is never evicted.
//!
//! Finding the largest holder must be cheap, since it happens for chunks of every process:
//! holders are kept ordered by what they hold, per session and sessions among themselves,
//! so each choice is a look at the end of an ordered set, and each change an update of one
//! entry in two sets.
//!
//! Each process reports what it holds through its [`HolderAccount`] whenever that changes,
//! under its own lock; the ledger's lock is taken inside it and never the other way round.
//! Evicting from another process happens with no lock held but that process's own.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use exec_server_core::metrics::{self, Counter, Gauge};

/// Why retained output was evicted, as `/metrics` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvictionCause {
    /// The process's own `process.retained_output_bytes` / `_chunks`.
    ProcessLimit,
    /// Its session's `process.max_retained_output_bytes_per_session`.
    SessionCap,
    /// The server's `process.retained_output_budget_bytes`.
    GlobalBudget,
}

impl EvictionCause {
    const ALL: [EvictionCause; 3] = [
        EvictionCause::ProcessLimit,
        EvictionCause::SessionCap,
        EvictionCause::GlobalBudget,
    ];

    fn label(self) -> &'static str {
        match self {
            EvictionCause::ProcessLimit => "process_limit",
            EvictionCause::SessionCap => "session_cap",
            EvictionCause::GlobalBudget => "global_budget",
        }
    }

    /// Counts `chunks` chunks of `bytes` output bytes evicted for this cause.
    pub fn record(self, chunks: usize, bytes: usize) {
        let metrics = RetentionMetrics::get();
        let index = self as usize;
        metrics.evicted_chunks[index].add(chunks as u64);
        metrics.evicted_bytes[index].add(bytes as u64);
    }
}

/// A process's retained output, as the budget sees it.
pub(crate) trait EvictOldest: Send + Sync {
    /// Evicts the oldest retained chunks until at least `charge` is freed or nothing is
    /// left; returns the charge freed.
    fn evict_oldest(&self, charge: usize, cause: EvictionCause) -> usize;
}

/// The server's retained output budget and who holds what of it.
pub(crate) struct OutputBudget {
    session_cap: usize,
    budget: usize,
    ledger: Mutex<Ledger>,
    next_session: AtomicU64,
}

/// Identifies one session's share of the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SessionShare(u64);

#[derive(Default)]
struct Ledger {
    total: usize,
    next_holder: u64,
    holders: HashMap<u64, Holder>,
    sessions: HashMap<SessionShare, SessionHolders>,
    /// Every session with holders, ordered by what it holds: the largest is the last.
    sessions_by_charge: BTreeSet<(usize, SessionShare)>,
}

struct Holder {
    session: SessionShare,
    charge: usize,
    output: Weak<dyn EvictOldest>,
}

#[derive(Default)]
struct SessionHolders {
    charge: usize,
    /// The session's holders, ordered by what they hold: the largest is the last.
    by_charge: BTreeSet<(usize, u64)>,
}

/// Where to evict next, and how much.
struct Victim {
    holder: u64,
    output: Weak<dyn EvictOldest>,
    excess: usize,
    cause: EvictionCause,
}

impl OutputBudget {
    pub fn new(session_cap: usize, budget: usize) -> Arc<Self> {
        RetentionMetrics::get().budget.set(budget as i64);
        Arc::new(Self {
            session_cap,
            budget,
            ledger: Mutex::new(Ledger::default()),
            next_session: AtomicU64::new(0),
        })
    }

    /// A new session's share, empty until its processes retain output.
    pub fn new_session(&self) -> SessionShare {
        SessionShare(self.next_session.fetch_add(1, Ordering::Relaxed))
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Accounts a process's retained output, initially empty, to `session`. The account
    /// leaves the ledger when dropped.
    pub fn register(
        self: &Arc<Self>,
        session: SessionShare,
        output: Weak<dyn EvictOldest>,
    ) -> HolderAccount {
        let mut ledger = self.ledger();
        let id = ledger.next_holder;
        ledger.next_holder += 1;
        ledger.holders.insert(
            id,
            Holder {
                session,
                charge: 0,
                output,
            },
        );
        ledger
            .sessions
            .entry(session)
            .or_default()
            .by_charge
            .insert((0, id));
        HolderAccount {
            budget: Arc::clone(self),
            id,
        }
    }

    /// Evicts until `session` is within its cap and the server within its budget. Call
    /// with no process's lock held: the oldest output of any process may go.
    pub fn enforce(&self, session: SessionShare) {
        loop {
            let Some(victim) = self.ledger().victim(session, self.session_cap, self.budget) else {
                return;
            };
            match victim.output.upgrade() {
                // A pick made stale by another recording's eviction frees less or nothing;
                // that eviction is in the ledger by the time the holder's lock was ours, so
                // the next pick sees it.
                Some(output) => {
                    output.evict_oldest(victim.excess, victim.cause);
                }
                // Being dropped: its account is about to leave the ledger anyway.
                None => self.ledger().remove(victim.holder),
            }
        }
    }

    /// What all processes hold together.
    #[cfg(test)]
    fn total(&self) -> usize {
        self.ledger().total
    }
}

impl Ledger {
    fn set_charge(&mut self, id: u64, charge: usize) {
        let Some(holder) = self.holders.get_mut(&id) else {
            return;
        };
        let old = std::mem::replace(&mut holder.charge, charge);
        if old == charge {
            return;
        }
        let share = holder.session;
        let session = self.sessions.entry(share).or_default();
        session.by_charge.remove(&(old, id));
        session.by_charge.insert((charge, id));
        self.sessions_by_charge.remove(&(session.charge, share));
        session.charge = session.charge - old + charge;
        if session.charge > 0 {
            self.sessions_by_charge.insert((session.charge, share));
        }
        self.total = self.total - old + charge;
        RetentionMetrics::get()
            .retained
            .add(charge as i64 - old as i64);
    }

    fn remove(&mut self, id: u64) {
        self.set_charge(id, 0);
        let Some(holder) = self.holders.remove(&id) else {
            return;
        };
        if let Some(session) = self.sessions.get_mut(&holder.session) {
            session.by_charge.remove(&(0, id));
            if session.by_charge.is_empty() {
                self.sessions.remove(&holder.session);
            }
        }
    }

    fn victim(&self, share: SessionShare, session_cap: usize, budget: usize) -> Option<Victim> {
        let (excess, cause, session) = match self.sessions.get(&share) {
            Some(session) if session.charge > session_cap => (
                session.charge - session_cap,
                EvictionCause::SessionCap,
                session,
            ),
            _ if self.total > budget => {
                let (_, largest) = self.sessions_by_charge.last()?;
                (
                    self.total - budget,
                    EvictionCause::GlobalBudget,
                    self.sessions.get(largest)?,
                )
            }
            _ => return None,
        };
        let (_, holder) = session.by_charge.last()?;
        Some(Victim {
            holder: *holder,
            output: self.holders.get(holder)?.output.clone(),
            excess,
            cause,
        })
    }
}

/// One session's view of the budget: what its processes register with and enforce.
#[derive(Clone)]
pub(crate) struct SessionBudget {
    budget: Arc<OutputBudget>,
    share: SessionShare,
}

impl SessionBudget {
    pub fn new(budget: &Arc<OutputBudget>) -> Self {
        Self {
            budget: Arc::clone(budget),
            share: budget.new_session(),
        }
    }

    /// Accounts one more process's retained output to this session.
    pub fn register(&self, output: Weak<dyn EvictOldest>) -> HolderAccount {
        self.budget.register(self.share, output)
    }

    /// See [`OutputBudget::enforce`].
    pub fn enforce(&self) {
        self.budget.enforce(self.share);
    }
}

/// One process's entry in the budget's ledger; leaves it when dropped.
pub(crate) struct HolderAccount {
    budget: Arc<OutputBudget>,
    id: u64,
}

impl std::fmt::Debug for HolderAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HolderAccount")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl HolderAccount {
    /// Records what the process holds now. Called under the process's own lock, right
    /// after every change, so the ledger never lags behind a holder it may evict from.
    pub fn set_charge(&self, charge: usize) {
        self.budget.ledger().set_charge(self.id, charge);
    }
}

impl Drop for HolderAccount {
    fn drop(&mut self) {
        self.budget.ledger().remove(self.id);
    }
}

/// The retention series of `/metrics`.
struct RetentionMetrics {
    retained: Gauge,
    budget: Gauge,
    evicted_chunks: [Counter; 3],
    evicted_bytes: [Counter; 3],
}

impl RetentionMetrics {
    fn get() -> &'static Self {
        static METRICS: OnceLock<RetentionMetrics> = OnceLock::new();
        METRICS.get_or_init(|| RetentionMetrics {
            retained: metrics::gauge(
                "exec_server_process_retained_output_bytes",
                "Output retained for process/read by all processes, each chunk charged its bytes and its bookkeeping.",
                &[],
            ),
            budget: metrics::gauge(
                "exec_server_process_retained_output_budget_bytes",
                "process.retained_output_budget_bytes: the most output all processes may retain together.",
                &[],
            ),
            evicted_chunks: EvictionCause::ALL.map(|cause| {
                metrics::counter(
                    "exec_server_process_output_evicted_chunks_total",
                    "Retained output chunks evicted before anyone read them, by the limit that evicted them.",
                    &[("cause", cause.label())],
                )
            }),
            evicted_bytes: EvictionCause::ALL.map(|cause| {
                metrics::counter(
                    "exec_server_process_output_evicted_bytes_total",
                    "Retained output bytes evicted before anyone read them, by the limit that evicted them.",
                    &[("cause", cause.label())],
                )
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder that keeps a list of chunk charges, oldest first.
    struct FakeOutput {
        chunks: Mutex<std::collections::VecDeque<usize>>,
        account: OnceLock<HolderAccount>,
        budget: Arc<OutputBudget>,
        session: SessionShare,
    }

    impl FakeOutput {
        fn new(budget: &Arc<OutputBudget>, session: SessionShare) -> Arc<Self> {
            let output = Arc::new(Self {
                chunks: Mutex::new(Default::default()),
                account: OnceLock::new(),
                budget: Arc::clone(budget),
                session,
            });
            let weak: Weak<dyn EvictOldest> = Arc::downgrade(&output) as _;
            let _ = output.account.set(budget.register(session, weak));
            output
        }

        fn push(&self, charge: usize) {
            {
                let mut chunks = self.chunks.lock().unwrap();
                chunks.push_back(charge);
                self.account().set_charge(chunks.iter().sum());
            }
            self.budget.enforce(self.session);
        }

        fn account(&self) -> &HolderAccount {
            self.account.get().unwrap()
        }

        fn held(&self) -> Vec<usize> {
            self.chunks.lock().unwrap().iter().copied().collect()
        }
    }

    impl EvictOldest for FakeOutput {
        fn evict_oldest(&self, charge: usize, _cause: EvictionCause) -> usize {
            let mut chunks = self.chunks.lock().unwrap();
            let mut freed = 0;
            while freed < charge {
                let Some(oldest) = chunks.pop_front() else {
                    break;
                };
                freed += oldest;
            }
            self.account().set_charge(chunks.iter().sum());
            freed
        }
    }

    #[test]
    fn a_session_over_its_cap_loses_the_oldest_output_of_its_largest_holder() {
        let budget = OutputBudget::new(100, 1_000);
        let session = budget.new_session();
        let other = budget.new_session();
        let small = FakeOutput::new(&budget, session);
        let large = FakeOutput::new(&budget, session);
        let elsewhere = FakeOutput::new(&budget, other);
        elsewhere.push(90);
        small.push(10);
        for _ in 0..4 {
            large.push(20);
        }
        assert_eq!(budget.total(), 180);
        // 10 + 100 = 110 > 100: the largest holder's oldest chunk goes.
        large.push(20);
        assert_eq!(large.held(), [20, 20, 20, 20]);
        assert_eq!(small.held(), [10]);
        assert_eq!(elsewhere.held(), [90], "another session is not touched");
        assert_eq!(budget.total(), 180);
    }

    #[test]
    fn over_the_budget_the_session_that_holds_the_most_pays_first() {
        let budget = OutputBudget::new(1_000, 100);
        let (a, b) = (budget.new_session(), budget.new_session());
        // Session a holds 60 in one process; session b 35 spread over many.
        let big_process = FakeOutput::new(&budget, a);
        big_process.push(60);
        let spread: Vec<_> = (0..7).map(|_| FakeOutput::new(&budget, b)).collect();
        for output in &spread {
            output.push(5);
        }
        // b's next chunk takes the server to 105: a holds most, so a's largest pays,
        // although b caused it.
        spread[0].push(10);
        assert_eq!(big_process.held(), Vec::<usize>::new());
        assert_eq!(budget.total(), 45);
        assert!(spread.iter().all(|o| !o.held().is_empty()));
    }

    #[test]
    fn dropped_holders_leave_the_ledger() {
        let budget = OutputBudget::new(1_000, 1_000);
        let session = budget.new_session();
        let output = FakeOutput::new(&budget, session);
        output.push(300);
        assert_eq!(budget.total(), 300);
        drop(output);
        assert_eq!(budget.total(), 0);
        assert!(budget.ledger().sessions.is_empty());
        assert!(budget.ledger().sessions_by_charge.is_empty());
    }
}

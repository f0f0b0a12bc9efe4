//! A resource every session draws on, shared out so that no client takes what the others
//! need: file descriptors ([`crate::descriptors`]), inotify watches (the fs plugin), …
//! Each consumer charges the budget *before* it takes the resource and holds the returned
//! [`BudgetLease`] for as long as it keeps it; dropping the lease gives it back.
//!
//! * every live session is guaranteed `min(guarantee cap, capacity / (2 × live sessions))`
//!   units that nobody else may take: a charge is refused when it would leave less free
//!   than the unused guarantees of the *other* live sessions; a session is guaranteed at
//!   most what was free when it started, so a client opening more sessions never eats
//!   into the guarantee of a session started before;
//! * one session never holds more than its maximum percentage of the capacity.
//!
//! Charges that belong to no session take only what is left outside every live session's
//! guarantee. The session registry makes sessions live and ends them in every budget
//! ([`session_started`], [`session_ended`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use exec_server_proto::RpcError;

use crate::metrics::{self, Counter, Gauge};
use crate::sparse_map::shrink_when_sparse;

/// The limits in force.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Units clients may be charged for; `u64::MAX` for no limit.
    pub capacity: u64,
    /// The most one live session is guaranteed.
    pub guarantee_cap: u64,
    /// The most one session may hold, in percent of the capacity (clamped to 1–100).
    pub max_percent: u64,
}

impl Limits {
    /// The most one session may hold.
    fn session_max(&self) -> u64 {
        if self.capacity == u64::MAX {
            return u64::MAX;
        }
        self.capacity * self.max_percent.clamp(1, 100) / 100
    }

    /// What each of `live` sessions is guaranteed.
    pub(crate) fn guarantee(&self, live: u64) -> u64 {
        let fair = self.capacity / 2 / live.max(1);
        self.guarantee_cap.min(fair)
    }
}

/// How a budget names itself: in refusals and in `/metrics`.
#[derive(Debug)]
pub struct BudgetNames {
    /// Configuration keys named by refusals: the guarantee's and the maximum's.
    pub guarantee_key: &'static str,
    pub max_key: &'static str,
    /// The refusal, from what was asked for, the limit and its key.
    pub refusal: fn(&str, u64, &str) -> RpcError,
    /// Metric names and help: units charged, the capacity, refusals (labelled `reason`).
    pub in_use: (&'static str, &'static str),
    pub capacity: (&'static str, &'static str),
    pub refusals: (&'static str, &'static str),
}

/// One shared budget. Create it once (a `static` behind a `OnceLock`) and [`register`] it
/// before sessions start.
pub struct FairBudget {
    names: &'static BudgetNames,
    state: Mutex<State>,
    metrics: BudgetMetrics,
}

impl std::fmt::Debug for FairBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairBudget")
            .field("max_key", &self.names.max_key)
            .finish_non_exhaustive()
    }
}

/// Every budget sessions are live in.
static BUDGETS: Mutex<Vec<&'static FairBudget>> = Mutex::new(Vec::new());

/// Makes `budget` see sessions start and end from now on.
pub fn register(budget: &'static FairBudget) {
    let mut budgets = BUDGETS.lock().unwrap_or_else(|e| e.into_inner());
    if !budgets.iter().any(|known| std::ptr::eq(*known, budget)) {
        budgets.push(budget);
    }
}

fn budgets() -> Vec<&'static FairBudget> {
    BUDGETS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Counts `session` as live in every budget: it is guaranteed its share.
pub fn session_started(session: &str) {
    for budget in budgets() {
        budget.lock().start(session);
    }
}

/// `session` ended: no budget guarantees it anything any more; what its resources still
/// hold stays charged to it until they are given back.
pub fn session_ended(session: &str) {
    for budget in budgets() {
        budget.lock().end(session);
    }
}

struct BudgetMetrics {
    in_use: Gauge,
    capacity: Gauge,
    refused_session_max: Counter,
    refused_guarantees: Counter,
}

impl FairBudget {
    pub fn new(names: &'static BudgetNames, limits: Limits) -> Self {
        let refused =
            |reason| metrics::counter(names.refusals.0, names.refusals.1, &[("reason", reason)]);
        let metrics = BudgetMetrics {
            in_use: metrics::gauge(names.in_use.0, names.in_use.1, &[]),
            capacity: metrics::gauge(names.capacity.0, names.capacity.1, &[]),
            refused_session_max: refused("session_max"),
            refused_guarantees: refused("guarantees"),
        };
        metrics
            .capacity
            .set(limits.capacity.min(i64::MAX as u64) as i64);
        Self {
            names,
            state: Mutex::new(State::new(limits)),
            metrics,
        }
    }

    /// Replaces the limits (at start-up, from the configuration).
    pub fn set_limits(&self, limits: Limits) {
        self.lock().set_limits(limits);
        self.metrics
            .capacity
            .set(limits.capacity.min(i64::MAX as u64) as i64);
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.lock().limits
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is one call: a panic cannot leave the counts half changed.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Charges `amount` units to `session` (none: an unowned charge) for `what`, or
    /// refuses with the budget's refusal when that would take it past its share.
    pub fn charge(
        &'static self,
        session: Option<&str>,
        amount: u64,
        what: &str,
    ) -> Result<BudgetLease, RpcError> {
        self.try_charge(session, amount).map_err(|refusal| {
            let (counter, limit, key) = match refusal {
                Refusal::SessionMax(limit) => {
                    (&self.metrics.refused_session_max, limit, self.names.max_key)
                }
                Refusal::Guarantees(limit) => (
                    &self.metrics.refused_guarantees,
                    limit,
                    self.names.guarantee_key,
                ),
            };
            counter.inc();
            tracing::debug!(session, amount, what, limit, key, "shared budget reached");
            (self.names.refusal)(what, limit, key)
        })
    }

    /// [`Self::charge`] without a word: a refusal is neither counted nor logged.
    fn try_charge(
        &'static self,
        session: Option<&str>,
        amount: u64,
    ) -> Result<BudgetLease, Refusal> {
        let mut state = self.lock();
        let owner = session.map(|id| state.key(id));
        state.charge(owner.as_deref(), amount)?;
        drop(state);
        self.metrics.in_use.add(amount as i64);
        Ok(BudgetLease {
            budget: self,
            owner,
            amount,
        })
    }

    /// Units charged to `session` now.
    pub fn held_by(&self, session: &str) -> u64 {
        self.lock()
            .shares
            .get(session)
            .map_or(0, |share| share.held)
    }

    fn release(&self, owner: Option<&Arc<str>>, amount: u64) {
        let mut state = self.lock();
        state.used = state.used.saturating_sub(amount);
        if let Some(owner) = owner {
            if state.shares.contains_key(&**owner) {
                state.update(owner, |share| {
                    share.held = share.held.saturating_sub(amount)
                });
            }
        }
        drop(state);
        self.metrics.in_use.add(-(amount as i64));
    }

    #[cfg(test)]
    pub(crate) fn has_share(&self, session: &str) -> bool {
        self.lock().shares.contains_key(session)
    }
}

/// The counts behind one budget. Every question a charge asks is answered in constant
/// time: the number of live sessions and the sum of their unused guarantees are kept up
/// to date as shares change, and the sum is recounted only when the fair share itself
/// changes (a session starts or ends while the capacity, not the cap, sets the share).
pub(crate) struct State {
    limits: Limits,
    /// Units charged, to sessions and unowned together.
    used: u64,
    shares: HashMap<Arc<str>, Share>,
    /// Live sessions.
    live: u64,
    /// What each live session is guaranteed at most now: `limits.guarantee(live)`.
    fair: u64,
    /// The unused guarantees of all live sessions, summed ([`State::unused`]).
    unused: u64,
}

#[derive(Default)]
struct Share {
    held: u64,
    /// Between [`session_started`] and [`session_ended`]: guaranteed its share.
    live: bool,
    /// The most this session can ever be guaranteed: what was free for it when it started
    /// ([`State::start`]). A session that starts when the others' guarantees and what the
    /// hogs hold already fill the budget is guaranteed only what is left, so a client
    /// opening more sessions never eats into the guarantee of a session started before.
    reserved: u64,
}

/// Which limit refused a charge, with its value.
pub(crate) enum Refusal {
    SessionMax(u64),
    Guarantees(u64),
}

impl State {
    fn new(limits: Limits) -> Self {
        Self {
            limits,
            used: 0,
            shares: HashMap::new(),
            live: 0,
            fair: limits.guarantee(0),
            unused: 0,
        }
    }

    fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
        self.fair = limits.guarantee(self.live);
        self.recount_unused();
    }

    /// The shared key of `id`, so that leases need not copy the id.
    fn key(&mut self, id: &str) -> Arc<str> {
        match self.shares.get_key_value(id) {
            Some((key, _)) => Arc::clone(key),
            None => {
                let key: Arc<str> = Arc::from(id);
                // Charged after its end (a helper still on its way): guaranteed nothing.
                self.shares.insert(Arc::clone(&key), Share::default());
                key
            }
        }
    }

    /// Changes the share of `id` (made if missing) and keeps the counts true; a share
    /// that holds nothing and is not live is forgotten.
    fn update(&mut self, id: &str, change: impl FnOnce(&mut Share)) {
        if !self.shares.contains_key(id) {
            self.shares.insert(Arc::from(id), Share::default());
        }
        let share = self.shares.get_mut(id).expect("inserted above");
        let was_live = share.live;
        let before = unused_of(share, self.fair);
        change(share);
        let (live, after, gone) = (share.live, unused_of(share, self.fair), share.held == 0);
        if gone && !live {
            self.shares.remove(id);
            shrink_when_sparse(&mut self.shares);
        }
        self.unused = self.unused - before + after;
        if live != was_live {
            self.live = if live { self.live + 1 } else { self.live - 1 };
            let fair = self.limits.guarantee(self.live);
            if fair != self.fair {
                self.fair = fair;
                self.recount_unused();
            }
        }
    }

    /// Sums the unused guarantees again, after the fair share changed.
    fn recount_unused(&mut self) {
        let fair = self.fair;
        self.unused = self
            .shares
            .values()
            .map(|share| unused_of(share, fair))
            .sum();
    }

    /// Charges `amount` to `owner` (none: unowned) when [`Self::admit`] lets it.
    fn charge(&mut self, owner: Option<&str>, amount: u64) -> Result<(), Refusal> {
        let admitted = self.admit(owner, amount);
        if admitted.is_ok() {
            self.used += amount;
        }
        if let Some(owner) = owner {
            // Also forgets, on a refusal, the share `key` made for a session that holds
            // nothing.
            let charged = if admitted.is_ok() { amount } else { 0 };
            self.update(owner, |share| share.held += charged);
        }
        admitted
    }

    /// Makes `id` live, guaranteed at most what is free for it now.
    fn start(&mut self, id: &str) {
        self.update(id, |share| share.live = true);
        let kept = self.kept_for_others(Some(id));
        let free = self
            .limits
            .capacity
            .saturating_sub(self.used.saturating_add(kept));
        // A ceiling, not the fair share of the moment: when sessions leave, the fair
        // share grows back up to what was free.
        let reserved = self.limits.guarantee_cap.min(free);
        self.update(id, |share| share.reserved = reserved);
    }

    /// `id` ended: it is guaranteed nothing any more.
    fn end(&mut self, id: &str) {
        if self.shares.contains_key(id) {
            self.update(id, |share| share.live = false);
        }
    }

    /// What `share` is guaranteed now: the fair share of the live sessions, at most what it
    /// reserved when it started.
    fn guarantee_of(&self, share: &Share) -> u64 {
        self.fair.min(share.reserved)
    }

    /// The unused guarantees of the live sessions other than `owner`.
    fn kept_for_others(&self, owner: Option<&str>) -> u64 {
        let own = owner
            .and_then(|id| self.shares.get(id))
            .map_or(0, |share| unused_of(share, self.fair));
        self.unused - own
    }

    /// Whether `amount` more for `owner` keeps it within its maximum and leaves free the
    /// unused guarantee of every other live session. Within its own guarantee a session
    /// only needs the room itself.
    fn admit(&self, owner: Option<&str>, amount: u64) -> Result<(), Refusal> {
        let budget = self.limits;
        if budget.capacity == u64::MAX {
            return Ok(());
        }
        let own = owner.and_then(|id| self.shares.get(id));
        let held = own.map_or(0, |share| share.held);
        let session_max = budget.session_max();
        if owner.is_some() && held.saturating_add(amount) > session_max {
            return Err(Refusal::SessionMax(session_max));
        }
        let fits = self.used.saturating_add(amount) <= budget.capacity;
        if fits && own.is_some_and(|share| held.saturating_add(amount) <= self.guarantee_of(share))
        {
            return Ok(());
        }
        if self
            .used
            .saturating_add(amount)
            .saturating_add(self.kept_for_others(owner))
            > budget.capacity
        {
            return Err(Refusal::Guarantees(self.fair));
        }
        Ok(())
    }
}

/// The part of its guarantee a share does not use, when the fair share is `fair`: nothing
/// for a session that is not live.
fn unused_of(share: &Share, fair: u64) -> u64 {
    if !share.live {
        return 0;
    }
    fair.min(share.reserved).saturating_sub(share.held)
}

/// Units charged to a [`FairBudget`]; given back when dropped. Hold it exactly as long as
/// what it stands for is held.
pub struct BudgetLease {
    budget: &'static FairBudget,
    owner: Option<Arc<str>>,
    amount: u64,
}

impl std::fmt::Debug for BudgetLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetLease")
            .field("owner", &self.owner)
            .field("amount", &self.amount)
            .finish()
    }
}

impl BudgetLease {
    /// Units this lease holds.
    pub fn amount(&self) -> u64 {
        self.amount
    }

    /// The session charged, if any.
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    /// Gives back all but `amount` (some of what was charged for was let go of, like a
    /// child's ends of its pipes once it is spawned). Never grows the lease.
    pub fn shrink_to(&mut self, amount: u64) {
        if amount < self.amount {
            self.budget
                .release(self.owner.as_ref(), self.amount - amount);
            self.amount = amount;
        }
    }
}

impl BudgetLease {
    /// Charges what this lease holds to `session` instead of its owner now, when the
    /// budget admits it there (a connection's socket once the connection has a session:
    /// it then counts within that session's guarantee). `false`: it did not, and nothing
    /// changed. Not a client's request, so a refusal is not counted as one.
    pub fn move_to(&mut self, session: &str) -> bool {
        if self.owner.as_deref() == Some(session) {
            return true;
        }
        match self.budget.try_charge(Some(session), self.amount) {
            Ok(moved) => {
                *self = moved;
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for BudgetLease {
    fn drop(&mut self) {
        if self.amount > 0 {
            self.budget.release(self.owner.as_ref(), self.amount);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(capacity: u64, guarantee_cap: u64, max_percent: u64) -> State {
        State::new(Limits {
            capacity,
            guarantee_cap,
            max_percent,
        })
    }

    fn take(state: &mut State, owner: &str, amount: u64) -> Result<(), Refusal> {
        let key = state.key(owner);
        state.charge(Some(&key), amount)
    }

    #[test]
    fn one_session_takes_at_most_its_maximum() {
        let mut state = state(1000, 1000, 50);
        assert!(take(&mut state, "hog", 500).is_ok());
        assert!(matches!(
            take(&mut state, "hog", 1),
            Err(Refusal::SessionMax(500))
        ));
    }

    #[test]
    fn the_others_keep_their_guarantee_whatever_the_hogs_take() {
        let mut state = state(1000, 1000, 50);
        state.start("victim");
        // Six hog sessions and the victim: each is guaranteed 1000 / 2 / 7 = 71.
        let hogs: Vec<String> = (0..6).map(|i| format!("hog{i}")).collect();
        for hog in &hogs {
            state.start(hog);
        }
        for hog in &hogs {
            while take(&mut state, hog, 1).is_ok() {}
        }
        assert_eq!(state.limits.guarantee(7), 71);
        let free = state.limits.capacity - state.used;
        assert!(free >= 71, "the victim's guarantee is left: {free}");
        for _ in 0..71 {
            assert!(take(&mut state, "victim", 1).is_ok());
        }
        // Unowned charges take nothing that a session is guaranteed.
        let mut state = state_with_room();
        let free = state.limits.capacity - state.used;
        state.start("late");
        assert!(state.guarantee_of(&state.shares["late"]) > 0);
        assert!(state.admit(None, free).is_err());
    }

    /// A victim and one hog that filled all it may, with room left over.
    fn state_with_room() -> State {
        let mut state = state(1000, 1000, 30);
        state.start("victim");
        state.start("hog");
        while take(&mut state, "hog", 1).is_ok() {}
        state
    }

    /// Sessions a hog opens after filling what it may take are guaranteed only what is
    /// left: the victim started before keeps its own.
    #[test]
    fn later_sessions_never_take_an_earlier_sessions_guarantee() {
        let mut state = state(960, 1024, 50);
        state.start("victim");
        for hog in ["hog0", "hog1"] {
            state.start(hog);
            while take(&mut state, hog, 1).is_ok() {}
        }
        for late in ["late0", "late1", "late2", "late3", "late4", "late5"] {
            state.start(late);
            while take(&mut state, late, 1).is_ok() {}
        }
        let guarantee = state.guarantee_of(&state.shares["victim"]);
        assert!(guarantee > 0);
        for _ in 0..guarantee {
            assert!(take(&mut state, "victim", 1).is_ok());
        }
        assert!(state.used <= state.limits.capacity);
    }

    /// What was free at its start caps a session's guarantee; the number of sessions does
    /// not keep it small once they are gone.
    #[test]
    fn a_guarantee_grows_back_when_sessions_end() {
        let mut state = state(1000, 1000, 50);
        let others: Vec<String> = (0..9).map(|i| format!("s{i}")).collect();
        for other in &others {
            state.start(other);
        }
        state.start("late");
        assert_eq!(state.guarantee_of(&state.shares["late"]), 50);
        for other in &others {
            state.end(other);
        }
        assert_eq!(state.guarantee_of(&state.shares["late"]), 500);
    }

    #[test]
    fn an_ended_session_is_guaranteed_nothing() {
        let mut state = state(1000, 1000, 100);
        state.start("gone");
        state.start("hog");
        assert!(matches!(
            take(&mut state, "hog", 800),
            Err(Refusal::Guarantees(250))
        ));
        state.end("gone");
        assert!(take(&mut state, "hog", 800).is_ok());
    }

    /// The kept counts agree with counting the shares one by one, whatever the order of
    /// starts, charges, releases and ends (so a charge never has to walk every session).
    #[test]
    fn the_kept_counts_match_a_recount_after_every_change() {
        let mut state = state(600, 40, 60);
        let ids: Vec<String> = (0..40).map(|i| format!("s{i}")).collect();
        let mut seed = 7u64;
        for round in 0..4_000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let id = &ids[(seed >> 33) as usize % ids.len()];
            match (seed >> 20) % 4 {
                0 => state.start(id),
                1 => state.end(id),
                2 => {
                    let _ = take(&mut state, id, (seed >> 40) % 9 + 1);
                }
                _ => {
                    let held = state.shares.get(id.as_str()).map_or(0, |share| share.held);
                    let give_back = held.min((seed >> 44) % 9 + 1);
                    state.used -= give_back;
                    if state.shares.contains_key(id.as_str()) {
                        state.update(id, |share| share.held -= give_back);
                    }
                }
            }
            let live = state.shares.values().filter(|share| share.live).count() as u64;
            assert_eq!(state.live, live, "round {round}");
            assert_eq!(state.fair, state.limits.guarantee(live), "round {round}");
            let unused: u64 = state
                .shares
                .values()
                .filter(|share| share.live)
                .map(|share| state.guarantee_of(share).saturating_sub(share.held))
                .sum();
            assert_eq!(state.unused, unused, "round {round}");
            assert!(
                state
                    .shares
                    .values()
                    .all(|share| share.live || share.held > 0),
                "idle ended shares are forgotten (round {round})"
            );
        }
    }

    /// The table gives back its room once the sessions that filled it are gone.
    #[test]
    fn the_table_shrinks_when_sessions_leave() {
        let mut state = state(1_000_000, 64, 50);
        let ids: Vec<String> = (0..10_000).map(|i| format!("s{i}")).collect();
        for id in &ids {
            state.start(id);
        }
        let full = state.shares.capacity();
        for id in &ids {
            state.end(id);
        }
        assert!(state.shares.is_empty());
        assert!(
            state.shares.capacity() <= 128,
            "{} of {full}",
            state.shares.capacity()
        );
    }

    /// Moving a lease (a connection's socket into its session) is not a client's charge:
    /// refused, nothing changes and no refusal is counted. Before, the move counted one
    /// more refusal in `/metrics` than any client was ever told of.
    #[test]
    fn a_refused_move_changes_nothing_and_is_not_counted() {
        static NAMES: BudgetNames = BudgetNames {
            guarantee_key: "test.guarantee",
            max_key: "test.max_percent",
            refusal: RpcError::descriptor_budget,
            in_use: ("test_move_in_use", "test"),
            capacity: ("test_move_capacity", "test"),
            refusals: ("test_move_refusals_total", "test"),
        };
        let limits = Limits {
            capacity: 10,
            guarantee_cap: 10,
            max_percent: 50,
        };
        let budget: &'static FairBudget = Box::leak(Box::new(FairBudget::new(&NAMES, limits)));
        let mut lease = budget.charge(None, 5, "a connection").unwrap();
        let held = budget.charge(Some("s"), 5, "a file").unwrap();
        let refused =
            || budget.metrics.refused_session_max.get() + budget.metrics.refused_guarantees.get();
        assert!(!lease.move_to("s"), "s would hold more than its maximum");
        assert_eq!((lease.owner(), lease.amount()), (None, 5));
        assert_eq!(budget.held_by("s"), 5);
        assert_eq!(refused(), 0);
        assert!(budget.charge(Some("s"), 1, "a file").is_err());
        assert_eq!(refused(), 1, "a client's refusal is counted");
        drop(held);
        assert!(lease.move_to("s"));
        assert_eq!((lease.owner(), budget.held_by("s")), (Some("s"), 5));
    }
}

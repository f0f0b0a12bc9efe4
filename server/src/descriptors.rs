//! One budget for every file descriptor the server holds for a client: connections,
//! processes, `fs/open` handles, fs helpers, searches. Each consumer charges the ledger
//! with the descriptors it is about to open, *before* opening them, and holds the
//! returned [`DescriptorLease`] for as long as they stay open; dropping the lease gives
//! them back.
//!
//! The capacity is the soft `RLIMIT_NOFILE` (raised to the hard limit at start-up, see
//! [`crate::hygiene::raise_open_file_limit`]) minus `descriptors.reserve`, kept for the
//! server's own work (listeners, the runtime, logs, configuration and `/proc` reads). It is
//! shared out so that no client can take what the others need:
//!
//! * every live session is guaranteed `min(descriptors.session_guarantee, capacity / (2 ×
//!   live sessions))` descriptors that nobody else may take: a charge is refused when it
//!   would leave less free than the unused guarantees of the *other* live sessions;
//! * one session never holds more than `descriptors.session_max_percent` of the capacity.
//!
//! Charges that belong to no session (an accepted connection before its `initialize`) take
//! only what is left outside every live session's guarantee. Refusals are -32600 naming the
//! limit and its key ([`RpcError::descriptor_budget`]).
//!
//! The ledger is process-wide, as the descriptor table is: [`crate::descriptor_config`] sets it up when
//! the server starts; until then (unit tests, embedding) it uses the defaults under the
//! current limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use exec_server_proto::RpcError;
use serde::{Deserialize, Serialize};

use crate::hygiene::open_file_limit;
use crate::metrics::{self, Counter, Gauge};

const GUARANTEE_KEY: &str = "descriptors.session_guarantee";
pub(crate) const MAX_PERCENT_KEY: &str = "descriptors.session_max_percent";

/// The `[descriptors]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DescriptorConfig {
    /// Descriptors below the open-file limit that no client may be charged for: the
    /// server's own (listeners, runtime, logs, reads of configuration and `/proc`). At most
    /// half the limit.
    pub reserve: usize,
    /// The most one live session is guaranteed; the guarantee in force is the smaller of
    /// this and `capacity / (2 × live sessions)`.
    pub session_guarantee: usize,
    /// The most one session may hold, in percent of the capacity (1–100).
    pub session_max_percent: usize,
}

impl Default for DescriptorConfig {
    fn default() -> Self {
        Self {
            // The server's own descriptors at rest are about 30 (listeners, the runtime's
            // epoll and eventfds, stdio, the inotify instance, the spawner); the rest is
            // for short-lived opens nobody is charged for (configuration, `/proc`, TLS
            // material, metrics).
            reserve: 64,
            // With the recommended 65,536 descriptors: 256 processes' worth of pipes for
            // every one of up to 127 sessions, and a smaller share for each beyond.
            session_guarantee: 1_024,
            session_max_percent: 50,
        }
    }
}

/// Sets the ledger up from `config` under the current soft `RLIMIT_NOFILE` (see
/// [`crate::descriptor_config::configure`]).
pub(crate) fn set_config(config: &DescriptorConfig) {
    let budget = Budget::new(open_file_limit(), config);
    tracing::debug!(
        capacity = budget.capacity,
        guarantee = budget.guarantee_cap,
        max_percent = budget.max_percent,
        "descriptor budget"
    );
    ledger().lock().budget = budget;
    ledger().metrics.capacity.set(budget.capacity as i64);
}

/// Charges `amount` descriptors to `session` (a session id) for `what` ("an fs/open
/// handle"), or refuses with -32600 when that would take the session past its share.
pub fn charge(session: &str, amount: u64, what: &str) -> Result<DescriptorLease, RpcError> {
    ledger().charge(Some(session), amount, what)
}

/// Charges `amount` descriptors that belong to no session yet (an accepted connection):
/// they may use only what no live session is guaranteed.
pub fn charge_unowned(amount: u64, what: &str) -> Result<DescriptorLease, RpcError> {
    ledger().charge(None, amount, what)
}

/// Counts `session` as live from now on: it is guaranteed its share.
pub fn session_started(session: &str) {
    ledger().lock().start(session);
}

/// `session` ended: it is no longer guaranteed anything; what its resources still hold
/// stays charged to it until they close.
pub fn session_ended(session: &str) {
    let mut state = ledger().lock();
    if let Some(share) = state.shares.get_mut(session) {
        share.live = false;
        if share.held == 0 {
            state.shares.remove(session);
        }
    }
}

/// Descriptors charged to `session` now.
pub fn held_by(session: &str) -> u64 {
    ledger()
        .lock()
        .shares
        .get(session)
        .map_or(0, |share| share.held)
}

/// The limits in force, from the open-file limit and the configuration.
#[derive(Debug, Clone, Copy)]
struct Budget {
    /// Descriptors clients may be charged for; `u64::MAX` when the limit is unlimited.
    capacity: u64,
    guarantee_cap: u64,
    max_percent: u64,
}

impl Budget {
    fn new(limit: Option<u64>, config: &DescriptorConfig) -> Self {
        let capacity = limit.map_or(u64::MAX, |limit| {
            limit - (config.reserve as u64).min(limit / 2)
        });
        Self {
            capacity,
            guarantee_cap: config.session_guarantee as u64,
            max_percent: (config.session_max_percent as u64).clamp(1, 100),
        }
    }

    /// The most one session may hold.
    fn session_max(&self) -> u64 {
        if self.capacity == u64::MAX {
            return u64::MAX;
        }
        self.capacity * self.max_percent / 100
    }

    /// What each of `live` sessions is guaranteed.
    fn guarantee(&self, live: u64) -> u64 {
        let fair = self.capacity / 2 / live.max(1);
        self.guarantee_cap.min(fair)
    }
}

struct Ledger {
    state: Mutex<State>,
    metrics: LedgerMetrics,
}

struct State {
    budget: Budget,
    /// Descriptors charged, to sessions and unowned together.
    used: u64,
    shares: HashMap<Arc<str>, Share>,
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

struct LedgerMetrics {
    in_use: Gauge,
    capacity: Gauge,
    refused_session_max: Counter,
    refused_guarantees: Counter,
}

fn ledger() -> &'static Ledger {
    static LEDGER: OnceLock<Ledger> = OnceLock::new();
    LEDGER.get_or_init(|| {
        let budget = Budget::new(open_file_limit(), &DescriptorConfig::default());
        let metrics = LedgerMetrics::new();
        metrics
            .capacity
            .set(budget.capacity.min(i64::MAX as u64) as i64);
        Ledger {
            state: Mutex::new(State {
                budget,
                used: 0,
                shares: HashMap::new(),
            }),
            metrics,
        }
    })
}

impl LedgerMetrics {
    fn new() -> Self {
        let refused = |reason| {
            metrics::counter(
                "exec_server_descriptor_refusals_total",
                "Charges to the descriptor budget refused, by the limit that refused them.",
                &[("reason", reason)],
            )
        };
        Self {
            in_use: metrics::gauge(
                "exec_server_descriptors_charged",
                "File descriptors charged to the budget by sessions and connections.",
                &[],
            ),
            capacity: metrics::gauge(
                "exec_server_descriptor_capacity",
                "File descriptors clients may be charged for: the open-file limit minus descriptors.reserve.",
                &[],
            ),
            refused_session_max: refused("session_max"),
            refused_guarantees: refused("guarantees"),
        }
    }
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is one call: a panic cannot leave the counts half changed.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn charge(
        &'static self,
        session: Option<&str>,
        amount: u64,
        what: &str,
    ) -> Result<DescriptorLease, RpcError> {
        let mut state = self.lock();
        let owner = session.map(|id| state.key(id));
        if let Err(refusal) = state.admit(owner.as_deref(), amount) {
            drop(state);
            let (counter, limit, key) = match refusal {
                Refusal::SessionMax(limit) => {
                    (&self.metrics.refused_session_max, limit, MAX_PERCENT_KEY)
                }
                Refusal::Guarantees(limit) => {
                    (&self.metrics.refused_guarantees, limit, GUARANTEE_KEY)
                }
            };
            counter.inc();
            tracing::debug!(
                session,
                amount,
                what,
                limit,
                key,
                "descriptor budget reached"
            );
            return Err(RpcError::descriptor_budget(what, limit, key));
        }
        state.used += amount;
        if let Some(owner) = &owner {
            state.share(owner).held += amount;
        }
        drop(state);
        self.metrics.in_use.add(amount as i64);
        Ok(DescriptorLease { owner, amount })
    }

    fn release(&self, owner: Option<&Arc<str>>, amount: u64) {
        let mut state = self.lock();
        state.used = state.used.saturating_sub(amount);
        if let Some(owner) = owner {
            if let Some(share) = state.shares.get_mut(&**owner) {
                share.held = share.held.saturating_sub(amount);
                if share.held == 0 && !share.live {
                    state.shares.remove(&**owner);
                }
            }
        }
        drop(state);
        self.metrics.in_use.add(-(amount as i64));
    }
}

/// Which limit refused a charge, with its value.
enum Refusal {
    SessionMax(u64),
    Guarantees(u64),
}

impl State {
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

    fn share(&mut self, id: &str) -> &mut Share {
        if !self.shares.contains_key(id) {
            self.shares.insert(Arc::from(id), Share::default());
        }
        self.shares.get_mut(id).expect("inserted above")
    }

    /// Makes `id` live, guaranteed at most what is free for it now.
    fn start(&mut self, id: &str) {
        self.share(id).live = true;
        let kept = self.kept_for_others(Some(id));
        let free = self
            .budget
            .capacity
            .saturating_sub(self.used.saturating_add(kept));
        // A ceiling, not the fair share of the moment: when sessions leave, the fair
        // share grows back up to what was free.
        self.share(id).reserved = self.budget.guarantee_cap.min(free);
    }

    fn live_sessions(&self) -> u64 {
        self.shares.values().filter(|share| share.live).count() as u64
    }

    /// What `share` is guaranteed now: the fair share of the live sessions, at most what it
    /// reserved when it started.
    fn guarantee_of(&self, share: &Share) -> u64 {
        self.budget
            .guarantee(self.live_sessions())
            .min(share.reserved)
    }

    /// The unused guarantees of the live sessions other than `owner`.
    fn kept_for_others(&self, owner: Option<&str>) -> u64 {
        self.shares
            .iter()
            .filter(|(id, share)| share.live && Some(&***id) != owner)
            .map(|(_, share)| self.guarantee_of(share).saturating_sub(share.held))
            .sum()
    }

    /// Whether `amount` more for `owner` keeps it within its maximum and leaves free the
    /// unused guarantee of every other live session. Within its own guarantee a session
    /// only needs the room itself.
    fn admit(&self, owner: Option<&str>, amount: u64) -> Result<(), Refusal> {
        let budget = self.budget;
        if budget.capacity == u64::MAX {
            return Ok(());
        }
        let held = owner
            .and_then(|id| self.shares.get(id))
            .map_or(0, |share| share.held);
        let session_max = budget.session_max();
        if owner.is_some() && held.saturating_add(amount) > session_max {
            return Err(Refusal::SessionMax(session_max));
        }
        let fits = self.used.saturating_add(amount) <= budget.capacity;
        let own = owner.and_then(|id| self.shares.get(id));
        if fits && own.is_some_and(|share| held.saturating_add(amount) <= self.guarantee_of(share))
        {
            return Ok(());
        }
        let guarantee = budget.guarantee(self.live_sessions());
        let kept_for_others = self.kept_for_others(owner);
        if self
            .used
            .saturating_add(amount)
            .saturating_add(kept_for_others)
            > budget.capacity
        {
            return Err(Refusal::Guarantees(guarantee));
        }
        Ok(())
    }
}

/// Descriptors charged to the budget; given back when dropped. Hold it exactly as long as
/// the descriptors it stands for are open.
pub struct DescriptorLease {
    owner: Option<Arc<str>>,
    amount: u64,
}

impl std::fmt::Debug for DescriptorLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DescriptorLease")
            .field("owner", &self.owner)
            .field("amount", &self.amount)
            .finish()
    }
}

impl DescriptorLease {
    /// Descriptors this lease holds.
    pub fn amount(&self) -> u64 {
        self.amount
    }

    /// Gives back all but `amount` (some of the descriptors charged for were closed, like
    /// a child's ends of its pipes once it is spawned). Never grows the lease.
    pub fn shrink_to(&mut self, amount: u64) {
        if amount < self.amount {
            ledger().release(self.owner.as_ref(), self.amount - amount);
            self.amount = amount;
        }
    }
}

impl Drop for DescriptorLease {
    fn drop(&mut self) {
        if self.amount > 0 {
            ledger().release(self.owner.as_ref(), self.amount);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(capacity: u64, guarantee_cap: u64, max_percent: u64) -> State {
        State {
            budget: Budget {
                capacity,
                guarantee_cap,
                max_percent,
            },
            used: 0,
            shares: HashMap::new(),
        }
    }

    fn take(state: &mut State, owner: &str, amount: u64) -> Result<(), Refusal> {
        let key = state.key(owner);
        state.admit(Some(&key), amount)?;
        state.used += amount;
        state.share(owner).held += amount;
        Ok(())
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
        assert_eq!(state.budget.guarantee(7), 71);
        let free = state.budget.capacity - state.used;
        assert!(free >= 71, "the victim's guarantee is left: {free}");
        for _ in 0..71 {
            assert!(take(&mut state, "victim", 1).is_ok());
        }
        // Unowned charges take nothing that a session is guaranteed.
        let mut state = state_with_room();
        let free = state.budget.capacity - state.used;
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
        assert!(state.used <= state.budget.capacity);
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
            state.shares.get_mut(other.as_str()).unwrap().live = false;
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
        state.share("gone").live = false;
        assert!(take(&mut state, "hog", 800).is_ok());
    }

    #[test]
    fn leases_give_back_what_they_hold() {
        let session = "descriptors-unit-test-session";
        session_started(session);
        let mut lease = charge(session, 5, "a test").unwrap();
        assert_eq!(held_by(session), 5);
        lease.shrink_to(2);
        assert_eq!(held_by(session), 2);
        drop(lease);
        assert_eq!(held_by(session), 0);
        session_ended(session);
        assert!(!ledger().lock().shares.contains_key(session));
    }

    #[test]
    fn the_reserve_is_at_most_half_the_limit() {
        let config = DescriptorConfig {
            reserve: 10_000,
            ..DescriptorConfig::default()
        };
        assert_eq!(Budget::new(Some(1024), &config).capacity, 512);
        assert_eq!(Budget::new(None, &config).capacity, u64::MAX);
        let budget = Budget::new(Some(1024), &DescriptorConfig::default());
        assert_eq!(budget.capacity, 960);
        assert_eq!(budget.session_max(), 480);
        assert_eq!(budget.guarantee(1), 480);
        assert_eq!(budget.guarantee(10), 48);
    }
}

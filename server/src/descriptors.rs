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
//! only what is left outside every live session's guarantee. A connection's socket is
//! charged to its session once it attaches ([`ConnectionCharge`]), so it counts within
//! that session's guarantee. Refusals are -32600 naming the
//! limit and its key ([`RpcError::descriptor_budget`]).
//!
//! The ledger is process-wide, as the descriptor table is: [`crate::descriptor_config`] sets it up when
//! the server starts; until then (unit tests, embedding) it uses the defaults under the
//! current limit.

use std::sync::{Arc, Mutex, OnceLock};

use exec_server_proto::RpcError;
use serde::{Deserialize, Serialize};

use crate::fair_budget::{BudgetLease, BudgetNames, FairBudget, Limits};
use crate::hygiene::open_file_limit;

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
    let limits = limits(open_file_limit(), config);
    tracing::debug!(
        capacity = limits.capacity,
        guarantee = limits.guarantee_cap,
        max_percent = limits.max_percent,
        "descriptor budget"
    );
    ledger().set_limits(limits);
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

/// Descriptors charged to `session` now.
pub fn held_by(session: &str) -> u64 {
    ledger().held_by(session)
}

/// The limits from the open-file limit and the configuration: the capacity is the limit
/// less `descriptors.reserve` (at most half the limit).
fn limits(limit: Option<u64>, config: &DescriptorConfig) -> Limits {
    let capacity = limit.map_or(u64::MAX, |limit| {
        limit - (config.reserve as u64).min(limit / 2)
    });
    Limits {
        capacity,
        guarantee_cap: config.session_guarantee as u64,
        max_percent: (config.session_max_percent as u64).clamp(1, 100),
    }
}

static NAMES: BudgetNames = BudgetNames {
    guarantee_key: GUARANTEE_KEY,
    max_key: MAX_PERCENT_KEY,
    refusal: RpcError::descriptor_budget,
    in_use: (
        "exec_server_descriptors_charged",
        "File descriptors charged to the budget by sessions and connections.",
    ),
    capacity: (
        "exec_server_descriptor_capacity",
        "File descriptors clients may be charged for: the open-file limit minus descriptors.reserve.",
    ),
    refusals: (
        "exec_server_descriptor_refusals_total",
        "Charges to the descriptor budget refused, by the limit that refused them.",
    ),
};

fn ledger() -> &'static FairBudget {
    static LEDGER: OnceLock<FairBudget> = OnceLock::new();
    LEDGER.get_or_init(|| {
        let limits = limits(open_file_limit(), &DescriptorConfig::default());
        FairBudget::new(&NAMES, limits)
    })
}

/// Registers the ledger with the sessions (before the first one starts; again is a no-op).
pub(crate) fn register() {
    crate::fair_budget::register(ledger());
}

/// Descriptors charged to the budget; given back when dropped. Hold it exactly as long as
/// the descriptors it stands for are open.
pub type DescriptorLease = BudgetLease;

/// An accepted connection's charge for its socket, shared by the socket (which gives it
/// back when it closes) and the connection's processor, which moves it into the session
/// the connection attaches to: a session's own connection then counts within its
/// guarantee instead of against what the sessions' guarantees leave for connections.
#[derive(Debug, Clone)]
pub struct ConnectionCharge(Arc<Mutex<DescriptorLease>>);

impl ConnectionCharge {
    pub fn new(lease: DescriptorLease) -> Self {
        Self(Arc::new(Mutex::new(lease)))
    }

    /// Charges the socket to `session` from now on; where the session has no room for
    /// it, it stays charged to no session.
    pub fn move_to(&self, session: &str) {
        let mut lease = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !lease.move_to(session) {
            tracing::debug!(
                session,
                "no room in the session's share: its connection stays charged to no session"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_give_back_what_they_hold() {
        let session = "descriptors-unit-test-session";
        register();
        crate::fair_budget::session_started(session);
        let mut lease = charge(session, 5, "a test").unwrap();
        assert_eq!(held_by(session), 5);
        lease.shrink_to(2);
        assert_eq!(held_by(session), 2);
        drop(lease);
        assert_eq!(held_by(session), 0);
        crate::fair_budget::session_ended(session);
        assert!(!ledger().has_share(session));
    }

    #[test]
    fn the_reserve_is_at_most_half_the_limit() {
        let config = DescriptorConfig {
            reserve: 10_000,
            ..DescriptorConfig::default()
        };
        assert_eq!(limits(Some(1024), &config).capacity, 512);
        assert_eq!(limits(None, &config).capacity, u64::MAX);
        let limits = limits(Some(1024), &DescriptorConfig::default());
        assert_eq!(limits.capacity, 960);
        assert_eq!(limits.guarantee(1), 480);
        assert_eq!(limits.guarantee(10), 48);
    }
}

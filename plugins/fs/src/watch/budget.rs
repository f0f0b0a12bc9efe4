//! The server's inotify watches, one budget for every session: the kernel counts watches
//! per user (`/proc/sys/fs/inotify/max_user_watches`), so sessions that each stay within
//! `fs.max_watches_per_session` could still, together, take every watch the server's user
//! has, from the other sessions and from every other program of that user (editors, build
//! tools). The budget is `fs.max_watches_total`, at most half the user's limit; it is
//! shared out as the descriptor budget is ([`FairBudget`]): every live session is
//! guaranteed its part (at most `fs.max_watches_per_session`), no session holds more than
//! half, and sessions started later never eat into an earlier session's guarantee.

use std::sync::OnceLock;

use exec_server_core::fair_budget::{self, BudgetLease, BudgetNames, FairBudget, Limits};
use exec_server_core::proto::RpcError;

use crate::config::FsConfig;

const TOTAL_KEY: &str = "fs.max_watches_total";
const SESSION_KEY: &str = "fs.max_watches_per_session";
const MAX_USER_WATCHES: &str = "/proc/sys/fs/inotify/max_user_watches";

static NAMES: BudgetNames = BudgetNames {
    guarantee_key: SESSION_KEY,
    max_key: TOTAL_KEY,
    refusal: RpcError::watch_budget,
    in_use: (
        "exec_server_watches_charged",
        "inotify watches charged to the watch budget by sessions.",
    ),
    capacity: (
        "exec_server_watch_capacity",
        "inotify watches sessions may hold: fs.max_watches_total, at most half the user's max_user_watches.",
    ),
    refusals: (
        "exec_server_watch_refusals_total",
        "Charges to the watch budget refused, by the limit that refused them.",
    ),
};

fn ledger() -> &'static FairBudget {
    static LEDGER: OnceLock<FairBudget> = OnceLock::new();
    LEDGER.get_or_init(|| FairBudget::new(&NAMES, limits(&FsConfig::default(), None)))
}

/// The budget from the configuration and the user's kernel limit, if known.
fn limits(config: &FsConfig, max_user_watches: Option<u64>) -> Limits {
    let total = config.max_watches_total as u64;
    Limits {
        capacity: max_user_watches.map_or(total, |limit| total.min(limit / 2)),
        guarantee_cap: config.max_watches_per_session as u64,
        max_percent: 50,
    }
}

/// Sets the budget up from `[fs]` and the kernel's limit; called at install, before any
/// session starts.
pub(crate) fn configure(config: &FsConfig) {
    let kernel = std::fs::read_to_string(MAX_USER_WATCHES)
        .ok()
        .and_then(|text| text.trim().parse().ok());
    let limits = limits(config, kernel);
    tracing::debug!(capacity = limits.capacity, "inotify watch budget");
    ledger().set_limits(limits);
    fair_budget::register(ledger());
}

/// Charges `amount` watches to `session` for `what`, or refuses past its share.
pub(crate) fn charge(session: &str, amount: usize, what: &str) -> Result<BudgetLease, RpcError> {
    ledger().charge(Some(session), amount as u64, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_at_most_half_the_user_s_watches() {
        let config = FsConfig {
            max_watches_total: 8192,
            ..FsConfig::default()
        };
        assert_eq!(limits(&config, Some(8192)).capacity, 4096);
        assert_eq!(limits(&config, Some(1_000_000)).capacity, 8192);
        assert_eq!(limits(&config, None).capacity, 8192);
        assert_eq!(limits(&config, None).guarantee_cap, 256);
    }
}

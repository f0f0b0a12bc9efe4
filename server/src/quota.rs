//! Per-session quotas: how many of one kind of resource (live processes, open file
//! handles, watches, searches …) one session may hold at once, so that no client takes the
//! server from the others.
//!
//! A plugin declares each quota once as a `static` [`Quota`] (its metric label, what it
//! counts, and the configuration key of its limit) and takes units with
//! [`Quota::acquire`]; the returned [`QuotaLease`] gives them back when dropped, so
//! whatever ends the resource — its normal end, an error path, the session's end — frees
//! exactly what it took. A refusal names the quota, the limit and the key to raise.
//!
//! `/metrics` shows, per quota: the units held by all sessions together
//! (`exec_server_quota_in_use`), how many sessions are at their limit
//! (`exec_server_quota_sessions_at_limit`), and the refusals
//! (`exec_server_quota_refusals_total`). Session ids are never labels.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use exec_server_proto::RpcError;

use crate::descriptors::DescriptorLease;
use crate::metrics::{self, Counter, Gauge};
use crate::Session;

/// One kind of resource a session may hold only so much of.
#[derive(Debug)]
pub struct Quota {
    /// Metric label, e.g. `processes`.
    pub name: &'static str,
    /// What is counted, for refusals: "live processes".
    pub what: &'static str,
    /// The configuration key of the limit: `process.max_processes_per_session`.
    pub key: &'static str,
}

impl Quota {
    pub const fn new(name: &'static str, what: &'static str, key: &'static str) -> Self {
        Self { name, what, key }
    }

    /// Takes `amount` units for `session` if that keeps it within `limit`; otherwise the
    /// refusal -32600 naming the quota, the limit and its key.
    pub fn acquire(
        &'static self,
        session: &Session,
        limit: usize,
        amount: usize,
    ) -> Result<QuotaLease, RpcError> {
        let ledger = ledger(session);
        let metrics = self.metrics();
        let mut used = ledger.used.lock().unwrap_or_else(|e| e.into_inner());
        let held = used.entry(self.name).or_insert(0);
        let after = held.saturating_add(amount);
        if after > limit {
            metrics.refusals.inc();
            tracing::debug!(
                session = session.id(),
                quota = self.name,
                limit,
                "session quota reached"
            );
            return Err(RpcError::quota_exceeded(self.what, limit, self.key));
        }
        let was_at_limit = *held >= limit;
        *held = after;
        metrics.in_use.add(amount as i64);
        if !was_at_limit && after >= limit {
            metrics.sessions_at_limit.inc();
        }
        Ok(QuotaLease {
            quota: self,
            ledger: Arc::clone(&ledger),
            limit,
            amount,
            descriptors: None,
        })
    }

    /// Units `session` holds now.
    pub fn used(&'static self, session: &Session) -> usize {
        let ledger = ledger(session);
        let used = ledger.used.lock().unwrap_or_else(|e| e.into_inner());
        used.get(self.name).copied().unwrap_or(0)
    }

    fn metrics(&'static self) -> Arc<QuotaMetrics> {
        static ALL: OnceLock<Mutex<HashMap<&'static str, Arc<QuotaMetrics>>>> = OnceLock::new();
        let mut all = ALL
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Arc::clone(all.entry(self.name).or_insert_with(|| {
            let labels = [("quota", self.name)];
            Arc::new(QuotaMetrics {
                in_use: metrics::gauge(
                    "exec_server_quota_in_use",
                    "Units of a per-session quota held by all sessions together.",
                    &labels,
                ),
                sessions_at_limit: metrics::gauge(
                    "exec_server_quota_sessions_at_limit",
                    "Sessions holding as much of a per-session quota as their limit allows.",
                    &labels,
                ),
                refusals: metrics::counter(
                    "exec_server_quota_refusals_total",
                    "Requests refused because their session was at a quota's limit.",
                    &labels,
                ),
            })
        }))
    }
}

struct QuotaMetrics {
    in_use: Gauge,
    sessions_at_limit: Gauge,
    refusals: Counter,
}

/// What one session holds of every quota.
#[derive(Default)]
struct Ledger {
    used: Mutex<HashMap<&'static str, usize>>,
}

fn ledger(session: &Session) -> Arc<Ledger> {
    session.extension(Ledger::default)
}

/// Units of a quota held for one resource; given back when dropped.
pub struct QuotaLease {
    quota: &'static Quota,
    ledger: Arc<Ledger>,
    limit: usize,
    amount: usize,
    /// The descriptors the resource holds, given back with its units.
    descriptors: Option<DescriptorLease>,
}

impl QuotaLease {
    /// Keeps `descriptors` charged for as long as this lease is held: the resource's
    /// descriptors close no later than its quota units are given back.
    pub fn hold_descriptors(&mut self, descriptors: DescriptorLease) {
        self.descriptors = Some(descriptors);
    }
}

impl std::fmt::Debug for QuotaLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaLease")
            .field("quota", &self.quota.name)
            .field("amount", &self.amount)
            .finish()
    }
}

impl Drop for QuotaLease {
    fn drop(&mut self) {
        let metrics = self.quota.metrics();
        let mut used = self.ledger.used.lock().unwrap_or_else(|e| e.into_inner());
        let held = used.entry(self.quota.name).or_insert(0);
        let was_at_limit = *held >= self.limit;
        *held = held.saturating_sub(self.amount);
        metrics.in_use.add(-(self.amount as i64));
        if was_at_limit && *held < self.limit {
            metrics.sessions_at_limit.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::outbound_queue;
    use crate::session::SessionRegistry;

    static WIDGETS: Quota = Quota::new("test_widgets", "widgets", "test.max_widgets");

    fn session() -> Arc<Session> {
        let registry = SessionRegistry::new(std::time::Duration::from_secs(30));
        let (outbound, _drain) = outbound_queue(1, None);
        registry.create(outbound).0
    }

    #[test]
    fn a_session_holds_at_most_its_limit_and_leases_give_units_back() {
        let a = session();
        let b = session();
        let first = WIDGETS.acquire(&a, 3, 2).unwrap();
        let _second = WIDGETS.acquire(&a, 3, 1).unwrap();
        let refused = WIDGETS.acquire(&a, 3, 1).unwrap_err();
        assert_eq!(
            refused.code,
            exec_server_proto::error::code::INVALID_REQUEST
        );
        assert_eq!(
            refused.message,
            "session quota reached: at most 3 widgets at once (test.max_widgets)"
        );
        // Another session has its own share.
        let _other = WIDGETS.acquire(&b, 3, 3).unwrap();
        assert_eq!(WIDGETS.used(&a), 3);
        drop(first);
        assert_eq!(WIDGETS.used(&a), 1);
        assert!(WIDGETS.acquire(&a, 3, 2).is_ok());
    }
}

//! The connections a listener has accepted whose request head has not arrived yet, and
//! which of them to close when a cap is reached.
//!
//! A pending connection costs the server a descriptor while proving nothing about its
//! peer, so their number is capped per peer address and in total. At a cap the **oldest**
//! pending connection of that peer (resp. overall) is closed rather than the new one
//! refused: an attacker who stalls connections keeps pushing out only its own stale ones,
//! while a legitimate client — even one that shares the attacker's address — gets the
//! moment it needs to send its request. A connection leaves the table as soon as its
//! first request head is complete ([`PendingSlot::promote`]): from then on the request
//! decides (a bad credential is answered and the connection closed), and a burst of
//! honest requests from one proxy is never cut short.
//!
//! Only connections older than [`MIN_AGE_BEFORE_EVICTION`] are evicted: a cap reached by
//! a burst of fresh connections makes the accept loop wait a moment for their heads
//! instead of closing a connection that simply has not been scheduled yet.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::metrics::Gauge;

/// How long a pending connection may take to send its request head before a newer
/// connection may push it out. Honest clients send the head with the connection.
pub(crate) const MIN_AGE_BEFORE_EVICTION: Duration = Duration::from_millis(200);

/// Pending connections of one listener.
pub(crate) struct PendingTable {
    inner: Mutex<Inner>,
    max_per_peer: usize,
    max_total: usize,
    /// How many are pending now (`/metrics`).
    gauge: Gauge,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    /// Every pending connection by admission order (ids only grow): the first is the oldest.
    by_age: BTreeMap<u64, Entry>,
    /// Each peer's pending ids, oldest first.
    by_peer: HashMap<IpAddr, VecDeque<u64>>,
}

struct Entry {
    peer: IpAddr,
    admitted: Instant,
    /// Cancelled when the connection is evicted; its task then closes it.
    evict: CancellationToken,
    /// Resolves once the connection's task has let go of it (its slot is dropped).
    closed: oneshot::Receiver<()>,
}

/// What one admission pushed out: counts by the cap that was reached, and the evicted
/// connections' closings to wait for.
#[derive(Debug, Default)]
pub(crate) struct Evictions {
    pub per_peer: u64,
    pub total: u64,
    /// The accept loop waits for these before it accepts again, so that under a flood the
    /// evicted sockets are closed as fast as new ones arrive and descriptors do not pile
    /// up behind tasks that have not run yet.
    pub closing: Vec<oneshot::Receiver<()>>,
}

/// One pending connection's place in the table; dropping it (the connection upgraded or
/// closed, its socket handed on or dropped first) frees the place.
pub(crate) struct PendingSlot {
    table: Arc<PendingTable>,
    id: u64,
    evicted: CancellationToken,
    _closed: oneshot::Sender<()>,
}

impl PendingSlot {
    /// Resolves when the table evicted this connection to make room for a newer one.
    pub(crate) fn evicted(&self) -> CancellationToken {
        self.evicted.clone()
    }

    /// A handle that takes the connection out of the table once its request head arrived.
    pub(crate) fn promoter(&self) -> Promoter {
        Promoter {
            table: Arc::clone(&self.table),
            id: self.id,
        }
    }
}

/// Takes a connection out of the pending table (it can no longer be evicted).
#[derive(Clone)]
pub(crate) struct Promoter {
    table: Arc<PendingTable>,
    id: u64,
}

impl Promoter {
    pub(crate) fn promote(&self) {
        self.table.remove(self.id);
    }
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        self.table.remove(self.id);
    }
}

/// The address a per-peer cap counts by: IPv4 addresses as they are (IPv4-mapped IPv6
/// included), IPv6 addresses by their /64, the block one subscriber usually holds.
pub(crate) fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

impl PendingTable {
    pub(crate) fn new(max_per_peer: usize, max_total: usize, gauge: Gauge) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner::default()),
            max_per_peer: max_per_peer.max(1),
            max_total: max_total.max(1),
            gauge,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Admits a new connection from `ip` at `now`, first evicting the oldest pending
    /// connection of the same peer and then the oldest overall if a cap is reached. When
    /// the connection to evict is younger than [`MIN_AGE_BEFORE_EVICTION`], nothing
    /// happens and the answer is the instant to try again.
    pub(crate) fn admit(
        self: &Arc<Self>,
        ip: IpAddr,
        now: Instant,
    ) -> Result<(PendingSlot, Evictions), Instant> {
        let peer = peer_key(ip);
        let mut evictions = Evictions::default();
        let mut inner = self.lock();
        let peer_oldest = inner
            .by_peer
            .get(&peer)
            .filter(|ids| ids.len() >= self.max_per_peer)
            .and_then(|ids| ids.front().copied());
        let total_oldest = (inner.by_age.len() >= self.max_total)
            .then(|| inner.by_age.keys().next().copied())
            .flatten();
        for candidate in [peer_oldest, total_oldest].into_iter().flatten() {
            let ready_at = inner.by_age[&candidate].admitted + MIN_AGE_BEFORE_EVICTION;
            if ready_at > now {
                return Err(ready_at);
            }
        }
        if let Some(oldest) = peer_oldest {
            evictions.closing.extend(inner.evict(oldest));
            evictions.per_peer += 1;
        }
        if inner.by_age.len() >= self.max_total {
            if let Some(oldest) = inner.by_age.keys().next().copied() {
                evictions.closing.extend(inner.evict(oldest));
                evictions.total += 1;
            }
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let evicted = CancellationToken::new();
        let (closed_tx, closed_rx) = oneshot::channel();
        inner.by_age.insert(
            id,
            Entry {
                peer,
                admitted: now,
                evict: evicted.clone(),
                closed: closed_rx,
            },
        );
        inner.by_peer.entry(peer).or_default().push_back(id);
        self.gauge.set(inner.by_age.len() as i64);
        drop(inner);
        let slot = PendingSlot {
            table: Arc::clone(self),
            id,
            evicted,
            _closed: closed_tx,
        };
        Ok((slot, evictions))
    }

    fn remove(&self, id: u64) {
        let mut inner = self.lock();
        inner.forget(id);
        self.gauge.set(inner.by_age.len() as i64);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_age.len()
    }
}

impl Inner {
    fn evict(&mut self, id: u64) -> Option<oneshot::Receiver<()>> {
        let entry = self.forget(id)?;
        entry.evict.cancel();
        Some(entry.closed)
    }

    fn forget(&mut self, id: u64) -> Option<Entry> {
        let entry = self.by_age.remove(&id)?;
        if let Some(ids) = self.by_peer.get_mut(&entry.peer) {
            ids.retain(|&other| other != id);
            if ids.is_empty() {
                self.by_peer.remove(&entry.peer);
            }
        }
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// Admits at an instant one second after the previous admission, so every earlier
    /// connection is old enough to be evicted.
    fn admit(table: &Arc<PendingTable>, ip: IpAddr) -> (PendingSlot, Evictions) {
        thread_local!(static CLOCK: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) });
        let now = CLOCK.with(|clock| {
            let next = clock
                .get()
                .map_or_else(Instant::now, |t| t + Duration::from_secs(1));
            clock.set(Some(next));
            next
        });
        table.admit(ip, now).expect("admitted")
    }

    #[test]
    fn fresh_connections_are_not_evicted_the_caller_is_told_when_to_retry() {
        let table = table(1, 10);
        let start = Instant::now();
        let (first, _) = table.admit(ip("10.0.0.1"), start).unwrap();
        let retry = table
            .admit(ip("10.0.0.1"), start)
            .err()
            .expect("too young to evict");
        assert_eq!(retry, start + MIN_AGE_BEFORE_EVICTION);
        assert!(!first.evicted().is_cancelled());
        let (_second, evictions) = table.admit(ip("10.0.0.1"), retry).unwrap();
        assert_eq!(evictions.per_peer, 1);
        assert!(first.evicted().is_cancelled());
    }

    #[test]
    fn a_promoted_connection_leaves_the_table_and_cannot_be_evicted() {
        let table = table(1, 10);
        let (first, _) = admit(&table, ip("10.0.0.1"));
        first.promoter().promote();
        assert_eq!(table.len(), 0);
        let (_second, evictions) = admit(&table, ip("10.0.0.1"));
        assert_eq!((evictions.per_peer, evictions.total), (0, 0));
        assert!(!first.evicted().is_cancelled());
        drop(first);
        assert_eq!(table.len(), 1);
    }

    fn table(per_peer: usize, total: usize) -> Arc<PendingTable> {
        PendingTable::new(per_peer, total, Gauge::default())
    }

    #[test]
    fn a_peer_at_its_cap_loses_its_oldest_connection() {
        let table = table(2, 10);
        let (a1, _) = admit(&table, ip("10.0.0.1"));
        let (b1, _) = admit(&table, ip("10.0.0.2"));
        let (a2, _) = admit(&table, ip("10.0.0.1"));
        let (a3, evictions) = admit(&table, ip("10.0.0.1"));
        assert_eq!((evictions.per_peer, evictions.total), (1, 0));
        assert!(a1.evicted().is_cancelled());
        assert!(!a2.evicted().is_cancelled());
        assert!(!a3.evicted().is_cancelled());
        assert!(!b1.evicted().is_cancelled());
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn the_total_cap_evicts_the_oldest_of_anyone() {
        let table = table(5, 3);
        let (first, _) = admit(&table, ip("10.0.0.1"));
        let (second, _) = admit(&table, ip("10.0.0.2"));
        let (third, _) = admit(&table, ip("10.0.0.3"));
        let (fourth, evictions) = admit(&table, ip("10.0.0.4"));
        assert_eq!((evictions.per_peer, evictions.total), (0, 1));
        assert!(first.evicted().is_cancelled());
        for slot in [&second, &third, &fourth] {
            assert!(!slot.evicted().is_cancelled());
        }
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn finished_connections_free_their_place() {
        let gauge = Gauge::default();
        let table = PendingTable::new(1, 4, gauge.clone());
        let (a, _) = admit(&table, ip("10.0.0.1"));
        assert_eq!(gauge.get(), 1);
        drop(a);
        assert_eq!(gauge.get(), 0);
        let (b, evictions) = admit(&table, ip("10.0.0.1"));
        assert_eq!((evictions.per_peer, evictions.total), (0, 0));
        assert!(!b.evicted().is_cancelled());
        // An evicted slot dropped later frees nothing twice.
        let (c, _) = admit(&table, ip("10.0.0.1"));
        assert!(b.evicted().is_cancelled());
        drop(b);
        assert_eq!(table.len(), 1);
        drop(c);
        assert_eq!(table.len(), 0);
        assert!(table.lock().by_peer.is_empty());
    }

    #[test]
    fn an_eviction_reports_when_the_evicted_connection_let_go() {
        let table = table(1, 10);
        let (first, _) = admit(&table, ip("10.0.0.1"));
        let (_second, mut evictions) = admit(&table, ip("10.0.0.1"));
        let mut closing = evictions.closing.pop().expect("one closing");
        assert!(evictions.closing.is_empty());
        assert!(matches!(
            closing.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        drop(first);
        assert!(matches!(
            closing.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
    }

    #[test]
    fn peers_are_grouped_by_ipv4_address_and_ipv6_slash_64() {
        assert_eq!(peer_key(ip("::ffff:10.1.2.3")), ip("10.1.2.3"));
        assert_eq!(peer_key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        let table = table(1, 10);
        let (a, _) = admit(&table, ip("2001:db8:1:2::1"));
        let (_b, evictions) = admit(&table, ip("2001:db8:1:2::2"));
        assert_eq!(evictions.per_peer, 1);
        assert!(a.evicted().is_cancelled());
        let (_c, evictions) = admit(&table, ip("2001:db8:1:3::1"));
        assert_eq!((evictions.per_peer, evictions.total), (0, 0));
    }
}

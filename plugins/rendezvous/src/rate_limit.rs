//! Request rates of the registry endpoints (`register`, `connect`, `validate`): a token
//! bucket per tenant and one per peer address, answered with 429 and `Retry-After`
//! (RELAY §7.6) when empty.
//!
//! The peer is limited before its token is checked, so guessing tokens costs the same as
//! any other request. IPv6 peers are grouped by /64, the block one host usually holds.
//! Memory stays bounded: a bucket that has refilled is indistinguishable from a new one and
//! is forgotten when room is needed; beyond [`MAX_TRACKED_PEERS`] buckets that are still
//! refilling, new addresses share a single bucket.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::RendezvousConfig;
use crate::refusal::Refusal;
use crate::store::TenantId;

/// Peer buckets kept while they refill; a flood from more addresses than this shares one.
pub const MAX_TRACKED_PEERS: usize = 65_536;

/// Shortest time between two purges of the peer table.
const PURGE_EVERY: Duration = Duration::from_secs(1);

/// The refill rate and the size of a bucket.
#[derive(Debug, Clone, Copy)]
struct Rule {
    per_sec: u32,
    burst: u32,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: Instant,
    /// Set by a refusal, cleared by the next admitted request: only the first refusal of
    /// a run is logged, so a flood cannot flood the log as well.
    refusing: bool,
}

impl Bucket {
    fn full(rule: Rule, now: Instant) -> Self {
        Self {
            tokens: f64::from(rule.burst),
            updated: now,
            refusing: false,
        }
    }

    fn refill(&mut self, rule: Rule, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * f64::from(rule.per_sec)).min(f64::from(rule.burst));
        self.updated = now;
    }

    fn is_full(&self, rule: Rule, now: Instant) -> bool {
        let mut probe = *self;
        probe.refill(rule, now);
        probe.tokens >= f64::from(rule.burst)
    }

    /// Takes one token; `Err(retry after in whole seconds, first refusal of a run)`.
    fn take(&mut self, rule: Rule, now: Instant) -> Result<(), (u64, bool)> {
        self.refill(rule, now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            self.refusing = false;
            return Ok(());
        }
        let wait = ((1.0 - self.tokens) / f64::from(rule.per_sec))
            .ceil()
            .max(1.0);
        let first = !std::mem::replace(&mut self.refusing, true);
        Err((wait as u64, first))
    }
}

/// The key of a peer's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PeerKey {
    V4([u8; 4]),
    /// The /64 prefix.
    V6([u8; 8]),
}

impl PeerKey {
    fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::V4(v4.octets()),
                None => {
                    let mut prefix = [0u8; 8];
                    prefix.copy_from_slice(&v6.octets()[..8]);
                    Self::V6(prefix)
                }
            },
        }
    }
}

impl std::fmt::Display for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::V4(o) => write!(f, "{}", std::net::Ipv4Addr::from(*o)),
            Self::V6(p) => {
                let mut octets = [0u8; 16];
                octets[..8].copy_from_slice(p);
                write!(f, "{}/64", std::net::Ipv6Addr::from(octets))
            }
        }
    }
}

struct Peers {
    buckets: HashMap<PeerKey, Bucket>,
    /// When refilled buckets were last forgotten; at most once a second, so a flood from
    /// many addresses does not make every request walk the whole table.
    purged: Instant,
    /// Shared by new addresses while [`MAX_TRACKED_PEERS`] buckets are refilling.
    overflow: Bucket,
}

/// A request over its rate: the refusal, and whether it is the first of its run (and so
/// worth a log line).
#[derive(Debug)]
pub struct Limited {
    pub refusal: Refusal,
    pub first: bool,
}

/// The request-rate limits of the registry endpoints.
pub struct RateLimits {
    tenant_rule: Rule,
    peer_rule: Rule,
    tenants: Mutex<Vec<Bucket>>,
    peers: Mutex<Peers>,
}

impl RateLimits {
    pub fn new(config: &RendezvousConfig, tenants: usize) -> Self {
        let now = Instant::now();
        let tenant_rule = Rule {
            per_sec: config.rate_limit_per_tenant_per_sec,
            burst: config.rate_limit_per_tenant_burst,
        };
        let peer_rule = Rule {
            per_sec: config.rate_limit_per_ip_per_sec,
            burst: config.rate_limit_per_ip_burst,
        };
        Self {
            tenant_rule,
            peer_rule,
            tenants: Mutex::new(vec![Bucket::full(tenant_rule, now); tenants]),
            peers: Mutex::new(Peers {
                buckets: HashMap::new(),
                purged: now,
                overflow: Bucket::full(peer_rule, now),
            }),
        }
    }

    /// One request from `ip`.
    pub fn check_peer(&self, ip: IpAddr) -> Result<(), Limited> {
        let now = Instant::now();
        let rule = self.peer_rule;
        let key = PeerKey::of(ip);
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if !peers.buckets.contains_key(&key)
            && peers.buckets.len() >= MAX_TRACKED_PEERS
            && now.saturating_duration_since(peers.purged) >= PURGE_EVERY
        {
            peers.buckets.retain(|_, b| !b.is_full(rule, now));
            peers.purged = now;
        }
        let bucket = if peers.buckets.len() < MAX_TRACKED_PEERS || peers.buckets.contains_key(&key)
        {
            peers
                .buckets
                .entry(key)
                .or_insert_with(|| Bucket::full(rule, now))
        } else {
            &mut peers.overflow
        };
        bucket.take(rule, now).map_err(|(retry, first)| Limited {
            refusal: Refusal::PeerRate {
                peer: key.to_string(),
                per_sec: rule.per_sec,
                burst: rule.burst,
                retry_after_secs: retry,
            },
            first,
        })
    }

    /// One request of `tenant` (named `name`).
    pub fn check_tenant(&self, tenant: TenantId, name: &str) -> Result<(), Limited> {
        let now = Instant::now();
        let rule = self.tenant_rule;
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        tenants[tenant.index()]
            .take(rule, now)
            .map_err(|(retry, first)| Limited {
                refusal: Refusal::TenantRate {
                    tenant: name.to_owned(),
                    per_sec: rule.per_sec,
                    burst: rule.burst,
                    retry_after_secs: retry,
                },
                first,
            })
    }

    /// Peer buckets currently tracked.
    #[cfg(test)]
    pub fn tracked_peers(&self) -> usize {
        self.peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .buckets
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::Capacity;
    use crate::config::{TokenConfig, TokenRole};

    fn limits(edit: impl FnOnce(&mut RendezvousConfig)) -> (RateLimits, Capacity) {
        let tokens = ["a", "b"]
            .iter()
            .map(|name| TokenConfig {
                name: (*name).to_owned(),
                sha256: "0".repeat(64),
                role: TokenRole::Any,
                environments: vec!["*".to_owned()],
                max_environments: None,
                max_harness_sockets: None,
            })
            .collect();
        let mut config = RendezvousConfig {
            tokens,
            ..RendezvousConfig::default()
        };
        edit(&mut config);
        let capacity = Capacity::new(&config);
        (RateLimits::new(&config, capacity.tenant_count()), capacity)
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_bucket_holds_its_burst_and_refills_at_its_rate() {
        let (limits, capacity) = limits(|c| {
            c.rate_limit_per_tenant_per_sec = 2;
            c.rate_limit_per_tenant_burst = 3;
        });
        let (a, b) = (capacity.tenant_of_token(0), capacity.tenant_of_token(1));
        for _ in 0..3 {
            assert!(limits.check_tenant(a, "a").is_ok());
        }
        let first = limits.check_tenant(a, "a").unwrap_err();
        assert!(first.first);
        assert_eq!(first.refusal.retry_after_secs(), Some(1));
        assert_eq!(
            first.refusal.to_string(),
            "tenant a is over its request rate limit of 2 per second with bursts of 3 (rendezvous.rate_limit_per_tenant_per_sec, rendezvous.rate_limit_per_tenant_burst)"
        );
        // Only the first refusal of a run is worth a log line.
        assert!(!limits.check_tenant(a, "a").unwrap_err().first);
        // Another tenant has its own bucket.
        assert!(limits.check_tenant(b, "b").is_ok());
        // Half a second refills one token at 2 per second.
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(limits.check_tenant(a, "a").is_ok());
        assert!(limits.check_tenant(a, "a").is_err());
        // Refills stop at the burst.
        tokio::time::advance(Duration::from_secs(60)).await;
        for _ in 0..3 {
            assert!(limits.check_tenant(a, "a").is_ok());
        }
        assert!(limits.check_tenant(a, "a").unwrap_err().first);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_covers_the_wait_for_one_token() {
        let (limits, _) = limits(|c| {
            c.rate_limit_per_ip_per_sec = 1;
            c.rate_limit_per_ip_burst = 1;
        });
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        assert!(limits.check_peer(ip).is_ok());
        tokio::time::advance(Duration::from_millis(100)).await;
        let refused = limits.check_peer(ip).unwrap_err();
        assert_eq!(refused.refusal.retry_after_secs(), Some(1));
        assert!(refused
            .refusal
            .to_string()
            .starts_with("address 192.0.2.7 "));
    }

    #[tokio::test(start_paused = true)]
    async fn ipv6_peers_share_a_bucket_per_64_and_mapped_ipv4_is_ipv4() {
        let (limits, _) = limits(|c| {
            c.rate_limit_per_ip_per_sec = 1;
            c.rate_limit_per_ip_burst = 1;
        });
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert!(limits.check_peer(one).is_ok());
        let refused = limits.check_peer(same_64).unwrap_err();
        assert!(
            refused.refusal.to_string().contains("2001:db8:1:2::/64"),
            "{}",
            refused.refusal
        );
        assert!(limits.check_peer(other_64).is_ok());
        let v4: IpAddr = "198.51.100.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:198.51.100.1".parse().unwrap();
        assert!(limits.check_peer(v4).is_ok());
        assert!(limits.check_peer(mapped).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_peer_table_stays_bounded_under_a_flood_of_addresses() {
        let (limits, _) = limits(|c| {
            c.rate_limit_per_ip_per_sec = 1;
            c.rate_limit_per_ip_burst = 2;
        });
        let address = |i: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        for i in 0..MAX_TRACKED_PEERS as u32 + 1_000 {
            let _ = limits.check_peer(address(i));
        }
        assert_eq!(limits.tracked_peers(), MAX_TRACKED_PEERS);
        // The addresses beyond the table share one bucket of 2.
        let late = MAX_TRACKED_PEERS as u32 + 5_000;
        assert!(limits.check_peer(address(late)).is_err());
        // Once the tracked buckets have refilled they are forgotten to make room.
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(limits.check_peer(address(late)).is_ok());
        assert_eq!(limits.tracked_peers(), 1);
    }
}

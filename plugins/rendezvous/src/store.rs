//! The rendezvous's registry state behind one seam, [`RendezvousStore`] (RELAY §8.2, §8.3,
//! §8.9): the tenants and their token digests, every environment's registration and its
//! executor's attach state, and the capacity the registrations and harness sockets hold.
//! [`crate::memory::MemoryStore`] is the default; [`crate::redis_store::RedisStore`] is
//! shared by several nodes (§8.10), each answering any registry call and holding the
//! sockets of the environments whose executors attached to it.
//!
//! What stays out of the store is what only the process that holds a socket can do: the
//! live sockets and the routes between them are the router's (`crate::router`). The two
//! meet in [`Ended`]: every store call that may end a registration — expiry on access, a
//! sweep, a replacement, an executor that left — reports it, and the caller hands it to the
//! router, which resets and closes that registration's sockets.
//!
//! A registration is known to the router by its [`Epoch`], which the store assigns afresh
//! each time it installs one (a registration id can come back: it is derived from the
//! environment and the key), so a socket admitted for a registration that has since
//! ended is recognised as stale.

use std::sync::Arc;

use async_trait::async_trait;
use axum::http::StatusCode;
use exec_server_relay_core::noise::NoisePublicKey;
use tokio::time::Instant;

use crate::config::TokenRole;
use crate::refusal::Refusal;

/// One installation of a registration; increases with every registration the store
/// installs, so a later registration of an environment always has a larger epoch.
pub type Epoch = u64;

/// A tenant: the tokens that share a `name` (§8.3), by position among the tenants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TenantId(pub(crate) usize);

impl TenantId {
    /// Position among the tenants, `0..tenant_count()`.
    pub fn index(self) -> usize {
        self.0
    }
}

/// What a bearer token grants (§8.3).
#[derive(Debug, Clone)]
pub struct TokenGrant {
    /// The tenant's name, for logs (the token itself is never logged).
    pub name: String,
    pub tenant: TenantId,
    pub role: TokenRole,
    /// Exact ids, or prefixes followed by one trailing `*`; `*` is every environment.
    pub environments: Vec<String>,
}

/// Why a registration ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Its executor closed its socket with 1000: it stopped for good (§8.8).
    ExecutorLeft,
    /// No executor attached within `attach_timeout_secs`.
    AttachTimeout,
    /// Its executor stayed detached for `registration_ttl_secs` (§8.2).
    RegistrationTtl,
    /// Another executor key registered the environment after this one's executor was
    /// gone for longer than the grace (§8.2); the environment itself stays.
    Replaced,
}

impl Removal {
    /// The `reason` of its log line.
    pub fn reason(self) -> &'static str {
        match self {
            Self::ExecutorLeft => "executor_left",
            Self::AttachTimeout => "attach_timeout",
            Self::RegistrationTtl => "registration_ttl",
            Self::Replaced => "replaced",
        }
    }
}

/// A registration that ended, for the router to reset and close its sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub environment: String,
    pub epoch: Epoch,
    pub why: Removal,
}

/// A `register` the store refused (§7.6).
#[derive(Debug)]
pub enum RegisterRefusal {
    /// 409: another executor is live, or the key is another tenant's.
    Busy,
    /// 503 or its tenant's limit.
    Capacity(Refusal),
    /// 503: the shared store could not be reached.
    StoreUnavailable,
}

/// The shared store could not be reached or failed; the request is answered 503 and the
/// caller tries again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreUnavailable;

/// What `connect` may hand out (§7.4).
#[derive(Debug)]
pub enum Connectable {
    /// `node`: the public URL of the node that holds the executor's socket, when that is
    /// another node than this one (harnesses are sent there).
    Yes {
        reg: String,
        key: NoisePublicKey,
        node: Option<String>,
    },
    NotFound,
    Unavailable,
    StoreUnavailable,
}

/// Why an upgrade is refused (§8.4 checks 5–7, §8.8, §8.9).
#[derive(Debug)]
pub enum UpgradeRefusal {
    Status(StatusCode),
    Capacity(Refusal),
    /// The environment's executor socket is held by the node at this public URL.
    Elsewhere(String),
}

/// An environment this node has sockets of (RELAY §8.10), as a heartbeat reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub environment: String,
    /// The registration its sockets here belong to.
    pub epoch: Epoch,
    /// Whether this node holds its executor socket (else only harness sockets or parked
    /// routes, waiting for the executor to come back).
    pub executor: bool,
}

/// An environment this node has sockets of, that the store says it no longer holds
/// (RELAY §8.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// The same registration's executor attached to another node: this node's sockets of
    /// the environment are closed so their peers reconnect there.
    Moved(String),
    /// The registration ended or was replaced.
    Ended(Ended),
}

/// The capacity one harness socket holds at its environment and its owner's tenant, given
/// back when dropped (when the socket ends or its upgrade fails).
pub struct HarnessLease {
    _held: Box<dyn Send + Sync>,
}

impl HarnessLease {
    /// Wraps whatever a store gives back on drop.
    pub fn new(inner: impl Send + Sync + 'static) -> Self {
        Self {
            _held: Box::new(inner),
        }
    }
}

impl std::fmt::Debug for HarnessLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HarnessLease")
    }
}

/// The registry's state. Every call that may end registrations pushes them onto `ended`;
/// the caller passes them to the router. Calls take `now` so the store and the router
/// agree on one clock (and tests can move it).
#[async_trait]
pub trait RendezvousStore: Send + Sync + 'static {
    /// The grant of the token whose SHA-256 is `digest`, compared in constant time with
    /// every configured digest (§8.3).
    async fn authenticate(&self, digest: &[u8; 32]) -> Option<TokenGrant>;

    /// How many tenants there are (their ids are `0..tenant_count()`).
    fn tenant_count(&self) -> usize;

    /// `register` (§8.2): the registration id of the environment's registration for
    /// `key`, new or the same again.
    async fn register(
        &self,
        environment: &str,
        key: NoisePublicKey,
        name: Option<String>,
        tenant: TenantId,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Result<String, RegisterRefusal>;

    /// Whether `connect` may hand out a bundle, and for which registration (§7.4).
    async fn connectable(
        &self,
        environment: &str,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Connectable;

    /// The environment's current registration id (`validate`, §8.3).
    async fn current_registration(
        &self,
        environment: &str,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Result<Option<String>, StoreUnavailable>;

    /// May an executor socket for `reg` be opened (§8.4 checks 5–7)?
    async fn admit_executor(
        &self,
        environment: &str,
        reg: &str,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Result<Epoch, StatusCode>;

    /// May a harness socket for `reg` be opened? Its capacity is taken now, so concurrent
    /// upgrades cannot over-admit (§8.9).
    async fn admit_harness(
        &self,
        environment: &str,
        reg: &str,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Result<(Epoch, HarnessLease), UpgradeRefusal>;

    /// An executor socket for `reg` was opened on this node: the environment is attached
    /// here. `None` when `reg` is no longer the environment's registration.
    async fn executor_attached(
        &self,
        environment: &str,
        reg: &str,
        now: Instant,
    ) -> Result<Option<Epoch>, StoreUnavailable>;

    /// The environment's executor socket ended. An executor that left for good (close
    /// 1000) ends its registration at once; otherwise the detach clock starts (§8.2).
    async fn executor_detached(
        &self,
        environment: &str,
        epoch: Epoch,
        left_for_good: bool,
        now: Instant,
        ended: &mut Vec<Ended>,
    );

    /// Ends every registration that is due (the attach timeout, the registration TTL).
    async fn sweep(&self, now: Instant, ended: &mut Vec<Ended>);

    /// How often this node must vouch for the executor sockets it holds; `None` for a
    /// store of one process, where nothing else can take them over.
    fn heartbeat_every(&self) -> Option<std::time::Duration> {
        None
    }

    /// This node still has the sockets of `held`: the lease on the executor sockets among
    /// them is renewed. Answers the environments whose executor is (now) held elsewhere
    /// or whose registration ended, so their sockets here are closed.
    async fn heartbeat(&self, _held: &[Held]) -> Result<Vec<Lost>, StoreUnavailable> {
        Ok(Vec::new())
    }

    /// Whether the store answers now (`/readyz`).
    async fn ready(&self) -> bool {
        true
    }
}

/// The store the service uses.
pub type SharedStore = Arc<dyn RendezvousStore>;

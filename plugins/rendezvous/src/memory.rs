//! The in-memory [`RendezvousStore`], the default: one process holds every registration
//! (RELAY §8.2), and a restart loses them (executors register again, harnesses resume).
//!
//! A registration ends in one place, `MemoryStore::remove`: when its executor leaves for
//! good (closes with 1000), when no executor attached within `attach_timeout_secs`, and
//! when its executor stayed away for `registration_ttl_secs`; a replacement by another
//! executor ends it too, while the environment stays. Expiry runs in the background sweep
//! and also lazily whenever an environment is accessed, and a registration that finds the
//! service full sweeps first, so capacity is free the moment its registration is due to
//! go. The capacity itself is counted by `Capacity`; an environment's record and its
//! slot live and die together.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::http::StatusCode;
use exec_server_relay_core::noise::NoisePublicKey;
use exec_server_relay_core::proto;
use tokio::time::Instant;

use crate::capacity::{Capacity, EnvironmentSlot, Gauge};
use crate::config::RendezvousConfig;
use crate::refusal::Refusal;
use crate::signing::registration_id;
use crate::store::{
    Connectable, Ended, Epoch, HarnessLease, RegisterRefusal, Removal, RendezvousStore,
    StoreUnavailable, TenantId, TokenGrant, UpgradeRefusal,
};
use crate::tokens::{effective_config, Tokens};

/// Replaced registration ids remembered per environment (their upgrades get 410; older
/// ones 404, which also makes their executor register again).
const REPLACED_IDS: usize = 64;

/// The most recent ids of something, at most `cap` of them.
pub(crate) struct RecentIds {
    order: VecDeque<String>,
    set: HashSet<String>,
    cap: usize,
}

impl RecentIds {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            order: VecDeque::new(),
            set: HashSet::new(),
            cap,
        }
    }

    pub(crate) fn insert(&mut self, id: String) {
        if self.set.insert(id.clone()) {
            self.order.push_back(id);
            if self.order.len() > self.cap {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    pub(crate) fn remove(&mut self, id: &str) {
        if self.set.remove(id) {
            self.order.retain(|x| x != id);
        }
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.set.contains(id)
    }
}

/// The current registration of an environment (§8.2).
struct Registration {
    id: String,
    key: NoisePublicKey,
    created: Instant,
    epoch: Epoch,
    /// The capacity it holds; released when the registration is dropped.
    slot: EnvironmentSlot,
}

/// One registered environment. A record exists exactly as long as its registration does.
struct Environment {
    registration: Registration,
    /// Ids of registrations replaced by a newer one (upgrade → 410).
    replaced: RecentIds,
    /// An executor socket is open for the registration.
    attached: bool,
    ever_attached: bool,
    detached_since: Option<Instant>,
    /// Harness socket places at this environment, taken at upgrade time.
    socket_places: Arc<Gauge>,
}

impl Environment {
    fn executor_within_grace(&self, grace: Duration, now: Instant) -> bool {
        self.attached
            || (self.ever_attached
                && self
                    .detached_since
                    .is_some_and(|t| now.saturating_duration_since(t) < grace))
    }
}

type Environments = HashMap<String, Environment>;

/// Every registration of this process, its tokens and its capacity.
pub struct MemoryStore {
    tokens: Tokens,
    envs: Mutex<Environments>,
    /// Every slot the registrations and harness sockets hold is counted here.
    capacity: Capacity,
    grace: Duration,
    registration_ttl: Duration,
    attach_timeout: Duration,
    /// No registration is due to be deleted before this: a full service sweeps before
    /// refusing only when something can be due, so a flood of refused registrations
    /// never makes each request walk every environment. Only touched with `envs` held.
    next_due: Mutex<Option<Instant>>,
    next_epoch: AtomicU64,
}

impl MemoryStore {
    /// The store for `config`: its tenants, token digests and limits.
    pub fn new(config: &RendezvousConfig) -> Result<Self, String> {
        let config = &effective_config(config);
        let capacity = Capacity::new(config);
        let tokens = Tokens::new(config, &capacity)?;
        Ok(Self {
            tokens,
            envs: Mutex::new(HashMap::new()),
            capacity,
            grace: Duration::from_secs(config.grace_secs),
            registration_ttl: Duration::from_secs(config.registration_ttl_secs),
            attach_timeout: Duration::from_secs(config.attach_timeout_secs),
            next_due: Mutex::new(None),
            next_epoch: AtomicU64::new(1),
        })
    }

    #[cfg(test)]
    pub(crate) fn capacity(&self) -> &Capacity {
        &self.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Environments> {
        self.envs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When `env`'s registration is due to be deleted, and why; `None` while its executor
    /// is attached.
    fn deadline(&self, env: &Environment) -> Option<(Instant, Removal)> {
        if env.attached {
            return None;
        }
        if !env.ever_attached {
            return Some((
                env.registration.created + self.attach_timeout,
                Removal::AttachTimeout,
            ));
        }
        env.detached_since
            .map(|t| (t + self.registration_ttl, Removal::RegistrationTtl))
    }

    /// Records a deadline that starts now (a new registration, a detached executor).
    fn note_deadline(&self, env: &Environment) {
        if let Some((at, _)) = self.deadline(env) {
            let mut next = self.next_due.lock().unwrap_or_else(|e| e.into_inner());
            *next = Some(next.map_or(at, |n| n.min(at)));
        }
    }

    /// Whether any registration can be due at `now`.
    fn anything_due(&self, now: Instant) -> bool {
        self.next_due
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at <= now)
    }

    /// Whether `env`'s registration is due to be deleted at `now`, and why.
    fn due(&self, env: &Environment, now: Instant) -> Option<Removal> {
        self.deadline(env)
            .and_then(|(at, why)| (at <= now).then_some(why))
    }

    /// Deletes `id`'s registration if it is due: every access to an environment goes
    /// through here first, so expiry never waits for the sweep.
    fn expire(&self, envs: &mut Environments, id: &str, now: Instant, ended: &mut Vec<Ended>) {
        if let Some(why) = envs.get(id).and_then(|env| self.due(env, now)) {
            self.remove(envs, id, why, ended);
        }
    }

    /// The one way a registration ends with its environment: the router is told (through
    /// `ended`) to close its sockets, and dropping the record gives its capacity back.
    fn remove(&self, envs: &mut Environments, id: &str, why: Removal, ended: &mut Vec<Ended>) {
        let Some(env) = envs.remove(id) else {
            return;
        };
        let tenant = env.registration.slot.tenant();
        let registration = env.registration.id.clone();
        ended.push(Ended {
            environment: id.to_owned(),
            epoch: env.registration.epoch,
            why,
        });
        drop(env);
        tracing::info!(
            reason = why.reason(),
            tenant = self.capacity.tenant_name(tenant),
            environment = %proto::truncate_for_log(id),
            registration = %registration,
            held = self.capacity.environments_held(),
            tenant_held = self.capacity.tenant_environments_held(tenant),
            "registration deleted; its capacity is free"
        );
    }

    /// `register` (§8.2): idempotent for the same key and tenant, 409 while another
    /// executor is live or the key is another tenant's, and within the service's and the
    /// tenant's capacity.
    pub fn register_now(
        &self,
        id: &str,
        key: NoisePublicKey,
        name: Option<String>,
        tenant: TenantId,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Result<String, RegisterRefusal> {
        let mut envs = self.lock();
        self.expire(&mut envs, id, now, ended);
        if let Some(env) = envs.get(id) {
            let current = &env.registration;
            if current.key == key {
                // The key is public (every `connect` hands it out): only the tenant that
                // registered it gets its registration, and a fresh executor URL, again;
                // another tenant waits, like a standby, until the registration ends.
                return if current.slot.tenant() == tenant {
                    Ok(current.id.clone())
                } else {
                    Err(RegisterRefusal::Busy)
                };
            }
            // A restarted executor (a new key, the same tenant) takes over at once when no
            // executor socket is open: its predecessor is gone, and waiting out the grace
            // would only lock the environment. Another tenant's executor, or any executor
            // while one is attached, waits as a standby until the registration ends.
            let restart = current.slot.tenant() == tenant && !env.attached;
            let live = env.executor_within_grace(self.grace, now)
                || (!env.ever_attached
                    && now.saturating_duration_since(current.created) < self.grace);
            if live && !restart {
                return Err(RegisterRefusal::Busy);
            }
        }
        let admitted = match self.admit(&mut envs, id, key.clone(), tenant, now, ended) {
            Err(_) if self.anything_due(now) => {
                // Full, but something is due: free it first, then decide.
                self.sweep_locked(&mut envs, now, ended);
                self.admit(&mut envs, id, key, tenant, now, ended)
            }
            admitted => admitted,
        };
        let reg_id = admitted.map_err(RegisterRefusal::Capacity)?;
        tracing::info!(
            environment = %proto::truncate_for_log(id),
            registration = %reg_id,
            tenant = self.capacity.tenant_name(tenant),
            name = ?name,
            held = self.capacity.environments_held(),
            tenant_held = self.capacity.tenant_environments_held(tenant),
            "executor registered"
        );
        Ok(reg_id)
    }

    /// Installs a registration for `key`, a new one or one that replaces a registration
    /// whose executor is gone. Capacity is charged before anything changes, so a refusal
    /// leaves the state as it was.
    fn admit(
        &self,
        envs: &mut Environments,
        id: &str,
        key: NoisePublicKey,
        tenant: TenantId,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Result<String, Refusal> {
        let reg_id = registration_id(id, &key);
        match envs.get_mut(id) {
            Some(env) => {
                self.capacity
                    .move_environment(&mut env.registration.slot, tenant)?;
                ended.push(Ended {
                    environment: id.to_owned(),
                    epoch: env.registration.epoch,
                    why: Removal::Replaced,
                });
                env.replaced
                    .insert(std::mem::take(&mut env.registration.id));
                env.replaced.remove(&reg_id);
                env.registration.id = reg_id.clone();
                env.registration.key = key;
                env.registration.created = now;
                env.registration.epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
                env.attached = false;
                env.ever_attached = false;
                env.detached_since = None;
                self.note_deadline(env);
            }
            None => {
                let slot = self.capacity.lease_environment(tenant)?;
                let registration = Registration {
                    id: reg_id.clone(),
                    key,
                    created: now,
                    epoch: self.next_epoch.fetch_add(1, Ordering::Relaxed),
                    slot,
                };
                let env = Environment {
                    registration,
                    replaced: RecentIds::new(REPLACED_IDS),
                    attached: false,
                    ever_attached: false,
                    detached_since: None,
                    socket_places: self.capacity.environment_sockets(id),
                };
                self.note_deadline(&env);
                envs.insert(id.to_owned(), env);
            }
        }
        Ok(reg_id)
    }

    pub fn connectable_now(&self, id: &str, now: Instant, ended: &mut Vec<Ended>) -> Connectable {
        let mut envs = self.lock();
        self.expire(&mut envs, id, now, ended);
        let Some(env) = envs.get(id) else {
            return Connectable::NotFound;
        };
        if env.executor_within_grace(self.grace, now) {
            Connectable::Yes {
                reg: env.registration.id.clone(),
                key: env.registration.key.clone(),
                node: None,
            }
        } else {
            Connectable::Unavailable
        }
    }

    pub fn current_registration_now(
        &self,
        id: &str,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Option<String> {
        let mut envs = self.lock();
        self.expire(&mut envs, id, now, ended);
        envs.get(id).map(|e| e.registration.id.clone())
    }

    /// Upgrade checks 5–7 of §8.4: the registration exists, belongs here, is current.
    fn upgrade_target<'a>(
        &self,
        envs: &'a mut Environments,
        id: &str,
        reg: &str,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Result<&'a mut Environment, StatusCode> {
        self.expire(envs, id, now, ended);
        let Some(env) = envs.get_mut(id) else {
            return Err(StatusCode::NOT_FOUND);
        };
        if env.registration.id == reg {
            Ok(env)
        } else if env.replaced.contains(reg) {
            Err(StatusCode::GONE)
        } else {
            Err(StatusCode::NOT_FOUND)
        }
    }

    pub fn admit_executor_now(
        &self,
        id: &str,
        reg: &str,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Result<Epoch, StatusCode> {
        let mut envs = self.lock();
        self.upgrade_target(&mut envs, id, reg, now, ended)
            .map(|env| env.registration.epoch)
    }

    /// The place of a harness socket at the environment and among the owner tenant's
    /// sockets is taken now, before the upgrade completes, so concurrent upgrades cannot
    /// over-admit; it is released when the socket ends (or the upgrade fails and the
    /// lease is dropped unused).
    pub fn admit_harness_now(
        &self,
        id: &str,
        reg: &str,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Result<(Epoch, HarnessLease), UpgradeRefusal> {
        let mut envs = self.lock();
        let env = self
            .upgrade_target(&mut envs, id, reg, now, ended)
            .map_err(UpgradeRefusal::Status)?;
        if !env.executor_within_grace(self.grace, now) {
            return Err(UpgradeRefusal::Status(StatusCode::SERVICE_UNAVAILABLE));
        }
        let slot = self
            .capacity
            .lease_harness_socket(&env.socket_places, env.registration.slot.tenant())
            .map_err(UpgradeRefusal::Capacity)?;
        Ok((env.registration.epoch, HarnessLease::new(slot)))
    }

    pub fn executor_attached_now(&self, id: &str, reg: &str) -> Option<Epoch> {
        let mut envs = self.lock();
        let env = envs.get_mut(id)?;
        if env.registration.id != reg {
            return None;
        }
        env.attached = true;
        env.ever_attached = true;
        env.detached_since = None;
        Some(env.registration.epoch)
    }

    pub fn executor_detached_now(
        &self,
        id: &str,
        epoch: Epoch,
        left_for_good: bool,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) {
        let mut envs = self.lock();
        let Some(env) = envs.get_mut(id) else {
            return;
        };
        if env.registration.epoch != epoch || !env.attached {
            return;
        }
        env.attached = false;
        if left_for_good {
            self.remove(&mut envs, id, Removal::ExecutorLeft, ended);
        } else {
            env.detached_since = Some(now);
            self.note_deadline(env);
            tracing::info!(environment = %proto::truncate_for_log(id), "executor detached");
        }
    }

    pub fn sweep_now(&self, now: Instant, ended: &mut Vec<Ended>) {
        let mut envs = self.lock();
        self.sweep_locked(&mut envs, now, ended);
    }

    fn sweep_locked(&self, envs: &mut Environments, now: Instant, ended: &mut Vec<Ended>) {
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, env) in envs.iter() {
            match self.deadline(env) {
                Some((at, why)) if at <= now => due.push((id.clone(), why)),
                Some((at, _)) => next = Some(next.map_or(at, |n| n.min(at))),
                None => {}
            }
        }
        *self.next_due.lock().unwrap_or_else(|e| e.into_inner()) = next;
        for (id, why) in due {
            self.remove(envs, &id, why, ended);
        }
    }
}

#[async_trait]
impl RendezvousStore for MemoryStore {
    async fn authenticate(&self, digest: &[u8; 32]) -> Option<TokenGrant> {
        self.tokens.authenticate(digest)
    }

    fn tenant_count(&self) -> usize {
        self.capacity.tenant_count()
    }

    async fn register(
        &self,
        environment: &str,
        key: NoisePublicKey,
        name: Option<String>,
        tenant: TenantId,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Result<String, RegisterRefusal> {
        self.register_now(environment, key, name, tenant, now, ended)
    }

    async fn connectable(
        &self,
        environment: &str,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Connectable {
        self.connectable_now(environment, now, ended)
    }

    async fn current_registration(
        &self,
        environment: &str,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Result<Option<String>, StoreUnavailable> {
        Ok(self.current_registration_now(environment, now, ended))
    }

    async fn admit_executor(
        &self,
        environment: &str,
        reg: &str,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Result<Epoch, StatusCode> {
        self.admit_executor_now(environment, reg, now, ended)
    }

    async fn admit_harness(
        &self,
        environment: &str,
        reg: &str,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) -> Result<(Epoch, HarnessLease), UpgradeRefusal> {
        self.admit_harness_now(environment, reg, now, ended)
    }

    async fn executor_attached(
        &self,
        environment: &str,
        reg: &str,
        _now: Instant,
    ) -> Result<Option<Epoch>, StoreUnavailable> {
        Ok(self.executor_attached_now(environment, reg))
    }

    async fn executor_detached(
        &self,
        environment: &str,
        epoch: Epoch,
        left_for_good: bool,
        now: Instant,
        ended: &mut Vec<Ended>,
    ) {
        self.executor_detached_now(environment, epoch, left_for_good, now, ended)
    }

    async fn sweep(&self, now: Instant, ended: &mut Vec<Ended>) {
        self.sweep_now(now, ended)
    }
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;

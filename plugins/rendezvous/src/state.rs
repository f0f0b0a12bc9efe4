//! The rendezvous's state (RELAY §8.2, §8.6, §8.7): per environment the current
//! registration and the capacity it holds, the executor socket, the route table
//! `stream_id → harness socket` and the recently closed ids, plus the socket loops that
//! forward frames as their original bytes.
//!
//! The registry side is the [`Hub`]'s registration interface — `register`, `connectable`,
//! `current_registration`, `admit_executor`, `admit_harness` — and a registration ends in
//! one place, `Hub::remove`: when its executor leaves for good (closes with 1000), when no
//! executor attached within `attach_timeout_secs`, and when its executor stayed away for
//! `registration_ttl_secs`. Expiry runs in a background sweep and also lazily whenever an
//! environment is accessed, and a registration that finds the service full sweeps first,
//! so capacity is free the moment its registration is due to go. The capacity itself is
//! counted by [`Capacity`]; an environment's entry and its slot live and die together.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use axum::http::StatusCode;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::capacity::{Capacity, EnvironmentSlot, Gauge, HarnessSlot, TenantId};
use crate::config::RendezvousConfig;
use crate::refusal::Refusal;
use crate::signing::registration_id;
use exec_server_relay_core::noise::NoisePublicKey;
use exec_server_relay_core::proto::{self, Body, ResetReason};

/// Closed stream ids remembered per environment.
const CLOSED_IDS: usize = 1_024;
/// Replaced registration ids remembered per environment (their upgrades get 410; older
/// ones 404, which also makes their executor register again).
const REPLACED_IDS: usize = 64;
/// Invalid frames that close a harness socket (§6.2).
const MAX_INVALID_FRAMES: u32 = 8;
/// Frames queued towards one socket; beyond that frames are dropped (endpoints retransmit).
const SOCKET_QUEUE: usize = 1_024;

/// Timing of the router's liveness checks; tests shorten them.
#[derive(Debug, Clone, Copy)]
pub struct RouterTiming {
    pub ping_interval: Duration,
    pub pong_timeout: Duration,
    pub sweep_every: Duration,
}

impl Default for RouterTiming {
    fn default() -> Self {
        Self {
            ping_interval: Duration::from_secs(30),
            pong_timeout: Duration::from_secs(60),
            sweep_every: Duration::from_millis(250),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketRole {
    Executor,
    Harness,
}

enum Out {
    Frame(Bytes),
    Close(u16),
}

/// The sending half of one socket.
#[derive(Clone)]
struct SocketHandle {
    id: u64,
    tx: mpsc::Sender<Out>,
    kill: CancellationToken,
    /// Cancelled once the writer has finished (its close frame, if any, is written).
    written: CancellationToken,
}

impl SocketHandle {
    fn send(&self, bytes: Bytes) {
        if self.tx.try_send(Out::Frame(bytes)).is_err() {
            tracing::debug!(socket = self.id, "socket queue full; frame dropped");
        }
    }

    fn close(&self, code: u16) {
        if self.tx.try_send(Out::Close(code)).is_err() {
            self.kill.cancel();
        }
    }
}

#[derive(Default)]
struct Route {
    harness: Option<SocketHandle>,
    kh: Option<String>,
    parked_since: Option<Instant>,
    held_for_executor: Option<Bytes>,
    held_for_harness: Option<Bytes>,
}

/// The most recent ids of something, at most `cap` of them.
struct RecentIds {
    order: VecDeque<String>,
    set: HashSet<String>,
    cap: usize,
}

impl RecentIds {
    fn new(cap: usize) -> Self {
        Self {
            order: VecDeque::new(),
            set: HashSet::new(),
            cap,
        }
    }

    fn insert(&mut self, id: String) {
        if self.set.insert(id.clone()) {
            self.order.push_back(id);
            if self.order.len() > self.cap {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    fn remove(&mut self, id: &str) {
        if self.set.remove(id) {
            self.order.retain(|x| x != id);
        }
    }

    fn contains(&self, id: &str) -> bool {
        self.set.contains(id)
    }
}

/// The current registration of an environment (§8.2).
struct Registration {
    id: String,
    key: NoisePublicKey,
    created: Instant,
    /// The capacity it holds; released when the registration is dropped.
    slot: EnvironmentSlot,
}

/// One registered environment. An entry exists exactly as long as its registration does.
struct Environment {
    registration: Registration,
    /// Ids of registrations replaced by a newer one (upgrade → 410).
    replaced: RecentIds,
    executor: Option<SocketHandle>,
    ever_attached: bool,
    detached_since: Option<Instant>,
    routes: HashMap<String, Route>,
    closed: RecentIds,
    /// Every open harness socket, bound to a route or not, so that deleting the
    /// environment can close them all.
    harness_sockets: HashMap<u64, SocketHandle>,
    /// Harness socket places at this environment, taken at upgrade time.
    socket_places: Arc<Gauge>,
    unknown_reset_at: HashMap<String, Instant>,
}

impl Environment {
    fn new(registration: Registration, socket_places: Arc<Gauge>) -> Self {
        Self {
            registration,
            replaced: RecentIds::new(REPLACED_IDS),
            executor: None,
            ever_attached: false,
            detached_since: None,
            routes: HashMap::new(),
            closed: RecentIds::new(CLOSED_IDS),
            harness_sockets: HashMap::new(),
            socket_places,
            unknown_reset_at: HashMap::new(),
        }
    }

    fn executor_within_grace(&self, grace: Duration, now: Instant) -> bool {
        self.executor.is_some()
            || (self.ever_attached
                && self
                    .detached_since
                    .is_some_and(|t| now.saturating_duration_since(t) < grace))
    }

    fn close_route(&mut self, stream_id: &str) {
        self.routes.remove(stream_id);
        self.closed.insert(stream_id.to_owned());
    }

    /// Resets every route towards its harness with `executor_unavailable` and closes every
    /// harness socket: the registration they were admitted for is gone.
    fn reset_harnesses(&mut self) {
        let ids: Vec<String> = self.routes.keys().cloned().collect();
        for sid in ids {
            if let Some(h) = self.routes.get(&sid).and_then(|r| r.harness.as_ref()) {
                h.send(proto::encode(&proto::reset_frame(
                    &sid,
                    ResetReason::ExecutorUnavailable,
                )));
            }
            self.close_route(&sid);
        }
        for (_, socket) in self.harness_sockets.drain() {
            socket.close(1000);
        }
    }

    /// Reset{unknown_stream} to the executor, at most once per second per stream; `true`
    /// when one was sent.
    fn unknown_stream_reset(&mut self, stream_id: &str, now: Instant) -> bool {
        let due = self
            .unknown_reset_at
            .get(stream_id)
            .is_none_or(|t| now.saturating_duration_since(*t) >= Duration::from_secs(1));
        if !due {
            return false;
        }
        if self.unknown_reset_at.len() > CLOSED_IDS {
            self.unknown_reset_at.clear();
        }
        self.unknown_reset_at.insert(stream_id.to_owned(), now);
        if let Some(executor) = &self.executor {
            executor.send(proto::encode(&proto::reset_frame(
                stream_id,
                ResetReason::UnknownStream,
            )));
        }
        true
    }
}

/// Why a registration ended (the `reason` of its log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Its executor closed its socket with 1000: it stopped for good (§8.8).
    ExecutorLeft,
    /// No executor attached within `attach_timeout_secs`.
    AttachTimeout,
    /// Its executor stayed detached for `registration_ttl_secs` (§8.2).
    RegistrationTtl,
}

impl Removal {
    fn reason(self) -> &'static str {
        match self {
            Self::ExecutorLeft => "executor_left",
            Self::AttachTimeout => "attach_timeout",
            Self::RegistrationTtl => "registration_ttl",
        }
    }
}

pub enum RegisterRefusal {
    Busy,
    Capacity(Refusal),
}

/// Why an upgrade is refused (§8.4 checks 5–7, §8.8, §8.9).
pub enum UpgradeRefusal {
    Status(StatusCode),
    Capacity(Refusal),
}

pub enum Connectable {
    Yes { reg: String, key: NoisePublicKey },
    NotFound,
    Unavailable,
}

type Environments = HashMap<String, Environment>;

/// All environments of this service.
pub struct Hub {
    envs: Mutex<Environments>,
    /// Every slot the environments and harness sockets hold is counted here.
    capacity: Capacity,
    grace: Duration,
    registration_ttl: Duration,
    attach_timeout: Duration,
    /// No registration is due to be deleted before this: a full service sweeps before
    /// refusing only when something can be due, so a flood of refused registrations
    /// never makes each request walk every environment. Only touched with `envs` held.
    next_due: Mutex<Option<Instant>>,
    max_parked: usize,
    timing: RouterTiming,
    next_socket: AtomicU64,
}

impl Hub {
    pub fn new(config: &RendezvousConfig, capacity: Capacity, timing: RouterTiming) -> Arc<Self> {
        Arc::new(Self {
            envs: Mutex::new(HashMap::new()),
            capacity,
            grace: Duration::from_secs(config.grace_secs),
            registration_ttl: Duration::from_secs(config.registration_ttl_secs),
            attach_timeout: Duration::from_secs(config.attach_timeout_secs),
            next_due: Mutex::new(None),
            max_parked: config.max_parked_streams_per_environment,
            timing,
            next_socket: AtomicU64::new(1),
        })
    }

    #[cfg(test)]
    pub fn capacity(&self) -> &Capacity {
        &self.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Environments> {
        self.envs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When `env`'s registration is due to be deleted, and why; `None` while its executor
    /// is attached.
    fn deadline(&self, env: &Environment) -> Option<(Instant, Removal)> {
        if env.executor.is_some() {
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
    fn expire(&self, envs: &mut Environments, id: &str, now: Instant) {
        if let Some(why) = envs.get(id).and_then(|env| self.due(env, now)) {
            self.remove(envs, id, why);
        }
    }

    /// The one way a registration ends: its sockets are told and closed, and dropping it
    /// gives its capacity back.
    fn remove(&self, envs: &mut Environments, id: &str, why: Removal) {
        let Some(mut env) = envs.remove(id) else {
            return;
        };
        env.reset_harnesses();
        if let Some(executor) = env.executor.take() {
            executor.close(1000);
        }
        let tenant = env.registration.slot.tenant();
        let registration = std::mem::take(&mut env.registration.id);
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
    pub fn register(
        &self,
        id: &str,
        key: NoisePublicKey,
        name: Option<String>,
        tenant: TenantId,
    ) -> Result<String, RegisterRefusal> {
        let now = Instant::now();
        let mut envs = self.lock();
        self.expire(&mut envs, id, now);
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
            let live = env.executor_within_grace(self.grace, now)
                || (!env.ever_attached
                    && now.saturating_duration_since(current.created) < self.grace);
            if live {
                return Err(RegisterRefusal::Busy);
            }
        }
        let admitted = match self.admit(&mut envs, id, key.clone(), tenant, now) {
            Err(_) if self.anything_due(now) => {
                // Full, but something is due: free it first, then decide.
                self.sweep_locked(&mut envs, now);
                self.admit(&mut envs, id, key, tenant, now)
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
    ) -> Result<String, Refusal> {
        let reg_id = registration_id(id, &key);
        match envs.get_mut(id) {
            Some(env) => {
                self.capacity
                    .move_environment(&mut env.registration.slot, tenant)?;
                env.replaced
                    .insert(std::mem::take(&mut env.registration.id));
                env.reset_harnesses();
                env.replaced.remove(&reg_id);
                env.registration.id = reg_id.clone();
                env.registration.key = key;
                env.registration.created = now;
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
                    slot,
                };
                let places = self.capacity.environment_sockets(id);
                let env = Environment::new(registration, places);
                self.note_deadline(&env);
                envs.insert(id.to_owned(), env);
            }
        }
        Ok(reg_id)
    }

    pub fn connectable(&self, id: &str) -> Connectable {
        let now = Instant::now();
        let mut envs = self.lock();
        self.expire(&mut envs, id, now);
        let Some(env) = envs.get(id) else {
            return Connectable::NotFound;
        };
        if env.executor_within_grace(self.grace, now) {
            Connectable::Yes {
                reg: env.registration.id.clone(),
                key: env.registration.key.clone(),
            }
        } else {
            Connectable::Unavailable
        }
    }

    pub fn current_registration(&self, id: &str) -> Option<String> {
        let mut envs = self.lock();
        self.expire(&mut envs, id, Instant::now());
        envs.get(id).map(|e| e.registration.id.clone())
    }

    /// Upgrade checks 5–7 of §8.4: the registration exists, belongs here, is current.
    fn upgrade_target<'a>(
        &self,
        envs: &'a mut Environments,
        id: &str,
        reg: &str,
    ) -> Result<&'a mut Environment, StatusCode> {
        self.expire(envs, id, Instant::now());
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

    /// May an executor socket for `reg` be opened?
    pub fn admit_executor(&self, id: &str, reg: &str) -> Result<(), StatusCode> {
        let mut envs = self.lock();
        self.upgrade_target(&mut envs, id, reg).map(|_| ())
    }

    /// May a harness socket for `reg` be opened? Its place at the environment and among
    /// the owner tenant's sockets is taken now, before the upgrade completes, so
    /// concurrent upgrades cannot over-admit; the slot is released when the socket ends
    /// (or the upgrade fails and the slot is dropped unused).
    pub fn admit_harness(&self, id: &str, reg: &str) -> Result<HarnessSlot, UpgradeRefusal> {
        let now = Instant::now();
        let mut envs = self.lock();
        let env = self
            .upgrade_target(&mut envs, id, reg)
            .map_err(UpgradeRefusal::Status)?;
        if !env.executor_within_grace(self.grace, now) {
            return Err(UpgradeRefusal::Status(StatusCode::SERVICE_UNAVAILABLE));
        }
        self.capacity
            .lease_harness_socket(&env.socket_places, env.registration.slot.tenant())
            .map_err(UpgradeRefusal::Capacity)
    }

    fn spawn_socket(
        &self,
        socket: WebSocket,
    ) -> (
        SocketHandle,
        futures_util::stream::SplitStream<WebSocket>,
        Arc<Mutex<Instant>>,
    ) {
        let (sink, stream) = socket.split();
        let (tx, rx) = mpsc::channel(SOCKET_QUEUE);
        let kill = CancellationToken::new();
        let written = CancellationToken::new();
        let last_pong = Arc::new(Mutex::new(Instant::now()));
        let handle = SocketHandle {
            id: self.next_socket.fetch_add(1, Ordering::Relaxed),
            tx,
            kill: kill.clone(),
            written: written.clone(),
        };
        let timing = self.timing;
        let last = Arc::clone(&last_pong);
        tokio::spawn(async move {
            write_loop(sink, rx, kill, last, timing).await;
            written.cancel();
        });
        (handle, stream, last_pong)
    }

    /// Serves one executor socket for the registration `reg`.
    pub async fn serve_executor(self: Arc<Self>, env_id: String, reg: String, socket: WebSocket) {
        let (handle, mut stream, last_pong) = self.spawn_socket(socket);
        if !self.attach_executor(&env_id, &reg, &handle) {
            handle.close(4002);
            return;
        }
        let mut invalid = 0u32;
        let mut left_for_good = false;
        loop {
            let message = tokio::select! {
                _ = handle.kill.cancelled() => break,
                m = stream.next() => m,
            };
            let bytes = match message {
                Some(Ok(Message::Binary(bytes))) => bytes,
                Some(Ok(Message::Pong(_))) => {
                    *last_pong.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                    continue;
                }
                Some(Ok(Message::Text(_))) => {
                    handle.close(1003);
                    break;
                }
                Some(Err(e)) => {
                    if is_too_big(e) {
                        handle.close(1009);
                    }
                    break;
                }
                Some(Ok(Message::Close(frame))) => {
                    // 1000 is what an executor sends when it stops (§8.8, §9.1).
                    left_for_good = frame.is_some_and(|f| f.code == 1000);
                    break;
                }
                None => break,
                Some(Ok(_)) => continue,
            };
            let Some(frame) = decode_valid(&bytes) else {
                invalid += 1;
                tracing::debug!(invalid, "dropped an invalid frame from an executor");
                continue;
            };
            self.forward_from_executor(&env_id, &handle, bytes, &frame);
        }
        handle.kill.cancel();
        self.detach_executor(&env_id, handle.id, left_for_good);
    }

    /// Makes `handle` the executor socket of `reg`; `false` when `reg` is no longer the
    /// environment's registration.
    fn attach_executor(&self, env_id: &str, reg: &str, handle: &SocketHandle) -> bool {
        let mut envs = self.lock();
        let Some(env) = envs.get_mut(env_id) else {
            return false;
        };
        if env.registration.id != reg {
            return false;
        }
        if let Some(old) = env.executor.replace(handle.clone()) {
            old.close(4002);
        }
        env.ever_attached = true;
        env.detached_since = None;
        for route in env.routes.values_mut() {
            if let Some(held) = route.held_for_executor.take() {
                handle.send(held);
            }
        }
        tracing::info!(environment = %proto::truncate_for_log(env_id), "executor attached");
        true
    }

    /// The executor socket `socket` ended. An executor that left for good deletes its
    /// registration at once; otherwise it may come back within the grace (§8.2).
    fn detach_executor(&self, env_id: &str, socket: u64, left_for_good: bool) {
        let mut envs = self.lock();
        let Some(env) = envs.get_mut(env_id) else {
            return;
        };
        if env.executor.as_ref().is_none_or(|e| e.id != socket) {
            return;
        }
        env.executor = None;
        if left_for_good {
            self.remove(&mut envs, env_id, Removal::ExecutorLeft);
        } else {
            env.detached_since = Some(Instant::now());
            self.note_deadline(env);
            tracing::info!(environment = %proto::truncate_for_log(env_id), "executor detached");
        }
    }

    fn forward_from_executor(
        &self,
        env_id: &str,
        handle: &SocketHandle,
        bytes: Bytes,
        frame: &proto::RelayMessageFrame,
    ) {
        let now = Instant::now();
        let mut envs = self.lock();
        let Some(env) = envs.get_mut(env_id) else {
            return;
        };
        if env.executor.as_ref().is_none_or(|e| e.id != handle.id) {
            return;
        }
        let sid = frame.stream_id.as_str();
        let is_reset = matches!(frame.body, Some(Body::Reset(_)));
        let is_resume = matches!(&frame.body, Some(Body::Resume(r)) if r.next_seq >= 1);
        if let Some(route) = env.routes.get_mut(sid) {
            match &route.harness {
                Some(harness) => {
                    harness.send(bytes);
                    if is_reset {
                        harness.close(1000);
                        env.close_route(sid);
                    }
                }
                None => {
                    if is_reset {
                        env.close_route(sid);
                    } else if is_resume {
                        route.held_for_harness = Some(bytes);
                    }
                }
            }
        } else if env.closed.contains(sid) {
            if !is_reset {
                env.unknown_stream_reset(sid, now);
            }
        } else if !is_reset {
            let parked = env.routes.values().filter(|r| r.harness.is_none()).count();
            if parked < self.max_parked {
                env.routes.insert(
                    sid.to_owned(),
                    Route {
                        parked_since: Some(now),
                        held_for_harness: is_resume.then_some(bytes),
                        ..Route::default()
                    },
                );
            } else if env.unknown_stream_reset(sid, now) {
                tracing::warn!(
                    reason = "overloaded",
                    limit = "rendezvous.max_parked_streams_per_environment",
                    environment = %proto::truncate_for_log(env_id),
                    max = self.max_parked,
                    "environment is at its limit of parked streams; stream reset"
                );
            }
        }
    }

    /// Serves one harness socket whose signed URL named the registration `reg` and the key
    /// hash `kh`; `slot` is its capacity, held until the socket ends.
    pub async fn serve_harness(
        self: Arc<Self>,
        env_id: String,
        reg: String,
        kh: String,
        slot: HarnessSlot,
        socket: WebSocket,
    ) {
        let _slot = slot;
        let (handle, mut stream, last_pong) = self.spawn_socket(socket);
        if !self.open_harness(&env_id, &reg, &handle) {
            handle.close(1011);
            return;
        }
        let mut bound: Option<String> = None;
        let mut invalid = 0u32;
        let mut ended_by_reset = false;
        loop {
            let message = tokio::select! {
                _ = handle.kill.cancelled() => break,
                m = stream.next() => m,
            };
            let bytes = match message {
                Some(Ok(Message::Binary(bytes))) => bytes,
                Some(Ok(Message::Pong(_))) => {
                    *last_pong.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                    continue;
                }
                Some(Ok(Message::Text(_))) => {
                    handle.close(1003);
                    break;
                }
                Some(Err(e)) => {
                    if is_too_big(e) {
                        handle.close(1009);
                    }
                    break;
                }
                Some(Ok(Message::Close(_))) | None => break,
                Some(Ok(_)) => continue,
            };
            let Some(frame) = decode_valid(&bytes) else {
                invalid += 1;
                if invalid >= MAX_INVALID_FRAMES {
                    handle.close(1002);
                    break;
                }
                continue;
            };
            match &bound {
                None => {
                    if !self.bind_harness(&env_id, &kh, &handle, &frame.stream_id) {
                        break;
                    }
                    bound = Some(frame.stream_id.clone());
                }
                Some(sid) if *sid != frame.stream_id => {
                    handle.close(1008);
                    break;
                }
                Some(_) => {}
            }
            if !self.forward_from_harness(&env_id, &handle, bytes, &frame) {
                ended_by_reset = true;
                break;
            }
        }
        handle.kill.cancel();
        let now = Instant::now();
        let mut envs = self.lock();
        if let Some(env) = envs.get_mut(&env_id) {
            env.harness_sockets.remove(&handle.id);
            if let (Some(sid), false) = (&bound, ended_by_reset) {
                if let Some(route) = env.routes.get_mut(sid) {
                    if route.harness.as_ref().is_some_and(|h| h.id == handle.id) {
                        route.harness = None;
                        route.parked_since = Some(now);
                    }
                }
            }
        }
    }

    /// Records a new harness socket; `false` when its registration went away meanwhile.
    fn open_harness(&self, env_id: &str, reg: &str, handle: &SocketHandle) -> bool {
        let mut envs = self.lock();
        match envs.get_mut(env_id) {
            Some(env) if env.registration.id == reg => {
                env.harness_sockets.insert(handle.id, handle.clone());
                true
            }
            _ => false,
        }
    }

    /// Binds a harness socket to its stream (§8.6); `false` when the socket was refused.
    fn bind_harness(&self, env_id: &str, kh: &str, handle: &SocketHandle, sid: &str) -> bool {
        let mut envs = self.lock();
        let Some(env) = envs.get_mut(env_id) else {
            handle.close(1011);
            return false;
        };
        if env.closed.contains(sid) {
            handle.send(proto::encode(&proto::reset_frame(
                sid,
                ResetReason::UnknownStream,
            )));
            handle.close(1000);
            return false;
        }
        let route = env.routes.entry(sid.to_owned()).or_default();
        match &route.kh {
            Some(existing) if existing != kh => {
                handle.close(1008);
                return false;
            }
            _ => {}
        }
        route.kh = Some(kh.to_owned());
        if let Some(old) = route.harness.replace(handle.clone()) {
            tracing::info!(stream = %proto::truncate_for_log(sid), "harness socket takeover");
            old.close(4002);
        }
        route.parked_since = None;
        if let Some(held) = route.held_for_harness.take() {
            handle.send(held);
        }
        true
    }

    /// Forwards a harness frame; `false` when the socket must end.
    fn forward_from_harness(
        &self,
        env_id: &str,
        handle: &SocketHandle,
        bytes: Bytes,
        frame: &proto::RelayMessageFrame,
    ) -> bool {
        let now = Instant::now();
        let mut envs = self.lock();
        let Some(env) = envs.get_mut(env_id) else {
            return false;
        };
        let sid = frame.stream_id.as_str();
        let is_reset = matches!(frame.body, Some(Body::Reset(_)));
        let is_resume = matches!(&frame.body, Some(Body::Resume(r)) if r.next_seq >= 1);
        if let Some(executor) = &env.executor {
            executor.send(bytes);
        } else if env.executor_within_grace(self.grace, now) {
            if is_resume {
                if let Some(route) = env.routes.get_mut(sid) {
                    route.held_for_executor = Some(bytes);
                }
            }
        } else {
            handle.send(proto::encode(&proto::reset_frame(
                sid,
                ResetReason::ExecutorUnavailable,
            )));
            handle.close(1000);
            env.close_route(sid);
            return false;
        }
        if is_reset {
            env.close_route(sid);
            handle.close(1000);
            return false;
        }
        true
    }

    /// Expires parked routes, absent executors and old registrations (§8.2, §8.7).
    pub fn spawn_sweeper(self: &Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let hub = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(hub.timing.sweep_every);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => hub.sweep(Instant::now()),
                }
            }
        })
    }

    fn sweep(&self, now: Instant) {
        let mut envs = self.lock();
        self.sweep_locked(&mut envs, now);
    }

    fn sweep_locked(&self, envs: &mut Environments, now: Instant) {
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
            self.remove(envs, &id, why);
        }
        for env in envs.values_mut() {
            let executor_gone = env.executor.is_none()
                && env
                    .detached_since
                    .is_some_and(|t| now.saturating_duration_since(t) >= self.grace);
            if executor_gone && !env.routes.is_empty() {
                let ids: Vec<String> = env.routes.keys().cloned().collect();
                for sid in ids {
                    if let Some(h) = env.routes.get(&sid).and_then(|r| r.harness.clone()) {
                        h.send(proto::encode(&proto::reset_frame(
                            &sid,
                            ResetReason::ExecutorUnavailable,
                        )));
                        h.close(1000);
                    }
                    env.close_route(&sid);
                }
            }
            let expired: Vec<String> = env
                .routes
                .iter()
                .filter(|(_, r)| {
                    r.harness.is_none()
                        && r.parked_since
                            .is_some_and(|t| now.saturating_duration_since(t) >= self.grace)
                })
                .map(|(sid, _)| sid.clone())
                .collect();
            for sid in expired {
                if let Some(executor) = &env.executor {
                    executor.send(proto::encode(&proto::reset_frame(
                        &sid,
                        ResetReason::HarnessUnavailable,
                    )));
                }
                env.close_route(&sid);
            }
        }
    }

    /// Closes every socket with 1001 (service shutdown) and waits, up to `drain`, until
    /// their close frames are written.
    pub async fn close_all(&self, drain: Duration) {
        let mut written = Vec::new();
        {
            let envs = self.lock();
            for env in envs.values() {
                for socket in env.executor.iter().chain(env.harness_sockets.values()) {
                    socket.close(1001);
                    written.push(socket.written.clone());
                }
            }
        }
        let _ = tokio::time::timeout(drain, async {
            for socket in written {
                socket.cancelled().await;
            }
        })
        .await;
    }
}

/// A message or frame above 256 KiB (§2.5 row 2): the socket is closed with 1009.
fn is_too_big(error: axum::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error as WsError;
    matches!(
        error.into_inner().downcast_ref::<WsError>(),
        Some(WsError::Capacity(_))
    )
}

/// Decodes and validates rows 3–9 of §2.5; `None` for a frame the router drops.
fn decode_valid(bytes: &[u8]) -> Option<proto::RelayMessageFrame> {
    let frame = proto::decode(bytes).ok()?;
    proto::validate(&frame).ok()?;
    Some(frame)
}

/// Writes what is already queued for a socket that is being killed, ending with its
/// close frame if one was queued.
async fn flush_queued(
    sink: &mut futures_util::stream::SplitSink<WebSocket, Message>,
    rx: &mut mpsc::Receiver<Out>,
) {
    while let Ok(out) = rx.try_recv() {
        let message = match out {
            Out::Frame(bytes) => Message::Binary(bytes),
            Out::Close(code) => Message::Close(Some(CloseFrame {
                code,
                reason: "".into(),
            })),
        };
        let last = matches!(message, Message::Close(_));
        if sink.send(message).await.is_err() || last {
            return;
        }
    }
}

async fn write_loop(
    mut sink: futures_util::stream::SplitSink<WebSocket, Message>,
    mut rx: mpsc::Receiver<Out>,
    kill: CancellationToken,
    last_pong: Arc<Mutex<Instant>>,
    timing: RouterTiming,
) {
    let mut ping =
        tokio::time::interval_at(Instant::now() + timing.ping_interval, timing.ping_interval);
    let mut unanswered: Option<Instant> = None;
    loop {
        let pong_deadline = unanswered.map(|t| t + timing.pong_timeout);
        tokio::select! {
            _ = kill.cancelled() => {
                // A socket closed right after `close(code)` still tells its peer why.
                flush_queued(&mut sink, &mut rx).await;
                break;
            }
            out = rx.recv() => match out {
                Some(Out::Frame(bytes)) => {
                    if sink.send(Message::Binary(bytes)).await.is_err() {
                        break;
                    }
                }
                Some(Out::Close(code)) => {
                    let _ = sink.send(Message::Close(Some(CloseFrame { code, reason: "".into() }))).await;
                    break;
                }
                None => break,
            },
            _ = ping.tick() => {
                let pong = *last_pong.lock().unwrap_or_else(|e| e.into_inner());
                if unanswered.is_some_and(|t| pong >= t) {
                    unanswered = None;
                }
                if unanswered.is_none() {
                    unanswered = Some(Instant::now());
                }
                if sink.send(Message::Ping(Bytes::new())).await.is_err() {
                    break;
                }
            }
            _ = async { tokio::time::sleep_until(pong_deadline.unwrap_or_else(Instant::now)).await }, if pong_deadline.is_some() => {
                let pong = *last_pong.lock().unwrap_or_else(|e| e.into_inner());
                if unanswered.is_some_and(|t| pong >= t) {
                    unanswered = None;
                } else {
                    tracing::info!("pong_timeout: closing a relay socket");
                    break;
                }
            }
        }
    }
    kill.cancel();
    let _ = sink.close().await;
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;

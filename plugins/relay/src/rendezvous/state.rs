//! The router's state (RELAY §8.2, §8.6, §8.7): per environment the current registration,
//! the executor socket, the route table `stream_id → harness socket` and the recently
//! closed ids, plus the socket loops that forward frames as their original bytes.

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

use crate::config::RendezvousConfig;
use crate::noise::NoisePublicKey;
use crate::proto::{self, Body, ResetReason};
use crate::rendezvous::signing::registration_id;

/// Closed stream ids remembered per environment.
const CLOSED_IDS: usize = 1_024;
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

struct Registration {
    id: String,
    key: NoisePublicKey,
    created: Instant,
}

#[derive(Default)]
struct Route {
    harness: Option<SocketHandle>,
    kh: Option<String>,
    parked_since: Option<Instant>,
    held_for_executor: Option<Bytes>,
    held_for_harness: Option<Bytes>,
}

#[derive(Default)]
struct ClosedIds {
    order: VecDeque<String>,
    set: HashSet<String>,
}

impl ClosedIds {
    fn insert(&mut self, id: String) {
        if self.set.insert(id.clone()) {
            self.order.push_back(id);
            if self.order.len() > CLOSED_IDS {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
    fn contains(&self, id: &str) -> bool {
        self.set.contains(id)
    }
}

#[derive(Default)]
struct Environment {
    registration: Option<Registration>,
    /// Ids of registrations replaced by a newer one (upgrade → 410).
    replaced: HashSet<String>,
    executor: Option<SocketHandle>,
    ever_attached: bool,
    detached_since: Option<Instant>,
    routes: HashMap<String, Route>,
    closed: ClosedIds,
    harness_sockets: usize,
    unknown_reset_at: HashMap<String, Instant>,
}

impl Environment {
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

    /// Reset{unknown_stream} to the executor, at most once per second per stream.
    fn unknown_stream_reset(&mut self, stream_id: &str, now: Instant) {
        let due = self
            .unknown_reset_at
            .get(stream_id)
            .is_none_or(|t| now.saturating_duration_since(*t) >= Duration::from_secs(1));
        if !due {
            return;
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
    }
}

pub enum RegisterRefusal {
    Busy,
    Overloaded,
}

pub enum Connectable {
    Yes { reg: String, key: NoisePublicKey },
    NotFound,
    Unavailable,
}

/// All environments of this service.
pub struct Hub {
    envs: Mutex<HashMap<String, Environment>>,
    grace: Duration,
    registration_ttl: Duration,
    max_environments: usize,
    max_harness_sockets: usize,
    max_parked: usize,
    timing: RouterTiming,
    next_socket: AtomicU64,
}

impl Hub {
    pub fn new(config: &RendezvousConfig, timing: RouterTiming) -> Arc<Self> {
        Arc::new(Self {
            envs: Mutex::new(HashMap::new()),
            grace: Duration::from_secs(config.grace_secs),
            registration_ttl: Duration::from_secs(config.registration_ttl_secs),
            max_environments: config.max_environments,
            max_harness_sockets: config.max_harness_sockets_per_environment,
            max_parked: config.max_parked_streams_per_environment,
            timing,
            next_socket: AtomicU64::new(1),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Environment>> {
        self.envs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `register` (§8.2): idempotent for the same key, 409 while another executor is live.
    pub fn register(
        &self,
        id: &str,
        key: NoisePublicKey,
        name: Option<String>,
    ) -> Result<String, RegisterRefusal> {
        let now = Instant::now();
        let mut envs = self.lock();
        if !envs.contains_key(id) && envs.len() >= self.max_environments {
            return Err(RegisterRefusal::Overloaded);
        }
        let env = envs.entry(id.to_owned()).or_default();
        let reg_id = registration_id(id, &key);
        if let Some(current) = &env.registration {
            if current.key == key {
                return Ok(current.id.clone());
            }
            let live = env.executor_within_grace(self.grace, now)
                || (!env.ever_attached
                    && now.saturating_duration_since(current.created) < self.grace);
            if live {
                return Err(RegisterRefusal::Busy);
            }
            env.replaced.insert(current.id.clone());
            let stale: Vec<String> = env.routes.keys().cloned().collect();
            for stream_id in stale {
                if let Some(route) = env.routes.get(&stream_id) {
                    if let Some(h) = &route.harness {
                        h.send(proto::encode(&proto::reset_frame(
                            &stream_id,
                            ResetReason::ExecutorUnavailable,
                        )));
                        h.close(1000);
                    }
                }
                env.close_route(&stream_id);
            }
        }
        tracing::info!(environment = %proto::truncate_for_log(id), registration = %reg_id, name = ?name, "executor registered");
        env.replaced.remove(&reg_id);
        env.registration = Some(Registration {
            id: reg_id.clone(),
            key,
            created: now,
        });
        env.ever_attached = false;
        env.detached_since = None;
        Ok(reg_id)
    }

    pub fn connectable(&self, id: &str) -> Connectable {
        let now = Instant::now();
        let envs = self.lock();
        let Some(env) = envs.get(id) else {
            return Connectable::NotFound;
        };
        let Some(reg) = &env.registration else {
            return Connectable::NotFound;
        };
        if env.executor_within_grace(self.grace, now) {
            Connectable::Yes {
                reg: reg.id.clone(),
                key: reg.key,
            }
        } else {
            Connectable::Unavailable
        }
    }

    pub fn current_registration(&self, id: &str) -> Option<String> {
        self.lock()
            .get(id)
            .and_then(|e| e.registration.as_ref().map(|r| r.id.clone()))
    }

    /// Upgrade checks 5–7 of §8.4, plus the harness-side capacity and presence checks.
    pub fn check_upgrade(&self, id: &str, reg: &str, role: SocketRole) -> Result<(), StatusCode> {
        let now = Instant::now();
        let envs = self.lock();
        let Some(env) = envs.get(id) else {
            return Err(StatusCode::NOT_FOUND);
        };
        match &env.registration {
            Some(current) if current.id == reg => {}
            _ if env.replaced.contains(reg) => return Err(StatusCode::GONE),
            _ => return Err(StatusCode::NOT_FOUND),
        }
        if role == SocketRole::Harness {
            if !env.executor_within_grace(self.grace, now) {
                return Err(StatusCode::SERVICE_UNAVAILABLE);
            }
            if env.harness_sockets >= self.max_harness_sockets {
                return Err(StatusCode::SERVICE_UNAVAILABLE);
            }
        }
        Ok(())
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
        {
            let mut envs = self.lock();
            let env = envs.entry(env_id.clone()).or_default();
            if env.registration.as_ref().is_none_or(|r| r.id != reg) {
                handle.close(4002);
                return;
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
            tracing::info!(environment = %proto::truncate_for_log(&env_id), "executor attached");
        }
        let mut invalid = 0u32;
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
                tracing::debug!(invalid, "dropped an invalid frame from an executor");
                continue;
            };
            self.forward_from_executor(&env_id, &handle, bytes, &frame);
        }
        handle.kill.cancel();
        let mut envs = self.lock();
        if let Some(env) = envs.get_mut(&env_id) {
            if env.executor.as_ref().is_some_and(|e| e.id == handle.id) {
                env.executor = None;
                env.detached_since = Some(Instant::now());
                tracing::info!(environment = %proto::truncate_for_log(&env_id), "executor detached");
            }
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
            } else {
                env.unknown_stream_reset(sid, now);
            }
        }
    }

    /// Serves one harness socket whose signed URL named the key hash `kh`.
    pub async fn serve_harness(self: Arc<Self>, env_id: String, kh: String, socket: WebSocket) {
        let (handle, mut stream, last_pong) = self.spawn_socket(socket);
        if let Some(env) = self.lock().get_mut(&env_id) {
            env.harness_sockets += 1;
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
            env.harness_sockets = env.harness_sockets.saturating_sub(1);
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
            if env.executor.is_none()
                && env
                    .detached_since
                    .is_some_and(|t| now.saturating_duration_since(t) >= self.registration_ttl)
            {
                env.registration = None;
                env.replaced.clear();
                env.detached_since = None;
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
                let harnesses = env.routes.values().filter_map(|r| r.harness.as_ref());
                for socket in env.executor.iter().chain(harnesses) {
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

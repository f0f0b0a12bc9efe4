//! The router (RELAY §8.6, §8.7): the live sockets of this process and the routes between
//! them — per environment the executor socket, the route table `stream_id → harness
//! socket`, parked routes and the recently closed ids — and the socket loops that forward
//! frames as their original bytes. Registrations are not kept here: the store
//! (`crate::store`) decides who may attach, and tells the router, through
//! [`Router::registrations_ended`], which registrations' sockets to close.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use bytes::Bytes;
use exec_server_relay_core::proto::{self, Body, ResetReason, StreamFeatures};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::memory::RecentIds;
use crate::store::{Ended, Epoch, Held, Removal};

/// Closed stream ids remembered per environment.
const CLOSED_IDS: usize = 1_024;
/// Invalid frames that close a harness socket (§6.2).
pub(crate) const MAX_INVALID_FRAMES: u32 = 8;
/// Frames queued towards one socket; beyond that, or beyond the socket's queue bytes
/// (`rendezvous.socket_queue_bytes`), frames are dropped (endpoints retransmit).
const SOCKET_QUEUE: usize = 1_024;

/// Timing of the router's liveness checks; tests shorten them.
#[derive(Debug, Clone, Copy)]
pub struct RouterTiming {
    pub ping_interval: Duration,
    pub pong_timeout: Duration,
    pub sweep_every: Duration,
    /// A write to a socket that has not finished after this (the peer takes nothing)
    /// closes the socket (`rendezvous.stalled_peer_timeout_ms`).
    pub stalled_peer_timeout: Duration,
}

impl Default for RouterTiming {
    fn default() -> Self {
        Self {
            ping_interval: Duration::from_secs(30),
            pong_timeout: Duration::from_secs(60),
            sweep_every: Duration::from_millis(250),
            stalled_peer_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketRole {
    Executor,
    Harness,
}

pub(crate) enum Out {
    Frame(Bytes),
    Close(u16),
}

/// The sending half of one socket.
#[derive(Clone)]
pub(crate) struct SocketHandle {
    pub(crate) id: u64,
    tx: mpsc::Sender<Out>,
    /// Bytes of the frames in `tx`, at most `queue_bytes`.
    queued: Arc<AtomicUsize>,
    queue_bytes: usize,
    pub(crate) kill: CancellationToken,
    /// Cancelled once the writer has finished (its close frame, if any, is written).
    written: CancellationToken,
}

impl SocketHandle {
    /// A handle whose frames land in `tx` instead of a WebSocket.
    #[cfg(test)]
    pub(crate) fn for_test(id: u64, tx: mpsc::Sender<Out>, queue_bytes: usize) -> Self {
        Self {
            id,
            tx,
            queued: Arc::new(AtomicUsize::new(0)),
            queue_bytes,
            kill: CancellationToken::new(),
            written: CancellationToken::new(),
        }
    }

    /// Queues `bytes`, unless the socket's queue is full (in frames or bytes): then the
    /// frame is dropped and the endpoints' retransmission makes up for it.
    pub(crate) fn send(&self, bytes: Bytes) {
        let len = bytes.len();
        let room = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued + len <= self.queue_bytes).then_some(queued + len)
            });
        if room.is_err() || self.tx.try_send(Out::Frame(bytes)).is_err() {
            if room.is_ok() {
                self.queued.fetch_sub(len, Ordering::AcqRel);
            }
            tracing::debug!(socket = self.id, "socket queue full; frame dropped");
        }
    }

    /// Bytes queued towards the socket now.
    #[cfg(test)]
    pub(crate) fn queued_bytes(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    pub(crate) fn close(&self, code: u16) {
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
    /// The executor's msg2 announced no reliable stream: codex semantics, so the stream
    /// ends with the executor's socket (CODEX-0169 §4.5) and cannot wait for it.
    ends_with_executor_socket: bool,
}

/// The sockets and routes of one environment's registration on this process.
struct Environment {
    /// The registration these sockets belong to.
    epoch: Epoch,
    /// Registrations up to this one have ended: sockets admitted for them are stale.
    ended_through: Epoch,
    executor: Option<SocketHandle>,
    ever_attached: bool,
    detached_since: Option<Instant>,
    routes: HashMap<String, Route>,
    closed: RecentIds,
    /// Every open harness socket, bound to a route or not, so that ending the
    /// registration can close them all.
    harness_sockets: HashMap<u64, SocketHandle>,
    unknown_reset_at: HashMap<String, Instant>,
}

impl Environment {
    fn new(epoch: Epoch) -> Self {
        Self {
            epoch,
            ended_through: 0,
            executor: None,
            ever_attached: false,
            detached_since: None,
            routes: HashMap::new(),
            closed: RecentIds::new(CLOSED_IDS),
            harness_sockets: HashMap::new(),
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

    /// Moves the environment to the registration `epoch` (newer than its own): whatever
    /// belonged to the older one is reset and closed.
    fn renew(&mut self, epoch: Epoch) {
        self.reset_harnesses();
        if let Some(executor) = self.executor.take() {
            executor.close(1000);
        }
        self.epoch = epoch;
        self.ever_attached = false;
        self.detached_since = None;
    }

    /// May a socket admitted for `epoch` join? An older registration's environment is
    /// renewed first; a newer or ended one refuses it.
    fn admits(&mut self, epoch: Epoch) -> bool {
        if epoch <= self.ended_through || epoch < self.epoch {
            return false;
        }
        if epoch > self.epoch {
            self.renew(epoch);
        }
        true
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

    /// The executor socket ended: its codex-semantics streams ended with it, on the
    /// executor's side already. Their harnesses get Reset{executor_unavailable} and their
    /// sockets close now — parked, they would wait for records nobody will send (a codex
    /// executor says nothing about them when it reconnects) instead of resuming their
    /// sessions on new streams.
    fn reset_streams_lost_with_executor(&mut self) {
        let lost: Vec<String> = self
            .routes
            .iter()
            .filter(|(_, route)| route.ends_with_executor_socket)
            .map(|(sid, _)| sid.clone())
            .collect();
        for sid in lost {
            if let Some(harness) = self.routes.get(&sid).and_then(|r| r.harness.as_ref()) {
                harness.send(proto::encode(&proto::reset_frame(
                    &sid,
                    ResetReason::ExecutorUnavailable,
                )));
                harness.close(1000);
            }
            self.close_route(&sid);
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

type Environments = HashMap<String, Environment>;

/// Every live socket of this process, by environment.
pub struct Router {
    envs: Mutex<Environments>,
    /// How long a detached executor and a parked route are waited for (§8.7).
    grace: Duration,
    max_parked: usize,
    /// Bytes queued towards one socket at most.
    queue_bytes: usize,
    pub(crate) timing: RouterTiming,
    next_socket: AtomicU64,
}

impl Router {
    /// `queue_bytes`: bytes queued towards one socket at most.
    pub fn new(
        grace: Duration,
        max_parked: usize,
        queue_bytes: usize,
        timing: RouterTiming,
    ) -> Self {
        Self {
            envs: Mutex::new(HashMap::new()),
            grace,
            max_parked,
            queue_bytes,
            timing,
            next_socket: AtomicU64::new(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Environments> {
        self.envs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes the sockets of registrations the store ended: their harness routes are
    /// reset with `executor_unavailable` and their sockets closed; an environment whose
    /// registration was deleted is forgotten, one that was replaced keeps its closed ids.
    pub fn registrations_ended(&self, ended: Vec<Ended>) {
        if ended.is_empty() {
            return;
        }
        let mut envs = self.lock();
        for end in ended {
            let Some(env) = envs.get_mut(&end.environment) else {
                continue;
            };
            if env.epoch > end.epoch {
                continue;
            }
            env.renew(end.epoch);
            env.ended_through = env.ended_through.max(end.epoch);
            if end.why != Removal::Replaced {
                envs.remove(&end.environment);
            }
        }
    }

    /// The environments this process has sockets or routes of, with the registration
    /// they serve and whether it holds the executor socket (a shared store renews this
    /// node's lease on those, and says which moved elsewhere).
    pub fn held(&self) -> Vec<Held> {
        self.lock()
            .iter()
            .map(|(id, env)| Held {
                environment: id.clone(),
                epoch: env.epoch,
                executor: env.executor.is_some(),
            })
            .collect()
    }

    /// The environment's executor attached to another node (RELAY §8.10): this node's
    /// executor socket is closed as replaced (4002) and its harness sockets with 1001, so
    /// harnesses reconnect, are sent to the new node and resume there. Routes are
    /// forgotten without a Reset: the streams go on at the other node.
    pub fn environment_moved(&self, env_id: &str) {
        let Some(env) = self.lock().remove(env_id) else {
            return;
        };
        if let Some(executor) = &env.executor {
            executor.close(4002);
        }
        for socket in env.harness_sockets.values() {
            socket.close(1001);
        }
        tracing::info!(
            environment = %proto::truncate_for_log(env_id),
            harness_sockets = env.harness_sockets.len(),
            "environment moved to another node; its sockets here are closed"
        );
    }

    pub(crate) fn spawn_socket(
        &self,
        socket: WebSocket,
    ) -> (
        SocketHandle,
        futures_util::stream::SplitStream<WebSocket>,
        Arc<Mutex<Instant>>,
    ) {
        let (sink, stream) = socket.split();
        let (tx, rx) = mpsc::channel(SOCKET_QUEUE);
        let queued = Arc::new(AtomicUsize::new(0));
        let rx = Queue {
            rx,
            queued: Arc::clone(&queued),
        };
        let kill = CancellationToken::new();
        let written = CancellationToken::new();
        let last_pong = Arc::new(Mutex::new(Instant::now()));
        let handle = SocketHandle {
            id: self.next_socket.fetch_add(1, Ordering::Relaxed),
            tx,
            queued,
            queue_bytes: self.queue_bytes,
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

    /// Makes `handle` the executor socket of the registration `epoch`; `false` when that
    /// registration has been superseded or has ended meanwhile.
    pub(crate) fn attach_executor(
        &self,
        env_id: &str,
        epoch: Epoch,
        handle: &SocketHandle,
    ) -> bool {
        let mut envs = self.lock();
        let env = envs
            .entry(env_id.to_owned())
            .or_insert_with(|| Environment::new(epoch));
        if !env.admits(epoch) {
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

    /// The executor socket `socket` ended; the registration it served when it was the
    /// environment's executor, `None` for a socket that had been replaced.
    pub(crate) fn detach_executor(&self, env_id: &str, socket: u64) -> Option<Epoch> {
        let mut envs = self.lock();
        let env = envs.get_mut(env_id)?;
        if env.executor.as_ref().is_none_or(|e| e.id != socket) {
            return None;
        }
        env.executor = None;
        env.detached_since = Some(Instant::now());
        env.reset_streams_lost_with_executor();
        Some(env.epoch)
    }

    pub(crate) fn forward_from_executor(
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
            if let Some(Body::Handshake(msg2)) = &frame.body {
                route.ends_with_executor_socket = StreamFeatures::announced(msg2).is_empty();
            }
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

    /// Records a new harness socket admitted for the registration `epoch`; `false` when
    /// that registration has been superseded or has ended meanwhile. (A harness is only
    /// admitted once its environment's executor has attached, which is when the router
    /// learns the environment.)
    pub(crate) fn open_harness(&self, env_id: &str, epoch: Epoch, handle: &SocketHandle) -> bool {
        let mut envs = self.lock();
        let Some(env) = envs.get_mut(env_id) else {
            return false;
        };
        if !env.admits(epoch) {
            return false;
        }
        env.harness_sockets.insert(handle.id, handle.clone());
        true
    }

    /// A harness socket ended: forgotten, and its route parked unless a Reset ended it.
    pub(crate) fn close_harness(
        &self,
        env_id: &str,
        handle: &SocketHandle,
        bound: Option<&str>,
        ended_by_reset: bool,
    ) {
        let now = Instant::now();
        let mut envs = self.lock();
        if let Some(env) = envs.get_mut(env_id) {
            env.harness_sockets.remove(&handle.id);
            if let (Some(sid), false) = (bound, ended_by_reset) {
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
    pub(crate) fn bind_harness(
        &self,
        env_id: &str,
        kh: &str,
        handle: &SocketHandle,
        sid: &str,
    ) -> bool {
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
    pub(crate) fn forward_from_harness(
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
        // A handshake is held too: a harness may send msg1 only once (codex's does, and
        // ours on hybrid streams), and its handshake must complete once the executor is
        // back (§7.4).
        let is_handshake = matches!(frame.body, Some(Body::Handshake(_)));
        if let Some(executor) = &env.executor {
            executor.send(bytes);
        } else if env.executor_within_grace(self.grace, now) {
            if is_resume || is_handshake {
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

    /// Expires parked routes and resets the routes of executors gone past the grace
    /// (§8.7).
    pub(crate) fn sweep(&self, now: Instant) {
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
pub(crate) fn is_too_big(error: axum::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error as WsError;
    matches!(
        error.into_inner().downcast_ref::<WsError>(),
        Some(WsError::Capacity(_))
    )
}

/// Decodes and validates rows 3–9 of §2.5; `None` for a frame the router drops.
pub(crate) fn decode_valid(bytes: &[u8]) -> Option<proto::RelayMessageFrame> {
    let frame = proto::decode(bytes).ok()?;
    proto::validate(&frame).ok()?;
    Some(frame)
}

/// The receiving end of a socket's queue: what it hands out no longer counts against the
/// socket's queue bytes (the sink holds at most a burst of it).
struct Queue {
    rx: mpsc::Receiver<Out>,
    queued: Arc<AtomicUsize>,
}

impl Queue {
    fn taken(&self, out: Out) -> Out {
        if let Out::Frame(bytes) = &out {
            self.queued.fetch_sub(bytes.len(), Ordering::AcqRel);
        }
        out
    }

    async fn recv(&mut self) -> Option<Out> {
        let out = self.rx.recv().await?;
        Some(self.taken(out))
    }

    fn try_recv(&mut self) -> Option<Out> {
        let out = self.rx.try_recv().ok()?;
        Some(self.taken(out))
    }
}

/// Writes what is already queued for a socket that is being killed, ending with its
/// close frame if one was queued.
async fn flush_queued(
    sink: &mut futures_util::stream::SplitSink<WebSocket, Message>,
    rx: &mut Queue,
) {
    while let Some(out) = rx.try_recv() {
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

/// Frames written with one flush at most: enough to fill the socket in a burst, few
/// enough that Pings and the Pong deadline are never held up for long.
const BURST_FRAMES: usize = 64;

/// Writes `first` and the frames already queued behind it, then flushes once: a burst of
/// records costs one write to the socket, not one per frame. `Some(code)`: a close was
/// queued behind the frames; the caller sends it and ends.
async fn write_burst(
    sink: &mut futures_util::stream::SplitSink<WebSocket, Message>,
    first: Bytes,
    rx: &mut Queue,
) -> Result<Option<u16>, axum::Error> {
    sink.feed(Message::Binary(first)).await?;
    let mut close = None;
    for _ in 1..BURST_FRAMES {
        match rx.try_recv() {
            Some(Out::Frame(bytes)) => sink.feed(Message::Binary(bytes)).await?,
            Some(Out::Close(code)) => {
                close = Some(code);
                break;
            }
            None => break,
        }
    }
    sink.flush().await?;
    Ok(close)
}

async fn write_loop(
    mut sink: futures_util::stream::SplitSink<WebSocket, Message>,
    mut rx: Queue,
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
                let flush = flush_queued(&mut sink, &mut rx);
                let _ = tokio::time::timeout(timing.stalled_peer_timeout, flush).await;
                break;
            }
            out = rx.recv() => match out {
                Some(Out::Frame(bytes)) => {
                    let burst = write_burst(&mut sink, bytes, &mut rx);
                    match tokio::time::timeout(timing.stalled_peer_timeout, burst).await {
                        Ok(Ok(None)) => {}
                        Ok(Ok(Some(code))) => {
                            let _ = sink.send(Message::Close(Some(CloseFrame { code, reason: "".into() }))).await;
                            break;
                        }
                        Ok(Err(_)) => break,
                        Err(_) => {
                            tracing::warn!("stalled_peer: a relay socket took nothing for rendezvous.stalled_peer_timeout_ms; closing it");
                            break;
                        }
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
                let ping = sink.send(Message::Ping(Bytes::new()));
                if !matches!(tokio::time::timeout(timing.stalled_peer_timeout, ping).await, Ok(Ok(()))) {
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
    // A peer that takes nothing does not take a close either: its socket is dropped then.
    let _ = tokio::time::timeout(timing.stalled_peer_timeout, sink.close()).await;
}

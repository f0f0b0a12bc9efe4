//! Executor mode (RELAY §3.5, §6, §7.6, §9.1): register, keep one rendezvous socket,
//! admit handshakes through `/validate`, and run one JSON-RPC connection per stream — or,
//! in forward mode, hand each stream to a destination WebSocket ([`crate::forward`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use exec_server_core::audit::{AuditScope, AuthIdentity, Level, RelayIdentity, Who};
use exec_server_core::config::ConfigSource;
use exec_server_core::connection::{serve_connection, ConnectionInfo, Inbound};
use exec_server_core::{Listener, ListenerFailed, ServerContext, StartupError};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use exec_server_relay_core::driver::{
    drive_stream, sleep_until_opt, AppSide, Link, ShutdownMode, StreamEnd, StreamEvent, Uplink,
    STREAM_INBOX,
};
use exec_server_relay_core::endpoint::BaseUrl;
use exec_server_relay_core::link::{self, Incoming, LinkTiming, OpenError};
use exec_server_relay_core::noise::{
    suite_by_profile, NoiseHandshake, NoiseIdentity, NoisePublicKey, RecordCipher, DEFAULT_SUITE,
    MAX_AUTHORIZATION_BYTES,
};
use exec_server_relay_core::proto::{
    self, Body, RelayHandshake, RelayMessageFrame, ResetReason, StreamFeatures,
};
use exec_server_relay_core::registry::{RegistryClient, RegistryError};
use exec_server_relay_core::reliable::{ReliableStream, Role, Semantics, StreamLimits, Timing};
use exec_server_relay_core::tls::TlsTrust;

use crate::config::RelayConfig;
use crate::forward::ForwardTarget;

exec_server_core::inventory::submit! {
    exec_server_core::ConfiguredTransport { name: "relay", open: open_relay }
}

/// Retired stream ids remembered per registration (§6.3).
const RETIRED_IDS: usize = 1_024;
/// Invalid frames that name no usable stream within [`INVALID_WINDOW`] that close the
/// physical connection (§2.5). Frames that name a stream are that stream's failure, never
/// the connection's.
const MAX_INVALID_FRAMES: usize = 8;
const INVALID_WINDOW: Duration = Duration::from_secs(60);
/// How long a stopping executor keeps its connection for streams to flush: their 5 s
/// (§5.10) plus time for the final Resets.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(6);
/// How long a closing connection may take to write what is queued.
const LINK_DRAIN: Duration = Duration::from_secs(1);
/// How long a stream's JSON-RPC connection may take to finish once the stream ended.
const CONNECTION_END: Duration = Duration::from_secs(5);

fn open_relay(
    source: &ConfigSource,
    server: &Arc<ServerContext>,
) -> Result<Option<Box<dyn Listener>>, StartupError> {
    let config = RelayConfig::load(source)?;
    if !config.enabled() {
        return Ok(None);
    }
    let token = config
        .bearer_token()
        .map_err(|e| StartupError(e.to_string()))?;
    let base = BaseUrl::parse(
        config.url.as_deref().unwrap_or_default(),
        config.allow_insecure,
    )
    .map_err(|e| StartupError(e.to_string()))?;
    let trust = config.tls_trust().map_err(StartupError)?;
    let registry = RegistryClient::with_trust(
        base,
        token,
        Duration::from_millis(config.request_timeout_ms),
        config.allow_insecure,
        &trust,
    );
    let forward = config
        .forward_target(server.core.limits.max_message_bytes, &trust)
        .map_err(StartupError)?;
    if let Some(target) = &forward {
        tracing::info!(destination = %target.display_url(), "forwarding each relay stream");
    }
    let executor = Executor::new(
        config,
        registry,
        trust,
        Arc::clone(server),
        Timing::default(),
        forward,
    );
    Ok(Some(Box::new(RelayListener { executor })))
}

struct RelayListener {
    executor: Arc<Executor>,
}

#[async_trait]
impl Listener for RelayListener {
    async fn bind(&mut self) -> Result<Option<String>, StartupError> {
        Ok(None)
    }

    /// A terminal registry answer (§7.6, §9.1) ends the listener with an error, which
    /// stops the server with exit status 1.
    async fn serve(self: Box<Self>, _server: Arc<ServerContext>) -> Result<(), ListenerFailed> {
        self.executor
            .run()
            .await
            .map_err(|e| ListenerFailed(e.to_string()))
    }
}

enum Slot {
    Pending {
        digest: [u8; 32],
        cancel: CancellationToken,
    },
    Established {
        digest: [u8; 32],
        msg2: Bytes,
        /// What msg2 announced, sent again with a cached msg2.
        features: StreamFeatures,
        /// Codex streams resend nothing: their frames are never dropped on a full inbox.
        lossless: bool,
        data_seen: Arc<AtomicBool>,
        inbox: mpsc::Sender<StreamEvent>,
    },
}

#[derive(Default)]
struct Retired {
    order: VecDeque<String>,
    digests: HashMap<String, [u8; 32]>,
    last_unknown_reset: HashMap<String, Instant>,
}

impl Retired {
    fn insert(&mut self, id: String, digest: [u8; 32]) {
        if self.digests.insert(id.clone(), digest).is_none() {
            self.order.push_back(id);
            if self.order.len() > RETIRED_IDS {
                if let Some(old) = self.order.pop_front() {
                    self.digests.remove(&old);
                    self.last_unknown_reset.remove(&old);
                }
            }
        }
    }
}

#[derive(Default)]
struct State {
    registration_id: String,
    ws_url: String,
    streams: HashMap<String, Slot>,
    retired: Retired,
    /// Streams lost with a physical connection (codex streams at once, ours after the
    /// resume grace) whose harnesses have not been told yet: they get a Reset as soon as a
    /// connection is up again.
    lost_unannounced: Vec<String>,
}

/// Why the executor stopped serving for good.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecutorError {
    /// `register` got a terminal answer (§7.6): the process exits with status 1.
    #[error("relay registration failed: {0}")]
    Registration(RegistryError),
}

/// The executor: one per process in remote mode.
pub struct Executor {
    config: RelayConfig,
    environment_id: String,
    identity: NoiseIdentity,
    registry: RegistryClient,
    /// What the rendezvous socket's TLS trusts (the registry client has the same).
    tls: TlsTrust,
    server: Arc<ServerContext>,
    timing: Timing,
    link_timing: LinkTiming,
    uplink: Uplink,
    state: Mutex<State>,
    /// Failed handshakes seen on the current physical connection. Only counted for the
    /// operator's warning: each one resets its own stream and nothing else, so one
    /// harness's bad handshakes never cost the other harnesses this connection.
    failed_handshakes: AtomicUsize,
    /// Set while the single `register` that follows a `/validate` refused with 401/403
    /// runs (§7.6), so several refusals at once lead to one call.
    reregistering: AtomicBool,
    /// Cancelled when that `register` got a terminal answer: the executor stops and
    /// [`Executor::run`] returns the error held in `fatal_message`.
    fatal: CancellationToken,
    fatal_message: Mutex<Option<ExecutorError>>,
    /// One permit per stream that ended, so a shutdown knows when every stream flushed.
    stream_ended: Notify,
    /// Forward mode: where each stream goes instead of a local JSON-RPC connection.
    forward: Option<ForwardTarget>,
}

impl Executor {
    /// With `forward`, each stream is copied to its own WebSocket to that target instead
    /// of being served by this process (forward mode).
    pub fn new(
        config: RelayConfig,
        registry: RegistryClient,
        tls: TlsTrust,
        server: Arc<ServerContext>,
        timing: Timing,
        forward: Option<ForwardTarget>,
    ) -> Arc<Self> {
        let link_timing = LinkTiming {
            ping_interval: Duration::from_millis(config.ping_interval_ms),
            pong_timeout: Duration::from_millis(config.pong_timeout_ms),
        };
        // One identity per process, reused across registrations, of the configured suite.
        let identity = NoiseIdentity::generate_for(
            suite_by_profile(&config.security_profile).unwrap_or(DEFAULT_SUITE),
        );
        Arc::new(Self {
            environment_id: config.environment_id.clone().unwrap_or_default(),
            config,
            identity,
            registry,
            tls,
            server,
            timing,
            link_timing,
            uplink: Uplink::default(),
            state: Mutex::new(State::default()),
            failed_handshakes: AtomicUsize::new(0),
            reregistering: AtomicBool::new(false),
            fatal: CancellationToken::new(),
            fatal_message: Mutex::new(None),
            stream_ended: Notify::new(),
            forward,
        })
    }

    pub fn public_key(&self) -> NoisePublicKey {
        self.identity.public()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn limits(&self) -> StreamLimits {
        StreamLimits {
            max_message_bytes: self.server.core.limits.max_message_bytes,
            inbound_queue_messages: self.config.inbound_queue_messages,
            inbound_queue_bytes: self.config.inbound_queue_bytes,
        }
    }

    /// Registers, retrying transient failures with the backoff; `Err` on a terminal answer.
    async fn register(&self, backoff: &mut Backoff) -> Result<(), ExecutorError> {
        let shutdown = self.server.shutdown.clone();
        let key = self.identity.public();
        loop {
            let attempt =
                self.registry
                    .register(&self.environment_id, &key, self.config.name.as_deref());
            let result = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                r = attempt => r,
            };
            match result {
                Ok(reg) => {
                    tracing::info!(
                        environment = %self.environment_id,
                        registration = %reg.executor_registration_id,
                        url = %exec_server_relay_core::endpoint::redact_url(&reg.url),
                        "registered with the relay registry"
                    );
                    let mut state = self.lock();
                    if state.registration_id != reg.executor_registration_id {
                        state.retired = Retired::default();
                    }
                    state.registration_id = reg.executor_registration_id;
                    state.ws_url = reg.url;
                    return Ok(());
                }
                Err(e) if e.is_retryable() => {
                    if e.status() == Some(409) {
                        tracing::warn!("environment is busy with another executor; retrying: {e}");
                    } else {
                        tracing::warn!("relay registration failed; retrying: {e}");
                    }
                    let delay = backoff.next(e.retry_after());
                    tokio::select! {
                        _ = shutdown.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
                Err(e) => return Err(ExecutorError::Registration(e)),
            }
        }
    }

    /// After `/validate` answered 401 or 403: one `register` call now, while the physical
    /// connection carries on (§7.6). A terminal answer ends the process with status 1.
    fn register_again(self: &Arc<Self>) {
        if self.reregistering.swap(true, Ordering::SeqCst) {
            return;
        }
        let executor = Arc::clone(self);
        tokio::spawn(async move {
            let mut backoff = Backoff::new(
                Duration::from_millis(executor.config.reconnect_initial_backoff_ms),
                Duration::from_millis(executor.config.reconnect_max_backoff_ms),
            );
            let result = executor.register(&mut backoff).await;
            executor.reregistering.store(false, Ordering::SeqCst);
            if let Err(message) = result {
                *executor
                    .fatal_message
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(message);
                executor.fatal.cancel();
            }
        });
    }

    /// The registration and connection loop of §7.6; returns at shutdown.
    pub async fn run(self: &Arc<Self>) -> Result<(), ExecutorError> {
        let shutdown = self.server.shutdown.clone();
        let mut backoff = Backoff::new(
            Duration::from_millis(self.config.reconnect_initial_backoff_ms),
            Duration::from_millis(self.config.reconnect_max_backoff_ms),
        );
        self.register(&mut backoff).await?;
        loop {
            if let Some(message) = self.take_fatal() {
                return Err(message);
            }
            if shutdown.is_cancelled() {
                break;
            }
            let url = self.lock().ws_url.clone();
            let mut must_register = false;
            let timeout = Duration::from_millis(self.config.connect_timeout_ms);
            match link::open(&url, timeout, &self.tls).await {
                Ok(ws) => {
                    let started = Instant::now();
                    self.serve_physical(ws).await;
                    if started.elapsed() >= Duration::from_millis(self.config.stable_session_ms) {
                        backoff.reset();
                    }
                }
                Err(
                    e @ OpenError::Status {
                        status: 401 | 403 | 404 | 410,
                        ..
                    },
                ) => {
                    // Often a mismatch of the rendezvous's public URL and its listener:
                    // say so here, not only in the rendezvous's own log.
                    tracing::warn!("{e}; registering again");
                    must_register = true;
                }
                Err(e) => tracing::warn!("{e}"),
            }
            if shutdown.is_cancelled() {
                break;
            }
            let delay = backoff.next(None);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.fatal.cancelled() => continue,
                _ = tokio::time::sleep(delay) => {}
            }
            if must_register {
                self.register(&mut backoff).await?;
            }
        }
        Ok(())
    }

    fn take_fatal(&self) -> Option<ExecutorError> {
        if !self.fatal.is_cancelled() {
            return None;
        }
        self.fatal_message
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Serves one physical connection until it ends.
    async fn serve_physical(self: &Arc<Self>, ws: link::ClientWs) {
        let (handle, mut stream) = link::start(ws, self.link_timing);
        self.failed_handshakes.store(0, Ordering::SeqCst);
        self.uplink.set(Some(handle.frames.clone()));
        self.announce_lost_streams();
        self.broadcast(|| StreamEvent::Connected);
        let shutdown = self.server.shutdown.clone();
        let mut invalid: VecDeque<Instant> = VecDeque::new();
        let mut flush_until: Option<Instant> = None;
        loop {
            let incoming = tokio::select! {
                _ = shutdown.cancelled(), if flush_until.is_none() => {
                    // Each stream flushes its records (at most 5 s, §5.10) and then sends
                    // Reset{shutdown}; the connection keeps reading their acknowledgements.
                    flush_until = Some(Instant::now() + SHUTDOWN_FLUSH);
                    if self.established_streams() == 0 {
                        handle.close(1000);
                        break;
                    }
                    continue;
                }
                _ = self.stream_ended.notified(), if flush_until.is_some() => {
                    if self.established_streams() == 0 {
                        handle.close(1000);
                        break;
                    }
                    continue;
                }
                _ = sleep_until_opt(flush_until) => {
                    handle.close(1000);
                    break;
                }
                _ = self.fatal.cancelled() => {
                    handle.close(1000);
                    break;
                }
                i = link::read(&mut stream, &handle) => i,
            };
            let bytes = match incoming {
                Incoming::Binary(bytes) => bytes,
                Incoming::Text => {
                    handle.close(1003);
                    break;
                }
                Incoming::Ended(code) => {
                    tracing::info!(code = ?code, "relay connection closed");
                    break;
                }
            };
            let mut blocked = None;
            let fault = self.handle_bytes(&bytes, &mut blocked);
            if let Some((inbox, event)) = blocked {
                // A codex stream's full inbox holds up this socket instead of losing the
                // frame: nothing would resend it.
                let _ = inbox.send(event).await;
            }
            match fault {
                // An invalid frame that names a stream is that stream's failure: the stream
                // (if active) is reset and nothing is charged to the shared connection.
                Some(Some((sid, reason))) => self.reset_active(&sid, reason),
                // Nothing in it says whose it is: the router that let it through is at
                // fault, and the router is this connection's peer.
                Some(None) if unattributed_limit_reached(&mut invalid, Instant::now()) => {
                    tracing::warn!("8 unattributable invalid frames within 60 s; reconnecting");
                    handle.close(1002);
                    break;
                }
                Some(None) | None => {}
            }
        }
        self.uplink.set(None);
        handle.dead.cancel();
        // Frames already queued (a last Reset, the close code) reach the socket first.
        let _ = tokio::time::timeout(LINK_DRAIN, handle.finished()).await;
        self.broadcast(|| StreamEvent::Disconnected);
    }

    /// Resets, on the connection just opened, the streams lost with an earlier one.
    /// Nothing else would tell their harnesses: the rendezvous keeps a harness's socket
    /// open while the executor is away, and a codex harness waiting for output would wait
    /// for ever instead of resuming its session on a new stream.
    fn announce_lost_streams(&self) {
        let lost = std::mem::take(&mut self.lock().lost_unannounced);
        for sid in lost {
            self.send_reset(&sid, ResetReason::UnknownStream);
        }
    }

    /// A stream was lost with its physical connection: its harness is told on the current
    /// connection if one is up again, otherwise on the next.
    fn stream_lost_with_link(&self, sid: &str) {
        let mut state = self.lock();
        if self.uplink.is_connected() {
            drop(state);
            self.send_reset(sid, ResetReason::UnknownStream);
            return;
        }
        if state.lost_unannounced.len() < RETIRED_IDS {
            state.lost_unannounced.push(sid.to_owned());
        }
    }

    fn established_streams(&self) -> usize {
        let state = self.lock();
        state
            .streams
            .values()
            .filter(|s| matches!(s, Slot::Established { .. }))
            .count()
    }

    fn broadcast(&self, event: impl Fn() -> StreamEvent) {
        let state = self.lock();
        for slot in state.streams.values() {
            if let Slot::Established { inbox, .. } = slot {
                let _ = inbox.try_send(event());
            }
        }
    }

    /// Resets a stream that is pending or established (invalid frame naming it).
    fn reset_active(&self, sid: &str, reason: ResetReason) {
        let mut state = self.lock();
        match state.streams.remove(sid) {
            Some(Slot::Pending { digest, cancel }) => {
                cancel.cancel();
                state.retired.insert(sid.to_owned(), digest);
                drop(state);
                self.send_reset(sid, reason);
            }
            Some(Slot::Established { inbox, .. }) => {
                drop(state);
                self.retire_established(sid, inbox, reason);
            }
            None => {}
        }
    }

    /// Resets an established stream from the physical side: the Reset is queued now, so
    /// it precedes a close the same event may trigger, and the stream task ends without
    /// sending another.
    fn retire_established(&self, sid: &str, inbox: mpsc::Sender<StreamEvent>, reason: ResetReason) {
        self.send_reset(sid, reason);
        if let Err(mpsc::error::TrySendError::Full(event)) =
            inbox.try_send(StreamEvent::Retire(reason))
        {
            tokio::spawn(async move {
                let _ = inbox.send(event).await;
            });
        }
    }

    /// Queues a Reset at once when there is room, so it precedes a close that the same
    /// event may trigger (an executor exiting on a refused `register`); otherwise waits
    /// for room.
    fn send_reset(&self, sid: &str, reason: ResetReason) {
        let frame = proto::reset_frame(sid, reason);
        if self.uplink.try_send(&frame) || !self.uplink.is_connected() {
            return;
        }
        let uplink = self.uplink.clone();
        tokio::spawn(async move { uplink.send(&frame).await });
    }

    /// Notes a failed handshake (§3.5 "counts"). Its stream was reset and that is all it
    /// costs: the connection is shared by every harness of this environment, and the
    /// executor cannot tell which harness sent a bad msg1 (frames carry only a stream id;
    /// a harness key is known only after a successful `read_message`). The operator is
    /// warned at `warn_failed_handshakes` failures on one connection and again at each
    /// doubling, so a flood writes a handful of lines, not one per frame.
    fn count_failure(&self) {
        let failed = self.failed_handshakes.fetch_add(1, Ordering::SeqCst) + 1;
        // Zero is refused when the config is loaded; `max` keeps a hand-built one safe.
        let threshold = self.config.warn_failed_handshakes.max(1);
        if failed % threshold == 0 && (failed / threshold).is_power_of_two() {
            tracing::warn!(
                failed,
                "failed relay handshakes on this connection; each reset only its own stream"
            );
        }
    }

    /// Dispatches one binary message. Returns `Some` for an invalid frame (rows 3–8 of
    /// §2.5), with the stream to reset when one is named.
    /// A frame for a lossless stream whose inbox is full is handed back in `blocked`, for
    /// the caller to send with waiting.
    fn handle_bytes(
        self: &Arc<Self>,
        bytes: &[u8],
        blocked: &mut Option<BlockedFrame>,
    ) -> Option<Option<(String, ResetReason)>> {
        let Ok(frame) = proto::decode(bytes) else {
            return Some(None);
        };
        if let Err(fault) = proto::validate(&frame) {
            if fault == proto::FrameFault::HandshakeSize {
                // Row 9: a handshake failure, charged to the handshake budget.
                self.reject_handshake(&frame.stream_id, ResetReason::HandshakeFailed, true);
                return None;
            }
            let named = fault
                .reset_reason()
                .filter(|_| proto::stream_id_is_valid(&frame.stream_id))
                .map(|r| (frame.stream_id.clone(), r));
            return Some(named);
        }
        let sid = frame.stream_id.clone();
        match &frame.body {
            Some(Body::Handshake(h)) => self.on_handshake(&sid, h),
            Some(Body::Reset(_)) => {
                let mut state = self.lock();
                match state.streams.remove(&sid) {
                    Some(Slot::Pending { digest, cancel }) => {
                        cancel.cancel();
                        state.retired.insert(sid, digest);
                    }
                    Some(Slot::Established { inbox, .. }) => {
                        let _ = inbox.try_send(StreamEvent::Frame(frame));
                    }
                    None => {}
                }
            }
            _ => *blocked = self.on_stream_frame(sid, frame),
        }
        None
    }

    fn on_stream_frame(&self, sid: String, frame: RelayMessageFrame) -> Option<BlockedFrame> {
        let is_data = matches!(frame.body, Some(Body::Data(_)));
        let is_resume = matches!(&frame.body, Some(Body::Resume(r)) if r.next_seq >= 1);
        let mut state = self.lock();
        match state.streams.get(&sid) {
            Some(Slot::Established {
                inbox,
                data_seen,
                lossless,
                ..
            }) => {
                if is_data {
                    data_seen.store(true, Ordering::SeqCst);
                }
                if let Err(mpsc::error::TrySendError::Full(event)) =
                    inbox.try_send(StreamEvent::Frame(frame))
                {
                    if *lossless {
                        return Some((inbox.clone(), event));
                    }
                    tracing::debug!("stream inbox full; frame dropped");
                }
            }
            Some(Slot::Pending { .. }) => {
                if is_data {
                    if let Some(Slot::Pending { digest, cancel }) = state.streams.remove(&sid) {
                        cancel.cancel();
                        state.retired.insert(sid.clone(), digest);
                    }
                    drop(state);
                    self.send_reset(&sid, ResetReason::HandshakeFailed);
                    self.count_failure();
                }
            }
            None => {
                if is_data || is_resume {
                    let now = Instant::now();
                    let due = state
                        .retired
                        .last_unknown_reset
                        .get(&sid)
                        .is_none_or(|t| now.duration_since(*t) >= Duration::from_secs(1));
                    if due {
                        if state.retired.last_unknown_reset.len() > RETIRED_IDS {
                            state.retired.last_unknown_reset.clear();
                        }
                        state.retired.last_unknown_reset.insert(sid.clone(), now);
                        drop(state);
                        self.send_reset(&sid, ResetReason::UnknownStream);
                    }
                }
            }
        }
        None
    }

    fn reject_handshake(&self, sid: &str, reason: ResetReason, counts: bool) {
        if proto::stream_id_is_valid(sid) {
            self.send_reset(sid, reason);
        }
        if counts {
            self.count_failure();
        }
    }

    /// Handshake admission, rows 1–10 of §3.5.
    fn on_handshake(self: &Arc<Self>, sid: &str, handshake: &RelayHandshake) {
        let msg1 = handshake.payload.clone();
        let offered = StreamFeatures::announced(handshake);
        let digest = sha256(&msg1);
        let mut state = self.lock();
        match state.streams.get(sid) {
            Some(Slot::Pending { digest: d, .. }) if *d == digest => return,
            Some(Slot::Established {
                digest: d,
                msg2,
                features,
                data_seen,
                ..
            }) if *d == digest => {
                if !data_seen.load(Ordering::SeqCst) {
                    let frame = proto::frame(
                        sid,
                        0,
                        0,
                        proto::handshake_body_with(msg2.clone(), *features),
                    );
                    let uplink = self.uplink.clone();
                    tokio::spawn(async move { uplink.send(&frame).await });
                }
                return;
            }
            Some(_) => {
                match state.streams.remove(sid) {
                    Some(Slot::Pending { digest, cancel }) => {
                        cancel.cancel();
                        state.retired.insert(sid.to_owned(), digest);
                        drop(state);
                        self.reject_handshake(sid, ResetReason::DuplicateStream, true);
                    }
                    Some(Slot::Established { inbox, .. }) => {
                        drop(state);
                        self.retire_established(sid, inbox, ResetReason::DuplicateStream);
                        self.count_failure();
                    }
                    None => {}
                }
                return;
            }
            None => {}
        }
        if let Some(d) = state.retired.digests.get(sid) {
            if *d != digest {
                drop(state);
                self.reject_handshake(sid, ResetReason::DuplicateStream, true);
            }
            return;
        }
        let established = state
            .streams
            .values()
            .filter(|s| matches!(s, Slot::Established { .. }))
            .count();
        if established >= self.config.max_streams {
            drop(state);
            return self.reject_handshake(sid, ResetReason::StreamLimit, false);
        }
        let pending = state.streams.len() - established;
        if pending >= self.config.max_pending_validations {
            drop(state);
            return self.reject_handshake(sid, ResetReason::ValidationLimit, false);
        }
        let suite = self.identity.suite();
        let (min, max) = suite.msg1_bounds();
        if msg1.len() < min || msg1.len() > max {
            drop(state);
            return self.reject_handshake(sid, ResetReason::HandshakeFailed, true);
        }
        let registration_id = state.registration_id.clone();
        let p = suite.prologue(&self.environment_id, &registration_id, sid);
        let mut responder = match suite.responder(&self.identity, &p) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("cannot build the Noise responder: {e}");
                return;
            }
        };
        let mut payload = vec![0u8; proto::MAX_NOISE_MESSAGE];
        let authorization = match responder.read_message(&msg1, &mut payload) {
            Ok(n) if (1..=MAX_AUTHORIZATION_BYTES).contains(&n) => {
                match String::from_utf8(payload[..n].to_vec()) {
                    Ok(text) => text,
                    Err(_) => {
                        drop(state);
                        return self.reject_handshake(sid, ResetReason::HandshakeFailed, true);
                    }
                }
            }
            _ => {
                drop(state);
                return self.reject_handshake(sid, ResetReason::HandshakeFailed, true);
            }
        };
        let Some(harness_key) = responder.remote_static() else {
            drop(state);
            return self.reject_handshake(sid, ResetReason::HandshakeFailed, true);
        };
        let cancel = CancellationToken::new();
        state.streams.insert(
            sid.to_owned(),
            Slot::Pending {
                digest,
                cancel: cancel.clone(),
            },
        );
        drop(state);
        let executor = Arc::clone(self);
        let sid = sid.to_owned();
        tokio::spawn(async move {
            let timeout = Duration::from_millis(executor.config.validate_timeout_ms);
            let call = executor.registry.validate(
                &executor.environment_id,
                &registration_id,
                &harness_key,
                &authorization,
                &sid,
            );
            let outcome = tokio::select! {
                _ = cancel.cancelled() => return,
                r = tokio::time::timeout(timeout, call) => r.unwrap_or(Err(RegistryError::Timeout)),
            };
            executor.finish_validation(sid, digest, offered, responder, outcome);
        });
    }

    fn finish_validation(
        self: &Arc<Self>,
        sid: String,
        digest: [u8; 32],
        offered: StreamFeatures,
        mut responder: Box<dyn NoiseHandshake>,
        outcome: Result<bool, RegistryError>,
    ) {
        let mut state = self.lock();
        match state.streams.get(&sid) {
            Some(Slot::Pending { digest: d, .. }) if *d == digest => {}
            _ => return,
        }
        let reject = |state: &mut State, reason| {
            state.streams.remove(&sid);
            state.retired.insert(sid.clone(), digest);
            reason
        };
        // Registering again comes after the Reset is queued (§7.6): a terminal answer
        // closes the socket, and the Reset must be on it first.
        let mut register_again = false;
        let reason = match outcome {
            Ok(true) => None,
            Ok(false) => {
                self.count_failure();
                Some(reject(&mut state, ResetReason::Unauthorized))
            }
            Err(e) => {
                if e.is_auth_failure() {
                    tracing::error!("relay validate was refused ({e}); registering again");
                    register_again = true;
                } else {
                    tracing::warn!(
                        "relay validate failed: {}",
                        e.status()
                            .map_or_else(|| e.to_string(), |s| format!("HTTP {s}"))
                    );
                }
                Some(reject(&mut state, ResetReason::ValidationUnavailable))
            }
        };
        if let Some(reason) = reason {
            drop(state);
            self.send_reset(&sid, reason);
            if register_again {
                self.register_again();
            }
            return;
        }
        let who = self.stream_who(&sid, responder.remote_static());
        let mut msg2 = vec![0u8; self.identity.suite().msg2_len()];
        let transport = responder.write_message(&[], &mut msg2).and_then(|n| {
            msg2.truncate(n);
            responder.into_transport()
        });
        let transport = match transport {
            Ok(t) => t,
            Err(e) => {
                tracing::error!("Noise responder failed: {e}");
                reject(&mut state, ResetReason::HandshakeFailed);
                drop(state);
                return self.send_reset(&sid, ResetReason::HandshakeFailed);
            }
        };
        let msg2 = Bytes::from(msg2);
        // Our ends offer reliable streams; a codex harness offers nothing and gets codex
        // semantics (CODEX-0169 §4.5). msg2 accepts what the stream will use.
        let semantics =
            Semantics::for_stream(self.identity.suite(), StreamFeatures::RELIABLE, offered);
        let features = match semantics {
            Semantics::Reliable => StreamFeatures::RELIABLE,
            Semantics::Codex => StreamFeatures::NONE,
        };
        let (inbox_tx, inbox_rx) = mpsc::channel(STREAM_INBOX);
        let data_seen = Arc::new(AtomicBool::new(false));
        state.streams.insert(
            sid.clone(),
            Slot::Established {
                digest,
                msg2: msg2.clone(),
                features,
                lossless: semantics == Semantics::Codex,
                data_seen,
                inbox: inbox_tx,
            },
        );
        drop(state);
        // msg2 goes out before any frame of the stream task.
        let uplink = self.uplink.clone();
        let executor = Arc::clone(self);
        tokio::spawn(async move {
            uplink
                .send(&proto::frame(
                    &sid,
                    0,
                    0,
                    proto::handshake_body_with(msg2, features),
                ))
                .await;
            tracing::debug!(stream = %sid, ?semantics, "relay stream established");
            executor
                .run_stream(sid, digest, semantics, transport, inbox_rx, who)
                .await;
        });
    }

    async fn run_stream(
        self: Arc<Self>,
        sid: String,
        digest: [u8; 32],
        semantics: Semantics,
        transport: Box<dyn RecordCipher>,
        inbox: mpsc::Receiver<StreamEvent>,
        who: Arc<Who>,
    ) {
        let audit = AuditScope::connection(&self.server.audit, Arc::clone(&who), None);
        audit.emit("relay.stream.opened", |_: Level| {
            let mut details = serde_json::Map::new();
            details.insert(
                "semantics".into(),
                format!("{semantics:?}").to_lowercase().into(),
            );
            details
        });
        let machine = ReliableStream::new(
            sid.clone(),
            Role::Executor,
            semantics,
            transport,
            self.limits(),
            self.timing,
            Instant::now(),
        );
        let (app, mut connection) = match &self.forward {
            None => self.local_connection(&sid, who),
            Some(target) => forward_connection(target.clone(), &sid),
        };
        let end = drive_stream(
            machine,
            inbox,
            self.uplink.clone(),
            app,
            Duration::from_millis(self.config.resume_grace_ms),
            ShutdownMode::Flush(self.server.shutdown.clone()),
            Link::Shared,
        )
        .await;
        tracing::debug!(stream = %sid, end = ?end, "relay stream ended");
        if let StreamEnd::ResetReceived(reason) = &end {
            tracing::info!(stream = %sid, reason = %reason, "relay stream reset by the peer");
        }
        if matches!(end, StreamEnd::Lost) {
            self.stream_lost_with_link(&sid);
        }
        {
            let mut state = self.lock();
            state.streams.remove(&sid);
            state.retired.insert(sid, digest);
        }
        self.stream_ended.notify_one();
        // The stream's end closed the connection's inbound side; let the connection finish
        // in order so its session is detached (an aborted task would leave it attached),
        // or, forwarding, so the destination gets its Close.
        if tokio::time::timeout(CONNECTION_END, &mut connection)
            .await
            .is_err()
        {
            connection.abort();
        }
        audit.emit("relay.stream.closed", |_: Level| {
            let mut details = serde_json::Map::new();
            details.insert("end".into(), format!("{end:?}").into());
            details
        });
    }
}

impl Executor {
    /// The stream's JSON-RPC connection, served by this process.
    /// Who a stream's harness is, for the audit trail: its Noise static key (as a hash),
    /// the environment and the rendezvous (without query or fragment).
    fn stream_who(&self, sid: &str, harness: Option<NoisePublicKey>) -> Arc<Who> {
        let subject = harness.map(|key| {
            let hex: String = sha256(key.as_bytes())[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("sha256:{hex}")
        });
        let rendezvous = self.config.url.as_deref().unwrap_or_default();
        let rendezvous = rendezvous.split(['?', '#']).next().unwrap_or_default();
        Arc::new(Who {
            transport: "relay",
            peer: None,
            auth: Some(AuthIdentity {
                mode: "noise",
                subject,
                issuer: None,
            }),
            relay: Some(RelayIdentity {
                environment: self.environment_id.clone(),
                rendezvous: rendezvous.to_owned(),
                stream: sid.to_owned(),
                suite: self.identity.suite().name(),
            }),
        })
    }

    fn local_connection(&self, sid: &str, who: Arc<Who>) -> (AppSide, tokio::task::JoinHandle<()>) {
        let (to_app, app_rx) = mpsc::channel::<Bytes>(1);
        let (outbound, from_app) = self
            .server
            .outbound_queue(Some(self.server.core.limits.max_message_bytes));
        let info = ConnectionInfo {
            transport: "relay",
            parse_error_prefix: format!(
                "failed to parse JSON-RPC message from exec-server relay stream {sid}"
            ),
            detach_on_close: true,
            drain_on_end: None,
            descriptor: None,
            who,
        };
        let inbound = Box::pin(futures_util::stream::unfold(app_rx, |mut rx| async move {
            rx.recv().await.map(|bytes| (Inbound::Message(bytes), rx))
        }));
        let connection = tokio::spawn(serve_connection(
            Arc::clone(&self.server),
            info,
            inbound,
            outbound,
        ));
        let app = AppSide {
            to_app,
            from_app: from_app.into_receiver(),
        };
        (app, connection)
    }
}

/// Messages waiting between a forwarded stream and its destination, each way. One is
/// enough to keep both busy; more would only hold more memory.
const FORWARD_QUEUE: usize = 1;

/// The stream's messages copied to and from its own destination socket.
fn forward_connection(target: ForwardTarget, sid: &str) -> (AppSide, tokio::task::JoinHandle<()>) {
    let (to_app, to_destination) = mpsc::channel::<Bytes>(FORWARD_QUEUE);
    let (from_destination, from_app) = mpsc::channel::<String>(FORWARD_QUEUE);
    let sid = sid.to_owned();
    let task = tokio::spawn(async move {
        target.serve(&sid, to_destination, from_destination).await;
    });
    (AppSide { to_app, from_app }, task)
}

/// Notes an invalid frame that names no stream at `now`; true when it is the
/// [`MAX_INVALID_FRAMES`]th within [`INVALID_WINDOW`].
fn unattributed_limit_reached(invalid: &mut VecDeque<Instant>, now: Instant) -> bool {
    invalid.push_back(now);
    while invalid
        .front()
        .is_some_and(|t| now.duration_since(*t) > INVALID_WINDOW)
    {
        invalid.pop_front();
    }
    invalid.len() >= MAX_INVALID_FRAMES
}

/// A frame for a stream whose inbox was full, to be sent with waiting.
type BlockedFrame = (mpsc::Sender<StreamEvent>, StreamEvent);

fn sha256(bytes: &[u8]) -> [u8; 32] {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .try_into()
        .expect("32 bytes")
}

/// Reconnect backoff of §7.6: a bound that starts at `initial`, doubles and is capped at
/// `max`; each delay is drawn uniformly from the upper half of the bound, as codex does
/// (CODEX-0169 §4.3), so executors cut off together do not come back together.
/// `Retry-After` is honoured up to the cap.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial,
        }
    }

    pub fn next(&mut self, retry_after: Option<Duration>) -> Duration {
        let bound = self.next;
        let mut delay = bound.mul_f64(0.5 + 0.5 * unit_random());
        if let Some(ra) = retry_after {
            delay = delay.max(ra.min(self.max));
        }
        self.next = (self.next * 2).min(self.max);
        delay
    }

    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// A uniform random number in [0, 1).
fn unit_random() -> f64 {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 8];
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        return 1.0;
    }
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_with_jitter_in_the_upper_half() {
        let mut delays = Vec::new();
        for _ in 0..50 {
            let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
            for bound in [1u64, 2, 4, 8, 16, 30, 30, 30] {
                let delay = b.next(None);
                let bound = Duration::from_secs(bound);
                assert!(
                    delay >= bound / 2 && delay <= bound,
                    "{delay:?} for {bound:?}"
                );
                delays.push(delay);
            }
            b.reset();
            assert!(b.next(None) <= Duration::from_secs(1));
        }
        delays.sort();
        delays.dedup();
        assert!(delays.len() > 8, "the delays are not all the same");
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        assert!(b.next(Some(Duration::from_secs(5))) >= Duration::from_secs(5));
        assert!(b.next(Some(Duration::from_secs(100))) <= Duration::from_secs(30));
    }
}

//! The harness side (RELAY §3.4, §5.8, §9.4): fetch a connect bundle, open the rendezvous
//! socket, run the Noise initiator with msg1 retransmission, then hand the caller a duplex
//! of whole JSON-RPC messages whose stream resumes across physical reconnects.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::driver::{
    drive_stream, AppSide, Link, ShutdownMode, StreamEnd, StreamEvent, Uplink, STREAM_INBOX,
};
use crate::endpoint::{redact_url, BaseUrl};
use crate::link::{self, Incoming, LinkTiming};
use crate::noise::{
    suite_by_profile, NoiseIdentity, NoisePublicKey, DEFAULT_SUITE, MAX_AUTHORIZATION_BYTES,
    SUITE_V1,
};
use crate::proto::{self, Body, ResetReason, StreamFeatures};
use crate::registry::{ConnectBundle, RegistryClient, RegistryError, SecretString};
use crate::reliable::{ReliableStream, Role, Semantics, StreamLimits, Timing};
use crate::tls::TlsTrust;

/// A harness-side failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("{0}")]
    Open(String),
    #[error("relay handshake failed")]
    HandshakeFailed,
    #[error("relay handshake timed out")]
    HandshakeTimeout,
    #[error("relay stream reset: {0}")]
    Reset(String),
    #[error("relay executor changed")]
    ExecutorChanged,
    #[error("relay stream lost")]
    Lost,
}

/// Supplies connect bundles instead of the HTTP `connect` call.
#[async_trait]
pub trait RelayBundleProvider: Send + Sync {
    /// Called once per physical connection attempt; must return a fresh bundle.
    async fn connect_bundle(
        &self,
        environment_id: &str,
        harness_key: &NoisePublicKey,
    ) -> Result<ConnectBundle, RelayError>;
}

/// What [`connect_relay`] needs.
#[derive(Clone)]
pub struct RelayConnectArgs {
    pub registry_url: String,
    pub environment_id: String,
    pub bearer_token: SecretString,
    /// The harness's static key; unset: a fresh key of the default suite, or of the
    /// suite the executor registered with when that is another.
    pub identity: Option<Arc<NoiseIdentity>>,
    /// The stream features msg1 offers. Reliable by default; a codex executor ignores
    /// the offer and the stream follows codex semantics.
    pub stream_features: StreamFeatures,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub handshake_timeout: Duration,
    pub resume_grace: Duration,
    /// A PEM file of CA certificates trusted besides the system's roots, for the `https`
    /// registry and the `wss` rendezvous socket (`relay.ca_file`, `--ca-file`).
    pub ca_file: Option<PathBuf>,
    pub allow_insecure: bool,
    /// Wait out a registry that answers `connect` with 503 or 429 for its `Retry-After`
    /// ([`crate::busy`]); on by default. A caller with its own retry loop turns it off.
    pub retry_busy_registry: bool,
    pub bundle_provider: Option<Arc<dyn RelayBundleProvider>>,
    /// Test hooks: the relay's fixed timing values.
    pub timing: Timing,
    pub link_timing: LinkTiming,
    pub limits: StreamLimits,
}

impl std::fmt::Debug for RelayConnectArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayConnectArgs")
            .field("registry_url", &redact_url(&self.registry_url))
            .field("environment_id", &self.environment_id)
            .field("bearer_token", &self.bearer_token)
            .finish_non_exhaustive()
    }
}

impl RelayConnectArgs {
    pub fn new(registry_url: &str, environment_id: &str, bearer_token: SecretString) -> Self {
        Self {
            registry_url: registry_url.to_owned(),
            environment_id: environment_id.to_owned(),
            bearer_token,
            identity: None,
            stream_features: StreamFeatures::RELIABLE,
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(15),
            resume_grace: Duration::from_secs(30),
            ca_file: None,
            allow_insecure: false,
            retry_busy_registry: true,
            bundle_provider: None,
            timing: Timing::default(),
            link_timing: LinkTiming::default(),
            limits: StreamLimits::default(),
        }
    }
}

struct HttpBundles {
    registry: RegistryClient,
    retry_busy: bool,
}

#[async_trait]
impl RelayBundleProvider for HttpBundles {
    async fn connect_bundle(
        &self,
        environment_id: &str,
        harness_key: &NoisePublicKey,
    ) -> Result<ConnectBundle, RelayError> {
        // A registry at its capacity (`store_unavailable`, `rate_limited`) is waited for.
        let mut busy = crate::busy::BusyRetries::default();
        loop {
            match self.registry.connect(environment_id, harness_key).await {
                Err(error) if self.retry_busy => {
                    let status = error.status().unwrap_or(0);
                    match busy.next_wait(status, error.retry_after()) {
                        Some(wait) => tokio::time::sleep(wait).await,
                        None => return Err(error.into()),
                    }
                }
                other => return Ok(other?),
            }
        }
    }
}

/// An established stream: send and receive whole JSON-RPC messages.
pub struct RelayConnection {
    stream_id: String,
    outgoing: mpsc::Sender<String>,
    incoming: mpsc::Receiver<Bytes>,
    end: Arc<Mutex<Option<RelayError>>>,
    /// Tells the stream's driver to reset the stream now ([`RelayConnection::abort`]). The
    /// driver, not this, ends the physical connection once its Reset is queued: closing the
    /// socket first could lose the Reset, and the rendezvous would then keep the executor's
    /// end (and its session) for its 30 s grace.
    abort: CancellationToken,
}

impl std::fmt::Debug for RelayConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayConnection")
            .field("stream_id", &self.stream_id)
            .finish()
    }
}

impl RelayConnection {
    pub fn stream_id(&self) -> &str {
        &self.stream_id
    }

    /// Queues one message (waits while the stream's send buffer is full).
    pub async fn send(&self, message: String) -> Result<(), RelayError> {
        self.outgoing
            .send(message)
            .await
            .map_err(|_| self.error().unwrap_or(RelayError::Lost))
    }

    /// The next message; `None` once the stream has ended (see [`RelayConnection::error`]).
    pub async fn recv(&mut self) -> Option<Bytes> {
        self.incoming.recv().await
    }

    /// Why the stream ended, if it ended abnormally.
    pub fn error(&self) -> Option<RelayError> {
        self.end.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The sending and receiving halves, for callers that read and write concurrently.
    pub fn split(self) -> (mpsc::Sender<String>, mpsc::Receiver<Bytes>) {
        (self.outgoing, self.incoming)
    }

    /// Ends the stream at once with Reset{shutdown}, without waiting for a flush; the socket
    /// closes after the Reset.
    pub fn abort(&self) {
        self.abort.cancel();
    }
}

fn base_client(
    args: &RelayConnectArgs,
    trust: &TlsTrust,
) -> Result<Arc<dyn RelayBundleProvider>, RelayError> {
    if let Some(provider) = &args.bundle_provider {
        return Ok(Arc::clone(provider));
    }
    let base = BaseUrl::parse(&args.registry_url, args.allow_insecure)
        .map_err(|e| RelayError::Config(e.to_string()))?;
    Ok(Arc::new(HttpBundles {
        registry: RegistryClient::with_trust(
            base,
            args.bearer_token.clone(),
            args.request_timeout,
            args.allow_insecure,
            trust,
        ),
        retry_busy: args.retry_busy_registry,
    }))
}

/// The connect bundle and the harness key it was issued for. A harness without a fixed
/// identity keys itself for the default suite; when the executor registered with another
/// suite, it asks again with a key of that suite (the bundle names the profile).
async fn fetch_bundle(
    args: &RelayConnectArgs,
    provider: &Arc<dyn RelayBundleProvider>,
) -> Result<(ConnectBundle, Arc<NoiseIdentity>), RelayError> {
    let fixed = args.identity.clone();
    let identity = fixed
        .clone()
        .unwrap_or_else(|| Arc::new(NoiseIdentity::generate_for(DEFAULT_SUITE)));
    let bundle = provider
        .connect_bundle(&args.environment_id, &identity.public())
        .await?;
    if fixed.is_some() || bundle.security_profile == identity.suite().security_profile() {
        return Ok((bundle, identity));
    }
    let Some(suite) = suite_by_profile(&bundle.security_profile) else {
        return Ok((bundle, identity));
    };
    let identity = Arc::new(NoiseIdentity::generate_for(suite));
    let bundle = provider
        .connect_bundle(&args.environment_id, &identity.public())
        .await?;
    Ok((bundle, identity))
}

/// Connects a new stream (§3.4): bundle, socket, handshake. The caller then speaks
/// JSON-RPC (`initialize`, `initialized`, …) over the returned connection.
pub async fn connect_relay(args: RelayConnectArgs) -> Result<RelayConnection, RelayError> {
    let trust = TlsTrust::with_ca_file(args.ca_file.as_deref())
        .map_err(|e| RelayError::Config(format!("relay.ca_file {e}")))?;
    let provider = base_client(&args, &trust)?;
    let (bundle, identity) = fetch_bundle(&args, &provider).await?;
    let authz = bundle
        .harness_key_authorization
        .expose()
        .as_bytes()
        .to_vec();
    if authz.is_empty() || authz.len() > MAX_AUTHORIZATION_BYTES {
        return Err(RelayError::Config(
            "the harness key authorization is empty or too long".into(),
        ));
    }
    let stream_id = uuid::Uuid::new_v4().to_string();
    let ws = link::open(&bundle.url, args.connect_timeout, &trust)
        .await
        .map_err(|e| RelayError::Open(e.to_string()))?;
    let (handle, mut reader) = link::start(ws, args.link_timing);

    let suite = identity.suite();
    if bundle.security_profile != suite.security_profile() {
        return Err(RelayError::Config(format!(
            "the registry selected the security profile `{}`; this harness's key is for `{}`",
            crate::proto::truncate_for_log(&bundle.security_profile),
            suite.security_profile()
        )));
    }
    let p = suite.prologue(
        &bundle.environment_id,
        &bundle.executor_registration_id,
        &stream_id,
    );
    let mut initiator = suite
        .initiator(&identity, &bundle.executor_public_key, &p)
        .map_err(|e| RelayError::Config(e.to_string()))?;
    let mut buf = vec![0u8; proto::MAX_NOISE_MESSAGE];
    let n = initiator
        .write_message(&authz, &mut buf)
        .map_err(|_| RelayError::HandshakeFailed)?;
    let msg1 = proto::frame(
        &stream_id,
        0,
        0,
        proto::handshake_body_with(buf[..n].to_vec(), args.stream_features),
    );
    let msg1_bytes = proto::encode(&msg1);
    let send = |bytes: Bytes| {
        let tx = handle.frames.control.clone();
        async move {
            let _ = tx.send(bytes).await;
        }
    };
    let reset = |reason| proto::encode(&proto::reset_frame(&stream_id, reason));
    send(msg1_bytes.clone()).await;
    let started = Instant::now();
    let deadline = started + args.handshake_timeout;
    // msg1 is sent again only to executors of the classic suite, which are always ours
    // (§3.4); what a codex executor makes of a second msg1 is not known, and codex's own
    // harness never sends one.
    let retry_at: &[u64] = if suite.name() == SUITE_V1 {
        &[1, 3, 7]
    } else {
        &[]
    };
    let mut retries = retry_at.iter().map(|s| started + Duration::from_secs(*s));
    let mut next_retry = retries.next();
    let (msg2, peer_features) = loop {
        let wake = next_retry.map_or(deadline, |r| r.min(deadline));
        let incoming = tokio::select! {
            i = link::read(&mut reader, &handle) => i,
            _ = tokio::time::sleep_until(wake) => {
                if Instant::now() >= deadline {
                    send(reset(ResetReason::HandshakeTimeout)).await;
                    handle.close(1000);
                    return Err(RelayError::HandshakeTimeout);
                }
                send(msg1_bytes.clone()).await;
                next_retry = retries.next();
                continue;
            }
        };
        let bytes = match incoming {
            Incoming::Binary(b) => b,
            Incoming::Text => {
                handle.close(1003);
                return Err(RelayError::Open(
                    "the rendezvous sent a text message".into(),
                ));
            }
            Incoming::Ended(code) => {
                return Err(RelayError::Open(format!(
                    "the rendezvous closed the socket ({code:?})"
                )))
            }
        };
        let Ok(frame) = proto::decode(&bytes) else {
            send(reset(ResetReason::InvalidFrame)).await;
            handle.close(1002);
            return Err(RelayError::HandshakeFailed);
        };
        if frame.stream_id != stream_id {
            continue;
        }
        match frame.body {
            Some(Body::Handshake(h)) => {
                let features = StreamFeatures::announced(&h);
                break (h.payload, features);
            }
            Some(Body::Reset(r)) => {
                handle.close(1000);
                return Err(RelayError::Reset(ResetReason::parse(&r.reason).to_string()));
            }
            Some(Body::Data(_)) => {
                send(reset(ResetReason::HandshakeFailed)).await;
                handle.close(1000);
                return Err(RelayError::HandshakeFailed);
            }
            _ => continue,
        }
    };
    let mut payload = vec![0u8; proto::MAX_NOISE_MESSAGE];
    let ok = msg2.len() == suite.msg2_len()
        && matches!(initiator.read_message(&msg2, &mut payload), Ok(0));
    let transport = if ok {
        initiator.into_transport().ok()
    } else {
        None
    };
    let Some(transport) = transport else {
        send(reset(ResetReason::HandshakeFailed)).await;
        handle.close(1000);
        return Err(RelayError::HandshakeFailed);
    };

    let semantics = Semantics::for_stream(suite, args.stream_features, peer_features);
    tracing::debug!(stream = %stream_id, ?semantics, "relay stream established");
    let machine = ReliableStream::new(
        stream_id.clone(),
        Role::Harness,
        semantics,
        transport,
        args.limits,
        args.timing,
        Instant::now(),
    );
    let uplink = Uplink::default();
    uplink.set(Some(handle.frames.clone()));
    let (inbox_tx, inbox_rx) = mpsc::channel(STREAM_INBOX);
    let (to_app, incoming) = mpsc::channel::<Bytes>(1);
    let (outgoing, from_app) = mpsc::channel::<String>(128);
    let end = Arc::new(Mutex::new(None));
    // `done` ends the physical connection (and its reconnects); `abort` only the driver,
    // which cancels `done` itself once the stream's last frame is on its way.
    let done = CancellationToken::new();
    let abort = CancellationToken::new();
    let physical = Physical {
        stream_id: stream_id.clone(),
        semantics,
        msg2,
        pinned: bundle.executor_public_key,
        identity,
        provider,
        trust,
        args: args.clone(),
        inbox: inbox_tx,
        uplink: uplink.clone(),
        done: done.clone(),
        end: Arc::clone(&end),
    };
    tokio::spawn(physical.run(handle, reader));
    let driver_end = Arc::clone(&end);
    let driver_done = done.clone();
    let driver_abort = abort.clone();
    tokio::spawn(async move {
        let result = drive_stream(
            machine,
            inbox_rx,
            uplink,
            AppSide { to_app, from_app },
            args.resume_grace,
            ShutdownMode::Abort(driver_abort),
            Link::Own,
        )
        .await;
        let error = match result {
            StreamEnd::ResetSent(ResetReason::StreamClosed) => None,
            StreamEnd::ResetSent(ResetReason::Shutdown) => None,
            StreamEnd::ResetSent(reason) | StreamEnd::Retired(reason) => {
                Some(RelayError::Reset(reason.to_string()))
            }
            StreamEnd::ResetReceived(reason) => {
                Some(RelayError::Reset(ResetReason::parse(&reason).to_string()))
            }
            StreamEnd::Lost => Some(RelayError::Lost),
        };
        {
            let mut slot = driver_end.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = error;
            }
        }
        // Let the Reset reach the socket before it closes.
        tokio::time::sleep(Duration::from_millis(50)).await;
        driver_done.cancel();
    });
    Ok(RelayConnection {
        stream_id,
        outgoing,
        incoming,
        end,
        abort,
    })
}

/// The harness's physical connection: pumps frames into the stream's inbox and
/// reconnects within the grace (§5.8).
struct Physical {
    stream_id: String,
    semantics: Semantics,
    msg2: Bytes,
    pinned: NoisePublicKey,
    identity: Arc<NoiseIdentity>,
    provider: Arc<dyn RelayBundleProvider>,
    trust: TlsTrust,
    args: RelayConnectArgs,
    inbox: mpsc::Sender<StreamEvent>,
    uplink: Uplink,
    done: CancellationToken,
    end: Arc<Mutex<Option<RelayError>>>,
}

impl Physical {
    fn fail(&self, error: RelayError) {
        let mut slot = self.end.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(error);
        }
    }

    /// A text message or an undecodable frame (§2.5 rows 1 and 3): Reset{invalid_frame}
    /// for the stream, then close the socket with `code`; the stream fails.
    async fn protocol_violation(&self, handle: &link::LinkHandle, code: u16) {
        let reset = proto::encode(&proto::reset_frame(
            &self.stream_id,
            ResetReason::InvalidFrame,
        ));
        let _ = handle.frames.control.try_send(reset);
        handle.close(code);
        let _ = self
            .inbox
            .send(StreamEvent::Retire(ResetReason::InvalidFrame))
            .await;
    }

    async fn run(
        self,
        mut handle: link::LinkHandle,
        mut reader: futures_util::stream::SplitStream<link::ClientWs>,
    ) {
        loop {
            // Pump until the socket ends or the stream is done.
            loop {
                let incoming = tokio::select! {
                    _ = self.done.cancelled() => {
                        handle.close(1000);
                        return;
                    }
                    i = link::read(&mut reader, &handle) => i,
                };
                let bytes = match incoming {
                    Incoming::Binary(b) => b,
                    Incoming::Text => {
                        return self.protocol_violation(&handle, 1003).await;
                    }
                    // A protocol or policy close ends the stream (§8.8); anything else is
                    // a lost connection that the stream survives through Resume (§5.8).
                    Incoming::Ended(Some(code @ (1002 | 1003 | 1008 | 1009))) => {
                        self.fail(RelayError::Open(format!(
                            "the relay connection was closed with code {code}"
                        )));
                        let _ = self
                            .inbox
                            .send(StreamEvent::Retire(ResetReason::InvalidFrame))
                            .await;
                        return;
                    }
                    Incoming::Ended(_) => break,
                };
                let Ok(frame) = proto::decode(&bytes) else {
                    return self.protocol_violation(&handle, 1002).await;
                };
                if frame.stream_id != self.stream_id {
                    continue;
                }
                if let Err(fault) = proto::validate(&frame) {
                    if let Some(reason) = fault.reset_reason() {
                        let _ = self.inbox.send(StreamEvent::Abort(reason)).await;
                    }
                    continue;
                }
                if let Some(Body::Handshake(h)) = &frame.body {
                    if h.payload != self.msg2 {
                        let _ = self
                            .inbox
                            .send(StreamEvent::Abort(ResetReason::InvalidFrame))
                            .await;
                    }
                    continue;
                }
                let is_reset = matches!(frame.body, Some(Body::Reset(_)));
                let lossless = self.semantics == Semantics::Codex;
                if let Err(mpsc::error::TrySendError::Full(event)) =
                    self.inbox.try_send(StreamEvent::Frame(frame))
                {
                    if lossless {
                        // Nothing is resent on a codex stream: wait rather than drop.
                        let _ = self.inbox.send(event).await;
                    } else if is_reset {
                        let _ = self
                            .inbox
                            .send(StreamEvent::Abort(ResetReason::Unspecified))
                            .await;
                    }
                }
            }
            self.uplink.set(None);
            let _ = self.inbox.send(StreamEvent::Disconnected).await;
            if self.semantics == Semantics::Codex {
                // No Resume on a codex stream: the disconnect ended it.
                self.fail(RelayError::Lost);
                return;
            }
            match self.reconnect().await {
                Some((h, r)) => {
                    handle = h;
                    reader = r;
                    self.uplink.set(Some(handle.frames.clone()));
                    let _ = self.inbox.send(StreamEvent::Connected).await;
                }
                None => return,
            }
        }
    }

    /// Attempts immediately, then after 0.5, 1, 2, 4, 5, 5 … s, within the grace.
    async fn reconnect(
        &self,
    ) -> Option<(
        link::LinkHandle,
        futures_util::stream::SplitStream<link::ClientWs>,
    )> {
        let give_up = Instant::now() + self.args.resume_grace;
        let mut delay = Duration::ZERO;
        loop {
            tokio::select! {
                _ = self.done.cancelled() => return None,
                _ = tokio::time::sleep(delay) => {}
            }
            if Instant::now() >= give_up {
                return None;
            }
            delay = if delay.is_zero() {
                Duration::from_millis(500)
            } else {
                (delay * 2).min(Duration::from_secs(5))
            };
            let bundle = match self
                .provider
                .connect_bundle(&self.args.environment_id, &self.identity.public())
                .await
            {
                Ok(b) => b,
                Err(RelayError::Registry(e)) if e.is_auth_failure() => {
                    self.fail(RelayError::Registry(e));
                    let _ = self
                        .inbox
                        .send(StreamEvent::Abort(ResetReason::StreamClosed))
                        .await;
                    return None;
                }
                Err(e) => {
                    tracing::debug!("relay reconnect attempt failed: {e}");
                    continue;
                }
            };
            if bundle.executor_public_key != self.pinned {
                self.fail(RelayError::ExecutorChanged);
                let _ = self
                    .inbox
                    .send(StreamEvent::Abort(ResetReason::StreamClosed))
                    .await;
                return None;
            }
            match link::open(&bundle.url, self.args.connect_timeout, &self.trust).await {
                Ok(ws) => return Some(link::start(ws, self.args.link_timing)),
                Err(e) => tracing::debug!("relay reconnect attempt failed: {e}"),
            }
        }
    }
}

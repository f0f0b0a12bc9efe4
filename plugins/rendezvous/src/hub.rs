//! Where the store and the router meet: every registry decision goes to the store, every
//! socket to the router, and the registrations a store call ended are handed to the router
//! before the call returns. The socket loops of executor and harness sockets live here:
//! they attach and detach through both.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use axum::http::StatusCode;
use exec_server_relay_core::noise::NoisePublicKey;
use futures_util::stream::SplitStream;
use futures_util::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::router::{decode_valid, is_too_big, Router, SocketHandle, MAX_INVALID_FRAMES};
use crate::store::{
    Connectable, Epoch, HarnessLease, Lost, RegisterRefusal, SharedStore, StoreUnavailable,
    TenantId, TokenGrant, UpgradeRefusal,
};

/// The registry state and the live sockets of this process.
pub struct Hub {
    store: SharedStore,
    router: Router,
}

impl Hub {
    pub fn new(store: SharedStore, router: Router) -> Arc<Self> {
        Arc::new(Self { store, router })
    }

    pub async fn authenticate(&self, digest: &[u8; 32]) -> Option<TokenGrant> {
        self.store.authenticate(digest).await
    }

    pub fn tenant_count(&self) -> usize {
        self.store.tenant_count()
    }

    pub async fn register(
        &self,
        id: &str,
        key: NoisePublicKey,
        name: Option<String>,
        tenant: TenantId,
    ) -> Result<String, RegisterRefusal> {
        let mut ended = Vec::new();
        let registered = self
            .store
            .register(id, key, name, tenant, Instant::now(), &mut ended)
            .await;
        self.router.registrations_ended(ended);
        registered
    }

    pub async fn connectable(&self, id: &str) -> Connectable {
        let mut ended = Vec::new();
        let answer = self.store.connectable(id, Instant::now(), &mut ended).await;
        self.router.registrations_ended(ended);
        answer
    }

    pub async fn current_registration(&self, id: &str) -> Result<Option<String>, StoreUnavailable> {
        let mut ended = Vec::new();
        let current = self
            .store
            .current_registration(id, Instant::now(), &mut ended)
            .await;
        self.router.registrations_ended(ended);
        current
    }

    /// May an executor socket for `reg` be opened? Its registration's epoch.
    pub async fn admit_executor(&self, id: &str, reg: &str) -> Result<Epoch, StatusCode> {
        let mut ended = Vec::new();
        let admitted = self
            .store
            .admit_executor(id, reg, Instant::now(), &mut ended)
            .await;
        self.router.registrations_ended(ended);
        admitted
    }

    /// May a harness socket for `reg` be opened? Its capacity is held from now on.
    pub async fn admit_harness(
        &self,
        id: &str,
        reg: &str,
    ) -> Result<(Epoch, HarnessLease), UpgradeRefusal> {
        let mut ended = Vec::new();
        let admitted = self
            .store
            .admit_harness(id, reg, Instant::now(), &mut ended)
            .await;
        self.router.registrations_ended(ended);
        admitted
    }

    /// Serves one executor socket admitted for the registration `reg` (`epoch`). The
    /// router has its socket before the store marks the environment attached, so a
    /// harness admitted because of that mark always finds the environment's sockets.
    pub async fn serve_executor(
        self: Arc<Self>,
        env_id: String,
        reg: String,
        epoch: Epoch,
        socket: WebSocket,
    ) {
        let (handle, mut stream, last_pong) = self.router.spawn_socket(socket);
        if !self.router.attach_executor(&env_id, epoch, &handle) {
            handle.close(4002);
            return;
        }
        let current = self
            .store
            .executor_attached(&env_id, &reg, Instant::now())
            .await;
        if current.is_err() {
            // The store is unreachable: the executor reconnects (1011) and tries again.
            self.router.detach_executor(&env_id, handle.id);
            handle.close(1011);
            return;
        }
        if current != Ok(Some(epoch)) {
            // The registration changed since the upgrade was admitted.
            self.router.detach_executor(&env_id, handle.id);
            handle.close(4002);
            return;
        }
        let mut invalid = 0u32;
        // 1000 is what an executor sends when it stops (§8.8, §9.1).
        let left_for_good = loop {
            let bytes = match next_binary(&handle, &mut stream, &last_pong).await {
                Received::Binary(bytes) => bytes,
                Received::Ended { closed_with_1000 } => break closed_with_1000,
            };
            let Some(frame) = decode_valid(&bytes) else {
                invalid += 1;
                tracing::debug!(invalid, "dropped an invalid frame from an executor");
                continue;
            };
            self.router
                .forward_from_executor(&env_id, &handle, bytes, &frame);
        };
        handle.kill.cancel();
        if let Some(epoch) = self.router.detach_executor(&env_id, handle.id) {
            let mut ended = Vec::new();
            self.store
                .executor_detached(&env_id, epoch, left_for_good, Instant::now(), &mut ended)
                .await;
            self.router.registrations_ended(ended);
        }
    }

    /// Serves one harness socket admitted for the registration `epoch`, whose signed URL
    /// named the key hash `kh`; `lease` is its capacity, held until the socket ends.
    pub async fn serve_harness(
        self: Arc<Self>,
        env_id: String,
        epoch: Epoch,
        kh: String,
        lease: HarnessLease,
        socket: WebSocket,
    ) {
        let _lease = lease;
        let (handle, mut stream, last_pong) = self.router.spawn_socket(socket);
        if !self.router.open_harness(&env_id, epoch, &handle) {
            handle.close(1011);
            return;
        }
        let mut bound: Option<String> = None;
        let mut invalid = 0u32;
        let mut ended_by_reset = false;
        loop {
            let Received::Binary(bytes) = next_binary(&handle, &mut stream, &last_pong).await
            else {
                break;
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
                    if !self
                        .router
                        .bind_harness(&env_id, &kh, &handle, &frame.stream_id)
                    {
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
            if !self
                .router
                .forward_from_harness(&env_id, &handle, bytes, &frame)
            {
                ended_by_reset = true;
                break;
            }
        }
        handle.kill.cancel();
        self.router
            .close_harness(&env_id, &handle, bound.as_deref(), ended_by_reset);
    }

    /// Ends the registrations that are due and expires parked routes and absent
    /// executors (§8.2, §8.7).
    pub async fn sweep(&self, now: Instant) {
        let mut ended = Vec::new();
        self.store.sweep(now, &mut ended).await;
        self.router.registrations_ended(ended);
        self.router.sweep(now);
    }

    /// Renews this node's lease on the executor sockets it holds, in a store shared by
    /// several nodes, and closes the sockets of environments held elsewhere now (an
    /// executor that left this node and attached to another leaves its harnesses here).
    pub async fn heartbeat(&self) {
        let held = self.router.held();
        if held.is_empty() {
            return;
        }
        let Ok(lost) = self.store.heartbeat(&held).await else {
            return;
        };
        for lost in lost {
            match lost {
                Lost::Moved(environment) => self.router.environment_moved(&environment),
                Lost::Ended(end) => self.router.registrations_ended(vec![end]),
            }
        }
    }

    /// Whether the store answers (`/readyz`).
    pub async fn ready(&self) -> bool {
        self.store.ready().await
    }

    pub fn spawn_sweeper(self: &Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let hub = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(hub.router.timing.sweep_every);
            // A store of one process needs no heartbeat: its timer never fires.
            let beat_every = hub.store.heartbeat_every();
            let mut beat = tokio::time::interval(beat_every.unwrap_or(Duration::from_secs(3_600)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => hub.sweep(Instant::now()).await,
                    _ = beat.tick(), if beat_every.is_some() => hub.heartbeat().await,
                }
            }
        })
    }

    /// Closes every socket with 1001 (service shutdown), waiting up to `drain`.
    pub async fn close_all(&self, drain: Duration) {
        self.router.close_all(drain).await;
    }
}

/// What a rendezvous socket's reader got next.
enum Received {
    /// A binary message: one frame to decode.
    Binary(bytes::Bytes),
    /// The socket is done (killed, closed, failed or refused); `closed_with_1000`: the peer
    /// closed it with code 1000.
    Ended { closed_with_1000: bool },
}

/// The next binary message of an executor or harness socket. Pongs refresh `last_pong`;
/// a text message closes the socket with 1003 and an oversized one with 1009 (§8.6).
async fn next_binary(
    handle: &SocketHandle,
    stream: &mut SplitStream<WebSocket>,
    last_pong: &Mutex<Instant>,
) -> Received {
    let ended = |closed_with_1000| Received::Ended { closed_with_1000 };
    loop {
        let message = tokio::select! {
            _ = handle.kill.cancelled() => return ended(false),
            m = stream.next() => m,
        };
        match message {
            Some(Ok(Message::Binary(bytes))) => return Received::Binary(bytes),
            Some(Ok(Message::Pong(_))) => {
                *last_pong.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            }
            Some(Ok(Message::Text(_))) => {
                handle.close(1003);
                return ended(false);
            }
            Some(Err(e)) => {
                if is_too_big(e) {
                    handle.close(1009);
                }
                return ended(false);
            }
            Some(Ok(Message::Close(frame))) => {
                return ended(frame.is_some_and(|f| f.code == 1000));
            }
            None => return ended(false),
            Some(Ok(_)) => {}
        }
    }
}

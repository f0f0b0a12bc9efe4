//! Entry points for the `rendezvous` fuzz target (`fuzz/fuzz_targets/rendezvous.rs`),
//! whose crate depends on no HTTP or Redis crate: the service's own routes called
//! in-process over a memory store (no sockets), and the Redis store's reply decoding.
//! Everything here calls the code the service runs; nothing is a copy of it. Not an API.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Extension;
use tokio::time::Instant;
use tower_service::Service as _;

use crate::config::RendezvousConfig;
use crate::memory::MemoryStore;
use crate::redis_store::scripts;
use crate::refusal::Refusal;
use crate::router::{RouterTiming, SocketRole};
use crate::service::{self, Admitted, Service, UpgradeQuery};
use crate::signing::SigningKey;
use crate::store::{Connectable, Epoch, Held, Lost, RegisterRefusal, SharedStore, UpgradeRefusal};

/// The public URL of the in-process service, in its `ws` form.
pub const WS_BASE: &str = "ws://127.0.0.1:1";

/// An answer of the in-process service.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// What became of a socket upgrade (`GET /ws/environment/{id}?…`), step by step.
#[derive(Debug, Default)]
pub struct UpgradeOutcome {
    /// The route matched and the environment id decoded (else the router answered).
    pub routed: bool,
    /// The environment id, as the route decoded it.
    pub environment: String,
    /// Checks 1–3 passed: `(role, reg, kh, exp)` as signed, the role as in the query.
    pub verified: Option<(&'static str, String, String, u64)>,
    /// Check 4 passed too.
    pub unexpired: bool,
    /// The store admitted the socket.
    pub admitted: bool,
    /// The status of the refusal, when there was one.
    pub refused: Option<u16>,
}

/// The service's routes over a memory store, with the upgrade route's WebSocket handshake
/// left out: an upgrade runs the service's checks and the store's admission, and an
/// admitted executor is marked attached as if its socket had opened.
pub struct InProcessService {
    app: axum::Router,
    store: SharedStore,
    /// The epoch of each environment's last admitted executor, for [`Self::detach`].
    epochs: Mutex<HashMap<String, Epoch>>,
    base_path: String,
}

type OutcomeSlot = Arc<Mutex<UpgradeOutcome>>;

impl InProcessService {
    /// The service for `config` (its store is always the memory store), signing with `key`.
    pub fn new(config: RendezvousConfig, key: SigningKey) -> Result<Self, String> {
        let store: SharedStore = Arc::new(MemoryStore::new(&config)?);
        let base_path = config.base_path.trim_end_matches('/').to_owned();
        let ws_base = format!("{WS_BASE}{base_path}");
        let service = Service::new(
            config,
            key,
            Arc::clone(&store),
            ws_base.clone(),
            ws_base,
            RouterTiming::default(),
        );
        let app = service::routes(&service, &base_path, get(checked_upgrade));
        Ok(Self {
            app,
            store,
            epochs: Mutex::new(HashMap::new()),
            base_path,
        })
    }

    /// `rendezvous.base_path`, without a trailing `/`.
    pub fn base_path(&self) -> &str {
        &self.base_path
    }

    /// One request from `peer`; `None` when the method, target or a header could not
    /// have come from an HTTP parser (those never reach the service).
    pub async fn request(
        &self,
        method: &[u8],
        target: &[u8],
        headers: &[(&[u8], &[u8])],
        body: Vec<u8>,
        peer: SocketAddr,
    ) -> Option<Answer> {
        let mut request = build(method, target, headers, body)?;
        request.extensions_mut().insert(ConnectInfo(peer));
        let response = self.call(request).await;
        let (parts, body) = response.into_parts();
        let body = axum::body::to_bytes(body, usize::MAX).await.ok()?;
        Some(Answer {
            status: parts.status.as_u16(),
            headers: parts
                .headers
                .iter()
                .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
                .collect(),
            body: body.to_vec(),
        })
    }

    /// `GET target` as a socket upgrade; `None` when `target` is no request target.
    pub async fn upgrade(&self, target: &[u8]) -> Option<UpgradeOutcome> {
        let mut request = build(b"GET", target, &[], Vec::new())?;
        let slot = OutcomeSlot::default();
        request.extensions_mut().insert(Arc::clone(&slot));
        let answered = self.call(request).await.status();
        let mut outcome = std::mem::take(&mut *slot.lock().unwrap_or_else(|e| e.into_inner()));
        if outcome.refused.is_none() && !outcome.admitted {
            outcome.refused = Some(answered.as_u16());
        }
        if let (true, Some((role, ..))) = (outcome.admitted, &outcome.verified) {
            if *role == "environment" {
                self.attach(&outcome).await;
            }
        }
        Some(outcome)
    }

    /// The executor's socket opened: the store marks the environment attached, as the
    /// executor's socket loop does once the router holds the socket.
    async fn attach(&self, outcome: &UpgradeOutcome) {
        let Some((_, reg, ..)) = &outcome.verified else {
            return;
        };
        if let Ok(Some(epoch)) = self
            .store
            .executor_attached(&outcome.environment, reg, Instant::now())
            .await
        {
            self.epochs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(outcome.environment.clone(), epoch);
        }
    }

    /// The executor socket of `environment` ended; `left_for_good`: it closed with 1000.
    pub async fn detach(&self, environment: &str, left_for_good: bool) {
        let epoch = self
            .epochs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(environment);
        if let Some(epoch) = epoch {
            let mut ended = Vec::new();
            self.store
                .executor_detached(
                    environment,
                    epoch,
                    left_for_good,
                    Instant::now(),
                    &mut ended,
                )
                .await;
        }
    }

    /// The sweep as it runs `after` from now: the registrations due by then end.
    pub async fn sweep_after(&self, after: Duration) {
        let mut ended = Vec::new();
        self.store.sweep(Instant::now() + after, &mut ended).await;
    }

    async fn call(&self, request: Request<Body>) -> Response {
        match self.app.clone().call(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}

/// A request as an HTTP parser would hand it over, or `None`.
fn build(
    method: &[u8],
    target: &[u8],
    headers: &[(&[u8], &[u8])],
    body: Vec<u8>,
) -> Option<Request<Body>> {
    let method = Method::from_bytes(method).ok()?;
    let uri = Uri::try_from(target).ok()?;
    if uri.scheme().is_some() || !target.starts_with(b"/") {
        return None;
    }
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::from(body))
        .ok()?;
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name).ok()?;
        let value = HeaderValue::from_bytes(value).ok()?;
        request.headers_mut().append(name, value);
    }
    Some(request)
}

/// `GET /ws/environment/{id}` without the WebSocket handshake: the checks and the
/// admission of the real route, each step noted in the request's [`OutcomeSlot`].
async fn checked_upgrade(
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    slot: Option<Extension<OutcomeSlot>>,
    request: Request<Body>,
) -> Response {
    let query = UpgradeQuery::parse(request.uri().query().unwrap_or(""));
    let mut outcome = UpgradeOutcome {
        routed: true,
        environment: id.clone(),
        ..UpgradeOutcome::default()
    };
    let answer = match service.verify_signed_url(&id, &query) {
        Err((status, _)) => status.into_response(),
        Ok(url) => {
            let role = match url.role {
                SocketRole::Executor => "environment",
                SocketRole::Harness => "harness",
            };
            outcome.verified = Some((role, url.reg.clone(), url.kh.clone(), url.exp));
            match service.check_expiry(&url, service::now_unix()) {
                Err((status, _)) => status.into_response(),
                Ok(()) => {
                    outcome.unexpired = true;
                    match service.admit(&id, &url).await {
                        Ok(Admitted::Executor(_)) | Ok(Admitted::Harness(..)) => {
                            outcome.admitted = true;
                            StatusCode::SWITCHING_PROTOCOLS.into_response()
                        }
                        Err(refused) => refused,
                    }
                }
            }
        }
    };
    if !outcome.admitted {
        outcome.refused = Some(answer.status().as_u16());
    }
    if let Some(Extension(slot)) = slot {
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = outcome;
    }
    answer
}

/// What each decoder of the Redis store makes of one reply.
#[derive(Debug)]
pub struct DecodedReplies {
    pub register: Result<String, RegisterRefusal>,
    pub connect: Connectable,
    pub current: Option<String>,
    pub admit_executor: Result<Epoch, StatusCode>,
    pub admit_harness: Result<(Epoch, String), UpgradeRefusal>,
    pub attached: Option<Epoch>,
    /// The `ended` lists at each position a script puts one, and the reply as one.
    pub ended: Vec<usize>,
    pub heartbeat: Vec<Lost>,
}

/// Parses `resp` as Redis would have sent it (RESP) and hands the reply to every decoder
/// of the Redis store, as the node at `node` with the sockets of `held`; `None` when
/// `resp` is no reply.
pub fn decode_store_reply(resp: &[u8], node: &str, held: &[Held]) -> Option<DecodedReplies> {
    let reply = redis::parse_redis_value(resp).ok()?;
    let refusal = || Refusal::ServiceEnvironments { max: 1 };
    Some(DecodedReplies {
        register: scripts::register_reply(&reply, refusal(), refusal()),
        connect: scripts::connect_reply(&reply, node),
        current: scripts::current_reply(&reply),
        admit_executor: scripts::admit_executor_reply(&reply),
        admit_harness: scripts::admit_harness_reply(&reply),
        attached: scripts::attached_reply(&reply),
        ended: (0..5)
            .map(|i| scripts::ended_at(&reply, i).len())
            .chain([scripts::ended(&reply).len()])
            .collect(),
        heartbeat: scripts::heartbeat_reply(&reply, held),
    })
}

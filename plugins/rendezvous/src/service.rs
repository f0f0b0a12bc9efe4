//! The service: its start-up (listener, signing key, tokens), the registry endpoints
//! (RELAY §7) and the WebSocket upgrade checks (§8.4) in front of the router.

// Handlers return early with a ready `Response`; boxing it buys nothing here.
#![allow(clippy::result_large_err)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{ConnectInfo, FromRequestParts, Path, State};
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use exec_server_core::config::secret::read_secret_file;
use exec_server_core::config::{secret_env, ConfigSource};
use exec_server_core::proto::net::is_loopback;
use exec_server_core::transport::http_server::{serve_http, serve_https, ListenerLimits};
use exec_server_core::StartupError;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use url::{Host, Url};

use exec_server_relay_core::endpoint::{
    check_environment_id, decode_segment, encode_segment, BaseUrl, UrlError,
};
use exec_server_relay_core::noise::{suite_by_profile, NoisePublicKey, SUITES};
use exec_server_relay_core::proto::MAX_WS_MESSAGE_BYTES;
use exec_server_relay_core::registry::STREAM_ID_HEADER;

use crate::config::{RendezvousConfig, TokenRole};
use crate::hub::Hub;
use crate::memory::MemoryStore;
use crate::rate_limit::{Limited, RateLimits};
use crate::redis_store::RedisStore;
use crate::refusal::Refusal;
use crate::router::{Router, RouterTiming, SocketRole};
use crate::signing::{key_hash, token_digest, AuthorizationClaims, SigningKey, SigningKeyError};
use crate::store::{
    Connectable, Epoch, HarnessLease, RegisterRefusal, SharedStore, TokenGrant, UpgradeRefusal,
};

/// Environment variable holding the base64 signing key (§8.4).
pub const SIGNING_KEY_ENV: &str = secret_env::RENDEZVOUS_SIGNING_KEY_ENV;

/// Command-line flags of `exec-server rendezvous` (§9.5), and the `[listener]` limits.
#[derive(Debug, Clone, Default)]
pub struct RendezvousArgs {
    pub listen: Option<String>,
    pub public_url: Option<String>,
    pub listener: ListenerLimits,
}

/// Everything the handlers share.
pub struct Service {
    config: RendezvousConfig,
    key: SigningKey,
    /// The public base URL with `http` replaced by `ws` (§8.4).
    ws_base: String,
    /// This node's own URL in that form, where harnesses reach the environments whose
    /// executor sockets it holds.
    node_ws_base: String,
    hub: Arc<Hub>,
    limits: RateLimits,
}

/// A running service (tests and the CLI).
pub struct RunningRendezvous {
    /// The public base URL, as printed on the first stdout line.
    pub url: String,
    pub local_addr: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl RunningRendezvous {
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Why the service could not start (exit status 2, like every start-up error).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("rendezvous.listen must be http://IP:PORT or https://IP:PORT, got `{0}`")]
    Listen(String),
    #[error(
        "rendezvous.listen is https://, but rendezvous.tls_cert_file and rendezvous.tls_key_file are not set: set both (--tls-cert-file, --tls-key-file) to serve TLS, or listen on http:// behind a TLS-terminating proxy"
    )]
    HttpsWithoutTls,
    #[error(
        "rendezvous.tls_cert_file and rendezvous.tls_key_file are set, so rendezvous.listen must be https://IP:PORT, got `{0}`"
    )]
    TlsWithoutHttps(String),
    #[error("rendezvous.{0} is set without rendezvous.{1}: in-process TLS needs both")]
    TlsHalf(&'static str, &'static str),
    #[error(transparent)]
    TlsFiles(#[from] crate::tls::TlsFilesError),
    #[error(
        "refusing plain HTTP on the non-loopback address {0} without rendezvous.public_url (a TLS proxy in front) or rendezvous.allow_insecure = true"
    )]
    Insecure(SocketAddr),
    #[error("rendezvous.public_url {problem}, got `{url}`")]
    PublicUrl { url: String, problem: UrlError },
    #[error(
        "rendezvous.public_url is `{0}`, but the listener serves TLS itself (https): executors and harnesses would be handed ws:// URLs it refuses; give the public URL as https://"
    )]
    PublicUrlWithoutTls(String),
    #[error("invalid config: rendezvous.signing_key_file {0}")]
    SigningKeyFile(String),
    #[error(transparent)]
    SigningKey(#[from] SigningKeyError),
    #[error("{0}")]
    Tokens(String),
    #[error(
        "rendezvous.tokens is empty, so every request would be refused: add [[rendezvous.tokens]] (docs/OPERATIONS.md, \"Remote mode\"), or pass --insecure-no-auth to accept any bearer token on a loopback address"
    )]
    NoTokens,
    #[error(
        "rendezvous.insecure_no_auth accepts any bearer token, so it is refused on the non-loopback address {0}; configure [[rendezvous.tokens]]"
    )]
    NoAuthOffLoopback(SocketAddr),
    #[error(
        "rendezvous.insecure_no_auth accepts any bearer token, so it is refused with rendezvous.{0} `{1}`, which publishes the service beyond this machine (a proxy in front of a loopback listener); configure [[rendezvous.tokens]]"
    )]
    NoAuthPublished(&'static str, String),
    #[error(
        "rendezvous.store is shared by several nodes, which must sign with one key: set rendezvous.signing_key_file or EXEC_SERVER_RENDEZVOUS_SIGNING_KEY on every node"
    )]
    SharedStoreNeedsKey,
    #[error("rendezvous.node_url must be http(s)://host[:port][/prefix], got `{0}`")]
    NodeUrl(String),
    #[error("failed to bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("failed to read the bound address: {0}")]
    LocalAddr(std::io::Error),
}

/// `rendezvous.listen`: `http://IP:PORT` or `https://IP:PORT` with an explicit port (0
/// picks a free one); true for `https`.
fn parse_listen(listen: &str) -> Result<(SocketAddr, bool), StartError> {
    let wrong = || StartError::Listen(listen.to_owned());
    let url = Url::parse(listen).map_err(|_| wrong())?;
    let https = match url.scheme() {
        "http" => false,
        "https" => true,
        _ => return Err(wrong()),
    };
    let bare = !url.username().is_empty()
        || url.password().is_some()
        || url.path() != "/"
        || url.query().is_some()
        || url.fragment().is_some();
    // The URL standard drops a default port (`:80`); the listener wants it written.
    let port_written = listen
        .trim_end_matches('/')
        .rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok());
    let ip = match url.host() {
        Some(Host::Ipv4(ip)) => IpAddr::V4(ip),
        Some(Host::Ipv6(ip)) => IpAddr::V6(ip),
        _ => return Err(wrong()),
    };
    match url.port_or_known_default() {
        Some(port) if !bare && port_written => Ok((SocketAddr::new(ip, port), https)),
        _ => Err(wrong()),
    }
}

/// The in-process TLS configuration (§8.9): both files set and `listen` is `https`, or
/// neither and it is `http`; anything in between is a start-up error that says which.
fn listener_tls(
    config: &RendezvousConfig,
    https: bool,
) -> Result<Option<Arc<rustls::ServerConfig>>, StartError> {
    let cert = (!config.tls_cert_file.is_empty()).then_some(&config.tls_cert_file);
    let key = (!config.tls_key_file.is_empty()).then_some(&config.tls_key_file);
    match (cert, key, https) {
        (None, None, false) => Ok(None),
        (None, None, true) => Err(StartError::HttpsWithoutTls),
        (Some(_), None, _) => Err(StartError::TlsHalf("tls_cert_file", "tls_key_file")),
        (None, Some(_), _) => Err(StartError::TlsHalf("tls_key_file", "tls_cert_file")),
        (Some(_), Some(_), false) => Err(StartError::TlsWithoutHttps(config.listen.clone())),
        (Some(cert), Some(key), true) => Ok(Some(crate::tls::server_config(
            std::path::Path::new(cert),
            std::path::Path::new(key),
        )?)),
    }
}

/// `insecure_no_auth` is for one machine: a public or node URL naming another host means a
/// proxy publishes the loopback listener, and then anyone could register and connect.
fn refuse_published_without_auth(
    config: &RendezvousConfig,
    public_url: Option<&BaseUrl>,
) -> Result<(), StartError> {
    if let Some(url) = public_url.filter(|url| !url.is_loopback_host()) {
        return Err(StartError::NoAuthPublished("public_url", url.redacted()));
    }
    let node = config
        .node_url
        .as_deref()
        .map(|url| (url, BaseUrl::parse(url, true)));
    if let Some((text, parsed)) = node {
        if !parsed.is_ok_and(|url| url.is_loopback_host()) {
            return Err(StartError::NoAuthPublished("node_url", text.to_owned()));
        }
    }
    Ok(())
}

/// Refuses a public URL that cannot reach this listener for a reason no proxy explains (a
/// TLS listener announced as `http://`), and warns of one that names this machine's
/// loopback on another port than the listener's (right only with a local proxy).
fn check_public_url_reaches(
    url: &BaseUrl,
    tls: bool,
    listener: SocketAddr,
) -> Result<(), StartError> {
    if tls && !url.is_tls() {
        return Err(StartError::PublicUrlWithoutTls(url.redacted()));
    }
    if url.is_loopback_host() && url.port() != Some(listener.port()) {
        tracing::warn!(
            public_url = %url,
            listener = %listener,
            "rendezvous.public_url names this machine on another port than the listener's: registrations hand out URLs nothing answers unless a proxy here forwards that port"
        );
    }
    Ok(())
}

/// `rendezvous.public_url` (§8.9): `http(s)://`, host, optional port and path prefix, no
/// query or fragment, trailing `/` removed.
fn parse_public_url(url: &str) -> Result<BaseUrl, StartError> {
    BaseUrl::parse(url, true).map_err(|problem| StartError::PublicUrl {
        url: url.to_owned(),
        problem,
    })
}

fn load_signing_key(config: &RendezvousConfig) -> Result<SigningKey, StartError> {
    if let Some(path) = &config.signing_key_file {
        let mut bytes =
            read_secret_file(path).map_err(|e| StartError::SigningKeyFile(e.describe(path)))?;
        let key = SigningKey::new(&bytes);
        zeroize::Zeroize::zeroize(&mut bytes);
        return Ok(key?);
    }
    // Captured and erased from the environment at start-up.
    if let Some(text) = secret_env::secret_variable(SIGNING_KEY_ENV) {
        return Ok(SigningKey::from_base64(text.expose())?);
    }
    if config.store != "memory" {
        // Every node must verify what any other signed.
        return Err(StartError::SharedStoreNeedsKey);
    }
    tracing::warn!(
        "no rendezvous signing key configured; generated one for this run: URLs and authorizations will not survive a restart"
    );
    Ok(SigningKey::random())
}

/// Starts the service from its configuration; returns once it listens. Its listener
/// runs under `limits`, like every network listener.
pub async fn start(
    config: RendezvousConfig,
    timing: RouterTiming,
    limits: ListenerLimits,
) -> Result<RunningRendezvous, StartError> {
    let (addr, https) = parse_listen(&config.listen)?;
    let tls = listener_tls(&config, https)?;
    if config.tokens.is_empty() && !config.insecure_no_auth {
        return Err(StartError::NoTokens);
    }
    if config.insecure_no_auth && !is_loopback(addr.ip()) {
        return Err(StartError::NoAuthOffLoopback(addr));
    }
    let plain_off_loopback = !is_loopback(addr.ip()) && tls.is_none();
    if plain_off_loopback && config.public_url.is_none() && !config.allow_insecure {
        return Err(StartError::Insecure(addr));
    }
    if plain_off_loopback && config.public_url.is_none() {
        tracing::warn!("plain HTTP on a non-loopback address: bearer tokens travel in clear");
    }
    let public_url = config
        .public_url
        .as_deref()
        .map(parse_public_url)
        .transpose()?;
    if config.insecure_no_auth {
        refuse_published_without_auth(&config, public_url.as_ref())?;
        tracing::warn!(
            "rendezvous.insecure_no_auth: any bearer token is accepted, as one tenant with every role"
        );
    }
    let key = load_signing_key(&config)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })?;
    let local_addr = listener.local_addr().map_err(StartError::LocalAddr)?;
    let base_path = config.base_path.trim_end_matches('/').to_owned();
    let public = match public_url {
        Some(url) => {
            check_public_url_reaches(&url, tls.is_some(), local_addr)?;
            url
        }
        None => {
            let scheme = if tls.is_some() { "https" } else { "http" };
            parse_public_url(&format!("{scheme}://{local_addr}{base_path}"))?
        }
    };
    // The same URL with `ws` for `http` and `wss` for `https` (§8.4).
    let ws_scheme = if public.is_tls() { "wss" } else { "ws" };
    let public = public.redacted();
    let rest = public
        .split_once("://")
        .map_or(public.as_str(), |(_, rest)| rest);
    let ws_base = format!("{ws_scheme}://{rest}");
    // With a shared store, this node's own URL is recorded as the owner of the executor
    // sockets it holds and handed to harnesses of those environments.
    let node_url = match config.node_url.as_deref() {
        Some(url) => parse_public_url(url)
            .map_err(|_| StartError::NodeUrl(url.to_owned()))?
            .redacted(),
        None => public.clone(),
    };
    let node_ws_base = ws_base_of(&node_url);
    let store: SharedStore = if config.store == "memory" {
        Arc::new(MemoryStore::new(&config).map_err(StartError::Tokens)?)
    } else {
        tracing::info!(
            store = %crate::store_url::redacted_url(&config.store),
            node = %node_url,
            "registry state in Redis, shared with the other nodes"
        );
        Arc::new(RedisStore::new(&config, &config.store, node_url).map_err(StartError::Tokens)?)
    };
    tracing::info!(address = %local_addr, tls = tls.is_some(), "rendezvous listening");
    let service = Service::new(config, key, store, ws_base, node_ws_base, timing);
    let hub = Arc::clone(&service.hub);
    let app = routes(&service, &base_path, get(upgrade));
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let sweeper = hub.spawn_sweeper(shutdown.clone());
    let task = tokio::spawn(async move {
        // Handlers read the peer address (per-address rate limits) from `ConnectInfo`,
        // which the shared accept loop inserts into every request.
        match tls {
            Some(tls) => serve_https(listener, app, limits, tls, "rendezvous", stop).await,
            None => serve_http(listener, app, limits, "rendezvous", stop).await,
        }
        hub.close_all(Duration::from_secs(1)).await;
        sweeper.abort();
    });
    Ok(RunningRendezvous {
        url: public,
        local_addr,
        shutdown,
        task,
    })
}

/// `exec-server rendezvous`: starts the service from the `[rendezvous]` table and the
/// command-line flags, prints its public URL as the first line on stdout, and serves until
/// `shutdown` resolves.
pub async fn run(
    source: &ConfigSource,
    args: RendezvousArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), StartupError> {
    let mut config = RendezvousConfig::load(source)?;
    crate::audit::open(source).map_err(StartupError)?;
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(url) = args.public_url {
        config.public_url = Some(url);
    }
    let running = start(config, RouterTiming::default(), args.listener)
        .await
        .map_err(|e| StartupError(e.to_string()))?;
    {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{}", running.url);
        let _ = stdout.flush();
    }
    shutdown.await;
    running.stop().await;
    crate::audit::flush().await;
    Ok(())
}

/// A public base URL with `https` replaced by `wss` and `http` by `ws` (§8.4).
fn ws_base_of(public: &str) -> String {
    match public.split_once("://") {
        Some(("https", rest)) => format!("wss://{rest}"),
        Some((_, rest)) => format!("ws://{rest}"),
        None => public.to_owned(),
    }
}

impl Service {
    /// The service over `store`, signing with `key`; `ws_base` and `node_ws_base` are the
    /// public URL and this node's own URL in their `ws` form.
    pub(crate) fn new(
        config: RendezvousConfig,
        key: SigningKey,
        store: SharedStore,
        ws_base: String,
        node_ws_base: String,
        timing: RouterTiming,
    ) -> Arc<Self> {
        let timing = RouterTiming {
            stalled_peer_timeout: Duration::from_millis(config.stalled_peer_timeout_ms),
            ..timing
        };
        let router = Router::new(
            Duration::from_secs(config.grace_secs),
            config.max_parked_streams_per_environment,
            config.socket_queue_bytes,
            timing,
        );
        let hub = Hub::new(store, router);
        let limits = RateLimits::new(&config, hub.tenant_count());
        Arc::new(Self {
            config,
            key,
            ws_base,
            node_ws_base,
            hub,
            limits,
        })
    }
}

/// Every route of the service, the registry and the socket upgrades under `base_path`;
/// `upgrade` answers `GET /ws/environment/{id}`.
pub(crate) fn routes(
    service: &Arc<Service>,
    base_path: &str,
    upgrade: MethodRouter<Arc<Service>>,
) -> axum::Router {
    let inner = axum::Router::new()
        .route("/cloud/environment/{id}/register", post(register))
        .route("/cloud/environment/{id}/connect", post(connect))
        .route("/cloud/environment/{id}/validate", post(validate))
        .route("/ws/environment/{id}", upgrade)
        .with_state(Arc::clone(service));
    let app = axum::Router::new()
        .route("/livez", get(|| async { StatusCode::OK }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(Arc::clone(service));
    if base_path.is_empty() {
        app.merge(inner)
    } else {
        app.nest(base_path, inner)
    }
}

/// 200 while the store answers; 503 while it is unreachable, so a load balancer sends
/// new requests to nodes that can answer them.
async fn readyz(State(service): State<Arc<Service>>) -> StatusCode {
    if service.hub.ready().await {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// The process's metrics (Prometheus text), for any configured bearer token.
async fn metrics(State(service): State<Arc<Service>>, headers: HeaderMap) -> Response {
    let known = match bearer_token(&headers) {
        Some(token) => service
            .hub
            .authenticate(&token_digest(&token))
            .await
            .is_some(),
        None => false,
    };
    if !known {
        crate::audit::refused(crate::audit::Refused {
            status: 401,
            reason: "unauthorized",
            message: "/metrics needs a configured bearer token",
            environment: "",
            tenant: None,
        });
        return StatusCode::UNAUTHORIZED.into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        exec_server_core::metrics::render(),
    )
        .into_response()
}

/// A registry call while the shared store is unreachable: 503, try again shortly.
fn store_unavailable(environment: &str) -> Response {
    let mut response = error(
        environment,
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        "the registry's store is unreachable; try again",
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    response
}

// ---- registry endpoints --------------------------------------------------------------

fn json(status: StatusCode, value: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// The body of a registry error answer (§7.6).
fn error_json(code: &str, message: &str) -> Value {
    serde_json::json!({"error": {"code": code, "message": message}})
}

/// A refused registry call: logged with its reason (never a token, key or authorisation)
/// and answered with the JSON error body that names it.
fn error(environment: &str, status: StatusCode, code: &str, message: &str) -> Response {
    error_for(None, environment, status, code, message)
}

/// [`error`] for a caller whose token was known: the audit event names its tenant.
fn error_for(
    tenant: Option<&str>,
    environment: &str,
    status: StatusCode,
    code: &str,
    message: &str,
) -> Response {
    crate::audit::refused(crate::audit::Refused {
        status: status.as_u16(),
        reason: code,
        message,
        environment,
        tenant,
    });
    tracing::warn!(
        status = status.as_u16(),
        reason = code,
        environment = %exec_server_relay_core::proto::truncate_for_log(environment),
        "registry request refused: {message}"
    );
    let mut response = json(status, &error_json(code, message));
    if status == StatusCode::SERVICE_UNAVAILABLE && code == "executor_unavailable" {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}

/// A refused request: its JSON error body (§7.6) and its log line, both naming the limit
/// and the key that raises it — never the token.
fn refuse(refusal: &Refusal, caller: Option<&str>, environment: &str) -> Response {
    refusal_log(refusal, caller, environment);
    refusal_response(refusal)
}

fn refusal_response(refusal: &Refusal) -> Response {
    let mut response = json(
        refusal.status(),
        &error_json(refusal.code(), &refusal.to_string()),
    );
    if let Some(secs) = refusal.retry_after_secs() {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
    }
    response
}

/// `caller` is the tenant that made the request, when its token has been checked.
fn refusal_log(refusal: &Refusal, caller: Option<&str>, environment: &str) {
    crate::audit::refused(crate::audit::Refused {
        status: refusal.status().as_u16(),
        reason: refusal.code(),
        message: &refusal.to_string(),
        environment,
        tenant: refusal.tenant().or(caller),
    });
    tracing::warn!(
        reason = refusal.code(),
        limit = refusal.config_key(),
        tenant = refusal.tenant().or(caller).unwrap_or("-"),
        environment = %exec_server_relay_core::proto::truncate_for_log(environment),
        "request refused: {refusal}"
    );
}

/// A request over a rate limit; only the first refusal of a run is logged.
fn limited(limited: Limited, environment: &str) -> Response {
    if limited.first {
        refusal_log(&limited.refusal, None, environment);
    }
    refusal_response(&limited.refusal)
}

/// The request's `Authorization: Bearer` token.
fn bearer_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim().to_owned())
}

fn environment_matches(patterns: &[String], id: &str) -> bool {
    patterns.iter().any(|p| {
        p == "*"
            || p == id
            || p.strip_suffix('*')
                .is_some_and(|prefix| id.starts_with(prefix))
    })
}

impl Service {
    /// Bearer token check of §8.3: unknown → 401, wrong role or environment → 403;
    /// otherwise the caller's tenant.
    async fn authorize(
        &self,
        headers: &HeaderMap,
        needs: TokenRole,
        id: &str,
    ) -> Result<TokenGrant, Response> {
        let token = bearer_token(headers);
        let unauthorized = || {
            error(
                id,
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a valid bearer token is required",
            )
        };
        let Some(token) = token else {
            return Err(unauthorized());
        };
        let Some(entry) = self.hub.authenticate(&token_digest(&token)).await else {
            return Err(unauthorized());
        };
        let role_ok = entry.role == TokenRole::Any || entry.role == needs;
        let environment_ok = environment_matches(&entry.environments, id);
        if !role_ok || !environment_ok {
            // Which rule refused it: the caller holds this token, so its own role and
            // patterns are no secret to it.
            let why = if role_ok {
                "this token's environments patterns do not match this environment".to_owned()
            } else {
                format!(
                    "this token's role is `{}`, and this call needs `{}`",
                    entry.role.name(),
                    needs.name()
                )
            };
            tracing::info!(token = %entry.name, reason = %why, "token not allowed for this call");
            return Err(error_for(
                Some(&entry.name),
                id,
                StatusCode::FORBIDDEN,
                "forbidden",
                &why,
            ));
        }
        Ok(entry)
    }

    fn executor_url(&self, id: &str, reg: &str) -> String {
        let exp = now_unix() + self.config.executor_url_ttl_secs;
        let sig = self.key.url_signature("environment", id, reg, "", exp);
        format!(
            "{}/ws/environment/{}?role=environment&reg={reg}&exp={exp}&sig={sig}",
            self.ws_base,
            encode_segment(id)
        )
    }

    /// A harness URL on the node that holds the environment's executor socket: `node`
    /// (its public URL) when that is another node, else this one.
    fn harness_url(&self, node: Option<&str>, id: &str, reg: &str, kh: &str) -> String {
        let exp = now_unix() + self.config.harness_url_ttl_secs;
        let sig = self.key.url_signature("harness", id, reg, kh, exp);
        let base = node.map_or_else(|| self.node_ws_base.clone(), ws_base_of);
        format!(
            "{base}/ws/environment/{}?role=harness&reg={reg}&kh={kh}&exp={exp}&sig={sig}",
            encode_segment(id)
        )
    }
}

/// The common start of every registry call, cheapest check first: the peer's request
/// rate (before its token is even looked at), a declared body size over the limit (413
/// without reading any of it), the bearer token, the tenant's request rate, the
/// environment id, then the body itself, read up to the limit. Returns the parsed body
/// and the caller's token entry (its tenant).
async fn authorized_call(
    service: &Service,
    peer: SocketAddr,
    headers: &HeaderMap,
    role: TokenRole,
    id: &str,
    body: Body,
) -> Result<(Value, TokenGrant), Response> {
    service
        .limits
        .check_peer(peer.ip())
        .map_err(|l| limited(l, id))?;
    let max_body = service.config.max_request_body_bytes;
    let too_large =
        |caller: Option<&str>| refuse(&Refusal::RequestBody { max: max_body }, caller, id);
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max_body as u64) {
        return Err(too_large(None));
    }
    let caller = service.authorize(headers, role, id).await?;
    service
        .limits
        .check_tenant(caller.tenant, &caller.name)
        .map_err(|l| limited(l, id))?;
    if let Err(problem) = check_environment_id(id) {
        return Err(error(
            id,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &format!("environment id {problem}"),
        ));
    }
    let bytes = axum::body::to_bytes(body, max_body)
        .await
        .map_err(|_| too_large(Some(&caller.name)))?;
    let value = serde_json::from_slice(&bytes).map_err(|e| {
        error(
            id,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &format!("malformed JSON: {e}"),
        )
    })?;
    Ok((value, caller))
}

fn key_member(id: &str, body: &Value, name: &str) -> Result<NoisePublicKey, Response> {
    let value = body.get(name).ok_or_else(|| {
        error(
            id,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &format!("missing `{name}`"),
        )
    })?;
    NoisePublicKey::from_json(value).map_err(|e| {
        error(
            id,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &format!("`{name}`: {e}"),
        )
    })
}

async fn register(
    State(service): State<Arc<Service>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (body, caller) =
        match authorized_call(&service, peer, &headers, TokenRole::Executor, &id, body).await {
            Ok(call) => call,
            Err(r) => return r,
        };
    // codex registers `noise_hybrid_ik_v1` with a hybrid key; our executors may also
    // register the classic `noise_ik_v1`. The key must be of the profile's suite.
    let profile = match body.get("security_profile") {
        Some(Value::String(profile)) => profile.as_str(),
        Some(_) => {
            return error(
                &id,
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "`security_profile` is not a string",
            )
        }
        None => {
            return error(
                &id,
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "missing `security_profile`",
            )
        }
    };
    let Some(suite) = suite_by_profile(profile) else {
        let known: Vec<&str> = SUITES.iter().map(|s| s.security_profile()).collect();
        return error(
            &id,
            StatusCode::BAD_REQUEST,
            "unsupported_security_profile",
            &format!(
                "security_profile `{}` is not supported; this rendezvous accepts {}",
                exec_server_relay_core::proto::truncate_for_log(profile),
                known.join(", ")
            ),
        );
    };
    let key = match key_member(&id, &body, "executor_public_key") {
        Ok(k) => k,
        Err(r) => return r,
    };
    if key.suite_name() != suite.name() {
        return error(
            &id,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &format!(
                "`executor_public_key` is a `{}` key, but security_profile `{}` needs a `{}` key",
                key.suite_name(),
                suite.security_profile(),
                suite.name()
            ),
        );
    }
    let name = body.get("name").and_then(Value::as_str).map(str::to_owned);
    if name.as_ref().is_some_and(|n| n.len() > 256) {
        return error(
            &id,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "`name` is longer than 256 bytes",
        );
    }
    let reg = match service.hub.register(&id, key, name, caller.tenant).await {
        Ok(reg) => reg,
        Err(RegisterRefusal::Busy) => {
            return error(
                &id,
                StatusCode::CONFLICT,
                "environment_busy",
                "another executor is serving this environment",
            )
        }
        Err(RegisterRefusal::Capacity(refusal)) => {
            return refuse(&refusal, Some(&caller.name), &id)
        }
        Err(RegisterRefusal::StoreUnavailable) => return store_unavailable(&id),
    };
    json(
        StatusCode::OK,
        &serde_json::json!({
            "environment_id": id,
            "url": service.executor_url(&id, &reg),
            "security_profile": suite.security_profile(),
            "executor_registration_id": reg,
        }),
    )
}

async fn connect(
    State(service): State<Arc<Service>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (body, _) =
        match authorized_call(&service, peer, &headers, TokenRole::Harness, &id, body).await {
            Ok(call) => call,
            Err(r) => return r,
        };
    let harness_key = match key_member(&id, &body, "harness_public_key") {
        Ok(k) => k,
        Err(r) => return r,
    };
    let (reg, executor_key, node) = match service.hub.connectable(&id).await {
        Connectable::Yes { reg, key, node } => (reg, key, node),
        Connectable::StoreUnavailable => return store_unavailable(&id),
        Connectable::NotFound => {
            return error(
                &id,
                StatusCode::NOT_FOUND,
                "environment_not_found",
                "no executor has registered this environment",
            )
        }
        Connectable::Unavailable => {
            return error(
                &id,
                StatusCode::SERVICE_UNAVAILABLE,
                "executor_unavailable",
                "no executor is attached to this environment",
            )
        }
    };
    let kh = key_hash(&harness_key);
    let authz = service.key.authorization(&AuthorizationClaims {
        v: 1,
        env: id.clone(),
        reg: reg.clone(),
        kh: kh.clone(),
        exp: now_unix() + service.config.authorization_ttl_secs,
    });
    json(
        StatusCode::OK,
        &serde_json::json!({
            "environment_id": id,
            "url": service.harness_url(node.as_deref(), &id, &reg, &kh),
            "security_profile": executor_key.suite().security_profile(),
            "executor_registration_id": reg,
            "executor_public_key": executor_key.to_json(),
            "harness_key_authorization": authz,
        }),
    )
}

async fn validate(
    State(service): State<Arc<Service>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (body, _) =
        match authorized_call(&service, peer, &headers, TokenRole::Executor, &id, body).await {
            Ok(call) => call,
            Err(r) => return r,
        };
    let harness_key = match key_member(&id, &body, "harness_public_key") {
        Ok(k) => k,
        Err(r) => return r,
    };
    let Some(reg) = body.get("executor_registration_id").and_then(Value::as_str) else {
        return error(
            &id,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "missing `executor_registration_id`",
        );
    };
    let Some(authz) = body
        .get("harness_key_authorization")
        .and_then(Value::as_str)
    else {
        return error(
            &id,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "missing `harness_key_authorization`",
        );
    };
    let current = match service.hub.current_registration(&id).await {
        Ok(current) => current,
        Err(_) => return store_unavailable(&id),
    };
    let Some(current) = current else {
        return error(
            &id,
            StatusCode::NOT_FOUND,
            "environment_not_found",
            "no registration for this environment",
        );
    };
    // The stream the executor validates for (codex sends it; older executors do not).
    let stream = headers
        .get(STREAM_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(exec_server_relay_core::proto::truncate_for_log)
        .unwrap_or_else(|| "-".to_owned());
    let refusal = if reg != current {
        Some("the registration id is not the environment's current one")
    } else {
        match service.key.verify_authorization(authz) {
            None => Some("the authorization is not one this rendezvous issued"),
            Some(claims) if claims.v != 1 || claims.env != id || claims.reg != reg => {
                Some("the authorization is for another environment or registration")
            }
            Some(claims) if claims.kh != key_hash(&harness_key) => {
                Some("the authorization was issued for another harness key")
            }
            Some(claims) if claims.exp < now_unix() => Some("the authorization has expired"),
            Some(_) => None,
        }
    };
    match refusal {
        Some(reason) => tracing::warn!(
            environment = %exec_server_relay_core::proto::truncate_for_log(&id),
            stream = %stream,
            "validate answered valid=false: {reason}"
        ),
        None => tracing::debug!(
            environment = %exec_server_relay_core::proto::truncate_for_log(&id),
            stream = %stream,
            "validate answered valid=true"
        ),
    }
    json(
        StatusCode::OK,
        &serde_json::json!({ "valid": refusal.is_none() }),
    )
}

// ---- WebSocket upgrades -------------------------------------------------------------

#[derive(Debug, Default)]
pub(crate) struct UpgradeQuery {
    role: Option<String>,
    reg: Option<String>,
    kh: Option<String>,
    exp: Option<String>,
    sig: Option<String>,
}

impl UpgradeQuery {
    pub(crate) fn parse(query: &str) -> Self {
        let mut q = Self::default();
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = decode_segment(v);
            match k {
                "role" => q.role = v,
                "reg" => q.reg = v,
                "kh" => q.kh = v,
                "exp" => q.exp = v,
                "sig" => q.sig = v,
                _ => {}
            }
        }
        q
    }
}

/// What a signed URL names, once its signature verifies (§8.4 checks 1–3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SignedUrl {
    pub(crate) role: SocketRole,
    pub(crate) reg: String,
    /// The harness key hash; empty for an executor.
    pub(crate) kh: String,
    pub(crate) exp: u64,
}

/// An upgrade refused before the store is asked: its status and rejection reason.
pub(crate) type UrlRefusal = (StatusCode, &'static str);

async fn upgrade(
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    request: Request<Body>,
) -> Response {
    let query = UpgradeQuery::parse(request.uri().query().unwrap_or(""));
    let (mut parts, _) = request.into_parts();
    let ws = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(ws) => ws,
        Err(rejection) => return rejection.into_response(),
    };
    let url = match service
        .verify_signed_url(&id, &query)
        .and_then(|url| service.check_expiry(&url, now_unix()).map(|()| url))
    {
        Ok(url) => url,
        Err((status, reason)) => return upgrade_refused(&id, status, reason),
    };
    let admitted = match service.admit(&id, &url).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let hub = Arc::clone(&service.hub);
    let SignedUrl { reg, kh, .. } = url;
    // A failed upgrade drops the closure, and with it the harness lease.
    ws.max_message_size(MAX_WS_MESSAGE_BYTES)
        .max_frame_size(MAX_WS_MESSAGE_BYTES)
        .on_upgrade(move |socket| async move {
            match admitted {
                Admitted::Executor(epoch) => hub.serve_executor(id, reg, epoch, socket).await,
                Admitted::Harness(epoch, lease) => {
                    hub.serve_harness(id, epoch, kh, lease, socket).await
                }
            }
        })
}

impl Service {
    /// Checks 1–3 of §8.4: the environment id and the query are well formed, and the
    /// signature is this service's over what the query names.
    pub(crate) fn verify_signed_url(
        &self,
        id: &str,
        query: &UpgradeQuery,
    ) -> Result<SignedUrl, UrlRefusal> {
        if check_environment_id(id).is_err() {
            return Err((StatusCode::BAD_REQUEST, "malformed_query"));
        }
        let role = match query.role.as_deref() {
            Some("environment") => SocketRole::Executor,
            Some("harness") => SocketRole::Harness,
            Some(_) => return Err((StatusCode::BAD_REQUEST, "invalid_role")),
            None => return Err((StatusCode::BAD_REQUEST, "missing_role")),
        };
        let (Some(reg), Some(exp)) = (
            query.reg.clone(),
            query.exp.as_deref().and_then(|e| e.parse::<u64>().ok()),
        ) else {
            return Err((StatusCode::BAD_REQUEST, "malformed_query"));
        };
        let kh = match role {
            SocketRole::Harness => match query.kh.clone() {
                Some(kh) if !kh.is_empty() => kh,
                _ => return Err((StatusCode::BAD_REQUEST, "malformed_query")),
            },
            SocketRole::Executor => String::new(),
        };
        let role_text = match role {
            SocketRole::Executor => "environment",
            SocketRole::Harness => "harness",
        };
        let signed = query
            .sig
            .as_deref()
            .is_some_and(|sig| self.key.verify_url(role_text, id, &reg, &kh, exp, sig));
        if !signed {
            let reason = if query.sig.is_none() {
                "missing_signature"
            } else {
                "invalid_signature"
            };
            return Err((StatusCode::UNAUTHORIZED, reason));
        }
        Ok(SignedUrl { role, reg, kh, exp })
    }

    /// Check 4 of §8.4: the URL has not expired, and does not claim to live longer than
    /// this service signs URLs for (plus a minute of clock skew).
    pub(crate) fn check_expiry(&self, url: &SignedUrl, now: u64) -> Result<(), UrlRefusal> {
        let ttl = match url.role {
            SocketRole::Executor => self.config.executor_url_ttl_secs,
            SocketRole::Harness => self.config.harness_url_ttl_secs,
        };
        if url.exp < now || url.exp > now + ttl + 60 {
            return Err((StatusCode::UNAUTHORIZED, "invalid_expiry"));
        }
        Ok(())
    }

    /// Checks 5–7 of §8.4: the registration state; for a harness also the executor's
    /// presence and the capacity its socket takes.
    pub(crate) async fn admit(&self, id: &str, url: &SignedUrl) -> Result<Admitted, Response> {
        match url.role {
            SocketRole::Executor => match self.hub.admit_executor(id, &url.reg).await {
                Ok(epoch) => Ok(Admitted::Executor(epoch)),
                Err(status) => Err(upgrade_refused(id, status, "unknown_route")),
            },
            SocketRole::Harness => match self.hub.admit_harness(id, &url.reg).await {
                Ok((epoch, lease)) => Ok(Admitted::Harness(epoch, lease)),
                Err(UpgradeRefusal::Status(status)) => {
                    Err(upgrade_refused(id, status, "unknown_route"))
                }
                Err(UpgradeRefusal::Capacity(refusal)) => Err(refuse(&refusal, None, id)),
                Err(UpgradeRefusal::Elsewhere(node)) => Err(misdirected(id, &node)),
            },
        }
    }
}

/// A refused socket upgrade: logged, and answered with the status and codex's
/// `x-codex-rendezvous-rejection-reason` header (CODEX-0169 §4.3). A 4xx makes a codex
/// executor register again at once.
fn upgrade_refused(environment: &str, status: StatusCode, reason: &'static str) -> Response {
    crate::audit::refused(crate::audit::Refused {
        status: status.as_u16(),
        reason,
        message: "rendezvous socket upgrade refused",
        environment,
        tenant: None,
    });
    tracing::warn!(
        status = status.as_u16(),
        reason,
        environment = %exec_server_relay_core::proto::truncate_for_log(environment),
        "rendezvous socket upgrade refused"
    );
    let mut response = status.into_response();
    response.headers_mut().insert(
        "x-codex-rendezvous-rejection-reason",
        header::HeaderValue::from_static(reason),
    );
    response
}

/// A harness socket that landed on a node that does not hold the environment's executor
/// socket: 421 with a body naming the node that does (RELAY §8.10). A harness asks
/// `connect` again, which hands out a URL on that node.
fn misdirected(environment: &str, node: &str) -> Response {
    tracing::info!(
        environment = %exec_server_relay_core::proto::truncate_for_log(environment),
        node,
        "harness socket upgrade sent to the node that holds the environment"
    );
    let mut response = json(
        StatusCode::MISDIRECTED_REQUEST,
        &serde_json::json!({"error": {
            "code": "wrong_node",
            "message": format!("this environment's executor is held by the rendezvous node {node}; call connect again"),
            "node_url": node,
        }}),
    );
    response.headers_mut().insert(
        "x-codex-rendezvous-rejection-reason",
        header::HeaderValue::from_static("wrong_node"),
    );
    response
}

/// An upgrade the store admitted: the registration it is for and, for a harness, the
/// capacity it holds.
pub(crate) enum Admitted {
    Executor(Epoch),
    Harness(Epoch, HarnessLease),
}

/// Test hook: how long the router waits before parked routes and detached executors expire.
pub fn grace(config: &RendezvousConfig) -> Duration {
    Duration::from_secs(config.grace_secs)
}

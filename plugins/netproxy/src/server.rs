//! A running proxy for one process: its listeners (HTTP, and SOCKS5 when enabled), the
//! accept loops, and the shutdown that closes listeners, connections and tunnels.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{NetworkProxyLaunchConfig, ProxyConfig};
use crate::context::ProxyContext;
use crate::decider::PolicyDecider;
use crate::env::child_env;
use crate::event::EventSink;
use crate::http_proxy::serve_http;
use crate::limits::{Admission, ProxyLimits};
use crate::policy::PolicyEngine;
use crate::resolve::{Resolver, SystemResolver};
use crate::socks::serve_socks;

/// Where a listener comes from: `127.0.0.1:0`, or a socket the caller bound already
/// (for example inside a child's network namespace).
#[derive(Debug, Default)]
pub enum ListenerSource {
    #[default]
    Loopback,
    Std(std::net::TcpListener),
    Tokio(TcpListener),
}

impl From<std::net::TcpListener> for ListenerSource {
    fn from(listener: std::net::TcpListener) -> Self {
        Self::Std(listener)
    }
}

impl From<TcpListener> for ListenerSource {
    fn from(listener: TcpListener) -> Self {
        Self::Tokio(listener)
    }
}

impl ListenerSource {
    async fn into_listener(self) -> io::Result<TcpListener> {
        match self {
            Self::Loopback => TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await,
            Self::Std(listener) => {
                listener.set_nonblocking(true)?;
                TcpListener::from_std(listener)
            }
            Self::Tokio(listener) => Ok(listener),
        }
    }
}

/// What the caller plugs in.
pub struct ProxyOptions {
    pub resolver: Arc<dyn Resolver>,
    /// Asked about allowlist misses, only when `policyDecisionTimeoutMs` is set.
    pub decider: Option<Arc<dyn PolicyDecider>>,
    /// Receives every decision (`network/policyDecision` without `processId`).
    pub events: EventSink,
    pub limits: ProxyLimits,
    /// Charged for each accepted connection (none: only `limits.max_connections`).
    pub admission: Option<Admission>,
    pub http_listener: ListenerSource,
    /// Used only with `enableSocks5`.
    pub socks_listener: ListenerSource,
}

impl ProxyOptions {
    /// The system resolver, no decider, default limits, loopback listeners.
    pub fn new(events: EventSink) -> Self {
        Self {
            resolver: Arc::new(SystemResolver),
            decider: None,
            events,
            limits: ProxyLimits::default(),
            admission: None,
            http_listener: ListenerSource::Loopback,
            socks_listener: ListenerSource::Loopback,
        }
    }
}

#[derive(Clone, Copy)]
enum ListenerKind {
    Http,
    Socks,
}

/// The proxy of one process. Dropping it (or [`Proxy::shutdown`]) closes its listeners
/// and every connection and tunnel it holds.
pub struct Proxy {
    http_addr: SocketAddr,
    socks_addr: Option<SocketAddr>,
    allow_local_binding: bool,
    shutdown: CancellationToken,
    accept_loops: Vec<JoinHandle<()>>,
}

impl Proxy {
    /// Validates `config` (an invalid one is `InvalidInput` with the §3.1 text), binds or
    /// adopts the listeners and starts serving.
    pub async fn start(
        config: &NetworkProxyLaunchConfig,
        options: ProxyOptions,
    ) -> io::Result<Self> {
        config
            .validate()
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
        warn_unsupported(&config.proxy);
        let http = options.http_listener.into_listener().await?;
        let socks = match config.proxy.enable_socks5 {
            true => Some(options.socks_listener.into_listener().await?),
            false => None,
        };
        let http_addr = http.local_addr()?;
        let socks_addr = socks.as_ref().map(TcpListener::local_addr).transpose()?;
        let shutdown = CancellationToken::new();
        let engine = PolicyEngine::new(
            &config.proxy,
            config.policy_decision_timeout_ms,
            options.resolver,
            options.decider,
            options.limits.resolve_timeout,
        );
        let slots = Arc::new(Semaphore::new(options.limits.max_connections));
        let ctx = Arc::new(ProxyContext {
            engine,
            events: options.events,
            limits: options.limits,
            shutdown: shutdown.clone(),
            own_addrs: [Some(http_addr), socks_addr]
                .into_iter()
                .flatten()
                .collect(),
        });
        let admit = Admit {
            slots,
            admission: options.admission,
        };
        let mut accept_loops = vec![spawn_accept_loop(http, ListenerKind::Http, &ctx, &admit)];
        if let Some(socks) = socks {
            accept_loops.push(spawn_accept_loop(socks, ListenerKind::Socks, &ctx, &admit));
        }
        tracing::info!(%http_addr, ?socks_addr, "network proxy started");
        Ok(Self {
            http_addr,
            socks_addr,
            allow_local_binding: config.proxy.allow_local_binding,
            shutdown,
            accept_loops,
        })
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn socks_addr(&self) -> Option<SocketAddr> {
        self.socks_addr
    }

    /// The child's variables for these listeners (§3.2); use [`child_env`] directly
    /// when the child reaches the proxy through other (bridged) ports.
    pub fn child_env(&self) -> Vec<(&'static str, String)> {
        child_env(
            self.http_addr.port(),
            self.socks_addr.map(|addr| addr.port()),
            self.allow_local_binding,
        )
    }

    /// Stops the proxy and waits until its listeners are closed.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        for accept_loop in std::mem::take(&mut self.accept_loops) {
            let _ = accept_loop.await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// What a connection needs before it is served: one of `max_connections` slots, then
/// the caller's admission.
#[derive(Clone)]
pub(crate) struct Admit {
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) admission: Option<Admission>,
}

/// Held for as long as an admitted connection is open.
pub(crate) struct Admitted {
    _slot: tokio::sync::OwnedSemaphorePermit,
    _charge: Option<Box<dyn Send>>,
}

impl Admit {
    /// Takes a slot (waiting for one), then accepts a connection the admission lets in;
    /// `None` once the slots are closed. Refused connections are closed at once.
    pub(crate) async fn accept(
        &self,
        listener: &TcpListener,
    ) -> Option<(TcpStream, SocketAddr, Admitted)> {
        loop {
            let slot = Arc::clone(&self.slots).acquire_owned().await.ok()?;
            let (stream, client) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "network proxy: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let charge = match &self.admission {
                None => None,
                Some(admission) => match admission() {
                    Some(charge) => Some(charge),
                    None => {
                        tracing::warn!(%client, "network proxy: connection refused by the descriptor budget");
                        drop(stream);
                        continue;
                    }
                },
            };
            let admitted = Admitted {
                _slot: slot,
                _charge: charge,
            };
            return Some((stream, client, admitted));
        }
    }
}

fn spawn_accept_loop(
    listener: TcpListener,
    kind: ListenerKind,
    ctx: &Arc<ProxyContext>,
    admit: &Admit,
) -> JoinHandle<()> {
    let shutdown = ctx.shutdown.clone();
    let accepting = accept_loop(listener, kind, ctx.clone(), admit.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = accepting => {}
        }
    })
}

/// Serves every connection [`Admit::accept`] lets in, so at most `max_connections` are
/// open and each is charged.
async fn accept_loop(
    listener: TcpListener,
    kind: ListenerKind,
    ctx: Arc<ProxyContext>,
    admit: Admit,
) {
    while let Some((stream, client, admitted)) = admit.accept(&listener).await {
        let conn_ctx = ctx.clone();
        ctx.spawn(async move {
            let _admitted = admitted;
            match kind {
                ListenerKind::Http => serve_http(stream, client, conn_ctx).await,
                ListenerKind::Socks => serve_socks(stream, client, conn_ctx).await,
            }
        });
    }
}

/// Settings the proxy accepts but does not act on, said once at start.
fn warn_unsupported(proxy: &ProxyConfig) {
    let unix_sockets = proxy
        .unix_sockets
        .as_ref()
        .is_some_and(|map| !map.is_empty());
    if unix_sockets || proxy.dangerously_allow_all_unix_sockets {
        tracing::warn!(
            "allowUnixSockets and dangerouslyAllowAllUnixSockets are macOS-only; requests will be rejected on this platform"
        );
    }
    if proxy.allow_upstream_proxy {
        tracing::warn!("network proxy: allowUpstreamProxy is not supported; connecting directly");
    }
    if proxy.enable_socks5_udp {
        tracing::warn!("network proxy: enableSocks5Udp is not supported; UDP ASSOCIATE is refused");
    }
    if proxy.credential_masking == Some(true) {
        tracing::warn!("network proxy: credentialMasking is not supported by this proxy");
    }
}

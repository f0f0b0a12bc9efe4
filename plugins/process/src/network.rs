//! The managed network of one process (CODEX-NETWORK.md §3): `process/start` with
//! `networkProxy` gets a policy proxy of its own (`exec-server-netproxy`), the proxy
//! variables in its environment, a `network/policyDecision` notification for every
//! decision, and — with `policyDecisionTimeoutMs` — a `network/policyRequest` to the client
//! for each allowlist miss. The proxy lives until the process exits. With
//! `enforceManagedNetwork` and no `networkProxy`, the child is bridged to the proxy the
//! client runs instead ([`Plan::Bridged`]).

use std::os::fd::OwnedFd;
use std::sync::Arc;

use exec_server_core::proto::process::StartParams;
use exec_server_core::proto::RpcError;
use exec_server_core::{descriptors, Session};
use exec_server_netproxy::{
    client_proxy, Admission, Bridge, DeciderAnswer, EventSink, ListenerSource,
    NetworkProxyLaunchConfig, PolicyDecider, PolicyEvent, PolicyRequest, Proxy, ProxyLimits,
    ProxyOptions,
};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;

/// The notification of each decision.
pub(crate) const POLICY_DECISION: &str = "network/policyDecision";
/// The server→client request about an allowlist miss.
pub(crate) const POLICY_REQUEST: &str = "network/policyRequest";

/// Decisions queued for the client; beyond this the notification is dropped (the decision
/// itself is logged all the same) rather than holding the proxy's connections.
const EVENT_QUEUE: usize = 1024;

/// `networkProxy` decoded and checked; `None` when absent or `null`.
pub(crate) fn parse(value: Option<&Value>) -> Result<Option<NetworkProxyLaunchConfig>, RpcError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let config = NetworkProxyLaunchConfig::from_value(value.clone())
        .map_err(|e| RpcError::invalid_params(e.to_string()))?;
    Ok(Some(config))
}

/// Ports the proxy listens on inside a managed child's network namespace (nothing else
/// listens there, so any free number would do; these are the usual ones).
pub(crate) const HTTP_PORT_IN_NAMESPACE: u16 = 3128;
pub(crate) const SOCKS_PORT_IN_NAMESPACE: u16 = 1080;

/// How a process's proxy is reached.
pub(crate) enum Plan {
    /// On the server's loopback, started before the process: the child is not confined
    /// to it (no sandbox, or one that leaves the network open), as with codex.
    Loopback,
    /// Inside the child's own network namespace, on these ports, served from the
    /// listeners the sandbox launcher makes there: the proxy is its only way out.
    Enforced(Vec<u16>),
    /// A proxy the client runs on the server's loopback, at these ports: the launcher
    /// listens on the same ports inside the child's namespace, and the server forwards
    /// what they accept (CODEX-NETWORK §3.5). The child's variables stay as the client
    /// sent them.
    Bridged(Vec<u16>),
}

impl Plan {
    /// The plan for a start with `config` (`networkProxy`), or `None` when no proxy is
    /// involved. `confines_network`: the sandbox gives the child a network namespace of
    /// its own (a policy that restricts the network).
    pub(crate) fn decide(
        config: Option<&NetworkProxyLaunchConfig>,
        params: &StartParams,
        confines_network: bool,
    ) -> Result<Option<Self>, RpcError> {
        let enforce = params.enforce_managed_network == Some(true) && confines_network;
        let Some(config) = config else {
            return match enforce {
                true => Self::bridged(params).map(Some),
                // Nothing asks for a proxy, or nothing confines the child to one.
                false => Ok(None),
            };
        };
        if !enforce {
            return Ok(Some(Self::Loopback));
        }
        let mut ports = vec![HTTP_PORT_IN_NAMESPACE];
        if config.proxy.enable_socks5 {
            ports.push(SOCKS_PORT_IN_NAMESPACE);
        }
        Ok(Some(Self::Enforced(ports)))
    }

    /// The client's proxy, from the proxy variables in `env` and
    /// `managedNetwork.loopbackPorts`; none at all is codex's refusal (fail closed).
    fn bridged(params: &StartParams) -> Result<Self, RpcError> {
        let extra = params
            .managed_network
            .as_ref()
            .map_or(&[][..], |m| &m.loopback_ports[..]);
        let env = params.env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        client_proxy::loopback_proxy_ports(env, extra)
            .map(Self::Bridged)
            .map_err(|e| RpcError::invalid_params(e.to_string()))
    }

    /// The ports the launcher listens on inside the child's namespace.
    pub(crate) fn namespace_ports(&self) -> Option<&[u16]> {
        match self {
            Self::Loopback => None,
            Self::Enforced(ports) | Self::Bridged(ports) => Some(ports),
        }
    }

    /// The child's proxy variables when they are known before the proxy starts.
    pub(crate) fn child_env(
        &self,
        config: &NetworkProxyLaunchConfig,
    ) -> Vec<(&'static str, String)> {
        match self {
            Self::Loopback | Self::Bridged(_) => Vec::new(),
            Self::Enforced(ports) => exec_server_netproxy::child_env(
                ports[0],
                ports.get(1).copied(),
                config.proxy.allow_local_binding,
            ),
        }
    }
}

/// What carries a process's traffic until it exits: its own proxy, or the bridge to the
/// client's.
pub(crate) enum Held {
    Proxy(Proxy),
    Bridge(Bridge),
}

impl Held {
    async fn shutdown(self) {
        match self {
            Self::Proxy(proxy) => proxy.shutdown().await,
            Self::Bridge(bridge) => bridge.shutdown().await,
        }
    }
}

/// Serves the listeners the launcher made in the child's namespace (`listeners`, in
/// [`Plan::namespace_ports`] order): the process's own proxy, or the bridge.
pub(crate) async fn serve_namespace(
    session: &Arc<Session>,
    process_id: &str,
    config: Option<&NetworkProxyLaunchConfig>,
    plan: &Plan,
    listeners: Vec<OwnedFd>,
) -> Result<Option<Held>, RpcError> {
    match (config, plan) {
        (Some(config), Plan::Enforced(_)) => {
            let listeners = Listeners::from_namespace(listeners);
            let proxy = start_proxy(session, process_id, config, listeners).await?;
            Ok(Some(Held::Proxy(proxy)))
        }
        (None, Plan::Bridged(ports)) => {
            let listeners = listeners.into_iter().map(std::net::TcpListener::from);
            let listeners = listeners.zip(ports.iter().copied()).collect();
            let limits = ProxyLimits::default();
            let bridge =
                Bridge::start(listeners, &limits, Some(admission(session))).map_err(|e| {
                    RpcError::internal(format!("failed to start the network bridge: {e}"))
                })?;
            tracing::info!(
                process = process_id,
                ?ports,
                "network bridge to the client's proxy started"
            );
            Ok(Some(Held::Bridge(bridge)))
        }
        _ => Ok(None),
    }
}

/// Where the proxy listens: on the server's loopback, or on sockets bound inside the
/// child's network namespace (the only way out of it).
pub(crate) struct Listeners {
    pub(crate) http: ListenerSource,
    pub(crate) socks: ListenerSource,
}

impl Listeners {
    pub(crate) fn loopback() -> Self {
        Self {
            http: ListenerSource::Loopback,
            socks: ListenerSource::Loopback,
        }
    }

    /// The launcher's listeners, in [`Plan::Enforced`]'s port order.
    pub(crate) fn from_namespace(listeners: Vec<OwnedFd>) -> Self {
        let mut listeners = listeners.into_iter().map(std::net::TcpListener::from);
        Self {
            http: listeners
                .next()
                .map_or(ListenerSource::Loopback, ListenerSource::Std),
            socks: listeners
                .next()
                .map_or(ListenerSource::Loopback, ListenerSource::Std),
        }
    }
}

/// Starts the proxy of process `process_id` of `session`.
pub(crate) async fn start_proxy(
    session: &Arc<Session>,
    process_id: &str,
    config: &NetworkProxyLaunchConfig,
    listeners: Listeners,
) -> Result<Proxy, RpcError> {
    let mut options = ProxyOptions::new(event_sink(session, process_id));
    options.admission = Some(admission(session));
    options.http_listener = listeners.http;
    options.socks_listener = listeners.socks;
    if config.policy_decision_timeout_ms.is_some() {
        options.decider = Some(Arc::new(ClientDecider {
            session: Arc::clone(session),
            process_id: process_id.to_owned(),
        }));
    }
    Proxy::start(config, options)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidInput => RpcError::invalid_params(e.to_string()),
            _ => RpcError::internal(format!("failed to start the network proxy: {e}")),
        })
}

/// Descriptors one connection of a child's proxy or bridge holds in the server: the
/// child's, and the one to its destination.
const DESCRIPTORS_PER_CONNECTION: u64 = 2;

/// Charges each connection a process's proxy or bridge accepts to the session's share of
/// the descriptor budget, like anything else the server holds for it: a child that opens
/// connections by the hundred is refused at its session's share, not at the server's
/// limit.
fn admission(session: &Session) -> Admission {
    let session = session.id().to_owned();
    Arc::new(move || {
        let what = "a managed-network connection";
        let lease = descriptors::charge(&session, DESCRIPTORS_PER_CONNECTION, what).ok()?;
        Some(Box::new(lease) as Box<dyn Send>)
    })
}

/// Keeps `proxy` until `exited` resolves (the process exited), then closes it.
pub(crate) fn hold_until(
    proxy: Held,
    exited: impl std::future::Future<Output = ()> + Send + 'static,
) {
    tokio::spawn(async move {
        exited.await;
        proxy.shutdown().await;
    });
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DecisionNotification<'a> {
    process_id: &'a str,
    #[serde(flatten)]
    event: &'a PolicyEvent,
}

/// A sink that queues each decision for one task, which sends them in order.
fn event_sink(session: &Arc<Session>, process_id: &str) -> EventSink {
    let (tx, mut rx) = mpsc::channel::<PolicyEvent>(EVENT_QUEUE);
    let session = Arc::clone(session);
    let id = process_id.to_owned();
    tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            let notification = DecisionNotification {
                process_id: &id,
                event: &event,
            };
            // A detached session gets no notifications (PROTOCOL §3.4); the decision
            // was logged by the proxy.
            let _ = session.notify(POLICY_DECISION, &notification).await;
        }
    });
    Arc::new(move |event| {
        if tx.try_send(event).is_err() {
            tracing::warn!("network/policyDecision queue full; a notification was dropped");
        }
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PolicyRequestParams<'a> {
    process_id: &'a str,
    request: &'a PolicyRequest,
}

/// Asks the client, with `network/policyRequest`; anything but a well-formed answer
/// (an error, no answer, a lost connection) is a deny, decided by the proxy.
struct ClientDecider {
    session: Arc<Session>,
    process_id: String,
}

#[exec_server_core::async_trait]
impl PolicyDecider for ClientDecider {
    async fn decide(&self, request: PolicyRequest) -> Option<DeciderAnswer> {
        let params = PolicyRequestParams {
            process_id: &self.process_id,
            request: &request,
        };
        match self
            .session
            .request_client(&self.process_id, POLICY_REQUEST, &params)
            .await
        {
            Ok(Ok(result)) => DeciderAnswer::from_result(&result),
            _ => None,
        }
    }
}

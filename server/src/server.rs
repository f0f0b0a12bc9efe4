//! Assembling and running a server: plugins installed, listeners bound, shutdown handled
//! (PROTOCOL §1.1, §1.5).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use exec_server_config::{ConfigSource, CoreConfig};
use exec_server_proto::decode::DecodeLimits;
use tokio_util::sync::CancellationToken;

use crate::config_section::config_sections;
use crate::plugin::plugins;
use crate::router::{MethodPlan, RequestMetrics, Router, StartupError};
use crate::session::SessionRegistry;

/// What every connection of a server shares.
pub struct ServerContext {
    pub core: CoreConfig,
    /// The audit trail (`[audit]`); disabled, it records nothing.
    pub audit: Arc<crate::audit::Auditor>,
    pub router: Router,
    pub sessions: Arc<SessionRegistry>,
    pub decode_limits: DecodeLimits,
    /// Cancelled when shutdown begins (signal, or end of the stdio connection).
    pub shutdown: CancellationToken,
    /// `false` once shutdown has begun: `/readyz` answers 503.
    ready: AtomicBool,
    /// Request metrics of `initialize`, which has no route.
    pub(crate) initialize_metrics: RequestMetrics,
    /// Request metrics of unknown methods, under one placeholder label.
    pub(crate) unknown_method_metrics: RequestMetrics,
}

impl ServerContext {
    /// Builds the context: checks the method plan and installs every enabled plugin.
    pub fn new(source: &ConfigSource, core: CoreConfig) -> Result<Arc<Self>, StartupError> {
        let plan = MethodPlan::new(source, &core, &plugins(), &config_sections())?;
        crate::descriptor_config::configure(source)?;
        let audit = open_audit(source, &core, &plan)?;
        let router = Router::install(&plan, source, &core)?;
        Ok(Arc::new(Self {
            sessions: SessionRegistry::with_audit(
                Duration::from_millis(core.session.detached_ttl_ms),
                Arc::clone(&audit),
            ),
            audit,
            decode_limits: DecodeLimits {
                max_message_bytes: core.limits.max_message_bytes,
                max_json_values: core.limits.max_json_values,
            },
            core,
            router,
            shutdown: CancellationToken::new(),
            ready: AtomicBool::new(true),
            initialize_metrics: RequestMetrics::for_method("initialize"),
            unknown_method_metrics: RequestMetrics::for_method("(unknown)"),
        }))
    }

    /// A new connection's outbound queue, holding at most
    /// `connection.outbound_queue_messages` messages and `connection.outbound_queue_bytes`
    /// bytes; `max_message_bytes` is the largest message the transport can carry, if it
    /// has a limit of its own (relay streams). Every transport sends through one.
    pub fn outbound_queue(
        &self,
        max_message_bytes: Option<usize>,
    ) -> (crate::outbound::Outbound, crate::outbound::OutboundDrain) {
        let connection = &self.core.connection;
        let limits = crate::outbound::QueueLimits {
            messages: connection.outbound_queue_messages,
            bytes: connection.outbound_queue_bytes,
            stalled_peer_timeout: Duration::from_millis(connection.stalled_peer_timeout_ms),
        };
        crate::outbound::outbound_queue_with(limits, max_message_bytes)
    }

    /// True until shutdown begins.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Begins shutdown: stop accepting, kill every session's processes, close connections.
    pub fn begin_shutdown(&self) {
        if self.ready.swap(false, Ordering::SeqCst) {
            tracing::info!("shutting down");
        }
        self.shutdown.cancel();
        self.sessions.end_all();
    }
}

/// Opens the audit trail before any plugin runs (a trail that cannot be written stops the
/// server) and records the configuration it starts with.
fn open_audit(
    source: &ConfigSource,
    core: &CoreConfig,
    plan: &MethodPlan,
) -> Result<Arc<crate::audit::Auditor>, StartupError> {
    let config: crate::audit::AuditConfig =
        crate::plugin::load_checked(source, crate::audit::config::TABLE)?;
    let audit = crate::audit::Auditor::open(&config, source).map_err(StartupError)?;
    if audit.is_enabled() {
        let mut effective = core.to_redacted_json();
        for (name, section) in &plan.tables {
            effective[*name] = section.clone();
        }
        audit.config_loaded(&effective, source.config_file());
    }
    Ok(audit)
}

/// A bound-or-bindable way in: one per `--listen` URL.
#[async_trait]
pub trait Listener: Send {
    /// Binds. Returns the line to announce on stdout once every listener is bound
    /// (`ws://IP:PORT`), if this listener has one.
    async fn bind(&mut self) -> Result<Option<String>, StartupError>;

    /// True when the listener speaks on the server's stdout (stdio), so announcements
    /// must go to stderr instead.
    fn owns_stdout(&self) -> bool {
        false
    }

    /// Serves connections until the server shuts down. An `Err` means the listener
    /// stopped for good while the server was running: the server shuts down and its
    /// process exits with status 1.
    async fn serve(self: Box<Self>, server: Arc<ServerContext>) -> Result<(), ListenerFailed>;
}

/// A listener that stopped for good while the server was running, for instance the relay
/// executor after a terminal registry answer (RELAY §7.6).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ListenerFailed(pub String);

/// Why [`run`] ended other than by an orderly shutdown.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Binding a listener failed (exit status 2, like every start-up error).
    #[error(transparent)]
    Startup(#[from] StartupError),
    /// A listener stopped for good while serving (exit status 1).
    #[error(transparent)]
    Listener(#[from] ListenerFailed),
}

/// Checks a `--listen` URL against the configuration without side effects (run at start-up
/// before anything is opened, and by `exec-server config`).
pub type CheckListenUrlFn = fn(&str, &CoreConfig) -> Result<(), StartupError>;

/// Creates an (unbound) listener for a `--listen` URL.
pub type OpenListenerFn = fn(&str, &Arc<ServerContext>) -> Result<Box<dyn Listener>, StartupError>;

/// Creates a configured transport's listener when its configuration switches it on.
pub type OpenConfiguredFn =
    fn(&ConfigSource, &Arc<ServerContext>) -> Result<Option<Box<dyn Listener>>, StartupError>;

/// A listener transport, registered with `inventory::submit!` and chosen by URL.
#[derive(Debug)]
pub struct ListenerKind {
    /// `stdio` (matches `stdio` and `stdio://`) or a URL scheme such as `ws`.
    pub scheme: &'static str,
    /// Validates the URL: its form, and whatever the configuration must say for it (a
    /// WebSocket off loopback needs authentication).
    pub check: CheckListenUrlFn,
    /// Creates the (unbound) listener for a checked URL.
    pub open: OpenListenerFn,
}

inventory::collect!(ListenerKind);

/// A transport switched on by its own configuration rather than by a `--listen` URL (for
/// example the relay, enabled by `relay.url`), registered with `inventory::submit!`.
#[derive(Debug)]
pub struct ConfiguredTransport {
    pub name: &'static str,
    /// Returns the transport's listener when its configuration enables it.
    pub open: OpenConfiguredFn,
}

inventory::collect!(ConfiguredTransport);

/// Opens every configured transport that its configuration switches on.
pub fn open_configured_transports(
    source: &ConfigSource,
    server: &Arc<ServerContext>,
) -> Result<Vec<Box<dyn Listener>>, StartupError> {
    let mut listeners = Vec::new();
    for kind in inventory::iter::<ConfiguredTransport> {
        if let Some(listener) = (kind.open)(source, server)? {
            tracing::debug!(transport = kind.name, "configured transport enabled");
            listeners.push(listener);
        }
    }
    Ok(listeners)
}

fn scheme_of(url: &str) -> &str {
    if url == "stdio" {
        return "stdio";
    }
    url.split_once("://").map_or("", |(scheme, _)| scheme)
}

fn listener_kind(url: &str) -> Result<&'static ListenerKind, StartupError> {
    let scheme = scheme_of(url);
    inventory::iter::<ListenerKind>
        .into_iter()
        .find(|k| k.scheme == scheme)
        .ok_or_else(|| {
            StartupError(format!(
                "unsupported --listen URL `{url}`; expected `ws://IP:PORT` or `stdio`"
            ))
        })
}

/// Every check start-up runs on the `--listen` URLs before anything is opened: a known
/// scheme, at most one stdio listener, and each transport's own check. `exec-server
/// config` runs it too, so a configuration it accepts is one the server starts with.
pub fn check_listen_urls(urls: &[String], core: &CoreConfig) -> Result<(), StartupError> {
    let mut stdio_seen = false;
    for url in urls {
        let kind = listener_kind(url)?;
        if kind.scheme == "stdio" {
            if stdio_seen {
                return Err(StartupError(
                    "at most one stdio listener may be configured".into(),
                ));
            }
            stdio_seen = true;
        }
        (kind.check)(url, core)?;
    }
    Ok(())
}

/// Creates the listeners for `urls`, once [`check_listen_urls`] accepts them.
pub fn open_listeners(
    urls: &[String],
    server: &Arc<ServerContext>,
) -> Result<Vec<Box<dyn Listener>>, StartupError> {
    check_listen_urls(urls, &server.core)?;
    urls.iter()
        .map(|url| (listener_kind(url)?.open)(url, server))
        .collect()
}

/// How long shutdown waits for the audit backends to write what is queued.
const AUDIT_SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// How long shutdown waits for listeners to close their connections.
const LISTENER_SHUTDOWN_WAIT: Duration = Duration::from_secs(6);

/// Binds every listener, announces the WebSocket addresses, serves until shutdown begins
/// (a signal, `shutdown`, the end of stdio, or a listener that failed), then shuts down per
/// PROTOCOL §1.5. A failed listener is the error.
pub async fn run(
    server: Arc<ServerContext>,
    mut listeners: Vec<Box<dyn Listener>>,
    external_shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RunError> {
    let mut announcements = Vec::new();
    for listener in &mut listeners {
        if let Some(line) = listener.bind().await? {
            announcements.push(line);
        }
    }
    let announce_on_stderr = listeners.iter().any(|l| l.owns_stdout());
    for line in announcements {
        if announce_on_stderr {
            eprintln!("{line}");
        } else {
            use std::io::Write;
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{line}");
            let _ = stdout.flush();
        }
    }

    let mut tasks = tokio::task::JoinSet::new();
    for listener in listeners {
        tasks.spawn(listener.serve(Arc::clone(&server)));
    }
    let mut failure = None;
    tokio::select! {
        _ = external_shutdown => {}
        _ = server.shutdown.cancelled() => {}
        failed = first_failure(&mut tasks) => failure = Some(failed),
    }
    server.begin_shutdown();
    // Listeners stop on the cancelled token. A relay stream flushes for up to 5 s before
    // it resets (RELAY.md §5.10), so wait a little longer than that, and no more.
    let _ = tokio::time::timeout(LISTENER_SHUTDOWN_WAIT, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    // The sessions' last events are queued by now; let the backends write them.
    server.audit.flush(AUDIT_SHUTDOWN_WAIT).await;
    failure.map_or(Ok(()), |failed| Err(failed.into()))
}

/// The first listener that fails; pending while none has.
async fn first_failure(
    tasks: &mut tokio::task::JoinSet<Result<(), ListenerFailed>>,
) -> ListenerFailed {
    loop {
        match tasks.join_next().await {
            Some(Ok(Err(failed))) => return failed,
            Some(_) => {}
            None => std::future::pending().await,
        }
    }
}

/// Installs the SIGTERM and SIGINT handlers now; the future resolves on either signal.
/// Installing them before a listener is bound means a signal that arrives as soon as an
/// address is announced already means "shut down gracefully".
pub fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, StartupError> {
    use tokio::signal::unix::{signal, SignalKind};
    let install = |kind| {
        signal(kind).map_err(|e| StartupError(format!("failed to install a signal handler: {e}")))
    };
    let mut term = install(SignalKind::terminate())?;
    let mut int = install(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

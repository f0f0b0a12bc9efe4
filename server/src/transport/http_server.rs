//! The one accept-and-serve loop of every network listener — the WebSocket transport and
//! the rendezvous service — serving an axum app over HTTP/1.1 under the `[listener]`
//! limits, so that peers who have not authenticated cannot hold the server's descriptors:
//!
//! * a request head must arrive within `header_read_timeout_ms` (hyper's timer); on a TLS
//!   listener the handshake and the head together, from accept, so a peer that stalls its
//!   handshake is closed exactly like one that stalls its head;
//! * a connection must be upgraded within `upgrade_timeout_ms` of its accept, or it is
//!   closed (plain HTTP connections — probes, registry calls — live at most that long);
//! * connections whose request head has not arrived (TLS handshakes in progress among them)
//!   are capped per peer and in total, evicting the oldest ([`super::pending`]);
//! * open connections are capped at `max_connections`, and a connection whose descriptor
//!   eats into the `fd_reserve` kept for the server's own work (a check of the descriptor
//!   numbers the kernel hands out, which sees descriptors nobody is charged for) or that the
//!   descriptor budget refuses ([`crate::descriptors`]: a connection may not take what live
//!   sessions are guaranteed) is closed right after accept;
//! * `accept` failing for lack of descriptors backs off ([`super::accept_backoff`]).
//!
//! Every refusal, eviction and time-out is counted in `/metrics`, labelled by listener.

use std::net::SocketAddr;
use std::os::fd::AsRawFd as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use exec_server_config::ListenerTable;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::{rustls, TlsAcceptor};
use tokio_util::sync::CancellationToken;
use tower_service::Service as _;

use super::accept_backoff::{error_label, is_connection_error, AcceptBackoff};
use super::pending::{Evictions, PendingSlot, PendingTable};
use crate::descriptors::{self, ConnectionCharge};
use crate::hygiene::DescriptorHeadroom;
use crate::metrics::{self, Counter, Gauge};

/// The limits of one listener, from `[listener]`.
#[derive(Debug, Clone)]
pub struct ListenerLimits {
    pub header_read_timeout: Duration,
    pub upgrade_timeout: Duration,
    pub max_connections: usize,
    pub max_pending_connections: usize,
    pub max_pending_per_peer: usize,
    pub fd_reserve: usize,
}

impl From<&ListenerTable> for ListenerLimits {
    fn from(table: &ListenerTable) -> Self {
        Self {
            header_read_timeout: Duration::from_millis(table.header_read_timeout_ms),
            upgrade_timeout: Duration::from_millis(table.upgrade_timeout_ms),
            max_connections: table.max_connections,
            max_pending_connections: table.max_pending_connections,
            max_pending_per_peer: table.max_pending_per_peer,
            fd_reserve: table.fd_reserve,
        }
    }
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self::from(&ListenerTable::default())
    }
}

/// Answer written (without blocking) to a connection closed right after accept, so that a
/// client learns why; an attacker's connection gets nothing more.
const REFUSAL: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// Serves `app` on `listener` until `shutdown` is cancelled. `name` labels the listener in
/// logs and `/metrics` (`websocket`, `rendezvous`). The app sees each request's peer as
/// `ConnectInfo<SocketAddr>`.
pub async fn serve_http(
    listener: TcpListener,
    app: axum::Router,
    limits: ListenerLimits,
    name: &'static str,
    shutdown: CancellationToken,
) {
    serve(listener, app, limits, None, name, shutdown).await
}

/// [`serve_http`] over TLS: every accepted connection first completes a handshake with
/// `tls`, under the same limits as a request head.
pub async fn serve_https(
    listener: TcpListener,
    app: axum::Router,
    limits: ListenerLimits,
    tls: Arc<rustls::ServerConfig>,
    name: &'static str,
    shutdown: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls);
    serve(listener, app, limits, Some(acceptor), name, shutdown).await
}

async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ListenerLimits,
    tls: Option<TlsAcceptor>,
    name: &'static str,
    shutdown: CancellationToken,
) {
    let metrics = Arc::new(ListenerMetrics::new(name));
    let headroom = ListenerHeadroom::new(limits.fd_reserve, name);
    let (max_pending, max_pending_per_peer) = headroom.pending_caps(&limits, name);
    let pending = PendingTable::new(max_pending_per_peer, max_pending, metrics.pending.clone());
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let limits = Arc::new(limits);
    let mut backoff = AcceptBackoff::new(name);
    let mut refusals = RefusalLog::new(name);
    loop {
        let accepted = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) if is_connection_error(&error) => continue,
            Err(error) => {
                metrics.accept_error(&error).inc();
                let delay = backoff.failed(&error);
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(delay) => continue,
                }
            }
        };
        backoff.succeeded();
        if headroom.exhausted(&stream) {
            metrics.refused_fd_reserve.inc();
            refusals.refused("fewer than listener.fd_reserve descriptors are left");
            refuse(stream, tls.is_some());
            continue;
        }
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            metrics.refused_max_connections.inc();
            refusals.refused("listener.max_connections connections are open");
            refuse(stream, tls.is_some());
            continue;
        };
        // The socket is charged to the descriptor budget for as long as it is open; a
        // connection belongs to no session yet, so it may not take what sessions are
        // guaranteed.
        let Ok(descriptor) = descriptors::charge_unowned(1, "a connection") else {
            metrics.refused_descriptor_budget.inc();
            refusals.refused("the descriptor budget left for connections is taken");
            refuse(stream, tls.is_some());
            continue;
        };
        // Request/response traffic: Nagle + delayed ACK would add ~40 ms.
        let _ = stream.set_nodelay(true);
        let (slot, evictions) = loop {
            match pending.admit(peer.ip(), std::time::Instant::now()) {
                Ok(admitted) => break admitted,
                // The cap is full of connections too young to judge: give their heads a
                // moment (the kernel's backlog holds everyone else meanwhile).
                Err(retry_at) => tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep_until(retry_at.into()) => {}
                },
            }
        };
        metrics.record(&evictions);
        metrics.accepted.inc();
        let stream = GuardedStream {
            stream,
            _open: OpenConnection::new(permit, metrics.open.clone()),
            descriptor: ConnectionCharge::new(descriptor),
        };
        tokio::spawn(serve_connection(
            stream,
            peer,
            slot,
            tls.clone(),
            app.clone(),
            Arc::clone(&limits),
            Arc::clone(&metrics),
            shutdown.clone(),
        ));
        // The evicted connections' tasks close them when they next run; accepting more
        // before that would let a flood's descriptors pile up past the caps.
        for closing in evictions.closing {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = closing => {}
            }
        }
    }
}

/// Closes a connection right after accept; a plain HTTP peer is told why first (a TLS
/// peer would read the answer as a broken handshake, so it gets nothing).
fn refuse(stream: TcpStream, tls: bool) {
    if !tls {
        let _ = stream.try_write(REFUSAL);
    }
}

/// How a connection's handshake ended before HTTP could start.
enum Handshake<S> {
    Done(S),
    Closed,
}

/// Serves one connection until it is upgraded, closes, times out, is evicted or the
/// server shuts down. An upgraded connection lives on in the app's upgrade task, still
/// holding its place in `max_connections` through [`GuardedStream`].
#[allow(clippy::too_many_arguments)]
async fn serve_connection(
    stream: GuardedStream,
    peer: SocketAddr,
    slot: PendingSlot,
    tls: Option<TlsAcceptor>,
    app: axum::Router,
    limits: Arc<ListenerLimits>,
    metrics: Arc<ListenerMetrics>,
    shutdown: CancellationToken,
) {
    let accepted = Instant::now();
    let deadline = tokio::time::sleep(limits.upgrade_timeout);
    tokio::pin!(deadline);
    let charge = stream.descriptor.clone();
    let Some(acceptor) = tls else {
        let head_timeout = limits.header_read_timeout;
        serve_http1(
            stream,
            (peer, charge),
            &slot,
            app,
            head_timeout,
            deadline,
            &metrics,
            shutdown,
        )
        .await;
        // The socket is closed (or lives on in the WebSocket) by now: only then does the
        // slot tell an evicting accept loop that this connection is gone.
        drop(slot);
        return;
    };
    // The handshake gets the head's time, and the head what the handshake left of it.
    let handshake = tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream));
    let evicted = slot.evicted();
    let handshake = tokio::select! {
        result = handshake => match result {
            Ok(Ok(stream)) => Handshake::Done(stream),
            Ok(Err(error)) => {
                metrics.tls_handshake_errors.inc();
                tracing::debug!(%peer, %error, "TLS handshake failed");
                Handshake::Closed
            }
            Err(_) => {
                metrics.header_timeouts.inc();
                tracing::debug!(%peer, "closed a connection whose TLS handshake did not complete in time");
                Handshake::Closed
            }
        },
        () = deadline.as_mut() => {
            metrics.upgrade_timeouts.inc();
            Handshake::Closed
        }
        () = evicted.cancelled() => {
            tracing::debug!(%peer, "closed the oldest pending connection to make room");
            Handshake::Closed
        }
        () = shutdown.cancelled() => Handshake::Closed,
    };
    if let Handshake::Done(stream) = handshake {
        let head_timeout = limits
            .header_read_timeout
            .saturating_sub(accepted.elapsed())
            .max(MIN_HEAD_TIME);
        serve_http1(
            stream,
            (peer, charge),
            &slot,
            app,
            head_timeout,
            deadline,
            &metrics,
            shutdown,
        )
        .await;
    }
    drop(slot);
}

/// What is left for a request head after a TLS handshake that used (nearly) all of
/// `header_read_timeout`: hyper needs a non-zero timeout, and a head sent in the same
/// flight as the handshake's end must still be read.
const MIN_HEAD_TIME: Duration = Duration::from_millis(10);

/// HTTP/1.1 on an accepted (and, for TLS, handshaken) connection until it is upgraded,
/// closes, times out, is evicted or the server shuts down.
#[allow(clippy::too_many_arguments)]
async fn serve_http1<S>(
    stream: S,
    (peer, charge): (SocketAddr, ConnectionCharge),
    slot: &PendingSlot,
    app: axum::Router,
    head_timeout: Duration,
    mut deadline: Pin<&mut tokio::time::Sleep>,
    metrics: &ListenerMetrics,
    shutdown: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let promoter = slot.promoter();
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        // A complete request head: the request itself decides from here on.
        promoter.promote();
        request.extensions_mut().insert(ConnectInfo(peer));
        request.extensions_mut().insert(charge.clone());
        let response = app.clone().call(request);
        async move {
            let mut response = response.await?;
            // One request per connection unless it upgrades: an answered request (a
            // refusal above all) frees its descriptor at once instead of idling until
            // `upgrade_timeout`.
            if response.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
                response.headers_mut().insert(
                    hyper::header::CONNECTION,
                    hyper::header::HeaderValue::from_static("close"),
                );
            }
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    {
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(head_timeout)
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        tokio::pin!(connection);
        let evicted = slot.evicted();
        let mut draining = false;
        loop {
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        if error.is_timeout() {
                            metrics.header_timeouts.inc();
                            tracing::debug!(%peer, "closed a connection whose request head did not arrive in time");
                        } else {
                            tracing::trace!(%peer, %error, "connection ended with an error");
                        }
                    }
                    break;
                }
                () = deadline.as_mut() => {
                    metrics.upgrade_timeouts.inc();
                    tracing::debug!(%peer, "closed a connection that was not upgraded in time");
                    break;
                }
                () = evicted.cancelled() => {
                    tracing::debug!(%peer, "closed the oldest pending connection to make room");
                    break;
                }
                () = shutdown.cancelled(), if !draining => {
                    draining = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// The listener's use of the descriptor reserve: accepted sockets inside it are refused,
/// and the pending caps are fitted to what is left below it.
struct ListenerHeadroom(DescriptorHeadroom);

impl ListenerHeadroom {
    fn new(reserve: usize, listener: &'static str) -> Self {
        let headroom = DescriptorHeadroom::new(reserve);
        if let (Some(limit), Some(high_water)) = (headroom.limit(), headroom.high_water()) {
            tracing::debug!(
                listener,
                limit,
                reserve = headroom.reserve(),
                high_water,
                "connections are refused once descriptor numbers reach limit - reserve"
            );
        }
        Self(headroom)
    }

    fn exhausted(&self, stream: &TcpStream) -> bool {
        self.0.would_exhaust(stream.as_raw_fd(), 1)
    }

    /// The pending caps in force: at most half the descriptors connections may use, so
    /// that a flood of pending connections is always answered by evicting the oldest and
    /// never reaches the reserve, where new connections — a legitimate one too — would be
    /// refused.
    fn pending_caps(&self, limits: &ListenerLimits, listener: &'static str) -> (usize, usize) {
        let Some(usable) = self.0.high_water().or(self.0.limit()) else {
            return (limits.max_pending_connections, limits.max_pending_per_peer);
        };
        let budget = usize::try_from(usable / 2).unwrap_or(usize::MAX).max(1);
        let total = limits.max_pending_connections.min(budget);
        let per_peer = limits.max_pending_per_peer.min(total);
        if total < limits.max_pending_connections {
            tracing::info!(
                listener,
                max_pending_connections = total,
                max_pending_per_peer = per_peer,
                "pending-connection caps lowered to fit the open-file limit"
            );
        }
        (total, per_peer)
    }
}

/// How often a listener warns about connections it closes right after accept.
const REFUSAL_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// Logs refusals without flooding the log: a warning at the first one, then at most one
/// every [`REFUSAL_WARNING_INTERVAL`], each with the count since the previous one.
struct RefusalLog {
    listener: &'static str,
    last_warning: Option<Instant>,
    unreported: u64,
}

impl RefusalLog {
    fn new(listener: &'static str) -> Self {
        Self {
            listener,
            last_warning: None,
            unreported: 0,
        }
    }

    fn refused(&mut self, why: &str) {
        self.unreported += 1;
        if self
            .last_warning
            .is_some_and(|at| at.elapsed() < REFUSAL_WARNING_INTERVAL)
        {
            return;
        }
        tracing::warn!(
            listener = self.listener,
            refused = self.unreported,
            "closing new connections right after accept: {why}"
        );
        self.last_warning = Some(Instant::now());
        self.unreported = 0;
    }
}

/// One open connection's share of `max_connections` and of the open-connections gauge.
struct OpenConnection {
    _permit: OwnedSemaphorePermit,
    gauge: Gauge,
}

impl OpenConnection {
    fn new(permit: OwnedSemaphorePermit, gauge: Gauge) -> Self {
        gauge.inc();
        Self {
            _permit: permit,
            gauge,
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// The accepted socket with its [`OpenConnection`]: after an upgrade the socket moves into
/// the WebSocket, and the place is given back only when that closes.
struct GuardedStream {
    stream: TcpStream,
    _open: OpenConnection,
    /// The socket's charge to the descriptor budget; the request's processor holds it too
    /// (as a request extension) and moves it into the session the connection attaches to.
    descriptor: ConnectionCharge,
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Every value of [`error_label`], the catch-all last.
const ACCEPT_ERROR_LABELS: [&str; 3] = ["emfile", "enfile", "other"];

/// The listener's series in `/metrics`, all labelled `listener="<name>"`.
struct ListenerMetrics {
    accepted: Counter,
    accept_errors: [Counter; 3],
    refused_max_connections: Counter,
    refused_fd_reserve: Counter,
    refused_descriptor_budget: Counter,
    evicted_per_peer: Counter,
    evicted_total: Counter,
    header_timeouts: Counter,
    upgrade_timeouts: Counter,
    tls_handshake_errors: Counter,
    open: Gauge,
    pending: Gauge,
}

impl ListenerMetrics {
    fn new(name: &'static str) -> Self {
        let label = [("listener", name)];
        let refused = |reason| {
            metrics::counter(
                "exec_server_listener_connections_refused_total",
                "Connections closed right after accept, by reason.",
                &[("listener", name), ("reason", reason)],
            )
        };
        let evicted = |cap| {
            metrics::counter(
                "exec_server_listener_connections_evicted_total",
                "Pending connections (no complete request head yet) closed to make room for a newer one, by the cap reached.",
                &[("listener", name), ("cap", cap)],
            )
        };
        let accept_error = |error| {
            metrics::counter(
                "exec_server_listener_accept_errors_total",
                "Failed accept calls (the listener backs off), by error.",
                &[("listener", name), ("error", error)],
            )
        };
        Self {
            accept_errors: ACCEPT_ERROR_LABELS.map(accept_error),
            accepted: metrics::counter(
                "exec_server_listener_connections_accepted_total",
                "Connections accepted and served.",
                &label,
            ),
            refused_max_connections: refused("max_connections"),
            refused_fd_reserve: refused("fd_reserve"),
            refused_descriptor_budget: refused("descriptor_budget"),
            evicted_per_peer: evicted("per_peer"),
            evicted_total: evicted("total"),
            header_timeouts: metrics::counter(
                "exec_server_listener_header_timeouts_total",
                "Connections closed because a request head (on TLS listeners: the handshake and the head) did not arrive in time.",
                &label,
            ),
            upgrade_timeouts: metrics::counter(
                "exec_server_listener_upgrade_timeouts_total",
                "Connections closed because they were not upgraded in time.",
                &label,
            ),
            tls_handshake_errors: metrics::counter(
                "exec_server_listener_tls_handshake_errors_total",
                "Connections closed because their TLS handshake failed (a stalled one counts as a header timeout).",
                &label,
            ),
            open: metrics::gauge(
                "exec_server_listener_open_connections",
                "Open connections, upgraded or not.",
                &label,
            ),
            pending: metrics::gauge(
                "exec_server_listener_pending_connections",
                "Connections whose request head has not arrived yet.",
                &label,
            ),
        }
    }

    fn accept_error(&self, error: &std::io::Error) -> &Counter {
        let label = error_label(error);
        let index = ACCEPT_ERROR_LABELS
            .iter()
            .position(|l| *l == label)
            .unwrap_or(ACCEPT_ERROR_LABELS.len() - 1);
        &self.accept_errors[index]
    }

    fn record(&self, evictions: &Evictions) {
        self.evicted_per_peer.add(evictions.per_peer);
        self.evicted_total.add(evictions.total);
    }
}

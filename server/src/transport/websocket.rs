//! The WebSocket transport (PROTOCOL §1.3): an HTTP/1.1 listener on `ws://IP:PORT` whose
//! `GET /` upgrades to a JSON-RPC connection, plus `/readyz` and `/livez`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::ConnectInfo;
use axum::http::{header, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use super::exposure::{self, Exposure};
use super::http_server::{serve_http, ListenerLimits};
use super::ws_auth::{authenticate, authenticate_as, AuthFailure};
use super::ws_upgrade::upgrade_request;
use exec_server_config::CoreConfig;

use crate::audit::sampler::Sampler;
use crate::audit::{AuditScope, Outcome, Who};
use crate::connection::{serve_connection, ConnectionInfo, Inbound};
use crate::descriptors::ConnectionCharge;
use crate::outbound::OutboundDrain;
use crate::router::StartupError;
use crate::server::{Listener, ListenerFailed, ListenerKind, ServerContext};

inventory::submit! {
    ListenerKind { scheme: "ws", check: check_websocket, open: open_websocket }
}

/// Read buffer of each WebSocket connection: allocated when it opens, so it is most of
/// what an idle connection costs. Larger messages still arrive whole (the buffer grows to
/// hold a frame), in reads of this size: 4 KiB (rather than 8) keeps an idle initialized
/// connection under 16 KiB, at one more `read` per 8 KiB of a large upload (a few µs per
/// megabyte, against the milliseconds of its base64 decoding).
const WS_READ_BUFFER_BYTES: usize = 4 * 1024;
/// Output is written out once this much is buffered (or at each flush); not preallocated.
const WS_WRITE_BUFFER_BYTES: usize = 16 * 1024;
/// A text message longer than this goes out as frames of this size (RFC 6455 §5.4).
/// tungstenite copies each frame into one output buffer that it writes from the front and
/// never shrinks: whole, an 87 MB answer was moved forward after every partial socket write
/// and its 87 MB buffer stayed with the connection. In frames, the buffer stays at one
/// frame, and clients with tungstenite's default 16 MiB frame limit (codex's) can take
/// answers of any size their message limit allows.
const WS_FRAGMENT_BYTES: usize = 256 * 1024;

type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// This transport's name in logs.
const TRANSPORT: &str = "websocket";

/// Close code for a message or frame above the limits (RFC 6455 "message too big").
const CLOSE_TOO_BIG: u16 = 1009;

/// The address of a `ws://` URL, and whether serving it unauthenticated was allowed in
/// words ([`exposure`]).
fn checked_address(url: &str, core: &CoreConfig) -> Result<(SocketAddr, Exposure), StartupError> {
    let addr = parse_ws_url(url).ok_or_else(|| {
        StartupError(format!(
            "invalid websocket --listen URL `{url}`; expected `ws://IP:PORT` or `ws://localhost:PORT`"
        ))
    })?;
    let authenticated = !core.websocket_auth.is_none();
    let allowed = core.websocket.dangerously_listen_without_auth;
    Ok((addr, exposure::check(addr, authenticated, allowed)?))
}

fn check_websocket(url: &str, core: &CoreConfig) -> Result<(), StartupError> {
    checked_address(url, core).map(drop)
}

fn open_websocket(
    url: &str,
    server: &Arc<ServerContext>,
) -> Result<Box<dyn Listener>, StartupError> {
    let (addr, exposure) = checked_address(url, &server.core)?;
    if exposure == Exposure::AllowedUnsafe {
        tracing::warn!(
            address = %addr,
            "serving without authentication off loopback ({}): anyone who reaches this address can run commands as this user",
            exposure::ALLOW_KEY
        );
    }
    Ok(Box::new(WebsocketListener {
        addr,
        listener: None,
        server: Arc::clone(server),
    }))
}

/// `ws://IP:PORT` with a literal IPv4 address or a bracketed IPv6 address, or
/// `ws://localhost:PORT` for `127.0.0.1` (the one name accepted: it needs no resolver, and
/// a name that could resolve elsewhere would make the loopback check a guess).
fn parse_ws_url(url: &str) -> Option<SocketAddr> {
    let rest = url.strip_prefix("ws://")?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if let Some(port) = rest.strip_prefix("localhost:") {
        let port = port.parse().ok()?;
        return Some(SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)));
    }
    rest.parse().ok()
}

struct WebsocketListener {
    addr: SocketAddr,
    listener: Option<TcpListener>,
    server: Arc<ServerContext>,
}

#[async_trait]
impl Listener for WebsocketListener {
    async fn bind(&mut self) -> Result<Option<String>, StartupError> {
        let listener = TcpListener::bind(self.addr).await.map_err(|e| {
            StartupError(format!(
                "failed to bind websocket listener {}: {e}",
                self.addr
            ))
        })?;
        let local = listener
            .local_addr()
            .map_err(|e| StartupError(format!("failed to read the bound address: {e}")))?;
        tracing::info!(address = %local, "websocket listener bound");
        self.listener = Some(listener);
        Ok(Some(format!("ws://{local}")))
    }

    async fn serve(self: Box<Self>, server: Arc<ServerContext>) -> Result<(), ListenerFailed> {
        let listener = self.listener.expect("bind runs before serve");
        let app = axum::Router::new()
            .fallback(route)
            .with_state(Arc::clone(&self.server));
        let limits = ListenerLimits::from(&server.core.listener);
        serve_http(listener, app, limits, "websocket", server.shutdown.clone()).await;
        Ok(())
    }
}

/// Every request goes through here so the rules apply in the order of PROTOCOL §1.3.1.
async fn route(
    axum::extract::State(server): axum::extract::State<Arc<ServerContext>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request<axum::body::Body>,
) -> Response {
    if request.headers().contains_key(header::ORIGIN) {
        static ORIGIN_REFUSALS: Sampler = Sampler::new("origin.refused");
        let target = request.uri().path().to_owned();
        let reason = "requests with an Origin header are refused";
        refused(&server, peer, &ORIGIN_REFUSALS, &target, reason);
        return (
            StatusCode::FORBIDDEN,
            "requests with an Origin header are refused\n",
        )
            .into_response();
    }
    let is_get = matches!(*request.method(), Method::GET | Method::HEAD);
    match request.uri().path() {
        "/readyz" if is_get => {
            if server.is_ready() {
                StatusCode::OK.into_response()
            } else {
                StatusCode::SERVICE_UNAVAILABLE.into_response()
            }
        }
        "/livez" if is_get => StatusCode::OK.into_response(),
        "/metrics" if is_get => metrics_response(&server, peer, request.headers()),
        "/readyz" | "/livez" | "/metrics" => StatusCode::METHOD_NOT_ALLOWED.into_response(),
        "/" => upgrade(server, peer, request).await,
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `/metrics` reveals activity, so it is guarded like the upgrade.
fn metrics_response(
    server: &ServerContext,
    peer: SocketAddr,
    headers: &axum::http::HeaderMap,
) -> Response {
    if let Err(failure) = authenticate(&server.core.websocket_auth, headers) {
        auth_refused(server, peer, "/metrics", failure);
        return failure.into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::metrics::render(),
    )
        .into_response()
}

async fn upgrade(
    server: Arc<ServerContext>,
    peer: SocketAddr,
    request: Request<axum::body::Body>,
) -> Response {
    let (mut parts, _body) = request.into_parts();
    let descriptor = parts.extensions.get::<ConnectionCharge>().cloned();
    let upgrade = match upgrade_request(&mut parts) {
        Ok(upgrade) => upgrade,
        Err(refusal) => return refusal.into_response(),
    };
    let auth = match authenticate_as(&server.core.websocket_auth, &parts.headers) {
        Ok(auth) => auth,
        Err(failure) => {
            tracing::debug!(%peer, reason = failure.text(), "websocket upgrade refused");
            auth_refused(&server, peer, "/", failure);
            return failure.into_response();
        }
    };
    let who = Arc::new(Who {
        transport: TRANSPORT,
        peer: Some(peer.to_string()),
        auth: Some(auth),
        relay: None,
    });
    if !server.is_ready() {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    // tungstenite's default 128 KiB buffers per direction dominate the cost of an idle
    // connection; these keep large messages at a few hundred syscalls per megabyte.
    let config = WebSocketConfig::default()
        .read_buffer_size(WS_READ_BUFFER_BYTES)
        .write_buffer_size(WS_WRITE_BUFFER_BYTES)
        .max_message_size(Some(server.core.limits.max_message_bytes))
        .max_frame_size(Some(server.core.websocket.max_frame_bytes));
    let response = upgrade.switching_protocols();
    tokio::spawn(async move {
        let upgraded = match upgrade.on_upgrade.await {
            Ok(upgraded) => upgraded,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "websocket upgrade failed");
                return;
            }
        };
        let socket =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config))
                .await;
        serve_socket(server, peer, who, descriptor, socket).await;
    });
    response
}

/// Records `auth.refused`: an upgrade or `/metrics` request whose credential failed, with
/// the reason the peer was given (never the credential).
fn auth_refused(server: &ServerContext, peer: SocketAddr, target: &str, failure: AuthFailure) {
    static AUTH_REFUSALS: Sampler = Sampler::new("auth.refused");
    refused(server, peer, &AUTH_REFUSALS, target, failure.text());
}

/// Records a refusal of an unauthenticated peer (the sampler's kind) with the text it
/// was given; at most [`crate::audit::sampler::RECORDED_PER_SECOND`] a second, the rest
/// counted.
fn refused(
    server: &ServerContext,
    peer: SocketAddr,
    sampler: &Sampler,
    target: &str,
    reason: &str,
) {
    if !server.audit.is_enabled() {
        return;
    }
    let Some(suppressed) = sampler.admit() else {
        return;
    };
    let who = Arc::new(Who {
        transport: TRANSPORT,
        peer: Some(peer.to_string()),
        ..Who::default()
    });
    let scope = AuditScope::connection(&server.audit, who, None);
    scope.emit_outcome(sampler.kind(), Outcome::refused(reason), |_| {
        let mut details = serde_json::Map::new();
        let target: String = target.chars().take(256).collect();
        details.insert("target".into(), target.into());
        if suppressed > 0 {
            details.insert("suppressed".into(), suppressed.into());
        }
        details
    });
}

/// True for a message or frame above the configured limits.
fn is_capacity_error(error: &WsError) -> bool {
    matches!(error, WsError::Capacity(_))
}

async fn serve_socket(
    server: Arc<ServerContext>,
    peer: SocketAddr,
    who: Arc<Who>,
    descriptor: Option<ConnectionCharge>,
    socket: Socket,
) {
    // Dropped last, once the socket, its buffers and the connection's state are freed.
    let _open = crate::memory_trim::OpenConnection::new();
    let (sink, stream) = socket.split();
    let (outbound, drain) = server.outbound_queue(None);
    let (close_tx, close_rx) = oneshot::channel();
    let ping_every = Duration::from_millis(server.core.websocket.ping_interval_ms);
    let writer = tokio::spawn(write_messages(sink, drain, close_rx, ping_every));

    // Ends at Close, end of stream or the first error; an over-limit message closes with 1009.
    let too_big = Arc::new(AtomicBool::new(false));
    let too_big_in_stream = Arc::clone(&too_big);
    let inbound = stream
        .take_while(move |item| {
            let keep_going = match item {
                Ok(Message::Close(_)) => false,
                Ok(_) => true,
                Err(e) => {
                    if is_capacity_error(e) {
                        too_big_in_stream.store(true, Ordering::SeqCst);
                    }
                    tracing::debug!(error = %e, "websocket read ended");
                    false
                }
            };
            std::future::ready(keep_going)
        })
        .filter_map(|item| {
            std::future::ready(match item {
                Ok(Message::Text(text)) => Some(Inbound::Message(text.into())),
                Ok(Message::Binary(bytes)) => Some(Inbound::Message(bytes)),
                _ => None,
            })
        });
    let info = ConnectionInfo {
        transport: TRANSPORT,
        parse_error_prefix: format!(
            "failed to parse websocket JSON-RPC message from exec-server websocket {peer}"
        ),
        detach_on_close: true,
        drain_on_end: None,
        descriptor,
        who,
    };
    serve_connection(Arc::clone(&server), info, Box::pin(inbound), outbound).await;
    let close_code = too_big.load(Ordering::SeqCst).then_some(CLOSE_TOO_BIG);
    let _ = close_tx.send(close_code);
    let _ = writer.await;
}

/// Writes what the connection queues until it ends, giving up on a peer that takes
/// nothing for `connection.stalled_peer_timeout_ms` (each feed, flush and ping must finish
/// in that time; tungstenite accepts a message only once the previous one is written).
async fn write_messages(
    mut sink: futures_util::stream::SplitSink<Socket, Message>,
    mut drain: OutboundDrain,
    close_rx: oneshot::Receiver<Option<u16>>,
    ping_every: Duration,
) {
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + ping_every, ping_every);
    let mut batch = Vec::new();
    loop {
        tokio::select! {
            more = drain.next_batch(&mut batch) => {
                // The connection ended; the reader reports how to close.
                if !more {
                    break;
                }
                if !write_batch(&mut sink, &drain, &mut batch).await {
                    return;
                }
            }
            _ = ping.tick() => {
                let sent = drain.write_or_give_up(TRANSPORT, sink.send(Message::Ping(Default::default())));
                if !matches!(sent.await, Some(Ok(()))) {
                    return;
                }
            }
        }
    }
    if let Ok(Some(code)) = close_rx.await {
        let frame = CloseFrame {
            code: CloseCode::from(code),
            reason: "message too big".into(),
        };
        let _ = drain
            .write_or_give_up(TRANSPORT, sink.send(Message::Close(Some(frame))))
            .await;
    }
    let _ = drain.write_or_give_up(TRANSPORT, sink.close()).await;
}

/// Feeds the whole batch, then flushes once: a burst of notifications costs one write
/// instead of one per message. `false`: the peer is gone or was given up on.
async fn write_batch(
    sink: &mut futures_util::stream::SplitSink<Socket, Message>,
    drain: &OutboundDrain,
    batch: &mut Vec<String>,
) -> bool {
    for text in batch.drain(..) {
        for message in fragments(text) {
            let fed = drain.write_or_give_up(TRANSPORT, sink.feed(message));
            if !matches!(fed.await, Some(Ok(()))) {
                return false;
            }
        }
    }
    matches!(
        drain.write_or_give_up(TRANSPORT, sink.flush()).await,
        Some(Ok(()))
    )
}

/// One text message as what is written: itself when it is short, else a text frame and
/// continuation frames of [`WS_FRAGMENT_BYTES`] (the last one final), each a view of the
/// same bytes. A fragment may end inside a UTF-8 sequence: only the whole message must be
/// valid UTF-8 (RFC 6455 §5.6).
fn fragments(text: String) -> impl Iterator<Item = Message> {
    fragments_of(text, WS_FRAGMENT_BYTES)
}

fn fragments_of(text: String, size: usize) -> impl Iterator<Item = Message> {
    let (whole, bytes) = if text.len() <= size {
        (Some(Message::Text(text.into())), Bytes::new())
    } else {
        (None, Bytes::from(text))
    };
    let len = bytes.len();
    let frames = (0..len).step_by(size.max(1)).map(move |start| {
        let end = (start + size).min(len);
        let opcode = if start == 0 {
            Data::Text
        } else {
            Data::Continue
        };
        Message::Frame(Frame::message(
            bytes.slice(start..end),
            OpCode::Data(opcode),
            end == len,
        ))
    });
    whole.into_iter().chain(frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(text: &str, size: usize) -> Vec<Frame> {
        fragments_of(text.to_owned(), size)
            .map(|m| match m {
                Message::Frame(f) => f,
                other => panic!("expected frames, got {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_short_message_is_one_text_message() {
        let all: Vec<_> = fragments_of("{\"id\":1}".to_owned(), 8).collect();
        assert_eq!(all, vec![Message::Text("{\"id\":1}".into())]);
    }

    #[test]
    fn a_long_message_is_a_text_frame_then_continuations_the_last_final() {
        // 3-byte characters, cut inside a character at every frame boundary.
        let text = "€".repeat(1_000);
        let frames = frames(&text, 1_024);
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[0].header().opcode, OpCode::Data(Data::Text));
        for (i, frame) in frames.iter().enumerate() {
            if i > 0 {
                assert_eq!(frame.header().opcode, OpCode::Data(Data::Continue));
            }
            assert_eq!(frame.header().is_final, i == frames.len() - 1);
        }
        let joined: Vec<u8> = frames.iter().flat_map(|f| f.payload().to_vec()).collect();
        assert_eq!(joined, text.as_bytes());
    }

    #[test]
    fn an_exact_multiple_has_no_empty_last_frame() {
        let frames = frames(&"a".repeat(4_096), 1_024);
        assert_eq!(frames.len(), 4);
        assert!(frames.iter().all(|f| f.payload().len() == 1_024));
        assert!(frames[3].header().is_final);
    }
}

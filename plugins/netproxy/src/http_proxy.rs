//! The HTTP proxy listener's connections: absolute-form requests are checked and
//! forwarded (hop-by-hop headers handled), CONNECT is checked and becomes a tunnel.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, HOST};
use hyper::service::service_fn;
use hyper::upgrade::OnUpgrade;
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::blocked::{blocked_connect, blocked_http, full_body, proxy_error, ProxyBody};
use crate::context::ProxyContext;
use crate::decision::Protocol;
use crate::policy::Target;
use crate::relay::relay;

/// Headers that describe one hop and must not be forwarded (RFC 9110 §7.6.1), plus the
/// proxy credentials, which are for us and not for the destination.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// hyper refuses read buffers below 8 KiB.
const MIN_BUFFER: usize = 8 * 1024;

/// The largest response head taken from a destination.
const UPSTREAM_HEAD_LIMIT: usize = 64 * 1024;

/// An accepted CONNECT: the client side once hyper lets go of it, and the upstream.
type Tunnel = (OnUpgrade, TcpStream);

pub(crate) async fn serve_http(stream: TcpStream, client: SocketAddr, ctx: Arc<ProxyContext>) {
    // The tunnel runs on this task after hyper hands the connection over, so that
    // stopping the proxy (which ends this task) closes it.
    let (tunnel_tx, mut tunnel_rx) = mpsc::channel::<Tunnel>(1);
    let service_ctx = ctx.clone();
    let service = service_fn(move |request| {
        let ctx = service_ctx.clone();
        let tunnels = tunnel_tx.clone();
        async move { Ok::<_, Infallible>(handle(request, client, &ctx, &tunnels).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(ctx.limits.header_read_timeout)
        .max_header_size(ctx.limits.max_request_head_bytes)
        .max_buf_size(ctx.limits.max_request_head_bytes.max(MIN_BUFFER));
    let connection = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    if let Err(error) = connection.await {
        tracing::debug!(%client, %error, "network proxy: HTTP connection ended");
    }
    if let Ok((on_upgrade, upstream)) = tunnel_rx.try_recv() {
        match on_upgrade.await {
            Ok(upgraded) => {
                relay(
                    TokioIo::new(upgraded),
                    upstream,
                    ctx.limits.tunnel_idle_timeout,
                )
                .await
            }
            Err(error) => tracing::debug!(%client, %error, "network proxy: CONNECT upgrade failed"),
        }
    }
}

async fn handle(
    request: Request<Incoming>,
    client: SocketAddr,
    ctx: &ProxyContext,
    tunnels: &mpsc::Sender<Tunnel>,
) -> Response<ProxyBody> {
    if request.method() == Method::CONNECT {
        connect(request, client, ctx, tunnels).await
    } else {
        forward(request, client, ctx).await
    }
}

async fn connect(
    mut request: Request<Incoming>,
    client: SocketAddr,
    ctx: &ProxyContext,
    tunnels: &mpsc::Sender<Tunnel>,
) -> Response<ProxyBody> {
    let Some(authority) = request.uri().authority() else {
        return proxy_error(StatusCode::BAD_REQUEST, "CONNECT needs host:port");
    };
    let port = authority.port_u16().unwrap_or(443);
    let target = Target::new(
        Protocol::HttpsConnect,
        authority.host(),
        port,
        Some("CONNECT"),
    );
    let evaluation = ctx.evaluate(&target, client).await;
    if let Some(decision) = evaluation.block() {
        return blocked_connect(decision);
    }
    let upstream = match ctx.connect(&target, &evaluation).await {
        Ok(upstream) => upstream,
        Err(error) => {
            tracing::debug!(host = target.host, %error, "network proxy: CONNECT upstream failed");
            return proxy_error(StatusCode::BAD_GATEWAY, "upstream connection failed");
        }
    };
    let on_upgrade = hyper::upgrade::on(&mut request);
    if tunnels.try_send((on_upgrade, upstream)).is_err() {
        return proxy_error(StatusCode::BAD_REQUEST, "one CONNECT per connection");
    }
    Response::new(full_body(""))
}

async fn forward(
    request: Request<Incoming>,
    client: SocketAddr,
    ctx: &ProxyContext,
) -> Response<ProxyBody> {
    let uri = request.uri();
    let (Some("http"), Some(authority)) = (uri.scheme_str(), uri.authority().cloned()) else {
        return proxy_error(
            StatusCode::BAD_REQUEST,
            "the proxy takes absolute http:// URLs or CONNECT",
        );
    };
    let port = authority.port_u16().unwrap_or(80);
    let method = request.method().as_str().to_string();
    let target = Target::new(Protocol::Http, authority.host(), port, Some(&method));
    let evaluation = ctx.evaluate(&target, client).await;
    if let Some(decision) = evaluation.block() {
        return blocked_http(&target, decision);
    }
    let upstream = match ctx.connect(&target, &evaluation).await {
        Ok(upstream) => upstream,
        Err(error) => {
            tracing::debug!(host = target.host, %error, "network proxy: upstream connect failed");
            return proxy_error(StatusCode::BAD_GATEWAY, "upstream connection failed");
        }
    };
    // `Host` is host[:port] only: any `user:password@` in the URL stays out of it.
    let host_header = match authority.port() {
        Some(port) => format!("{}:{port}", authority.host()),
        None => authority.host().to_string(),
    };
    let outgoing = origin_form(request, &host_header);
    send_upstream(upstream, outgoing, ctx).await
}

/// The request as the destination must see it: origin-form target, its own `Host`, no
/// hop-by-hop headers.
fn origin_form(request: Request<Incoming>, host_header: &str) -> Request<Incoming> {
    let (mut parts, body) = request.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    if let Ok(host) = HeaderValue::from_str(host_header) {
        parts.headers.insert(HOST, host);
    }
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = path.parse().unwrap_or_else(|_| Uri::from_static("/"));
    parts.version = Version::HTTP_11;
    Request::from_parts(parts, body)
}

async fn send_upstream(
    upstream: TcpStream,
    request: Request<Incoming>,
    ctx: &ProxyContext,
) -> Response<ProxyBody> {
    let mut builder = hyper::client::conn::http1::Builder::new();
    builder.max_header_size(UPSTREAM_HEAD_LIMIT);
    let (mut sender, connection) = match builder.handshake(TokioIo::new(upstream)).await {
        Ok(pair) => pair,
        Err(error) => {
            tracing::debug!(%error, "network proxy: upstream handshake failed");
            return proxy_error(StatusCode::BAD_GATEWAY, "upstream connection failed");
        }
    };
    ctx.spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "network proxy: upstream connection ended");
        }
    });
    let sent = tokio::time::timeout(
        ctx.limits.upstream_response_timeout,
        sender.send_request(request),
    )
    .await;
    match sent {
        Ok(Ok(response)) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.boxed())
        }
        Ok(Err(error)) => {
            tracing::debug!(%error, "network proxy: upstream request failed");
            proxy_error(StatusCode::BAD_GATEWAY, "upstream request failed")
        }
        Err(_) => proxy_error(StatusCode::GATEWAY_TIMEOUT, "upstream response timed out"),
    }
}

/// Removes the fixed hop-by-hop headers and those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

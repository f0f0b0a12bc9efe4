//! The responses a blocked HTTP client sees (§3.5): 403 with `x-proxy-error`; a JSON body
//! for plain HTTP, the bare message for CONNECT. Also the proxy's own error responses.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde::Serialize;

use crate::decision::{Decision, Protocol, Reason, Source, Verdict};
use crate::policy::Target;

/// The body type of every response the proxy writes (its own or an upstream's).
pub(crate) type ProxyBody = BoxBody<Bytes, hyper::Error>;

pub(crate) fn full_body(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// The JSON body of a blocked plain-HTTP request, in the spec's member order.
#[derive(Serialize)]
struct BlockedBody<'a> {
    status: &'static str,
    host: &'a str,
    reason: &'a Reason,
    decision: Verdict,
    source: Source,
    protocol: Protocol,
    port: u16,
    message: &'static str,
}

pub(crate) fn blocked_http(target: &Target, decision: &Decision) -> Response<ProxyBody> {
    let body = BlockedBody {
        status: "blocked",
        host: &target.host,
        reason: &decision.reason,
        decision: decision.verdict,
        source: decision.source,
        protocol: target.protocol,
        port: target.port,
        message: decision.reason.message(),
    };
    let json = serde_json::to_vec(&body).unwrap_or_default();
    forbidden(decision, "application/json", json)
}

pub(crate) fn blocked_connect(decision: &Decision) -> Response<ProxyBody> {
    forbidden(decision, "text/plain", decision.reason.message())
}

fn forbidden(
    decision: &Decision,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<ProxyBody> {
    let mut response = Response::new(full_body(body));
    *response.status_mut() = StatusCode::FORBIDDEN;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        "x-proxy-error",
        HeaderValue::from_static(decision.reason.proxy_error()),
    );
    response
}

/// A proxy-side failure (bad request, unreachable upstream), as plain text.
pub(crate) fn proxy_error(status: StatusCode, message: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(full_body(message));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

//! `http/request`: validates the request in codex's order (decoded params, method, URL,
//! scheme, the stream's id, headers), sends it and follows its redirects, then answers
//! with the whole body, or with the head at once and the body as
//! `http/request/bodyDelta` notifications.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use exec_server_core::proto::bytes::{base64_json, decode_base64};
use exec_server_core::proto::RpcError;
use exec_server_core::{descriptors, Call};
use reqwest::Method;
use tokio::time::Instant;
use url::Url;

use crate::body;
use crate::exchange::exchange;
use crate::headers::{process_env, request_headers, response_headers};
use crate::redirect::Hop;
use crate::state::HttpState;
use crate::streams::{ActiveStreams, StreamSlot};
use crate::wire::{self, RedirectPolicy, RequestParams, RequestResult};

/// Descriptors one request may hold at once, charged to its session for as long as it
/// runs (a streamed body included): its connection, and the resolver's socket while it
/// looks a name up. No connection is kept once its request ends ([`HttpState`]).
pub(crate) const DESCRIPTORS_PER_REQUEST: u64 = 2;

pub(crate) async fn handle(
    state: Arc<HttpState>,
    cx: Call,
    params: RequestParams,
) -> Result<RequestResult, RpcError> {
    let body = match &params.body_base64 {
        Some(text) => Some(Bytes::from(
            decode_base64(text).map_err(wire::invalid_body)?,
        )),
        None => None,
    };
    let method =
        Method::from_bytes(params.method.as_bytes()).map_err(|_| wire::invalid_method())?;
    let url = Url::parse(&params.url).map_err(wire::invalid_url)?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(wire::unsupported_scheme(url.scheme()));
    }
    let slot = match params.stream_response {
        true => Some(claim_stream(&state, &cx, &params.request_id)?),
        false => None,
    };
    let headers = request_headers(&params.headers, process_env)?;
    let lease = descriptors::charge(
        cx.session().id(),
        DESCRIPTORS_PER_REQUEST,
        "an http/request",
    )?;
    // One deadline covers the connect, the head and the body; none when not asked for.
    let deadline = params
        .timeout_ms
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    let follow = params.redirect_policy != Some(RedirectPolicy::Stop);
    let hop = Hop {
        method,
        url,
        headers,
        body,
    };
    let response = body::head_within(deadline, exchange(&state, hop, follow)).await?;
    let status = response.status().as_u16();
    let headers = response_headers(response.headers());
    let body_base64 = match slot {
        Some(slot) => {
            let stream = body::Stream {
                session: Arc::clone(cx.session()),
                queued: cx.response_queued(),
                closed: cx.connection_closed_signal(),
                slot,
                lease,
                request_id: params.request_id,
            };
            tokio::spawn(stream.run(response, deadline));
            base64_json(&[])
        }
        None => {
            let limit = state.config.max_buffered_body_bytes;
            base64_json(&body::read_whole(&cx, response, limit, deadline).await?)
        }
    };
    Ok(RequestResult {
        status,
        headers,
        body_base64,
    })
}

fn claim_stream(state: &HttpState, cx: &Call, id: &str) -> Result<StreamSlot, RpcError> {
    let streams = cx.connection_state(ActiveStreams::default);
    streams.claim(id, state.config.max_streams_per_connection)
}

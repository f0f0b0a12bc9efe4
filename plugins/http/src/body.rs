//! Reading a response body: whole, for a buffered answer, or piece by piece into
//! `http/request/bodyDelta` notifications. Both end at the request's deadline.

use exec_server_core::proto::bytes::Base64;
use exec_server_core::proto::RpcError;
use std::sync::Arc;

use exec_server_core::{Call, ConnectionClosed, DescriptorLease, ResponseQueued, Session};
use tokio::time::Instant;

use crate::streams::StreamSlot;
use crate::wire::{self, BodyDelta, BODY_DELTA, BODY_ERROR, MAX_DELTA_BYTES};

/// Reads the whole body, at most `limit` bytes, reserving room in the connection's
/// outbound budget for its base64 as it grows (a client that does not read its answers
/// makes this wait instead of holding the body).
pub(crate) async fn read_whole(
    cx: &Call,
    mut response: reqwest::Response,
    limit: u64,
    deadline: Option<Instant>,
) -> Result<Vec<u8>, RpcError> {
    let mut body = Vec::new();
    loop {
        let chunk = match within(deadline, response.chunk()).await {
            Some(Ok(Some(chunk))) => chunk,
            Some(Ok(None)) => return Ok(body),
            Some(Err(_)) | None => return Err(wire::body_failed()),
        };
        if (body.len() + chunk.len()) as u64 > limit {
            return Err(wire::body_too_large(limit));
        }
        body.extend_from_slice(&chunk);
        if !cx.reserve_response_bytes(body.len().div_ceil(3) * 4).await {
            return Err(wire::body_failed());
        }
    }
}

/// A streamed body on its way to the client, with what it holds: its place among the
/// connection's streams and its descriptors. It ends with its connection.
pub(crate) struct Stream {
    pub(crate) session: Arc<Session>,
    pub(crate) queued: ResponseQueued,
    pub(crate) closed: ConnectionClosed,
    pub(crate) slot: StreamSlot,
    pub(crate) lease: DescriptorLease,
    pub(crate) request_id: String,
}

impl Stream {
    /// Sends the body as deltas once the result is queued: `seq` from 1, one delta per
    /// piece read (split above [`MAX_DELTA_BYTES`]), then the empty terminal delta, with
    /// `error` when the body could not be read to its end. Stops without a word once the
    /// connection is gone, even while the origin sends nothing.
    pub(crate) async fn run(self, response: reqwest::Response, deadline: Option<Instant>) {
        let closed = self.closed.clone();
        tokio::select! {
            _ = closed.wait() => {}
            _ = self.pump(response, deadline) => {}
        }
    }

    async fn pump(self, mut response: reqwest::Response, deadline: Option<Instant>) {
        let Self {
            session,
            queued,
            slot,
            lease,
            request_id,
            ..
        } = self;
        queued.wait().await;
        let mut seq = 0u64;
        let error = loop {
            let chunk = match within(deadline, response.chunk()).await {
                Some(Ok(Some(chunk))) => chunk,
                Some(Ok(None)) => break None,
                Some(Err(_)) | None => break Some(BODY_ERROR),
            };
            for piece in chunk.chunks(MAX_DELTA_BYTES) {
                seq += 1;
                if !send(&session, &request_id, seq, piece).await {
                    return;
                }
            }
        };
        drop(response);
        drop(lease);
        seq += 1;
        let terminal = BodyDelta {
            request_id: &request_id,
            seq,
            delta_base64: Base64(&[]),
            done: true,
            error,
        };
        let _ = session.notify(BODY_DELTA, &terminal).await;
        drop(slot);
    }
}

/// One non-terminal delta; `false` when it could not be delivered.
async fn send(session: &Session, request_id: &str, seq: u64, piece: &[u8]) -> bool {
    let delta = BodyDelta {
        request_id,
        seq,
        delta_base64: Base64(piece),
        done: false,
        error: None,
    };
    session.notify(BODY_DELTA, &delta).await
}

/// `work`'s outcome, or `None` when `deadline` came first.
async fn within<T>(
    deadline: Option<Instant>,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, work).await.ok(),
        None => Some(work.await),
    }
}

/// The answer's head by `deadline`: its own error, or the codex timeout text.
pub(crate) async fn head_within<T>(
    deadline: Option<Instant>,
    work: impl std::future::Future<Output = Result<T, RpcError>>,
) -> Result<T, RpcError> {
    within(deadline, work)
        .await
        .unwrap_or_else(|| Err(wire::timed_out()))
}

//! [`Call`]: what a method handler may touch while it answers one request.

use std::any::Any;
use std::sync::Arc;

use exec_server_proto::environment::Capabilities;
use exec_server_proto::RequestId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditScope, Auditor, Who};
use crate::extensions::Extensions;
use crate::outbound::{Outbound, ResponseRoom};
use crate::session::Session;

/// State shared by every request of one connection.
pub(crate) struct ConnectionShared {
    /// Per-connection plugin state (e.g. open file handles); dropped when the connection
    /// ends, which is what closes them.
    pub(crate) extensions: Extensions,
    /// Cancelled when the connection ends; running requests are then abandoned.
    pub(crate) closed: CancellationToken,
    /// Limits how many requests may wait (long-poll) at once: `dispatch.max_waiting_reads`.
    pub(crate) waiting: Arc<Semaphore>,
    /// The server's capability flags (CODEX-0169 §2.2).
    pub(crate) capabilities: Arc<Capabilities>,
    /// The server's audit trail, and who this connection is.
    pub(crate) audit: Arc<Auditor>,
    pub(crate) who: Arc<Who>,
}

/// The context of one request.
pub struct Call {
    pub(crate) id: RequestId,
    pub(crate) session: Arc<Session>,
    pub(crate) generation: u64,
    pub(crate) connection: Arc<ConnectionShared>,
    pub(crate) response_queued: CancellationToken,
    /// The `dispatch.max_in_flight` permit this request holds while it executes; released
    /// by [`Call::park`] so waiting requests do not hold up others.
    pub(crate) in_flight: Option<OwnedSemaphorePermit>,
    /// The extensions this connection opted in to at `initialize`.
    pub(crate) extensions: Arc<[String]>,
    /// The connection's queue, whose byte budget [`Call::reserve_response_bytes`] draws on.
    pub(crate) outbound: Outbound,
    /// The bytes reserved for this request's answer; the connection hands them to the
    /// queue with the answer, or frees them when the request is abandoned.
    pub(crate) response_room: Arc<ResponseRoom>,
    /// The request's W3C `traceparent`, when the client sent a well-formed one.
    pub(crate) traceparent: Option<String>,
    /// What the handler adds to the request's audit event; `None` when it is not recorded.
    pub(crate) audit_notes:
        Option<Arc<std::sync::Mutex<serde_json::Map<String, serde_json::Value>>>>,
}

/// An owned handle on a request's reserved answer room, for work that makes the answer
/// away from the request's task (a worker thread reading a file whose size was unknown or
/// grew) and must reserve each part of it before making it.
#[derive(Clone)]
pub struct AnswerRoom {
    outbound: Outbound,
    room: Arc<ResponseRoom>,
}

impl std::fmt::Debug for AnswerRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnswerRoom")
    }
}

impl AnswerRoom {
    /// Adds `bytes` to the request's reservation, waiting until they are free, as
    /// [`Call::reserve_response_bytes`] does. `false`: the connection is gone.
    pub async fn reserve_more(&self, bytes: usize) -> bool {
        self.outbound.reserve(&self.room, bytes).await
    }
}

/// `{"id":,"result":}` around a result (17 bytes) and the few bytes a result object puts
/// around its payload (`{"dataBase64":""}`, 17 bytes): what a handler reserving for its
/// payload alone leaves out. The id is added to it.
const ENVELOPE: usize = 64;

/// Held while a request waits without counting against `dispatch.max_in_flight`.
pub struct Parked {
    _waiting: OwnedSemaphorePermit,
}

/// Resolves once the response of a request has been queued on its connection, so a plugin
/// can hold back notifications that must follow it (PROTOCOL §2.9 ordering rule 4).
#[derive(Clone)]
pub struct ResponseQueued(CancellationToken);

impl ResponseQueued {
    /// Waits until the response is queued (or the request was abandoned).
    pub async fn wait(&self) {
        self.0.cancelled().await;
    }
}

/// Resolves once the connection of a request has ended: for work a request starts that
/// outlives its answer (a streamed body) and must not outlive its connection.
#[derive(Clone)]
pub struct ConnectionClosed(CancellationToken);

impl ConnectionClosed {
    /// Waits until the connection ends.
    pub async fn wait(&self) {
        self.0.cancelled().await;
    }
}

impl Call {
    /// The request's id.
    pub fn request_id(&self) -> &RequestId {
        &self.id
    }

    /// The session the connection is attached to.
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// The server's capability flags, as `environment/info` reports them.
    pub fn capabilities(&self) -> &Capabilities {
        &self.connection.capabilities
    }

    /// Whether this connection opted in to the extension `name` at `initialize`
    /// (`"extensions": ["<name>"]`), so it may be sent that extension's notifications.
    pub fn client_accepts(&self, name: &str) -> bool {
        self.extensions.iter().any(|e| e == name)
    }

    /// The attach generation of this request's connection.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// True when another connection has taken the session over since this request arrived.
    pub fn session_taken_over(&self) -> bool {
        self.session.generation() != self.generation
    }

    /// Per-connection plugin state of type `T`, created by `init` on first use and dropped
    /// when the connection ends.
    pub fn connection_state<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Arc<T> {
        self.connection.extensions.get_or_insert_with(init)
    }

    /// Resolves when the connection ends.
    pub async fn connection_closed(&self) {
        self.connection.closed.cancelled().await;
    }

    /// A handle that resolves when the connection ends, to move into a task.
    pub fn connection_closed_signal(&self) -> ConnectionClosed {
        ConnectionClosed(self.connection.closed.clone())
    }

    /// A handle that resolves once this request's response is queued.
    pub fn response_queued(&self) -> ResponseQueued {
        ResponseQueued(self.response_queued.clone())
    }

    /// Reserves about `bytes` of the connection's outbound byte budget
    /// (`connection.outbound_queue_bytes`) for the answer this request is about to make,
    /// waiting until they are free. A handler whose answer is large calls it once the size
    /// is known and before it reads the data, so a peer that does not read its answers
    /// makes requests wait here, holding nothing, instead of each holding its whole answer
    /// (SECURITY.md, "bytes held for a peer"). The bytes stay reserved until the answer is
    /// written to the transport, or the request is abandoned; calling it again replaces
    /// the reservation by one for the sum. An answer above the whole budget waits for the
    /// queue to be empty. `false`: the connection is gone.
    pub async fn reserve_response_bytes(&self, bytes: usize) -> bool {
        // The id is the client's: a long string id makes a frame longer than a fixed
        // allowance, and an answer longer than its reservation waits for all of it again.
        let id = serde_json::to_string(&self.id).map_or(0, |text| text.len());
        let frame = bytes.saturating_add(ENVELOPE).saturating_add(id);
        self.answer_room().reserve_more(frame).await
    }

    /// This request's answer room, to grow from elsewhere ([`AnswerRoom::reserve_more`]).
    pub fn answer_room(&self) -> AnswerRoom {
        AnswerRoom {
            outbound: self.outbound.clone(),
            room: Arc::clone(&self.response_room),
        }
    }

    /// Adds `key` to this request's audit event (what only the handler knows: the
    /// process's pid, the isolation obtained, the bytes written). Nothing when the request
    /// is not recorded. Never put a secret in.
    pub fn audit_note(&self, key: &str, value: impl FnOnce() -> serde_json::Value) {
        if let Some(notes) = &self.audit_notes {
            let value = value();
            notes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.to_owned(), value);
        }
    }

    /// The scope of events this request causes later (a process's exit): the trail,
    /// who asked, the session, this request.
    pub fn audit_scope(&self) -> AuditScope {
        AuditScope {
            auditor: Arc::clone(&self.connection.audit),
            who: Arc::clone(&self.connection.who),
            session: Some(self.session.id().to_owned()),
            traceparent: self.traceparent.clone(),
            method: None,
            request_id: Some(self.id.clone()),
        }
    }

    /// Stops counting this request against `dispatch.max_in_flight` while it waits.
    /// Returns `None` when `dispatch.max_waiting_reads` requests already wait; the caller
    /// must then answer at once (PROTOCOL §2.9).
    pub fn park(&mut self) -> Option<Parked> {
        let waiting = Arc::clone(&self.connection.waiting)
            .try_acquire_owned()
            .ok()?;
        self.in_flight = None;
        Some(Parked { _waiting: waiting })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exec_server_proto::jsonrpc::{encode_result, RequestId};

    /// What [`Call::reserve_response_bytes`] reserves for a payload covers the frame its
    /// answer becomes (`{"id":…,"result":{"dataBase64":"…"}}`), whatever the id: a
    /// 40-character string id outgrew the old fixed allowance, and an answer longer than
    /// its reservation gave the reservation back and waited for all of it again.
    #[test]
    fn the_reservation_covers_the_frame_for_any_id() {
        let payload = vec![7u8; 999];
        let raw = exec_server_proto::bytes::base64_object("dataBase64", &payload);
        let reserved_for = payload.len().div_ceil(3) * 4;
        for id in [
            RequestId::Int(i64::MIN),
            RequestId::Str("x".repeat(40)),
            RequestId::Str("\"\\\u{1}".repeat(20)),
        ] {
            let id_len = serde_json::to_string(&id).unwrap().len();
            let frame = encode_result(&id, &raw);
            assert!(
                frame.len() <= reserved_for + ENVELOPE + id_len,
                "{frame:.80}"
            );
        }
    }
}

//! The connection processor: one per connection, whatever the transport.
//!
//! It reads whole messages in arrival order, decodes them under the limits of PROTOCOL
//! §2.5, runs the handshake strictly in order (§2.9), gates every other method (§3.3) and
//! dispatches requests concurrently, at most `dispatch.max_in_flight` at a time. Responses
//! and plugin notifications share the connection's one [`Outbound`] queue, which the
//! transport drains (`crate::outbound`).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;

use exec_server_proto::decode::oversized_detail;
use exec_server_proto::initialize::{
    InitializeParams, InitializeResult, INITIALIZE, INITIALIZED, SESSION_CLOSE,
};
use exec_server_proto::jsonrpc::parse_message;
use exec_server_proto::{Incoming, RequestId, RpcError};
use futures_util::{FutureExt, Stream, StreamExt};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::audit::request::{RequestAudit, RequestOrigin};
use crate::audit::{AuditScope, Level, Outcome, Who};
use crate::call::{Call, ConnectionShared};
use crate::extensions::Extensions;
use crate::metrics;
use crate::outbound::{Outbound, ResponseRoom};
use crate::plugin::{decode_params, encode_result as encode_value};
use crate::server::ServerContext;
use crate::session::Session;

/// One unit a transport hands to the processor.
#[derive(Debug)]
pub enum Inbound {
    /// One complete message (a stdio line, a WebSocket message, a relay message).
    Message(bytes::Bytes),
    /// A stdio line above `limits.max_message_bytes` that was discarded unread; answered
    /// with an id -1 error (PROTOCOL §1.2).
    Oversized,
}

/// What the processor needs to know about its transport.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    /// `stdio`, `websocket` or `relay`, for logs.
    pub transport: &'static str,
    /// Start of the id -1 message for malformed input, e.g.
    /// `failed to parse JSON-RPC message from exec-server stdio` (PROTOCOL §2.6).
    pub parse_error_prefix: String,
    /// `true`: the session is detached when the connection ends (WebSocket, relay);
    /// `false`: it ends with the connection (stdio).
    pub detach_on_close: bool,
    /// When the peer's input ends (not on shutdown): how long to keep answering requests
    /// already received and to let the session's live work finish before the connection
    /// closes (stdio, `connection.stdio_drain_ms`). `None`: close at once.
    pub drain_on_end: Option<std::time::Duration>,
    /// The accepted socket's charge to the descriptor budget (WebSocket), moved into the
    /// session the connection attaches to.
    pub descriptor: Option<crate::descriptors::ConnectionCharge>,
    /// Who the peer is, as far as the transport knows (audit events).
    pub who: Arc<Who>,
}

/// Serves one connection until its inbound stream ends or the server shuts down. The
/// transport drains the other end of `outbound` (see [`ServerContext::outbound_queue`]).
pub async fn serve_connection<S>(
    server: Arc<ServerContext>,
    info: ConnectionInfo,
    inbound: S,
    outbound: Outbound,
) where
    S: Stream<Item = Inbound> + Send + Unpin,
{
    let labels = [("transport", info.transport)];
    metrics::counter(
        "exec_server_connections_total",
        "Connections accepted, by transport.",
        &labels,
    )
    .inc();
    let active = metrics::gauge(
        "exec_server_connections_active",
        "Connections open now, by transport.",
        &labels,
    );
    active.inc();
    let shared = Arc::new(ConnectionShared {
        extensions: Extensions::default(),
        closed: CancellationToken::new(),
        waiting: Arc::new(Semaphore::new(server.core.dispatch.max_waiting_reads)),
        capabilities: Arc::clone(server.router.capabilities()),
        audit: Arc::clone(&server.audit),
        who: Arc::clone(&info.who),
    });
    let mut processor = Processor {
        in_flight: Arc::new(Semaphore::new(server.core.dispatch.max_in_flight)),
        server,
        outbound,
        info,
        shared,
        session: None,
        extensions: Arc::from(Vec::new()),
        initialized: false,
        closed_by_client: false,
        tasks: JoinSet::new(),
    };
    tracing::debug!(transport = processor.info.transport, "connection opened");
    // A peer that stopped reading is dropped wherever the processor waits; `finish` then
    // aborts its requests, freeing what they held or reserved, and detaches its session.
    let stalled = processor.outbound.clone();
    tokio::select! {
        () = processor.run(inbound) => {}
        () = stalled.peer_stalled() => {}
    }
    processor.finish();
    active.dec();
}

struct Processor {
    server: Arc<ServerContext>,
    info: ConnectionInfo,
    outbound: Outbound,
    shared: Arc<ConnectionShared>,
    /// The attached session and the generation this connection attached with.
    session: Option<(Arc<Session>, u64)>,
    /// The extensions the client opted in to at `initialize`.
    extensions: Arc<[String]>,
    /// `initialized` was accepted: the connection is in the normal phase.
    initialized: bool,
    /// The client closed its session (`session/close`): the connection ends after the answer.
    closed_by_client: bool,
    /// `dispatch.max_in_flight`: when no permit is left the reader pauses (back-pressure).
    in_flight: Arc<Semaphore>,
    /// Running requests; aborted when the connection ends, so they are never answered.
    tasks: JoinSet<()>,
}

impl Processor {
    async fn run<S: Stream<Item = Inbound> + Unpin>(&mut self, mut inbound: S) {
        let shutdown = self.server.shutdown.clone();
        loop {
            let next = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                next = self.next_when_room(&mut inbound) => next,
            };
            let Some(frame) = next else {
                if let Some(window) = self.info.drain_on_end {
                    self.drain(window).await;
                }
                break;
            };
            match frame {
                Inbound::Message(bytes) => self.handle_bytes(&bytes).await,
                Inbound::Oversized => {
                    let detail = oversized_detail(self.server.core.limits.max_message_bytes);
                    self.reply_untied(RpcError::malformed(&self.info.parse_error_prefix, detail))
                        .await;
                }
            }
            while self.tasks.try_join_next().is_some() {}
            if self.closed_by_client {
                break;
            }
        }
    }

    /// The next message, read only once the outbound queue has room under its byte
    /// budget: a peer that does not take its answers is paused at the source instead of
    /// having more work done for it. `None` also when the queue is gone.
    async fn next_when_room<S: Stream<Item = Inbound> + Unpin>(
        &self,
        inbound: &mut S,
    ) -> Option<Inbound> {
        if !self.outbound.wait_for_room().await {
            return None;
        }
        inbound.next().await
    }

    /// The peer's input ended: answer the requests already received and let the session's
    /// live work (running processes, searches) send its notifications, for at most
    /// `window` or until shutdown. Whatever is left is then cut off by [`Self::finish`].
    async fn drain(&mut self, window: std::time::Duration) {
        /// How often the session is asked whether work is still under way.
        const LIVE_WORK_POLL: std::time::Duration = std::time::Duration::from_millis(10);
        let deadline = tokio::time::Instant::now() + window;
        let shutdown = self.server.shutdown.clone();
        let answered = async {
            while self.tasks.join_next().await.is_some() {}
            let Some((session, _)) = &self.session else {
                return;
            };
            while session.has_live_work() {
                tokio::time::sleep(LIVE_WORK_POLL).await;
            }
        };
        tokio::select! {
            _ = answered => {}
            _ = tokio::time::sleep_until(deadline) => {
                tracing::info!(
                    transport = self.info.transport,
                    "input ended; drain window over, cutting off what is still running"
                );
            }
            _ = shutdown.cancelled() => {}
        }
    }

    fn finish(mut self) {
        self.shared.closed.cancel();
        self.tasks.abort_all();
        self.shared.extensions.end_all();
        if let Some((session, generation)) = self.session.take() {
            if self.info.detach_on_close {
                self.session_event(&session, "session.detached");
                self.server.sessions.detach(&session, generation);
            } else {
                self.server.sessions.end(&session);
            }
        }
        tracing::debug!(transport = self.info.transport, "connection closed");
    }

    async fn handle_bytes(&mut self, bytes: &[u8]) {
        let message = match parse_message(bytes, &self.server.decode_limits) {
            Ok(message) => message,
            Err(detail) => {
                let error = RpcError::malformed(&self.info.parse_error_prefix, detail);
                return self.reply_untied(error).await;
            }
        };
        match message {
            Incoming::Request {
                id,
                method,
                params,
                trace,
            } => {
                let traceparent = trace.as_ref().and_then(valid_traceparent);
                self.handle_request(id, method, params, traceparent).await
            }
            Incoming::Notification { method, .. } => self.handle_notification(&method).await,
            Incoming::Response { id, answer } => self.handle_response(id, answer),
        }
    }

    /// An answer to a request the server sent: to the session's request with that id, if
    /// one waits; anything else is dropped (§2.7).
    fn handle_response(&self, id: Option<RequestId>, answer: Result<Value, Value>) {
        let delivered = match (&self.session, &id) {
            (Some((session, _)), Some(RequestId::Int(n))) => session.client_answered(*n, answer),
            _ => false,
        };
        if !delivered {
            tracing::debug!(?id, "dropping a response that answers nothing pending");
        }
    }

    async fn handle_notification(&mut self, method: &str) {
        if method != INITIALIZED {
            return self
                .reply_untied(RpcError::unknown_notification(method))
                .await;
        }
        match &self.session {
            None => {
                self.reply_untied(RpcError::initialized_before_initialize())
                    .await
            }
            Some((session, generation)) if session.generation() != *generation => {
                self.reply_untied(RpcError::session_resumed_elsewhere())
                    .await
            }
            Some(_) => self.initialized = true,
        }
    }

    async fn handle_request(
        &mut self,
        id: RequestId,
        method: String,
        params: Value,
        traceparent: Option<String>,
    ) {
        if method == INITIALIZE {
            let result = self.initialize(params);
            self.server.initialize_metrics.record(result.is_ok());
            return self.reply(&id, result).await;
        }
        if method == SESSION_CLOSE {
            let result = self.close_session_recorded(&id).await;
            return self.reply(&id, result).await;
        }
        let Some(route) = self.server.router.get(&method) else {
            tracing::debug!(?method, %id, "unknown method");
            self.server.unknown_method_metrics.record(false);
            return self
                .reply(&id, Err(RpcError::unknown_method(&method)))
                .await;
        };
        let metrics = route.metrics.clone();
        let gate = match (&route.handler, &self.session) {
            (None, _) => Err(RpcError::method_disabled(&method)),
            (Some(_), None) => Err(RpcError::not_initialized(route.family)),
            (Some(_), Some((session, generation))) if session.generation() != *generation => {
                Err(RpcError::session_resumed_elsewhere())
            }
            (Some(_), Some(_)) if !self.initialized => {
                Err(RpcError::not_initialized_notification(route.family))
            }
            (Some(handler), Some((session, generation))) => {
                Ok((Arc::clone(handler), Arc::clone(session), *generation))
            }
        };
        let (handler, session, generation) = match gate {
            Ok(ready) => ready,
            Err(error) => {
                metrics.record(false);
                self.audit_refused(&method, &id, &route.audit, &params, &error);
                return self.reply(&id, Err(error)).await;
            }
        };

        let audit = RequestAudit::begin(
            &self.server.audit,
            RequestOrigin {
                who: &self.info.who,
                session: Some(session.id()),
                method: &method,
                id: &id,
                traceparent: traceparent.as_deref(),
            },
            &route.audit,
            &params,
        );
        // In `blocking` mode a changing request waits here, before anything later on the
        // connection is read, so arrival order still decides (PROTOCOL §2.9).
        if let Some(audit) = audit.as_ref().filter(|a| a.waits_before_running()) {
            if let Err(unwritten) = audit.received().await {
                let refusal = unwritten.refusal(&method);
                tracing::warn!(%method, backend = %unwritten.backend, "request refused: the audit trail is not writing");
                metrics.record(false);
                audit.refused(Outcome::error(&refusal));
                return self.reply(&id, Err(refusal)).await;
            }
        }
        let permit = Arc::clone(&self.in_flight)
            .acquire_owned()
            .await
            .expect("the in-flight semaphore is never closed");
        let response_queued = CancellationToken::new();
        let response_room = Arc::new(ResponseRoom::default());
        let call = Call {
            id: id.clone(),
            session: Arc::clone(&session),
            generation,
            connection: Arc::clone(&self.shared),
            response_queued: response_queued.clone(),
            in_flight: Some(permit),
            extensions: Arc::clone(&self.extensions),
            outbound: self.outbound.clone(),
            response_room: Arc::clone(&response_room),
            traceparent: traceparent.clone(),
            audit_notes: audit.as_ref().map(RequestAudit::notes),
        };
        let outbound = self.outbound.clone();
        // `process`: the process a request is about, when it names one, so a process's
        // story can be followed through the log by its id (borrowed: nothing is copied
        // unless debug logging is on).
        let span = tracing::debug_span!(
            "request",
            // A routed method is one of our own names; a string id displays quoted and
            // escaped, so neither can start a log line of its own.
            %method,
            %id,
            session = %session.id(),
            process = params.get("processId").and_then(serde_json::Value::as_str),
            traceparent,
        );
        let mut request = Box::pin(
            async move {
                // Resolves `response_queued` also when the request is abandoned, so nothing
                // waits for a response that will never be sent.
                let _queued = response_queued.drop_guard();
                let started = std::time::Instant::now();
                let outcome = AssertUnwindSafe(handler.call(call, params))
                    .catch_unwind()
                    .await;
                let result = match outcome {
                    Ok(result) if session.generation() != generation => {
                        drop(result);
                        Err(RpcError::session_resumed_elsewhere())
                    }
                    Ok(result) => result,
                    Err(_) => {
                        tracing::error!("method handler panicked");
                        Err(RpcError::internal(format!(
                            "internal error while handling `{method}`"
                        )))
                    }
                };
                let elapsed = started.elapsed();
                metrics.duration.observe(elapsed);
                metrics.record(result.is_ok());
                // One line per request at debug, inside the span that names it.
                let duration_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
                match &result {
                    Ok(_) => tracing::debug!(duration_us, outcome = "ok", "request answered"),
                    Err(error) => tracing::debug!(
                        duration_us,
                        outcome = "error",
                        code = error.code,
                        error = %error.message.escape_debug(),
                        "request answered"
                    ),
                }
                if let Some(audit) = audit {
                    audit.completed(Outcome::of(&result)).await;
                }
                outbound
                    .respond_reserved(&id, result, response_room.take())
                    .await;
            }
            .instrument(span),
        );
        // Run the request up to its first suspension point before the next message is
        // read, so handlers take their place in per-resource queues in arrival order
        // (PROTOCOL §2.9 rules 1 and 2: a process/start reserves its id, a process/write
        // queues on its process's stdin, before anything later is looked at).
        let first_poll = std::future::poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx))).await;
        if first_poll.is_pending() {
            self.tasks.spawn(request);
        }
    }

    fn initialize(&mut self, params: Value) -> Result<Box<RawValue>, RpcError> {
        if self.session.is_some() {
            return Err(RpcError::initialize_twice());
        }
        let params: InitializeParams = decode_params(params)?;
        let router = &self.server.router;
        let outbound = self
            .outbound
            .blocking(router.blocked_notifications(&params.extensions));
        let sessions = &self.server.sessions;
        let (session, generation) = match &params.resume_session_id {
            Some(id) => sessions.resume(id, outbound)?,
            None => sessions.create(outbound),
        };
        tracing::info!(
            transport = self.info.transport,
            client = %params.client_name.escape_debug(),
            session = %session.id(),
            resumed = params.resume_session_id.is_some(),
            "session attached"
        );
        let result = InitializeResult {
            session_id: session.id().to_owned(),
            environment_info: router.environment_info(),
        };
        self.extensions = params
            .extensions
            .into_iter()
            .filter(|name| router.has_extension(name))
            .collect();
        if let Some(charge) = &self.info.descriptor {
            charge.move_to(session.id());
        }
        session.set_who(&self.info.who);
        let kind = match &params.resume_session_id {
            Some(_) => "session.resumed",
            None => "session.opened",
        };
        self.session_event(&session, kind);
        self.session = Some((session, generation));
        encode_value(&result)
    }

    /// `session/close`: ends the session now — requests still running are dropped
    /// unanswered, every plugin's session state is released (processes are killed) — and
    /// marks the connection to end once the answer is queued.
    fn close_session(&mut self) -> Result<Box<RawValue>, RpcError> {
        const FAMILY: &str = "session";
        let Some((session, generation)) = &self.session else {
            return Err(RpcError::not_initialized(FAMILY));
        };
        if session.generation() != *generation {
            return Err(RpcError::session_resumed_elsewhere());
        }
        if !self.initialized {
            return Err(RpcError::not_initialized_notification(FAMILY));
        }
        self.tasks.abort_all();
        tracing::info!(
            transport = self.info.transport,
            session = %session.id(),
            "session closed by the client"
        );
        self.server
            .sessions
            .end_because(session, crate::session::Ending::ClosedByClient);
        self.session = None;
        self.closed_by_client = true;
        encode_value(&serde_json::json!({}))
    }

    /// Records a request refused before it reached its handler (not initialized, disabled,
    /// resumed elsewhere), with the refusal the client is given.
    fn audit_refused(
        &self,
        method: &str,
        id: &RequestId,
        audit: &crate::audit::MethodAudit,
        params: &Value,
        error: &RpcError,
    ) {
        let session = self.session.as_ref().map(|(session, _)| session.id());
        let origin = RequestOrigin {
            who: &self.info.who,
            session,
            method,
            id,
            traceparent: None,
        };
        if let Some(audit) = RequestAudit::begin(&self.server.audit, origin, audit, params) {
            audit.refused(Outcome::error(error));
        }
    }

    /// `session/close`, which kills the session's processes: in `blocking` mode it waits
    /// for its `received` event, and is refused when the trail cannot record it.
    async fn close_session_recorded(&mut self, id: &RequestId) -> Result<Box<RawValue>, RpcError> {
        let session = self
            .session
            .as_ref()
            .map(|(session, _)| Arc::clone(session));
        let audit = session.as_ref().and_then(|session| {
            let origin = RequestOrigin {
                who: &self.info.who,
                session: Some(session.id()),
                method: SESSION_CLOSE,
                id,
                traceparent: None,
            };
            let declared = crate::audit::MethodAudit::default();
            RequestAudit::begin(&self.server.audit, origin, &declared, &Value::Null)
        });
        if let Some(audit) = audit.as_ref().filter(|a| a.waits_before_running()) {
            if let Err(unwritten) = audit.received().await {
                let refusal = unwritten.refusal(SESSION_CLOSE);
                audit.refused(Outcome::error(&refusal));
                return Err(refusal);
            }
        }
        let result = self.close_session();
        if let Some(audit) = audit {
            audit.completed(Outcome::of(&result)).await;
        }
        result
    }

    /// Records a session event of this connection (`session.opened`, …).
    fn session_event(&self, session: &Session, kind: &'static str) {
        let scope = AuditScope::connection(
            &self.server.audit,
            Arc::clone(&self.info.who),
            Some(session.id().to_owned()),
        );
        scope.emit(kind, |_: Level| serde_json::Map::new());
    }

    async fn reply(&self, id: &RequestId, result: Result<Box<RawValue>, RpcError>) {
        self.outbound.respond(id, result).await;
    }

    async fn reply_untied(&self, error: RpcError) {
        self.reply(&RequestId::UNTIED, Err(error)).await;
    }
}

/// The W3C `traceparent` of a request's `trace` carrier, if well formed (PROTOCOL §2.4);
/// anything else is ignored. Recorded on the request's span so logs join the caller's trace.
fn valid_traceparent(trace: &Value) -> Option<String> {
    let text = trace.get("traceparent")?.as_str()?;
    let parts: Vec<&str> = text.split('-').collect();
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    let well_formed = parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1].bytes().any(|b| b != b'0')
        && hex(parts[2], 16)
        && parts[2].bytes().any(|b| b != b'0')
        && hex(parts[3], 2);
    well_formed.then(|| text.to_owned())
}

#[cfg(test)]
#[path = "connection_tests.rs"]
mod tests;

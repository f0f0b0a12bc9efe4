//! The client side of one session: requests in flight, the processes being followed, and
//! the supervisor task that reads the connection and replaces it when it is lost.
//!
//! Recovery (PROTOCOL §3.4): when the connection ends, requests that can be repeated stay
//! queued, the others fail with [`ExecServerError::Disconnected`]; the supervisor
//! reconnects and sends `initialize` with `resumeSessionId` until it succeeds or the
//! resume deadline passes, retrying -32010 while the server has not yet seen the old
//! connection end. It then resends the queued requests (in their original order and with
//! their original ids and `writeId`s) and sends every followed process a `process/read`
//! from its last delivered `seq`; the reorder buffers merge those answers with the new
//! notifications. When recovery is impossible every waiter and every process handle gets
//! [`ExecServerError::SessionLost`].

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use exec_server_proto::bytes::decode_base64;
use exec_server_proto::error::code;
use exec_server_proto::initialize::{InitializeParams, InitializeResult, INITIALIZE, INITIALIZED};
use exec_server_proto::process::{
    OutputNotification, ReadParams, ReadResult, CLOSED, EXITED, OUTPUT, READ,
};
use exec_server_proto::RpcError;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::WireError;
use crate::process::{ClosedParams, EventResult, ExitedParams, ProcessEvent};
use crate::reorder::{Pushed, Reorder};
use crate::transport::{Connection, Transport};
use crate::{ClientOptions, ExecServerError};

/// Whether a request may be sent again on a new connection after the old one was lost
/// with the request unanswered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Repeating it is harmless (reads, writes with a `writeId`, idempotent fs calls).
    Resend,
    /// It may have taken effect; the caller gets [`ExecServerError::Disconnected`].
    Once,
}

/// The answer to one request.
pub(crate) struct Answer {
    pub result: Result<Box<RawValue>, ExecServerError>,
    /// The request was sent again after a reconnect, so an earlier copy may have reached
    /// the server too.
    pub resent: bool,
}

enum Waiter {
    Caller(oneshot::Sender<Answer>),
    /// A catch-up `process/read` issued by the client itself.
    CatchUp(String),
}

struct Pending {
    method: String,
    frame: String,
    retry: Retry,
    /// The connection generation it was sent on; `None` while queued during recovery.
    sent_on: Option<u64>,
    resent: bool,
    waiter: Waiter,
}

enum Phase {
    Connected,
    Recovering,
    Ended(ExecServerError),
}

struct State {
    phase: Phase,
    /// Bumped for every connection.
    generation: u64,
    outgoing: Option<mpsc::UnboundedSender<String>>,
    session_id: String,
    /// By request id, so that resending walks them in their original order.
    pending: BTreeMap<i64, Pending>,
    processes: HashMap<String, Arc<Slot>>,
}

/// A followed process: its reorder buffer and the queue its handle reads.
pub(crate) struct Slot {
    state: Mutex<SlotState>,
    events: mpsc::Sender<EventResult>,
}

struct SlotState {
    reorder: Reorder,
    /// The `process/start` answer arrived: read errors now mean the process is gone.
    started: bool,
    /// A catch-up read is in flight; at most one at a time.
    catching_up: bool,
}

/// What the public client and the supervisor share.
pub(crate) struct Shared {
    state: Mutex<State>,
    next_id: AtomicI64,
    pub(crate) options: ClientOptions,
    transport: Arc<dyn Transport>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[derive(Serialize)]
struct RequestFrame<'a, P: ?Sized> {
    id: i64,
    method: &'a str,
    params: &'a P,
}

/// Any inbound message; classification follows PROTOCOL §2.1.
#[derive(Deserialize)]
struct InboundMessage<'a> {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default, borrow)]
    params: Option<&'a RawValue>,
    #[serde(default, borrow)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<WireError>,
}

/// Why a handshake on one connection failed.
pub(crate) enum HandshakeError {
    Rpc(RpcError),
    Lost,
    Timeout,
    /// The peer wrote something that is not a JSON-RPC message (the first such line, cut
    /// to a readable length): it does not speak the protocol on this connection.
    NotJsonRpc(String),
}

/// Sends `initialize` (optionally resuming) and, on success, `initialized`. Nothing else
/// can arrive before the answer, so the connection is read directly.
pub(crate) async fn handshake(
    connection: &mut Connection,
    next_id: &AtomicI64,
    client_name: &str,
    extensions: &[String],
    resume_session_id: Option<&str>,
    limit: Duration,
) -> Result<String, HandshakeError> {
    let id = next_id.fetch_add(1, Ordering::Relaxed);
    let params = InitializeParams {
        client_name: client_name.to_owned(),
        resume_session_id: resume_session_id.map(str::to_owned),
        extensions: extensions.to_vec(),
    };
    let frame = request_frame(id, INITIALIZE, &params);
    connection
        .outgoing
        .send(frame)
        .map_err(|_| HandshakeError::Lost)?;
    let answer = tokio::time::timeout(limit, async {
        while let Some(text) = connection.incoming.recv().await {
            let Ok(message) = serde_json::from_str::<InboundMessage>(&text) else {
                // Nothing but JSON-RPC may come before the answer; waiting would only
                // end in the initialize timeout.
                let shown: String = text.chars().take(120).collect();
                return Err(HandshakeError::NotJsonRpc(shown));
            };
            if message.id.as_ref().and_then(Value::as_i64) != Some(id) {
                continue;
            }
            if let Some(error) = message.error {
                return Err(HandshakeError::Rpc(error.into()));
            }
            return message
                .result
                .and_then(|raw| serde_json::from_str::<InitializeResult>(raw.get()).ok())
                .ok_or_else(|| {
                    HandshakeError::Rpc(RpcError::new(
                        code::INTERNAL_ERROR,
                        "initialize answered without a session id",
                    ))
                });
        }
        Err(HandshakeError::Lost)
    })
    .await;
    let result = answer.map_err(|_| HandshakeError::Timeout)??;
    let initialized = serde_json::json!({"method": INITIALIZED, "params": {}}).to_string();
    connection
        .outgoing
        .send(initialized)
        .map_err(|_| HandshakeError::Lost)?;
    Ok(result.session_id)
}

fn request_frame<P: Serialize + ?Sized>(id: i64, method: &str, params: &P) -> String {
    serde_json::to_string(&RequestFrame { id, method, params })
        .expect("request params always serialize")
}

impl Shared {
    pub(crate) fn new(
        options: ClientOptions,
        transport: Arc<dyn Transport>,
        connection: &Connection,
        session_id: String,
        next_id: AtomicI64,
    ) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                phase: Phase::Connected,
                generation: 1,
                outgoing: Some(connection.outgoing.clone()),
                session_id,
                pending: BTreeMap::new(),
                processes: HashMap::new(),
            }),
            next_id,
            options,
            transport,
        })
    }

    pub(crate) fn session_id(&self) -> String {
        lock(&self.state).session_id.clone()
    }

    /// Sends a request (or queues it while recovering) and waits for its answer.
    pub(crate) async fn call<P: Serialize + ?Sized>(
        self: &Arc<Self>,
        method: &str,
        params: &P,
        retry: Retry,
    ) -> Answer {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = request_frame(id, method, params);
        let (tx, rx) = oneshot::channel();
        {
            let mut state = lock(&self.state);
            if let Phase::Ended(error) = &state.phase {
                return Answer {
                    result: Err(error.clone()),
                    resent: false,
                };
            }
            let sent_on = match (&state.phase, &state.outgoing) {
                (Phase::Connected, Some(outgoing)) => {
                    outgoing.send(frame.clone()).ok().map(|()| state.generation)
                }
                _ => None,
            };
            state.pending.insert(
                id,
                Pending {
                    method: method.to_owned(),
                    frame,
                    retry,
                    sent_on,
                    resent: false,
                    waiter: Waiter::Caller(tx),
                },
            );
        }
        // Forget the request if the caller stops waiting (a timeout, a dropped future).
        let forget = ForgetOnDrop {
            shared: self,
            id: Some(id),
        };
        let answer = rx.await.unwrap_or(Answer {
            result: Err(ExecServerError::Closed),
            resent: false,
        });
        forget.disarm();
        answer
    }

    /// Starts following a process before its `process/start` is sent, so that no
    /// notification can arrive for an unknown id.
    pub(crate) fn follow(
        &self,
        process_id: &str,
    ) -> Result<mpsc::Receiver<EventResult>, ExecServerError> {
        let mut state = lock(&self.state);
        if let Phase::Ended(error) = &state.phase {
            return Err(error.clone());
        }
        if state.processes.contains_key(process_id) {
            return Err(ExecServerError::InvalidRequest(format!(
                "process {process_id} is already followed by this client"
            )));
        }
        let (events, rx) = mpsc::channel(self.options.event_queue.max(1));
        let slot = Slot {
            state: Mutex::new(SlotState {
                reorder: Reorder::new(self.options.reorder_window),
                started: false,
                catching_up: false,
            }),
            events,
        };
        state
            .processes
            .insert(process_id.to_owned(), Arc::new(slot));
        Ok(rx)
    }

    pub(crate) fn unfollow(&self, process_id: &str) {
        lock(&self.state).processes.remove(process_id);
    }

    /// Marks a followed process as started; with `catch_up`, also reads what it did
    /// already (its start answer was lost, so notifications may have been missed).
    pub(crate) fn started(&self, process_id: &str, catch_up: bool) {
        let mut state = lock(&self.state);
        let Some(slot) = state.processes.get(process_id).cloned() else {
            return;
        };
        lock(&slot.state).started = true;
        if catch_up {
            self.catch_up_locked(&mut state, process_id, &slot);
        }
    }

    /// Sends a catch-up `process/read` for one process, unless one is in flight or the
    /// connection is down (recovery sends one for every process anyway).
    fn catch_up_locked(&self, state: &mut State, process_id: &str, slot: &Slot) {
        let mut slot_state = lock(&slot.state);
        if slot_state.catching_up {
            return;
        }
        let (Phase::Connected, Some(outgoing)) = (&state.phase, &state.outgoing) else {
            return;
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let params = ReadParams {
            process_id: process_id.to_owned(),
            after_seq: Some(slot_state.reorder.cursor()),
            max_bytes: None,
            wait_ms: Some(0),
        };
        let frame = request_frame(id, READ, &params);
        if outgoing.send(frame.clone()).is_err() {
            return;
        }
        slot_state.catching_up = true;
        let generation = state.generation;
        state.pending.insert(
            id,
            Pending {
                method: READ.to_owned(),
                frame,
                retry: Retry::Once,
                sent_on: Some(generation),
                resent: false,
                waiter: Waiter::CatchUp(process_id.to_owned()),
            },
        );
    }

    fn catch_up(&self, process_id: &str) {
        let mut state = lock(&self.state);
        if let Some(slot) = state.processes.get(process_id).cloned() {
            self.catch_up_locked(&mut state, process_id, &slot);
        }
    }

    fn slot(&self, process_id: &str) -> Option<Arc<Slot>> {
        lock(&self.state).processes.get(process_id).cloned()
    }

    /// The connection was lost: requests that must not be repeated fail, catch-up reads
    /// are dropped (recovery issues new ones), the rest wait for the next connection.
    fn connection_lost(&self) {
        let mut state = lock(&self.state);
        if matches!(state.phase, Phase::Ended(_)) {
            return;
        }
        state.phase = Phase::Recovering;
        state.outgoing = None;
        let pending = std::mem::take(&mut state.pending);
        for (id, entry) in pending {
            match entry.waiter {
                Waiter::CatchUp(process_id) => {
                    if let Some(slot) = state.processes.get(&process_id) {
                        lock(&slot.state).catching_up = false;
                    }
                }
                Waiter::Caller(tx) if entry.sent_on.is_some() && entry.retry == Retry::Once => {
                    let _ = tx.send(Answer {
                        result: Err(ExecServerError::Disconnected {
                            method: entry.method,
                        }),
                        resent: false,
                    });
                }
                waiter => {
                    state.pending.insert(id, Pending { waiter, ..entry });
                }
            }
        }
    }

    /// The session is attached to `connection`: resend what is queued, in order, then
    /// catch every followed process up. Done under the state lock so that no new request
    /// can overtake a resent one.
    fn reattached(&self, connection: &Connection) {
        let mut state = lock(&self.state);
        state.generation += 1;
        let generation = state.generation;
        state.phase = Phase::Connected;
        state.outgoing = Some(connection.outgoing.clone());
        for entry in state.pending.values_mut() {
            if entry.sent_on.is_some() {
                entry.resent = true;
            }
            entry.sent_on = Some(generation);
            let _ = connection.outgoing.send(entry.frame.clone());
        }
        let slots: Vec<(String, Arc<Slot>)> = state
            .processes
            .iter()
            .map(|(id, slot)| (id.clone(), Arc::clone(slot)))
            .collect();
        for (process_id, slot) in slots {
            self.catch_up_locked(&mut state, &process_id, &slot);
        }
    }

    /// Recovery is impossible or the client closed: everything ends with `error`.
    fn end(&self, error: ExecServerError) {
        let (pending, processes) = {
            let mut state = lock(&self.state);
            if matches!(state.phase, Phase::Ended(_)) {
                return;
            }
            state.phase = Phase::Ended(error.clone());
            state.outgoing = None;
            (
                std::mem::take(&mut state.pending),
                std::mem::take(&mut state.processes),
            )
        };
        for entry in pending.into_values() {
            if let Waiter::Caller(tx) = entry.waiter {
                let _ = tx.send(Answer {
                    result: Err(error.clone()),
                    resent: false,
                });
            }
        }
        for slot in processes.into_values() {
            let error = error.clone();
            // A handle whose queue is full still gets its failure once it reads on.
            tokio::spawn(async move {
                let _ = slot.events.send(Err(error)).await;
            });
        }
    }
}

/// Removes a request from the pending table when its caller stops waiting.
struct ForgetOnDrop<'a> {
    shared: &'a Shared,
    id: Option<i64>,
}

impl ForgetOnDrop<'_> {
    fn disarm(mut self) {
        self.id = None;
    }
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            lock(&self.shared.state).pending.remove(&id);
        }
    }
}

/// The supervisor: reads the connection, routes answers and notifications, and replaces
/// the connection when it is lost. Ends when the client is closed or recovery fails.
pub(crate) async fn supervise(
    shared: Arc<Shared>,
    mut connection: Connection,
    closed: CancellationToken,
) {
    loop {
        let lost = tokio::select! {
            biased;
            _ = closed.cancelled() => false,
            lost = serve(&shared, &mut connection) => lost,
        };
        drop(connection);
        if !lost {
            shared.end(ExecServerError::Closed);
            shared.transport.shutdown();
            return;
        }
        shared.connection_lost();
        if !shared.transport.resumable() {
            shared.end(ExecServerError::SessionLost(format!(
                "the connection to the {} ended and cannot be resumed",
                shared.transport.describe()
            )));
            shared.transport.shutdown();
            return;
        }
        let recovered = tokio::select! {
            biased;
            _ = closed.cancelled() => Err(ExecServerError::Closed),
            recovered = recover(&shared) => recovered.map_err(ExecServerError::SessionLost),
        };
        match recovered {
            Ok(new_connection) => {
                shared.reattached(&new_connection);
                connection = new_connection;
            }
            Err(error) => {
                shared.end(error);
                shared.transport.shutdown();
                return;
            }
        }
    }
}

/// Reads one connection until it ends (`true`).
async fn serve(shared: &Arc<Shared>, connection: &mut Connection) -> bool {
    while let Some(text) = connection.incoming.recv().await {
        route(shared, &text).await;
    }
    true
}

async fn route(shared: &Arc<Shared>, text: &str) {
    let message: InboundMessage = match serde_json::from_str(text) {
        Ok(message) => message,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring a message that is not a JSON-RPC object");
            return;
        }
    };
    match (message.id, message.method) {
        (None, Some(method)) => notification(shared, &method, message.params).await,
        (Some(id), None) => {
            let result = match message.error {
                Some(error) => Err(ExecServerError::Rpc(error.into())),
                None => Ok(message.result.map_or_else(
                    || RawValue::from_string("null".into()).expect("null is JSON"),
                    ToOwned::to_owned,
                )),
            };
            match id.as_i64() {
                Some(-1) => {
                    if let Err(error) = result {
                        tracing::warn!(?error, "exec-server reported a protocol error");
                    }
                }
                Some(id) => response(shared, id, result).await,
                None => tracing::debug!(?id, "ignoring a response to an id this client never uses"),
            }
        }
        (Some(_), Some(method)) => {
            tracing::debug!(?method, "ignoring a request from the server");
        }
        (None, None) => tracing::debug!("ignoring a message with neither id nor method"),
    }
}

async fn response(shared: &Arc<Shared>, id: i64, result: Result<Box<RawValue>, ExecServerError>) {
    let Some(entry) = lock(&shared.state).pending.remove(&id) else {
        return;
    };
    match entry.waiter {
        Waiter::Caller(tx) => {
            let _ = tx.send(Answer {
                result,
                resent: entry.resent,
            });
        }
        Waiter::CatchUp(process_id) => caught_up(shared, &process_id, result).await,
    }
}

async fn caught_up(
    shared: &Arc<Shared>,
    process_id: &str,
    result: Result<Box<RawValue>, ExecServerError>,
) {
    let Some(slot) = shared.slot(process_id) else {
        return;
    };
    let read = result.and_then(|raw| {
        serde_json::from_str::<ReadResult>(raw.get())
            .map_err(|e| ExecServerError::Protocol(format!("process/read result: {e}")))
    });
    let mut events = Vec::new();
    let failure = {
        let mut slot_state = lock(&slot.state);
        slot_state.catching_up = false;
        match read {
            Ok(read) => {
                slot_state.reorder.merge_read(read, decode_chunk);
                slot_state.reorder.drain(&mut events);
                None
            }
            // The start has not been answered yet: the process may not exist so far, and
            // its start answer decides what to do.
            Err(_) if !slot_state.started => None,
            Err(ExecServerError::Rpc(error)) if error.code == code::INVALID_REQUEST => {
                Some(ExecServerError::SessionLost(format!(
                    "process {process_id} is no longer known to the server: {}",
                    error.message
                )))
            }
            Err(error) => {
                tracing::warn!(process = process_id, ?error, "catch-up read failed");
                None
            }
        }
    };
    if let Some(failure) = failure {
        shared.unfollow(process_id);
        let _ = slot.events.send(Err(failure)).await;
        return;
    }
    deliver(shared, process_id, &slot, events).await;
}

fn decode_chunk(chunk: &str) -> Vec<u8> {
    decode_base64(chunk).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "process output chunk is not valid base64");
        Vec::new()
    })
}

async fn notification(shared: &Arc<Shared>, method: &str, params: Option<&RawValue>) {
    let params = params.map_or("null", RawValue::get);
    let (process_id, event) = match method {
        OUTPUT => match serde_json::from_str::<OutputNotification>(params) {
            Ok(n) => {
                let event = ProcessEvent::Output {
                    seq: n.seq,
                    stream: n.stream,
                    bytes: decode_chunk(&n.chunk),
                };
                (n.process_id, Some(event))
            }
            Err(e) => return tracing::warn!(error = %e, "malformed process/output"),
        },
        EXITED => match serde_json::from_str::<ExitedParams>(params) {
            Ok(n) => {
                let event = ProcessEvent::Exited {
                    seq: n.seq,
                    exit_code: n.exit_code,
                    sandbox_denied: n.sandbox_denied,
                };
                (n.process_id, Some(event))
            }
            Err(e) => return tracing::warn!(error = %e, "malformed process/exited"),
        },
        CLOSED => match serde_json::from_str::<ClosedParams>(params) {
            Ok(n) => (n.process_id, n.seq.map(|seq| ProcessEvent::Closed { seq })),
            Err(e) => return tracing::warn!(error = %e, "malformed process/closed"),
        },
        other => return tracing::debug!(method = other, "ignoring an unknown notification"),
    };
    let Some(slot) = shared.slot(&process_id) else {
        return;
    };
    let mut events = Vec::new();
    let (pushed, overflowed) = {
        let mut slot_state = lock(&slot.state);
        let pushed = match event {
            Some(event) => slot_state.reorder.push(event),
            None => slot_state.reorder.push_close_without_seq(),
        };
        slot_state.reorder.drain(&mut events);
        (pushed, slot_state.reorder.overflowed())
    };
    if overflowed {
        shared.unfollow(&process_id);
        let _ = slot
            .events
            .send(Err(ExecServerError::Protocol(format!(
                "events of process {process_id} arrive with a gap that is never filled"
            ))))
            .await;
        return;
    }
    if pushed == Pushed::NeedsCatchUp {
        shared.catch_up(&process_id);
    }
    deliver(shared, &process_id, &slot, events).await;
}

/// Hands events to the process handle, in order; the last one unfollows the process.
async fn deliver(shared: &Arc<Shared>, process_id: &str, slot: &Slot, events: Vec<ProcessEvent>) {
    for event in events {
        let last = matches!(event, ProcessEvent::Closed { .. });
        if last {
            shared.unfollow(process_id);
        }
        if slot.events.send(Ok(event)).await.is_err() {
            // The handle is gone: nobody follows the process any more.
            shared.unfollow(process_id);
            return;
        }
        if last {
            return;
        }
    }
}

/// Reconnects and resumes the session within the resume deadline.
async fn recover(shared: &Arc<Shared>) -> Result<Connection, String> {
    let options = &shared.options;
    let session_id = shared.session_id();
    let deadline = Instant::now() + options.resume_deadline;
    let mut pause = options.resume_retry_interval;
    let mut last_error = String::from("no reconnect attempt finished");
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(format!(
                "could not resume session {session_id} within {} ms: {last_error}",
                options.resume_deadline.as_millis()
            ));
        }
        let connect_limit = options.connect_timeout.min(remaining);
        match tokio::time::timeout(connect_limit, shared.transport.connect()).await {
            Err(_) => last_error = "connecting timed out".into(),
            Ok(Err(error)) => last_error = error.to_string(),
            Ok(Ok(mut connection)) => {
                match resume_on(shared, &mut connection, &session_id, deadline).await {
                    Ok(()) => {
                        tracing::info!(session = %session_id, "session resumed");
                        return Ok(connection);
                    }
                    Err(Resume::Impossible(reason)) => {
                        return Err(format!("cannot resume session {session_id}: {reason}"))
                    }
                    Err(Resume::TryAgain(reason)) => last_error = reason,
                }
            }
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(pause.min(remaining)).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

enum Resume {
    Impossible(String),
    TryAgain(String),
}

/// Resumes on one connection, repeating `initialize` while the server still has the
/// session attached to the connection it has not yet seen end (-32010).
async fn resume_on(
    shared: &Arc<Shared>,
    connection: &mut Connection,
    session_id: &str,
    deadline: Instant,
) -> Result<(), Resume> {
    let options = &shared.options;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(Resume::TryAgain(format!(
                "session {session_id} stayed attached to the lost connection"
            )));
        }
        let outcome = handshake(
            connection,
            &shared.next_id,
            &options.client_name,
            &options.extensions,
            Some(session_id),
            options.initialize_timeout.min(remaining),
        )
        .await;
        match outcome {
            Ok(_) => return Ok(()),
            Err(HandshakeError::Rpc(error)) if error.code == code::SESSION_ATTACHED => {
                tracing::debug!(session = session_id, "session still attached; retrying");
                let remaining = deadline.saturating_duration_since(Instant::now());
                tokio::time::sleep(options.resume_retry_interval.min(remaining)).await;
            }
            Err(HandshakeError::Rpc(error)) => return Err(Resume::Impossible(error.message)),
            Err(HandshakeError::Lost) => {
                return Err(Resume::TryAgain("the new connection closed".into()))
            }
            Err(HandshakeError::Timeout) => {
                return Err(Resume::TryAgain("initialize timed out".into()))
            }
            Err(HandshakeError::NotJsonRpc(line)) => {
                return Err(Resume::Impossible(format!(
                    "the new connection does not speak JSON-RPC; it wrote `{line}`"
                )))
            }
        }
    }
}

//! The one way messages leave a connection, whatever the transport: encoding (responses
//! and notifications), the per-connection size limit, withholding extension notifications
//! the client did not opt in to, and the bounded queue that makes producers wait for a
//! slow client (back-pressure).
//!
//! [`outbound_queue`] makes both ends. The connection processor and the sessions hold the
//! [`Outbound`] end; the transport holds the [`OutboundDrain`] and writes each
//! [`OutboundDrain::next_batch`] to its wire with one flush. Notifications that must follow
//! a response wait for [`crate::ResponseQueued`]: the queue keeps order, so queued before
//! means written before.
//!
//! The queue is bounded twice: in messages (`connection.outbound_queue_messages`) and in
//! bytes (`connection.outbound_queue_bytes`). The byte budget is a semaphore of bytes: a
//! producer takes the bytes of its message before queueing it, a request may reserve the
//! bytes of its answer before making it ([`crate::Call::reserve_response_bytes`]), and the
//! drain gives the bytes back once the transport has written them. So what the server
//! holds for a peer that stops reading is the budget, not the sum of everything it asked
//! for; a transport that cannot hand data to its peer for
//! `connection.stalled_peer_timeout_ms` gives up on it ([`OutboundDrain::write_or_give_up`]).

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exec_server_proto::jsonrpc::{encode_error, encode_notification, encode_result};
use exec_server_proto::{RequestId, RpcError};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// What bounds one connection's outbound queue (the `[connection]` table).
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits {
    /// `connection.outbound_queue_messages`.
    pub messages: usize,
    /// `connection.outbound_queue_bytes`.
    pub bytes: usize,
    /// `connection.stalled_peer_timeout_ms`.
    pub stalled_peer_timeout: Duration,
}

impl Default for QueueLimits {
    fn default() -> Self {
        Self {
            messages: 128,
            bytes: 16 * 1024 * 1024,
            stalled_peer_timeout: Duration::from_secs(30),
        }
    }
}

/// Makes one connection's outbound queue, holding at most `capacity` messages and the
/// default byte budget; `max_message_bytes` is the largest message the transport can
/// carry, if it has a limit (relay streams, PROTOCOL §2.5).
pub fn outbound_queue(
    capacity: usize,
    max_message_bytes: Option<usize>,
) -> (Outbound, OutboundDrain) {
    let limits = QueueLimits {
        messages: capacity,
        ..QueueLimits::default()
    };
    outbound_queue_with(limits, max_message_bytes)
}

/// Makes one connection's outbound queue bounded by `limits`.
pub fn outbound_queue_with(
    limits: QueueLimits,
    max_message_bytes: Option<usize>,
) -> (Outbound, OutboundDrain) {
    let (tx, rx) = mpsc::channel(limits.messages.max(1));
    let room = Arc::new(Room::new(&limits));
    let outbound = Outbound {
        tx,
        room: Arc::clone(&room),
        max_bytes: max_message_bytes,
        blocked: Arc::default(),
    };
    let drain = OutboundDrain {
        rx,
        written: None,
        room,
    };
    (outbound, drain)
}

/// The byte budget shared by a connection's producers and its drain.
struct Room {
    /// One permit per byte of the budget.
    bytes: Arc<Semaphore>,
    budget: u32,
    stalled_peer_timeout: Duration,
    /// Cancelled when the transport gave up on a peer that stopped reading: the
    /// connection then ends (see [`Outbound::peer_stalled`]).
    stalled: CancellationToken,
}

impl Room {
    fn new(limits: &QueueLimits) -> Self {
        let budget = u32::try_from(limits.bytes.max(1)).unwrap_or(u32::MAX);
        Self {
            bytes: Arc::new(Semaphore::new(budget as usize)),
            budget,
            stalled_peer_timeout: limits.stalled_peer_timeout,
            stalled: CancellationToken::new(),
        }
    }

    /// The permits a message of `len` bytes takes: its size, or the whole budget for a
    /// larger one, which is therefore admitted alone, once the queue is empty (nothing is
    /// refused for its size here; the transport's own limit applies).
    fn permits_for(&self, len: usize) -> u32 {
        u32::try_from(len).unwrap_or(u32::MAX).min(self.budget)
    }

    /// Waits until `len` bytes are free and takes them. `None`: the connection is gone.
    async fn take(&self, len: usize) -> Option<OwnedSemaphorePermit> {
        let permits = self.permits_for(len);
        Arc::clone(&self.bytes)
            .acquire_many_owned(permits)
            .await
            .ok()
    }
}

/// One encoded message and the bytes of the budget it holds until it is written.
struct Queued {
    frame: String,
    room: OwnedSemaphorePermit,
}

/// Bytes a running request reserved for its answer ([`crate::Call::reserve_response_bytes`]);
/// handed to [`Outbound::respond_reserved`] with the answer, freed if the request is
/// abandoned.
#[derive(Default)]
pub(crate) struct ResponseRoom(Mutex<Option<OwnedSemaphorePermit>>);

impl ResponseRoom {
    pub(crate) fn take(&self) -> Option<OwnedSemaphorePermit> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn put(&self, permit: OwnedSemaphorePermit) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(permit);
    }
}

/// The producers' end of a connection's queue: encoded JSON messages.
#[derive(Clone)]
pub struct Outbound {
    tx: mpsc::Sender<Queued>,
    room: Arc<Room>,
    max_bytes: Option<usize>,
    /// Extension notifications this connection did not opt in to: never sent to it,
    /// because reference clients drop the connection on a notification they do not know.
    blocked: Arc<HashSet<&'static str>>,
}

impl Outbound {
    /// The same queue, withholding the notifications in `blocked`.
    pub(crate) fn blocking(&self, blocked: HashSet<&'static str>) -> Self {
        Self {
            blocked: Arc::new(blocked),
            ..self.clone()
        }
    }

    /// Encodes and queues one response, waiting for room. A response above the
    /// transport's limit is replaced by the "response too large" error for the same id.
    pub(crate) async fn respond(&self, id: &RequestId, result: Result<Box<RawValue>, RpcError>) {
        self.respond_reserved(id, result, None).await;
    }

    /// Like [`Outbound::respond`], using the bytes the request reserved for its answer
    /// (what is left over is freed; an answer larger than the reservation waits for the
    /// difference).
    pub(crate) async fn respond_reserved(
        &self,
        id: &RequestId,
        result: Result<Box<RawValue>, RpcError>,
        reserved: Option<OwnedSemaphorePermit>,
    ) {
        let mut frame = match result {
            Ok(raw) => frame_result(id, raw),
            Err(error) => encode_error(id, &error),
        };
        if let Some(limit) = self.max_bytes {
            if frame.len() > limit {
                frame = encode_error(id, &RpcError::response_too_large(frame.len(), limit));
            }
        }
        let Some(room) = self.room_for(frame.len(), reserved).await else {
            return;
        };
        // A closed queue means the connection is gone; its requests go unanswered (§3.5).
        let _ = self.tx.send(Queued { frame, room }).await;
    }

    /// The budget's bytes for a message of `len` bytes: taken from `reserved` when it is
    /// large enough, else waited for.
    async fn room_for(
        &self,
        len: usize,
        reserved: Option<OwnedSemaphorePermit>,
    ) -> Option<OwnedSemaphorePermit> {
        let needed = self.room.permits_for(len) as usize;
        match reserved {
            Some(mut permit) if permit.num_permits() >= needed => {
                let spare = permit.num_permits() - needed;
                if spare > 0 {
                    drop(permit.split(spare));
                }
                Some(permit)
            }
            // Given back before waiting for the whole: a request that held part of the
            // budget while it waited for more could wait forever on another doing the same.
            short => {
                drop(short);
                self.room.take(len).await
            }
        }
    }

    /// Reserves `len` bytes of the budget into `slot`, first giving back what `slot`
    /// held and then waiting for the sum (see [`Outbound::room_for`] for why). A slot that
    /// already holds the whole budget keeps it: nothing more can be charged, and giving it
    /// back would let another request make an answer nobody charged while this one grows
    /// (this one is the answer the budget admits alone). `false`: the connection is gone.
    pub(crate) async fn reserve(&self, slot: &ResponseRoom, len: usize) -> bool {
        let held = match slot.take() {
            Some(permit) if permit.num_permits() >= self.room.budget as usize => {
                slot.put(permit);
                return true;
            }
            Some(permit) => permit.num_permits(),
            None => 0,
        };
        match self.room.take(held.saturating_add(len)).await {
            Some(permit) => {
                slot.put(permit);
                true
            }
            None => false,
        }
    }

    /// Resolves once the queue has room under its byte budget, so the connection reads
    /// no new request while its peer is not taking what it already asked for. Waits in
    /// line behind producers already waiting. `false`: the connection is gone.
    pub(crate) async fn wait_for_room(&self) -> bool {
        self.room.take(1).await.is_some()
    }

    /// Resolves when the transport gave up on a peer that stopped reading.
    pub(crate) async fn peer_stalled(&self) {
        self.room.stalled.cancelled().await;
    }

    /// Encodes and queues one notification, waiting for room. `false`: nothing was sent
    /// (the connection is gone, the client did not opt in, or it cannot be encoded or sent
    /// whole on this transport; the last two are logged).
    pub(crate) async fn notify<P: Serialize + ?Sized>(&self, method: &str, params: &P) -> bool {
        if self.withheld(method) {
            return false;
        }
        let Some(frame) = self.encode_notification(method, params) else {
            return false;
        };
        let Some(room) = self.room.take(frame.len()).await else {
            return false;
        };
        self.tx.send(Queued { frame, room }).await.is_ok()
    }

    /// Like [`Outbound::notify`], but makes the params only once the queue has room, so a
    /// producer waiting for a slow client holds no encoded message meanwhile.
    pub(crate) async fn notify_with<P: Serialize>(
        &self,
        method: &str,
        params: impl FnOnce() -> P,
    ) -> bool {
        self.notify_frame_with(method, || encode_notification(method, &params()))
            .await
    }

    /// Like [`Outbound::notify_with`], for a producer that encodes the whole message
    /// itself (`{"method":…,"params":…}`, as [`encode_notification`] would), typically to
    /// write a large payload straight into its final buffer.
    pub(crate) async fn notify_frame_with(
        &self,
        method: &str,
        frame: impl FnOnce() -> Result<String, serde_json::Error>,
    ) -> bool {
        if self.withheld(method) {
            return false;
        }
        // Waits for the queue to have room under its byte budget before making the
        // message, so a producer waiting for a slow client holds no encoded message.
        if !self.wait_for_room().await {
            return false;
        }
        let Ok(slot) = self.tx.reserve().await else {
            return false;
        };
        let Some(frame) = self.checked_notification(method, frame()) else {
            return false;
        };
        let Some(room) = self.room.take(frame.len()).await else {
            return false;
        };
        slot.send(Queued { frame, room });
        true
    }

    fn withheld(&self, method: &str) -> bool {
        let blocked = self.blocked.contains(method);
        if blocked {
            tracing::debug!(
                method,
                "extension notification withheld: the client did not opt in"
            );
        }
        blocked
    }

    fn encode_notification<P: Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
    ) -> Option<String> {
        self.checked_notification(method, encode_notification(method, params))
    }

    /// The encoded notification if it could be encoded and fits the transport's limit.
    fn checked_notification(
        &self,
        method: &str,
        frame: Result<String, serde_json::Error>,
    ) -> Option<String> {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                tracing::error!(method, error = %e, "failed to encode notification");
                return None;
            }
        };
        if let Some(limit) = self.max_bytes {
            if frame.len() > limit {
                tracing::error!(
                    method,
                    size = frame.len(),
                    limit,
                    "notification too large to send"
                );
                return None;
            }
        }
        Some(frame)
    }
}

/// Answers at least this large are framed in the handler's own buffer.
const FRAME_IN_PLACE_BYTES: usize = 64 * 1024;

/// `{"id":…,"result":<raw>}`, byte for byte what [`encode_result`] writes. A large answer
/// (a whole file as base64) is framed around the buffer it already lives in: growing it by
/// a few bytes and moving its text up costs far less than a fresh buffer of that size
/// (whose every page must first be faulted in) and a copy into it.
fn frame_result(id: &RequestId, raw: Box<RawValue>) -> String {
    if raw.get().len() < FRAME_IN_PLACE_BYTES {
        return encode_result(id, &raw);
    }
    let marker = RawValue::from_string("0".to_owned()).expect("0 is JSON");
    let probe = encode_result(id, &marker);
    let Some(head) = probe.strip_suffix("0}") else {
        return encode_result(id, &raw);
    };
    let mut frame = String::from(Box::<str>::from(raw));
    frame.reserve_exact(head.len() + 1);
    frame.insert_str(0, head);
    frame.push('}');
    frame
}

/// The transport's end of a connection's queue.
pub struct OutboundDrain {
    rx: mpsc::Receiver<Queued>,
    /// The bytes of the messages last handed to the transport: freed when it comes back
    /// for more, that is once it has written them.
    written: Option<OwnedSemaphorePermit>,
    room: Arc<Room>,
}

impl OutboundDrain {
    /// Waits for the next message and appends it and every message already queued behind
    /// it to `batch`, so that a burst costs the transport one flush. `false` once the
    /// connection has ended and everything queued was taken. Calling it again means the
    /// previous batch was written: its bytes are room again.
    pub async fn next_batch(&mut self, batch: &mut Vec<String>) -> bool {
        let Some(first) = self.recv().await else {
            return false;
        };
        batch.push(first);
        while let Ok(next) = self.rx.try_recv() {
            batch.push(self.hand_over(next));
        }
        true
    }

    /// The next message, one at a time; `None` once the connection has ended. Calling it
    /// again means the previous message was written.
    pub async fn recv(&mut self) -> Option<String> {
        self.written = None;
        let queued = self.rx.recv().await?;
        Some(self.hand_over(queued))
    }

    fn hand_over(&mut self, queued: Queued) -> String {
        match &mut self.written {
            Some(written) => written.merge(queued.room),
            None => self.written = Some(queued.room),
        }
        queued.frame
    }

    /// A message already queued, without waiting.
    #[cfg(test)]
    pub(crate) fn try_recv(&mut self) -> Option<String> {
        let queued = self.rx.try_recv().ok()?;
        Some(self.hand_over(queued))
    }

    /// Runs one write of the transport (`write` hands data to the peer), giving up on the
    /// peer when it takes longer than `connection.stalled_peer_timeout_ms`: a peer that
    /// accepts nothing for that long has stopped reading. Giving up ends the connection
    /// (its session detaches, what was queued or reserved for it is freed) and is logged
    /// once at warn. `None`: the peer was given up on; the transport stops writing.
    pub async fn write_or_give_up<T>(
        &self,
        transport: &'static str,
        write: impl Future<Output = T>,
    ) -> Option<T> {
        match tokio::time::timeout(self.room.stalled_peer_timeout, write).await {
            Ok(done) => Some(done),
            Err(_) => {
                self.give_up(transport);
                None
            }
        }
    }

    fn give_up(&self, transport: &'static str) {
        if self.room.stalled.is_cancelled() {
            return;
        }
        tracing::warn!(
            transport,
            timeout_ms = self.room.stalled_peer_timeout.as_millis() as u64,
            "the peer stopped reading; closing its connection"
        );
        self.room.stalled.cancel();
    }

    /// The queue as a channel receiver, for a transport whose writer takes messages from a
    /// channel of its own (the relay's reliable stream). A message's bytes are freed once
    /// the channel took it; from there on the transport's own bounds hold it.
    pub fn into_receiver(mut self) -> mpsc::Receiver<String> {
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    next = self.recv() => next,
                    () = tx.closed() => None,
                };
                let Some(frame) = next else { break };
                if tx.send(frame).await.is_err() {
                    break;
                }
            }
        });
        rx
    }
}

impl Drop for OutboundDrain {
    /// Producers still waiting for room learn that the connection is gone.
    fn drop(&mut self) {
        self.room.bytes.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_batch_takes_everything_queued_and_the_drain_ends_with_the_producers() {
        let (outbound, mut drain) = outbound_queue(8, None);
        for i in 0..3 {
            assert!(outbound.notify("n", &i).await);
        }
        let mut batch = Vec::new();
        assert!(drain.next_batch(&mut batch).await);
        assert_eq!(batch.len(), 3);
        drop(outbound);
        assert!(!drain.next_batch(&mut batch).await);
    }

    #[test]
    fn large_answers_are_framed_in_place_exactly_as_small_ones_are_encoded() {
        for len in [10, FRAME_IN_PLACE_BYTES, FRAME_IN_PLACE_BYTES * 3] {
            let text = format!(r#"{{"dataBase64":"{}"}}"#, "QUJD".repeat(len / 4));
            let raw = RawValue::from_string(text).unwrap();
            for id in [RequestId::Int(7), RequestId::Str("a\"b".into())] {
                let expected = encode_result(&id, &raw);
                assert_eq!(frame_result(&id, raw.clone()), expected);
            }
        }
    }

    fn limits(bytes: usize) -> QueueLimits {
        QueueLimits {
            bytes,
            ..QueueLimits::default()
        }
    }

    #[tokio::test]
    async fn producers_wait_for_bytes_until_the_transport_has_written_a_batch() {
        let (outbound, mut drain) = outbound_queue_with(limits(100), None);
        assert!(outbound.notify("n", &"x".repeat(60)).await);
        let text = "y".repeat(60);
        let second = outbound.notify("n", &text);
        tokio::pin!(second);
        let waited = tokio::time::timeout(Duration::from_millis(50), &mut second).await;
        assert!(waited.is_err(), "a message over the byte budget was queued");
        let mut batch = Vec::new();
        assert!(drain.next_batch(&mut batch).await);
        // Taken but not yet written: its bytes are still held.
        let still = tokio::time::timeout(Duration::from_millis(50), &mut second).await;
        assert!(
            still.is_err(),
            "bytes were freed before the batch was written"
        );
        batch.clear();
        let (more, sent) = tokio::join!(drain.next_batch(&mut batch), second);
        assert!(more && sent);
    }

    #[tokio::test]
    async fn a_message_above_the_budget_is_admitted_alone() {
        let (outbound, mut drain) = outbound_queue_with(limits(10), None);
        assert!(outbound.notify("n", &"z".repeat(100)).await);
        assert!(drain.recv().await.unwrap().len() > 100);
    }

    #[tokio::test]
    async fn a_reservation_holds_room_until_its_answer_is_written() {
        let (outbound, mut drain) = outbound_queue_with(limits(1000), None);
        let slot = ResponseRoom::default();
        assert!(outbound.reserve(&slot, 900).await);
        let blocked = tokio::time::timeout(Duration::from_millis(50), outbound.wait_for_room());
        assert!(blocked.await.is_ok(), "100 bytes are still free");
        let answer = serde_json::value::to_raw_value(&"a".repeat(500)).unwrap();
        outbound
            .respond_reserved(&RequestId::Int(1), Ok(answer), slot.take())
            .await;
        // The answer kept what it needed of the reservation and gave back the rest.
        let frame = drain.recv().await.unwrap();
        assert_eq!(drain.room.bytes.available_permits(), 1000 - frame.len());
        // Coming back for more means it was written: the budget is whole again.
        let next = tokio::time::timeout(Duration::from_millis(10), drain.recv()).await;
        assert!(next.is_err());
        assert_eq!(drain.room.bytes.available_permits(), 1000);
    }

    /// A reservation that reached the whole budget keeps it while its answer grows: given
    /// back and taken again at each step, it let another request make an answer nobody
    /// had charged (three reads of a size-0 procfs file grew to 2 GB together).
    #[tokio::test]
    async fn a_reservation_of_the_whole_budget_keeps_it_while_it_grows() {
        let (outbound, _drain) = outbound_queue_with(limits(1000), None);
        let growing = ResponseRoom::default();
        assert!(outbound.reserve(&growing, 600).await);
        assert!(outbound.reserve(&growing, 600).await);
        // Another request waits for room behind it.
        let other = tokio::spawn({
            let outbound = outbound.clone();
            async move { outbound.reserve(&ResponseRoom::default(), 1).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        for _ in 0..3 {
            let more =
                tokio::time::timeout(Duration::from_millis(100), outbound.reserve(&growing, 600));
            assert!(
                more.await.unwrap(),
                "the holder of the whole budget keeps it"
            );
            assert!(!other.is_finished(), "no other request gets room meanwhile");
        }
        drop(growing.take());
        assert!(other.await.unwrap());
    }

    #[tokio::test]
    async fn dropping_the_drain_wakes_producers_waiting_for_room() {
        let (outbound, drain) = outbound_queue_with(limits(10), None);
        assert!(outbound.notify("n", &"c".repeat(20)).await);
        let waiting = tokio::spawn({
            let outbound = outbound.clone();
            async move { outbound.notify("n", &"d").await }
        });
        drop(drain);
        assert!(!waiting.await.unwrap());
    }

    #[tokio::test]
    async fn oversized_responses_become_errors_and_oversized_notifications_are_dropped() {
        let (outbound, mut drain) = outbound_queue(8, Some(64));
        let big = serde_json::value::to_raw_value(&"x".repeat(100)).unwrap();
        outbound.respond(&RequestId::Int(7), Ok(big)).await;
        let answer: serde_json::Value = serde_json::from_str(&drain.recv().await.unwrap()).unwrap();
        assert_eq!(answer["id"], 7);
        assert!(answer["error"]["message"].is_string(), "{answer}");
        assert!(!outbound.notify("n", &"y".repeat(100)).await);
    }
}

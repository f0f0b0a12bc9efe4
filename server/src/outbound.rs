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

use std::collections::HashSet;
use std::sync::Arc;

use exec_server_proto::jsonrpc::{encode_error, encode_notification, encode_result};
use exec_server_proto::{RequestId, RpcError};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::mpsc;

/// Makes one connection's outbound queue, holding at most `capacity` messages
/// (`connection.outbound_queue_messages`); `max_message_bytes` is the largest message the
/// transport can carry, if it has a limit (relay streams, PROTOCOL §2.5).
pub fn outbound_queue(
    capacity: usize,
    max_message_bytes: Option<usize>,
) -> (Outbound, OutboundDrain) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let outbound = Outbound {
        tx,
        max_bytes: max_message_bytes,
        blocked: Arc::default(),
    };
    (outbound, OutboundDrain { rx })
}

/// The producers' end of a connection's queue: encoded JSON messages.
#[derive(Clone)]
pub struct Outbound {
    tx: mpsc::Sender<String>,
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
        let mut frame = match result {
            Ok(raw) => frame_result(id, raw),
            Err(error) => encode_error(id, &error),
        };
        if let Some(limit) = self.max_bytes {
            if frame.len() > limit {
                frame = encode_error(id, &RpcError::response_too_large(frame.len(), limit));
            }
        }
        // A closed queue means the connection is gone; its requests go unanswered (§3.5).
        let _ = self.tx.send(frame).await;
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
        self.tx.send(frame).await.is_ok()
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
        let Ok(room) = self.tx.reserve().await else {
            return false;
        };
        let Some(frame) = self.checked_notification(method, frame()) else {
            return false;
        };
        room.send(frame);
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
    rx: mpsc::Receiver<String>,
}

impl OutboundDrain {
    /// Waits for the next message and appends it and every message already queued behind
    /// it to `batch`, so that a burst costs the transport one flush. `false` once the
    /// connection has ended and everything queued was taken.
    pub async fn next_batch(&mut self, batch: &mut Vec<String>) -> bool {
        let Some(first) = self.rx.recv().await else {
            return false;
        };
        batch.push(first);
        while let Ok(next) = self.rx.try_recv() {
            batch.push(next);
        }
        true
    }

    /// The next message, one at a time; `None` once the connection has ended.
    pub async fn recv(&mut self) -> Option<String> {
        self.rx.recv().await
    }

    /// A message already queued, without waiting.
    #[cfg(test)]
    pub(crate) fn try_recv(&mut self) -> Option<String> {
        self.rx.try_recv().ok()
    }

    /// The queue as a channel receiver, for a transport whose writer takes messages from a
    /// channel of its own (the relay's reliable stream).
    pub fn into_receiver(self) -> mpsc::Receiver<String> {
        self.rx
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

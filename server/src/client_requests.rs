//! Requests the server sends its client (`network/policyRequest`, CODEX-NETWORK.md §3.4),
//! and the answers that come back on the client's connection.
//!
//! Each session numbers its requests 1, 2, … and keeps the pending ones by id. An answer
//! is handed to the one waiting for it; one for an id nobody waits for any more (it was
//! given up, or never sent) is dropped. At most [`MAX_PENDING`] requests wait at once: a
//! client that never answers costs a bounded table, and the requester is told at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::oneshot;

/// Requests of one session that may wait for their answer at once.
pub const MAX_PENDING: usize = 1024;

/// A client's answer: its `result`, or its `error` object.
pub type ClientAnswer = Result<Value, Value>;

/// Why a request to the client got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoAnswer {
    /// [`MAX_PENDING`] requests already wait.
    TooManyPending,
    /// The session has no connection, or it went away before the answer.
    Disconnected,
}

#[derive(Default)]
pub(crate) struct ClientRequests {
    next_id: AtomicI64,
    pending: Mutex<HashMap<i64, oneshot::Sender<ClientAnswer>>>,
}

/// A request's place in the table; leaving it (dropping) gives it up.
pub(crate) struct Pending {
    requests: Arc<ClientRequests>,
    pub(crate) id: i64,
    pub(crate) answer: oneshot::Receiver<ClientAnswer>,
}

impl ClientRequests {
    /// Takes the next id and a place for its answer.
    pub(crate) fn register(self: &Arc<Self>) -> Result<Pending, NoAnswer> {
        let mut pending = self.lock();
        if pending.len() >= MAX_PENDING {
            return Err(NoAnswer::TooManyPending);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, answer) = oneshot::channel();
        pending.insert(id, tx);
        Ok(Pending {
            requests: Arc::clone(self),
            id,
            answer,
        })
    }

    /// Hands `answer` to the request `id` waits for; `false` when none does.
    pub(crate) fn answer(&self, id: i64, answer: ClientAnswer) -> bool {
        let waiting = self.lock().remove(&id);
        waiting.is_some_and(|tx| tx.send(answer).is_ok())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, oneshot::Sender<ClientAnswer>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.requests.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_reach_their_request_and_stray_ones_are_dropped() {
        let requests = Arc::new(ClientRequests::default());
        let mut first = requests.register().unwrap();
        let second = requests.register().unwrap();
        assert_eq!((first.id, second.id), (1, 2));
        assert!(requests.answer(1, Ok(Value::Bool(true))));
        assert_eq!(first.answer.try_recv().unwrap(), Ok(Value::Bool(true)));
        assert!(!requests.answer(1, Ok(Value::Null)), "answered twice");
        assert!(!requests.answer(99, Ok(Value::Null)), "never asked");
        drop(second);
        assert!(!requests.answer(2, Ok(Value::Null)), "given up");
    }

    #[test]
    fn the_table_is_bounded() {
        let requests = Arc::new(ClientRequests::default());
        let held: Vec<_> = (0..MAX_PENDING)
            .map(|_| requests.register().unwrap())
            .collect();
        assert_eq!(requests.register().err(), Some(NoAnswer::TooManyPending));
        drop(held);
        assert!(requests.register().is_ok());
    }
}

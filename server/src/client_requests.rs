//! Requests the server sends its client (`network/policyRequest`, CODEX-NETWORK.md §3.4),
//! and the answers that come back on the client's connection.
//!
//! Each session numbers its requests 1, 2, … and keeps the pending ones by id. An answer
//! is handed to the one waiting for it; one for an id nobody waits for any more (it was
//! given up, or never sent) is dropped. At most [`MAX_PENDING`] requests wait at once: a
//! client that never answers costs a bounded table, and the requester is told at once.
//!
//! The table is shared fairly by its owners (the session's processes): with `n` of them
//! asking, each may hold `MAX_PENDING / n`. One that asks for more is refused, and an
//! owner below its share that finds the table full takes the place of the oldest request
//! of the owner holding the most, which is answered as if the client had gone (a deny).
//! A child that floods its proxy cannot keep its siblings' requests from the client.

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
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    by_id: HashMap<i64, Waiting>,
    per_owner: HashMap<String, usize>,
}

struct Waiting {
    owner: String,
    answer: oneshot::Sender<ClientAnswer>,
}

/// A request's place in the table; leaving it (dropping) gives it up.
pub(crate) struct Pending {
    requests: Arc<ClientRequests>,
    pub(crate) id: i64,
    pub(crate) answer: oneshot::Receiver<ClientAnswer>,
}

impl ClientRequests {
    /// Takes the next id and a place for its answer, within `owner`'s fair share.
    pub(crate) fn register(self: &Arc<Self>, owner: &str) -> Result<Pending, NoAnswer> {
        let mut table = self.lock();
        let mine = table.per_owner.get(owner).copied().unwrap_or(0);
        let owners = table.per_owner.len() + usize::from(mine == 0);
        if mine >= (MAX_PENDING / owners).max(1) {
            return Err(NoAnswer::TooManyPending);
        }
        if table.by_id.len() >= MAX_PENDING {
            // Someone holds more than their share (the shares add up to no more than the
            // table): their oldest request makes room.
            table.evict_oldest_of_largest();
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, answer) = oneshot::channel();
        table.insert(id, owner, tx);
        Ok(Pending {
            requests: Arc::clone(self),
            id,
            answer,
        })
    }

    /// Hands `answer` to the request `id` waits for; `false` when none does.
    pub(crate) fn answer(&self, id: i64, answer: ClientAnswer) -> bool {
        let waiting = self.lock().remove(id);
        waiting.is_some_and(|tx| tx.send(answer).is_ok())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Table {
    fn insert(&mut self, id: i64, owner: &str, answer: oneshot::Sender<ClientAnswer>) {
        *self.per_owner.entry(owner.to_owned()).or_default() += 1;
        let owner = owner.to_owned();
        self.by_id.insert(id, Waiting { owner, answer });
    }

    fn remove(&mut self, id: i64) -> Option<oneshot::Sender<ClientAnswer>> {
        let waiting = self.by_id.remove(&id)?;
        if let Some(count) = self.per_owner.get_mut(&waiting.owner) {
            *count -= 1;
            if *count == 0 {
                self.per_owner.remove(&waiting.owner);
            }
        }
        Some(waiting.answer)
    }

    /// Drops the oldest request of the owner with the most (its waiter sees no answer).
    fn evict_oldest_of_largest(&mut self) {
        let Some(largest) = self
            .per_owner
            .iter()
            .max_by_key(|(_, count)| **count)
            .map(|(owner, _)| owner.clone())
        else {
            return;
        };
        let oldest = self
            .by_id
            .iter()
            .filter(|(_, waiting)| waiting.owner == largest)
            .map(|(id, _)| *id)
            .min();
        if let Some(id) = oldest {
            self.remove(id);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.requests.lock().remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_reach_their_request_and_stray_ones_are_dropped() {
        let requests = Arc::new(ClientRequests::default());
        let mut first = requests.register("p").unwrap();
        let second = requests.register("p").unwrap();
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
            .map(|_| requests.register("p").unwrap())
            .collect();
        assert_eq!(requests.register("p").err(), Some(NoAnswer::TooManyPending));
        drop(held);
        assert!(requests.register("p").is_ok());
    }

    #[test]
    fn a_full_table_makes_room_for_an_owner_below_its_share() {
        let requests = Arc::new(ClientRequests::default());
        let mut hog: Vec<_> = (0..MAX_PENDING)
            .map(|_| requests.register("hog").unwrap())
            .collect();
        // A second owner's share is half the table: the hog's oldest request gives way,
        // and its waiter sees no answer.
        let sibling = requests.register("sibling").unwrap();
        assert!(hog[0].answer.try_recv().is_err());
        assert!(!requests.answer(hog[0].id, Ok(Value::Null)), "evicted");
        assert!(requests.answer(sibling.id, Ok(Value::Bool(true))));
        // The hog is now over its half and is refused, until it is back under it.
        let _sibling_more: Vec<_> = (0..MAX_PENDING / 2)
            .map(|_| requests.register("sibling").unwrap())
            .collect();
        assert_eq!(
            requests.register("hog").err(),
            Some(NoAnswer::TooManyPending)
        );
        hog.truncate(MAX_PENDING / 4);
        assert!(requests.register("hog").is_ok());
    }
}

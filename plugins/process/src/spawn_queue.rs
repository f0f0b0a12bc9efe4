//! The spawner threads' queue (fair share): each session's spawns in arrival order, the
//! sessions served in turn. A few threads create every process ([`crate::spawn`]), so with
//! a single first-come first-served queue a session that keeps `dispatch.max_in_flight`
//! starts waiting would put every other session's start behind all of them; taking turns,
//! a start waits for at most one spawn of each other session that has one waiting.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};

/// Who a job is for: one key per session.
pub(crate) type Owner = u64;

pub(crate) struct FairQueue<T> {
    state: Mutex<QueueState<T>>,
    ready: Condvar,
}

struct QueueState<T> {
    jobs: HashMap<Owner, VecDeque<T>>,
    /// Owners with jobs waiting, in the order they are served next.
    turns: VecDeque<Owner>,
}

impl<T> FairQueue<T> {
    pub fn new() -> Self {
        Self {
            state: Mutex::new(QueueState {
                jobs: HashMap::new(),
                turns: VecDeque::new(),
            }),
            ready: Condvar::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, QueueState<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job` behind `owner`'s earlier ones.
    pub fn push(&self, owner: Owner, job: T) {
        let mut state = self.state();
        let queue = state.jobs.entry(owner).or_default();
        queue.push_back(job);
        if queue.len() == 1 {
            state.turns.push_back(owner);
        }
        drop(state);
        self.ready.notify_one();
    }

    /// The next job: the oldest of the owner whose turn it is. Blocks while there is none.
    pub fn pop(&self) -> T {
        let mut state = self.state();
        loop {
            if let Some(job) = state.take_turn() {
                return job;
            }
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl<T> QueueState<T> {
    fn take_turn(&mut self) -> Option<T> {
        let owner = self.turns.pop_front()?;
        let queue = self.jobs.get_mut(&owner)?;
        let job = queue.pop_front();
        if queue.is_empty() {
            self.jobs.remove(&owner);
        } else {
            self.turns.push_back(owner);
        }
        job
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_take_turns_and_each_owner_keeps_its_order() {
        let queue = FairQueue::new();
        for n in 0..4 {
            queue.push(1, format!("flood-{n}"));
        }
        queue.push(2, "victim-0".to_owned());
        queue.push(2, "victim-1".to_owned());
        queue.push(3, "other-0".to_owned());
        let order: Vec<String> = (0..7).map(|_| queue.pop()).collect();
        assert_eq!(
            order,
            ["flood-0", "victim-0", "other-0", "flood-1", "victim-1", "flood-2", "flood-3"]
        );
    }

    #[test]
    fn a_waiting_pop_takes_a_job_pushed_later() {
        let queue = std::sync::Arc::new(FairQueue::new());
        let popper = {
            let queue = std::sync::Arc::clone(&queue);
            std::thread::spawn(move || queue.pop())
        };
        queue.push(7, 42);
        assert_eq!(popper.join().unwrap(), 42);
    }
}

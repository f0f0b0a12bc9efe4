//! Worker threads for work that holds a [`SlotPermit`]: blocking calls that must not take
//! more OS threads than their pool has slots.
//!
//! The runtime's own blocking pool cannot promise that: a task that frees its slot as it
//! ends lets the next task start before the thread that ran it is idle again, so the
//! runtime starts another thread, and under steady churn the threads outnumber the slots
//! (and stay for their keep-alive). Here the permit is given back only after the worker
//! has made itself available again, and a thread is started only when every available
//! worker already has a job waiting for it. So the threads never outnumber the work that
//! holds permits, and with a [`FairSlots`](crate::FairSlots) pool of `total` slots never
//! exceed `total`. Idle workers exit after [`KEEP_ALIVE`].

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::fair_slots::SlotPermit;

/// How long an idle worker waits for a job before it exits.
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// A set of worker threads, started on demand.
#[derive(Clone)]
pub struct WorkerThreads {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WorkerThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerThreads")
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

struct Shared {
    /// Thread name, for `ps` and debuggers.
    name: &'static str,
    state: Mutex<State>,
    /// Wakes an available worker when a job arrives.
    job_ready: Condvar,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Workers waiting for a job, or started and about to take one from `jobs`.
    available: usize,
    threads: usize,
}

struct Job {
    work: Box<dyn FnOnce() + Send>,
    /// Given back once the worker that ran `work` is available again.
    permit: SlotPermit,
}

impl WorkerThreads {
    pub fn new(name: &'static str) -> Self {
        Self {
            shared: Arc::new(Shared {
                name,
                state: Mutex::new(State::default()),
                job_ready: Condvar::new(),
            }),
        }
    }

    /// Runs `work` on a worker thread; `permit` is held until that worker is available
    /// again, even if nobody waits for the result any more. A panic in `work` is caught
    /// (the result is then never sent) and the worker goes on.
    pub fn spawn(&self, permit: SlotPermit, work: impl FnOnce() + Send + 'static) {
        let mut state = self.shared.lock();
        state.jobs.push_back(Job {
            work: Box::new(work),
            permit,
        });
        if state.jobs.len() <= state.available {
            drop(state);
            self.shared.job_ready.notify_one();
            return;
        }
        // Counted as available at once: until it runs, the new thread is the worker that
        // takes the job, and a job queued meanwhile must not start yet another thread.
        state.threads += 1;
        state.available += 1;
        drop(state);
        let shared = Arc::clone(&self.shared);
        let started = std::thread::Builder::new()
            .name(self.shared.name.to_owned())
            .spawn(move || shared.work());
        if let Err(error) = started {
            // The job stays queued for the next worker that becomes available.
            let mut state = self.shared.lock();
            state.threads -= 1;
            state.available -= 1;
            drop(state);
            tracing::error!(pool = self.shared.name, %error, "cannot start a worker thread");
        }
    }

    /// Worker threads alive now.
    pub fn threads(&self) -> usize {
        self.shared.lock().threads
    }
}

/// Blocking work in a bounded, fair share of worker threads: at most `per_session` jobs
/// of one session and `total` of all run at once, further ones wait round-robin by
/// session. For plugins whose handlers read the host's files (discovery, configuration)
/// and must not each take a thread of the runtime's unbounded blocking pool.
#[derive(Debug)]
pub struct SlottedThreads {
    slots: crate::FairSlots,
    threads: WorkerThreads,
}

impl SlottedThreads {
    /// `name` names the slot pool (in errors and metrics) and the threads.
    pub fn new(name: &'static str, total: usize, per_session: usize) -> Self {
        Self {
            slots: crate::FairSlots::new(name, total, per_session),
            threads: WorkerThreads::new(name),
        }
    }

    /// Runs `work` for `session` once a slot is free; `None` when it panicked. Dropping
    /// the future gives up the wait; once `work` runs it runs to its end in its slot.
    pub async fn run<T: Send + 'static>(
        &self,
        session: &str,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let permit = self.slots.acquire(session).await;
        let (result_tx, result) = tokio::sync::oneshot::channel();
        self.threads.spawn(permit, move || {
            let _ = result_tx.send(work());
        });
        result.await.ok()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is complete before the lock is released.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A worker's life: take jobs until none comes for [`KEEP_ALIVE`].
    fn work(&self) {
        // `spawn` counted this worker as available.
        let mut state = self.lock();
        loop {
            let job = loop {
                if let Some(job) = state.jobs.pop_front() {
                    break job;
                }
                let (next, waited) = self
                    .job_ready
                    .wait_timeout(state, KEEP_ALIVE)
                    .unwrap_or_else(|e| e.into_inner());
                state = next;
                if waited.timed_out() && state.jobs.is_empty() {
                    state.available -= 1;
                    state.threads -= 1;
                    return;
                }
            };
            state.available -= 1;
            drop(state);
            let _ = std::panic::catch_unwind(AssertUnwindSafe(job.work));
            state = self.lock();
            state.available += 1;
            drop(state);
            // Only now may the slot's next holder start its work: it finds this worker.
            drop(job.permit);
            state = self.lock();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::FairSlots;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn threads_never_outnumber_the_slots_under_churn() {
        let slots = FairSlots::new("test_worker_churn", 4, 4);
        let workers = WorkerThreads::new("test-worker");
        let (done, finished) = mpsc::channel();
        for _ in 0..2_000 {
            let permit = slots.acquire("churn").await;
            let done = done.clone();
            workers.spawn(permit, move || done.send(()).unwrap());
            assert!(workers.threads() <= 4, "{} threads", workers.threads());
        }
        for _ in 0..2_000 {
            finished.recv().unwrap();
        }
        assert!(workers.threads() <= 4);
    }

    #[tokio::test]
    async fn a_panicking_job_gives_its_slot_back_and_the_worker_goes_on() {
        let slots = FairSlots::new("test_worker_panic", 1, 1);
        let workers = WorkerThreads::new("test-worker");
        workers.spawn(slots.acquire("a").await, || panic!("a bug in the job"));
        let permit = slots.acquire("a").await;
        let (tx, rx) = tokio::sync::oneshot::channel();
        workers.spawn(permit, move || tx.send(7).unwrap());
        assert_eq!(rx.await, Ok(7));
        assert_eq!(workers.threads(), 1);
    }

    /// One session's jobs run one at a time (its share), while another session's job
    /// runs beside them; a panic comes back as `None`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slotted_threads_keep_each_session_to_its_share() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let pool = Arc::new(SlottedThreads::new("test-slotted", 2, 1));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut jobs = Vec::new();
        for _ in 0..8 {
            let (pool, running, most) = (pool.clone(), running.clone(), most.clone());
            jobs.push(tokio::spawn(async move {
                pool.run("greedy", move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    running.fetch_sub(1, Ordering::SeqCst);
                })
                .await
            }));
        }
        // The other session is served while the greedy one still has jobs queued.
        assert_eq!(pool.run("other", || 7).await, Some(7));
        assert!(jobs.iter().any(|job| !job.is_finished()));
        for job in jobs {
            assert_eq!(job.await.unwrap(), Some(()));
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
        assert_eq!(pool.run("other", || panic!("a bug")).await, None::<()>);
    }
}

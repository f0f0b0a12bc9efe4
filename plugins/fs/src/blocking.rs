//! Filesystem work off the async reactor, in a bounded and fair share of the plugin's
//! worker threads: every syscall of an in-process `fs/*` method runs here, so a slow
//! disk, a dead network mount or a FIFO nobody reads stalls only the request that waits
//! for it — and never more than its session's share.
//!
//! At most `fs.max_blocking_per_session` operations of one session and
//! `fs.max_blocking_total` of all sessions run at once; further requests wait, served
//! round-robin by session ([`FairSlots`]). An operation has `fs.operation_timeout_ms` from
//! the moment it gets its slot: at the deadline its request is answered with an error that
//! names the key. A thread stuck in the kernel cannot be cancelled, so its slot stays
//! taken (counted as overdue) until the call returns — a session can stall only its own
//! share. The work runs on the plugin's own worker threads, which never outnumber the
//! slots. OS errors are mapped once, per PROTOCOL §5.3.

use std::time::{Duration, Instant};

use exec_server_core::proto::RpcError;
use exec_server_core::{FairSlots, Session, WorkerThreads};

use crate::config::FsConfig;

/// The threads in-process file operations run on, and who may use them when.
#[derive(Debug)]
pub(crate) struct BlockingPool {
    /// One slot per running operation, shared round-robin by session.
    slots: FairSlots,
    /// The threads the operations run on: at most one per slot.
    threads: WorkerThreads,
    timeout: Duration,
}

/// How long work that holds a shared slot (an fs worker thread, an fs helper) waits in all
/// for the reader of a FIFO or device it writes. The reader, not the server, decides when
/// there is room, so this bound — not `fs.operation_timeout_ms` or
/// `sandbox.helper_timeout_ms` — is how long a FIFO nobody reads keeps a slot from the
/// other sessions. `fs/writeFile` in the server waits on the reactor instead, in no slot,
/// until the operation's own deadline.
pub(crate) const PEER_WAIT_IN_SLOT: Duration = Duration::from_secs(2);

/// When an operation must be done by, and how to say that it was not.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Instant,
    method: &'static str,
    timeout: Duration,
    /// What ends at `at`: the operation, or its wait for a peer ([`PEER_WAIT_IN_SLOT`]).
    peer_wait: bool,
}

impl Deadline {
    pub(crate) fn new(method: &'static str, timeout: Duration) -> Self {
        let now = Instant::now();
        // A configured time-out too large to add is as good as none: a year away.
        let at = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600));
        Self {
            at,
            method,
            timeout,
            peer_wait: false,
        }
    }

    /// The deadline of `method` in the fs helper: none of its own, as the server's
    /// `sandbox.helper_timeout_ms` ends the helper; a wait for a peer is still bounded by
    /// [`Self::for_peer_in_slot`].
    pub(crate) fn in_fs_helper(method: &'static str) -> Self {
        Self::new(method, Duration::MAX)
    }

    /// The deadline of waiting for a FIFO's or device's reader in work that holds a shared
    /// slot: [`PEER_WAIT_IN_SLOT`] from now, or this one if it comes first.
    pub(crate) fn for_peer_in_slot(&self) -> Self {
        let peer = Self {
            peer_wait: true,
            ..Self::new(self.method, PEER_WAIT_IN_SLOT)
        };
        if peer.at < self.at {
            peer
        } else {
            *self
        }
    }

    pub(crate) fn instant(&self) -> Instant {
        self.at
    }

    /// Time left; `None` once the deadline has passed.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        self.at
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
    }

    /// The method's answer when it missed the deadline.
    pub(crate) fn missed(&self) -> RpcError {
        let ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        if self.peer_wait {
            return RpcError::fs_reader_stalled(self.method, ms);
        }
        RpcError::fs_operation_timed_out(self.method, ms)
    }
}

impl BlockingPool {
    pub(crate) fn new(config: &FsConfig) -> Self {
        Self {
            slots: FairSlots::new(
                "fs_blocking",
                config.max_blocking_total,
                config.max_blocking_per_session,
            ),
            threads: WorkerThreads::new("exec-fs-worker"),
            timeout: Duration::from_millis(config.operation_timeout_ms),
        }
    }

    /// Runs `work` for `method` on a blocking thread in `session`'s share, once a slot is
    /// free; `work` gets the operation's deadline. Dropping the future gives up the wait;
    /// once `work` runs, it runs to its end and holds its slot until then.
    pub(crate) async fn run<T, F>(
        &self,
        session: &Session,
        method: &'static str,
        work: F,
    ) -> Result<T, RpcError>
    where
        T: Send + 'static,
        F: FnOnce(Deadline) -> Result<T, RpcError> + Send + 'static,
    {
        let permit = self.slots.acquire(session.id()).await;
        let deadline = Deadline::new(method, self.timeout);
        let report = permit.deadline();
        let (result_tx, result) = tokio::sync::oneshot::channel();
        self.threads.spawn(permit, move || {
            // Nobody may be waiting any more (the deadline passed, the request was dropped).
            let _ = result_tx.send(work(deadline));
        });
        match tokio::time::timeout_at(deadline.instant().into(), result).await {
            Ok(Ok(result)) => result,
            Ok(Err(_panicked)) => Err(RpcError::internal("filesystem task failed")),
            Err(_elapsed) => {
                report.missed();
                tracing::debug!(
                    session = session.id(),
                    method,
                    "filesystem operation missed its deadline"
                );
                Err(deadline.missed())
            }
        }
    }
}

/// `?` on OS results inside filesystem work: the error becomes its §5.3 answer.
pub(crate) trait IoResultExt<T> {
    fn or_rpc(self) -> Result<T, RpcError>;
}

impl<T> IoResultExt<T> for std::io::Result<T> {
    fn or_rpc(self) -> Result<T, RpcError> {
        self.map_err(|e| RpcError::from_io(&e))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::sync::Arc;

    use exec_server_core::outbound::outbound_queue;
    use exec_server_core::session::SessionRegistry;

    use super::*;

    fn session() -> Arc<Session> {
        let registry = SessionRegistry::new(Duration::from_secs(30));
        let (outbound, _drain) = outbound_queue(1, None);
        registry.create(outbound).0
    }

    fn pool(per_session: usize, total: usize, timeout_ms: u64) -> BlockingPool {
        BlockingPool::new(&FsConfig {
            operation_timeout_ms: timeout_ms,
            max_blocking_per_session: per_session,
            max_blocking_total: total,
            ..FsConfig::default()
        })
    }

    #[tokio::test]
    async fn work_runs_and_its_errors_come_back() {
        let pool = pool(2, 2, 60_000);
        let session = session();
        assert_eq!(pool.run(&session, "fs/x", |_| Ok(7)).await, Ok(7));
        let error = pool
            .run(&session, "fs/x", |_| -> Result<(), _> {
                Err(RpcError::internal("boom"))
            })
            .await;
        assert_eq!(error, Err(RpcError::internal("boom")));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stuck_call_is_answered_at_its_deadline_and_keeps_its_slot_until_it_returns() {
        let pool = pool(1, 4, 50);
        let (session, other) = (session(), session());
        let (release, stuck) = mpsc::channel::<()>();
        let answer = pool
            .run(&session, "fs/readFile", move |_| {
                // Stands for a call stuck in the kernel: it returns only when released.
                let _ = stuck.recv();
                Ok(())
            })
            .await;
        assert_eq!(
            answer,
            Err(RpcError::fs_operation_timed_out("fs/readFile", 50))
        );
        assert_eq!(
            answer.unwrap_err().message,
            "fs/readFile timed out after 50 ms (fs.operation_timeout_ms)"
        );
        // The session's share is still taken; another session's is not.
        assert_eq!(pool.slots.held_by(session.id()), 1);
        assert_eq!(pool.run(&other, "fs/x", |_| Ok(1)).await, Ok(1));
        let waiting = pool.run(&session, "fs/x", |_| Ok(2));
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), &mut waiting)
                .await
                .is_err(),
            "the session's next operation waits for its stuck one"
        );
        release.send(()).unwrap();
        assert_eq!(waiting.await, Ok(2));
        // The last slot comes back once its worker is free again, just after the answer.
        let all_back = async {
            while pool.slots.running() > 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(20), all_back)
            .await
            .expect("every slot comes back");
    }

    #[tokio::test]
    async fn the_deadline_is_handed_to_the_work() {
        let pool = pool(1, 1, 60_000);
        let left = pool
            .run(&session(), "fs/x", |deadline| Ok(deadline.remaining()))
            .await
            .unwrap()
            .unwrap();
        assert!(left <= Duration::from_secs(60) && left > Duration::from_secs(50));
        let passed = Deadline::new("fs/x", Duration::ZERO);
        assert_eq!(passed.remaining(), None);
        let unbounded = Deadline::new("fs/x", Duration::from_millis(u64::MAX));
        assert!(unbounded.remaining().is_some());
    }
}

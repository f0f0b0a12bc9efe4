//! What a request may take of the server before it goes ahead (fair share): a session's
//! quota of live processes, its quota of `process/write` bytes waiting for a process to
//! read them, and the descriptors the server keeps in reserve below its open-file limit.
//! Each refusal is -32600 and names the limit and the key that sets it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use exec_server_core::hygiene::DescriptorHeadroom;
use exec_server_core::metrics::{self, Counter};
use exec_server_core::proto::RpcError;
use exec_server_core::Quota;

/// Processes a session has from the moment `process/start` reserves the id until the
/// process's keeper is reaped, i.e. until its whole tree is gone: a daemon that outlives
/// its process's close still counts.
pub(crate) static PROCESSES: Quota = Quota::new(
    "processes",
    "live processes",
    "process.max_processes_per_session",
);

/// Bytes of `process/write` chunks a session holds while their process has not read them
/// (a child that never reads its stdin keeps a write, and every write queued behind it,
/// pending for ever).
pub(crate) static PENDING_WRITE_BYTES: Quota = Quota::new(
    "pending_write_bytes",
    "bytes of process/write data waiting for their process",
    "process.max_pending_write_bytes_per_session",
);

/// The configuration key of the start's descriptor reserve.
const FD_RESERVE_KEY: &str = "process.fd_reserve";

/// Descriptors one start opens before it reaches the spawner: the child's pipes or
/// terminal (six for pipe mode) and, sandboxed, the launcher's control socket.
const DESCRIPTORS_TO_PREPARE: u64 = 8;
/// Descriptors the spawner opens for each start afterwards: the keeper's status pipe and
/// pidfd. Starts that passed the check but have not spawned yet still need them.
const DESCRIPTORS_TO_SPAWN: u64 = 3;

/// The reserve `process/start` leaves free, and the starts on their way to the spawner.
pub(crate) struct DescriptorReserve {
    headroom: DescriptorHeadroom,
    spawning: Arc<AtomicU64>,
}

/// A start between its descriptor check and the end of its spawn; counted by
/// [`DescriptorReserve`] while it lives.
pub(crate) struct Spawning(Arc<AtomicU64>);

impl Drop for Spawning {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl DescriptorReserve {
    pub fn new(reserve: usize) -> Self {
        Self {
            headroom: DescriptorHeadroom::new(reserve),
            spawning: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Refuses a start that would leave fewer descriptors free than the reserve, counting
    /// what it will open itself and what the starts ahead of it at the spawner still will.
    /// Hold the result until the spawn is over.
    pub fn admit_start(&self) -> Result<Spawning, RpcError> {
        let ahead = self.spawning.fetch_add(1, Ordering::Relaxed);
        let spawning = Spawning(Arc::clone(&self.spawning));
        let needed = DESCRIPTORS_TO_PREPARE + DESCRIPTORS_TO_SPAWN * (ahead + 1);
        if !self.headroom.exhausted_for(needed) {
            return Ok(spawning);
        }
        refused_fd_reserve().inc();
        tracing::debug!(
            reserve = self.headroom.reserve(),
            "process start refused: the descriptor reserve is reached"
        );
        Err(RpcError::descriptor_reserve(
            "a process start",
            self.headroom.reserve(),
            self.headroom.limit().unwrap_or(0),
            FD_RESERVE_KEY,
        ))
    }
}

fn refused_fd_reserve() -> &'static Counter {
    static REFUSED: OnceLock<Counter> = OnceLock::new();
    REFUSED.get_or_init(|| {
        metrics::counter(
            "exec_server_process_starts_refused_total",
            "process/start requests refused before anything was started, by reason (quota refusals are in exec_server_quota_refusals_total).",
            &[("reason", "fd_reserve")],
        )
    })
}

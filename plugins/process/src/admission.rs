//! What a request may take of the server before it goes ahead (fair share): a session's
//! quota of live processes, its quota of `process/write` bytes waiting for a process to
//! read them, and the descriptors the server keeps in reserve below its open-file limit.
//! Each refusal is -32600 and names the limit and the key that sets it.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

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

/// Descriptors a start opens before it reaches the spawner: the child's pipes or terminal
/// (six for pipe mode) and, sandboxed, the launcher's control socket. Checked by the
/// start's handler.
pub(crate) const DESCRIPTORS_TO_PREPARE: u64 = 8;
/// Descriptors the spawner opens for a start: the keeper's status pipe and its pidfd.
/// Checked by the spawner thread that creates the process, under the reserve's lock.
pub(crate) const DESCRIPTORS_TO_SPAWN: u64 = 3;

/// The descriptors `process/start` leaves free below the open-file limit.
#[derive(Debug, Clone)]
pub(crate) struct DescriptorReserve {
    headroom: DescriptorHeadroom,
    /// Held from a check until the descriptors it admitted are open, so that two starts
    /// (or a start and the spawner) never both count the same free descriptors.
    opening: Arc<Mutex<()>>,
}

/// Admission of the descriptors a caller is about to open; open them before dropping it.
pub(crate) struct Admitted<'a> {
    _opening: MutexGuard<'a, ()>,
}

impl DescriptorReserve {
    pub fn new(reserve: usize) -> Self {
        Self {
            headroom: DescriptorHeadroom::new(reserve),
            opening: Arc::default(),
        }
    }

    /// Refuses when `needed` more descriptors would be numbered inside the reserve. The
    /// start checks what it opens itself, and the spawner what it opens for the start, so
    /// no check has to guess at the descriptors of starts still on their way.
    pub fn admit(&self, needed: u64) -> Result<Admitted<'_>, RpcError> {
        let opening = self.opening.lock().unwrap_or_else(|e| e.into_inner());
        if !self.headroom.exhausted_for(needed) {
            return Ok(Admitted { _opening: opening });
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

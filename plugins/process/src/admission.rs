//! What a request may take of the server before it goes ahead (fair share): a session's
//! quota of live processes, its quota of `process/write` bytes waiting for a process to
//! read them, and the descriptors a process holds, charged to the session's share of the
//! descriptor budget ([`exec_server_core::descriptors`]). Each refusal is -32600 and names
//! the limit and the key that sets it.

use exec_server_core::descriptors;
use exec_server_core::proto::RpcError;
use exec_server_core::{DescriptorLease, Quota, Session};

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

/// Descriptors a start holds at its peak, charged to the session's descriptor budget before
/// anything is opened: the child's three pipes, both ends (or a terminal pair), the
/// launcher's control socket pair when sandboxed, and what the spawner opens (the keeper's
/// status pipe, both ends, and its pidfd).
pub(crate) const DESCRIPTORS_TO_START: u64 = 11;

/// Descriptors a started process keeps until its keeper is reaped: the read ends of stdout
/// and stderr, the write end of stdin (`pipeStdin`), the status pipe's read end, the
/// keeper's pidfd and, sandboxed, the control socket (a terminal needs fewer).
pub(crate) const DESCRIPTORS_HELD: u64 = 6;

/// Charges a start's peak to `session`'s descriptor budget.
pub(crate) fn charge_start(session: &Session) -> Result<DescriptorLease, RpcError> {
    descriptors::charge(session.id(), DESCRIPTORS_TO_START, "a process start")
}

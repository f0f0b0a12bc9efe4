//! The collector of one process: reads its output streams, collects its exit status,
//! records every event with the next `seq` and sends the notifications (PROTOCOL §4.3, §4.4).
//!
//! One task per process does all of this in sequence, which is what keeps notifications in
//! `seq` order without further coordination. It awaits room in the connection's outbound
//! queue before reading on, so a client that stops reading pauses collection for its own
//! processes only (§2.9), and memory stays bounded by the queue plus the retention limits.
//! While the session is detached nothing waits, output keeps being recorded and old chunks
//! are evicted (§4.6, and the session cap and server budget of [`crate::output_budget`]).
//!
//! Each read goes into an allocation of its own, of one chunk's size, which is shrunk in
//! place to what the read returned: a retained chunk holds exactly its bytes (no slice of a
//! larger buffer it would keep alive), and an idle process holds no buffer at all.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use exec_server_core::audit::AuditScope;
use exec_server_core::metrics::{self, Counter, Gauge};
use exec_server_core::proto::process::{
    encode_output_notification, ClosedNotification, ExitedNotification, OutputStream, CLOSED,
    EXITED, OUTPUT,
};
use exec_server_core::{ResponseQueued, Session};
use serde::Serialize;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::keeper::{exit_code, Report, RECORD_BYTES};
use crate::managed::ManagedProcess;
use crate::sys;
use crate::table::{CollectingGuard, ProcessTable};

/// The most bytes one `read(2)` asks for, and so the largest chunk whatever
/// `process.output_chunk_bytes` says: more than a pipe holds by default (64 KiB).
const MAX_READ_BYTES: usize = 256 * 1024;
/// Reads per stream after the exit is seen and before it is recorded, so that what the
/// child wrote before exiting precedes its exit event (a descendant may write forever).
const DRAIN_READS: usize = 64;

/// One output stream of the child.
pub(crate) struct OutputSource {
    pub fd: Arc<AsyncFd<OwnedFd>>,
    pub stream: OutputStream,
}

/// What one read attempt found.
enum ReadOutcome {
    Data,
    WouldBlock,
    Eof,
}

#[derive(Clone, Copy)]
enum Which {
    Primary,
    Secondary,
}

pub(crate) struct Pump {
    pub process: Arc<ManagedProcess>,
    /// Where the exit is recorded, on behalf of the `process/start` that started it.
    pub audit: AuditScope,
    /// When the process started, and the bytes of output it has written since.
    pub started: std::time::Instant,
    pub bytes_out: u64,
    pub session: Arc<Session>,
    pub table: Arc<ProcessTable>,
    /// stdout, or the terminal.
    pub primary: Option<OutputSource>,
    /// stderr in pipe mode.
    pub secondary: Option<OutputSource>,
    /// The keeper's status pipe (non-blocking), after the `started` record; closed once the
    /// exit is recorded, so that a retained process holds no descriptor for it.
    pub status: Option<AsyncFd<OwnedFd>>,
    /// Notifications wait for the `process/start` response (§2.9 rule 4); `None` once it
    /// has been queued.
    pub response_queued: Option<ResponseQueued>,
    pub chunk_bytes: usize,
    pub closed_retention: Duration,
    /// For a process confined by the sandbox: how long output may still arrive after its
    /// exit before `sandboxDenied` is computed (`sandbox.exit_output_grace_ms`).
    pub sandboxed_grace: Option<Duration>,
}

/// Counts one running process in `/metrics` while it lives.
struct RunningProcess;

impl RunningProcess {
    fn metrics() -> &'static (Counter, Counter, Gauge) {
        static METRICS: OnceLock<(Counter, Counter, Gauge)> = OnceLock::new();
        METRICS.get_or_init(|| {
            (
                metrics::counter(
                    "exec_server_processes_started_total",
                    "Managed processes started.",
                    &[],
                ),
                metrics::counter(
                    "exec_server_processes_finished_total",
                    "Managed processes that closed or were killed with their session.",
                    &[],
                ),
                metrics::gauge(
                    "exec_server_processes_running",
                    "Managed processes not yet closed.",
                    &[],
                ),
            )
        })
    }

    fn new() -> Self {
        let (started, _, running) = Self::metrics();
        started.inc();
        running.inc();
        Self
    }
}

impl Drop for RunningProcess {
    fn drop(&mut self) {
        let (_, finished, running) = Self::metrics();
        finished.inc();
        running.dec();
    }
}

impl Pump {
    /// Counts the process as running at once (so `/metrics` shows it before
    /// `process/start` is answered), then pumps it on a task of its own.
    pub fn spawn(self) {
        let running = (RunningProcess::new(), self.table.collecting());
        tokio::spawn(self.run(running));
    }

    async fn run(mut self, running: (RunningProcess, CollectingGuard)) {
        let table = Arc::clone(&self.table);
        let closed = tokio::select! {
            _ = table.ended() => false,
            _ = self.collect() => true,
        };
        drop(running);
        if !closed {
            // The session's end killed the tree; the session's keeper registry reaps.
            return;
        }
        drop(self.primary.take());
        drop(self.secondary.take());
        tokio::select! {
            _ = table.ended() => {}
            _ = tokio::time::sleep(self.closed_retention) => table.remove(&self.process),
        }
    }

    async fn collect(&mut self) {
        let mut exited = false;
        loop {
            if exited && self.primary.is_none() && self.secondary.is_none() {
                let seq = self.process.record(|log| log.record_close());
                let closed = ClosedNotification {
                    process_id: self.process.id.clone(),
                    seq,
                };
                self.notify(CLOSED, &closed).await;
                return;
            }
            tokio::select! {
                ready = readable(&self.primary) => {
                    if ready.is_err() || matches!(self.read_once(Which::Primary).await, ReadOutcome::Eof) {
                        self.primary = None;
                    }
                }
                ready = readable(&self.secondary) => {
                    if ready.is_err() || matches!(self.read_once(Which::Secondary).await, ReadOutcome::Eof) {
                        self.secondary = None;
                    }
                }
                ready = status_readable(&self.status), if !exited => {
                    drop(ready);
                    exited = self.on_exit_ready().await;
                    if exited {
                        self.status = None;
                    }
                }
            }
        }
    }

    /// The status pipe is readable: drain what the child left in its streams, then collect
    /// and record the exit. Returns whether the exit was recorded.
    async fn on_exit_ready(&mut self) -> bool {
        let Some(status) = &self.status else {
            return false;
        };
        let code = match status.try_io(Interest::READABLE, read_exit) {
            Ok(code) => code,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) => {
                tracing::warn!(process = ?self.process.id, error = %e, "exit status not collectable");
                -1
            }
        };
        self.drain().await;
        let (seq, sandbox_denied) = match self.sandboxed_grace {
            Some(grace) => {
                tokio::time::sleep(grace).await;
                self.drain().await;
                self.process.record(|log| log.record_sandboxed_exit(code))
            }
            None => (self.process.record(|log| log.record_exit(code)), false),
        };
        let exited = ExitedNotification {
            process_id: self.process.id.clone(),
            seq,
            exit_code: code,
            sandbox_denied,
        };
        // Recorded before the client hears of it, so what it does next is recorded after.
        self.record_exit(code, sandbox_denied);
        self.notify(EXITED, &exited).await;
        true
    }

    /// `process.exited`: the status, how long it ran, its output, and whether the server
    /// killed its group because the session ended.
    fn record_exit(&self, code: i32, sandbox_denied: bool) {
        let killed_at_session_end = self.table.session_has_ended();
        self.audit.emit("process.exited", |_| {
            let mut details = serde_json::Map::new();
            details.insert("processId".into(), self.process.id.clone().into());
            details.insert("exitCode".into(), code.into());
            let duration = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            details.insert("durationMs".into(), duration.into());
            details.insert("bytesOut".into(), self.bytes_out.into());
            details.insert("sandboxDenied".into(), sandbox_denied.into());
            if killed_at_session_end {
                details.insert(
                    "killedBy".into(),
                    "session end (SIGKILL to its group)".into(),
                );
            }
            details
        });
    }

    /// Reads what the child left in its streams, a bounded number of reads per stream.
    async fn drain(&mut self) {
        for which in [Which::Primary, Which::Secondary] {
            for _ in 0..DRAIN_READS {
                match self.read_once(which).await {
                    ReadOutcome::Data => {}
                    ReadOutcome::WouldBlock => break,
                    ReadOutcome::Eof => {
                        *self.source_mut(which) = None;
                        break;
                    }
                }
            }
        }
    }

    fn source_mut(&mut self, which: Which) -> &mut Option<OutputSource> {
        match which {
            Which::Primary => &mut self.primary,
            Which::Secondary => &mut self.secondary,
        }
    }

    /// One non-blocking read: records and announces what it got, chunk by chunk.
    async fn read_once(&mut self, which: Which) -> ReadOutcome {
        let Some(source) = self.source_mut(which).as_ref() else {
            return ReadOutcome::Eof;
        };
        let (fd, stream) = (Arc::clone(&source.fd), source.stream);
        let capacity = self.chunk_bytes.min(MAX_READ_BYTES);
        let mut data = Vec::with_capacity(capacity);
        let read = fd.try_io(Interest::READABLE, |fd| {
            sys::read(fd.as_raw_fd(), data.spare_capacity_mut())
        });
        let n = match read {
            Ok(0) => return ReadOutcome::Eof,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return ReadOutcome::WouldBlock,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return ReadOutcome::Data,
            // A terminal's master reads EIO once no process has the slave open any more.
            Err(e) if stream == OutputStream::Pty && e.raw_os_error() == Some(libc::EIO) => {
                return ReadOutcome::Eof
            }
            Err(e) => {
                tracing::warn!(process = ?self.process.id, error = %e, "output read failed");
                return ReadOutcome::Eof;
            }
        };
        // SAFETY: read(2) initialised the first `n` bytes of the spare capacity.
        unsafe { data.set_len(n) };
        // Shrinking gives the tail back without copying (the allocator splits the block).
        data.shrink_to_fit();
        self.publish(stream, Bytes::from(data)).await;
        ReadOutcome::Data
    }

    async fn publish(&mut self, stream: OutputStream, chunk: Bytes) {
        self.bytes_out += chunk.len() as u64;
        let seq = self.process.record_output(stream, chunk.clone());
        if let Some(queued) = self.response_queued.take() {
            queued.wait().await;
        }
        // Encoded only once the client's queue has room, and not at all while the session
        // is detached (no notification is produced then, §4.4): a pump waiting for a slow
        // client holds the chunk, which is retained anyway, and nothing more.
        let process_id = &self.process.id;
        self.session
            .notify_frame_with(OUTPUT, || {
                encode_output_notification(process_id, seq, stream, &chunk)
            })
            .await;
    }

    async fn notify<P: Serialize>(&mut self, method: &str, params: &P) {
        if let Some(queued) = self.response_queued.take() {
            queued.wait().await;
        }
        self.session.notify(method, params).await;
    }
}

async fn status_readable(status: &Option<AsyncFd<OwnedFd>>) -> io::Result<()> {
    match status {
        Some(status) => status.readable().await.map(drop),
        None => std::future::pending().await,
    }
}

async fn readable(source: &Option<OutputSource>) -> io::Result<()> {
    match source {
        Some(source) => source.fd.readable().await.map(drop),
        None => std::future::pending().await,
    }
}

/// Reads the target's exit from the keeper's (non-blocking) status pipe: its exit code per
/// PROTOCOL §4.11, `WouldBlock` while it runs, or an error when the keeper ended without
/// reporting it.
pub(crate) fn read_exit(status: &OwnedFd) -> io::Result<i32> {
    loop {
        let mut record = [MaybeUninit::uninit(); RECORD_BYTES];
        let n = sys::read(status.as_raw_fd(), &mut record)?;
        if n == 0 {
            return Err(io::Error::other(
                "the process keeper ended without reporting the exit",
            ));
        }
        if n != RECORD_BYTES {
            return Err(io::Error::other("truncated record from the process keeper"));
        }
        // SAFETY: read(2) initialised all RECORD_BYTES bytes.
        let record = record.map(|b| unsafe { b.assume_init() });
        if let Some(Report::Exited(wait_status)) = Report::decode(record) {
            return Ok(exit_code(wait_status));
        }
    }
}

/// Waits for the target's exit on the keeper's status pipe: its exit code, or -1 when the
/// keeper ended without reporting it.
pub(crate) async fn wait_exit(status: &AsyncFd<OwnedFd>) -> i32 {
    loop {
        let Ok(mut ready) = status.readable().await else {
            return -1;
        };
        match ready.try_io(|fd| read_exit(fd.get_ref())) {
            Ok(Ok(code)) => return code,
            Ok(Err(_)) => return -1,
            Err(_would_block) => continue,
        }
    }
}

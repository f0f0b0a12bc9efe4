//! One managed process as the methods see it: its recorded events, its stdin with the
//! ordered, deduplicated write path (PROTOCOL §4.7), its process group and its terminal.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use exec_server_core::proto::process::{OutputStream, TerminalSize};
use exec_server_core::proto::RpcError;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use crate::keepers::LiveKeeper;
use crate::output_budget::{EvictOldest, EvictionCause, SessionBudget};
use crate::retention::{EventLog, RetentionLimits, Snapshot};
use crate::sys;

/// Where `process/write` bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StdinMode {
    /// Pipe mode without `pipeStdin`: the child's stdin is at end-of-file for good.
    Closed,
    /// Pipe mode with `pipeStdin`.
    Pipe,
    /// Terminal mode: writes go to the terminal.
    Terminal,
}

pub(crate) struct ManagedProcess {
    pub id: String,
    /// The child's pid, which is also its process group id (it leads its own session).
    pub pid: libc::pid_t,
    /// The keeper of the child and all its descendants.
    keeper: Arc<LiveKeeper>,
    pub stdin_mode: StdinMode,
    /// The terminal's master side (terminal mode), for resizing.
    terminal: Option<Arc<AsyncFd<OwnedFd>>>,
    /// Held for the whole of a write: tokio's mutex queues waiters first-come first-served,
    /// which applies writes to one process in arrival order (§2.9 rule 1) and makes a
    /// retry see its original's outcome.
    writer: tokio::sync::Mutex<StdinWriter>,
    events: Mutex<EventLog>,
    /// Bumped after every recorded event; waiting reads and pending writes watch it.
    changed: watch::Sender<u64>,
    /// The session's share of the retained output budget, enforced after each recording;
    /// `None` in unit tests.
    budget: Option<SessionBudget>,
}

struct StdinWriter {
    sink: Option<Arc<AsyncFd<OwnedFd>>>,
    history: WriteIdHistory,
    /// `process/closeStdin` closed the sink: later writes answer `stdinClosed`.
    closed_by_client: bool,
}

/// What a process is started with, besides its id.
pub(crate) struct ProcessParts {
    pub pid: libc::pid_t,
    pub keeper: Arc<LiveKeeper>,
    pub stdin_mode: StdinMode,
    pub stdin: Option<Arc<AsyncFd<OwnedFd>>>,
    pub retention: RetentionLimits,
    pub write_id_history: usize,
    /// Where its retained output is accounted; `None` in unit tests.
    pub budget: Option<SessionBudget>,
}

impl ManagedProcess {
    pub fn new(id: String, parts: ProcessParts) -> Arc<Self> {
        let ProcessParts {
            pid,
            keeper,
            stdin_mode,
            stdin,
            retention,
            write_id_history,
            budget,
        } = parts;
        let terminal = match stdin_mode {
            StdinMode::Terminal => stdin.clone(),
            _ => None,
        };
        Arc::new_cyclic(|this: &Weak<Self>| {
            let account = budget.as_ref().map(|budget| {
                let output: Weak<dyn EvictOldest> = this.clone();
                budget.register(output)
            });
            Self {
                id,
                pid,
                keeper,
                stdin_mode,
                terminal,
                writer: tokio::sync::Mutex::new(StdinWriter {
                    sink: stdin,
                    history: WriteIdHistory::new(write_id_history),
                    closed_by_client: false,
                }),
                events: Mutex::new(EventLog::new(retention, account)),
                changed: watch::Sender::new(0),
                budget,
            }
        })
    }

    fn events(&self) -> std::sync::MutexGuard<'_, EventLog> {
        self.events.lock().expect("process event lock")
    }

    /// Runs `record` on the event log and wakes everyone waiting for news.
    pub fn record<R>(&self, record: impl FnOnce(&mut EventLog) -> R) -> R {
        let result = record(&mut self.events());
        self.changed.send_modify(|n| *n += 1);
        result
    }

    /// Records an output chunk, then keeps the session and the server within their
    /// retained output limits; returns the chunk's `seq`.
    pub fn record_output(&self, stream: OutputStream, chunk: Bytes) -> u64 {
        let seq = self.record(|log| log.record_output(stream, chunk));
        if let Some(budget) = &self.budget {
            budget.enforce();
        }
        seq
    }

    pub fn snapshot(&self, after_seq: u64, max_bytes: Option<u64>) -> Snapshot {
        self.events().snapshot(after_seq, max_bytes)
    }

    /// A receiver that sees every later event.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn exit_code(&self) -> Option<i32> {
        self.events().exit_code()
    }

    pub fn is_closed(&self) -> bool {
        self.events().is_closed()
    }

    pub fn has_terminal(&self) -> bool {
        self.terminal.is_some()
    }

    /// Resolves once the exit has been recorded.
    pub async fn exited(&self) {
        let mut changes = self.subscribe();
        while self.exit_code().is_none() {
            if changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Sends `signal` to the process group; `Ok(false)` when it no longer exists.
    pub fn signal_group(&self, signal: libc::c_int) -> io::Result<bool> {
        sys::signal_group(self.pid, signal)
    }

    /// SIGKILL to the process group, ignoring failures: used where nobody can be told.
    pub fn kill_group(&self) {
        if let Err(e) = self.signal_group(libc::SIGKILL) {
            tracing::warn!(process = ?self.id, error = %e, "failed to kill process group");
        }
    }

    /// Kills every descendant of the process, wherever it runs: SIGKILL to the group while
    /// it may still have members (before the close), and the keeper's whole-tree kill, which
    /// also reaches descendants that left the group or outlived the close.
    pub fn kill_tree(&self) {
        if !self.is_closed() {
            self.kill_group();
        }
        self.keeper.kill_tree();
    }

    pub fn resize(&self, size: TerminalSize) -> io::Result<()> {
        match &self.terminal {
            Some(master) => sys::set_window_size(master.as_raw_fd(), size),
            None => Ok(()),
        }
    }

    /// Steps 3–6 of §4.7 for a process whose stdin can be written: waits for earlier writes,
    /// deduplicates by `write_id`, writes every byte.
    /// `Ok(false)`: stdin was closed by `process/closeStdin` before this write's turn.
    pub async fn write(&self, data: &[u8], write_id: Option<&str>) -> Result<bool, RpcError> {
        let mut writer = self.writer.lock().await;
        if write_id.is_some_and(|id| writer.history.contains(id)) {
            return Ok(true);
        }
        if writer.closed_by_client {
            return Ok(false);
        }
        let sink = match &writer.sink {
            Some(sink) if self.exit_code().is_none() => Arc::clone(sink),
            _ => return Err(RpcError::stdin_write_failed()),
        };
        // A child that exited can no longer read what we write, even when a descendant
        // keeps the pipe open without reading it.
        let written = tokio::select! {
            result = write_all(&sink, data) => result,
            _ = self.exited() => Err(io::ErrorKind::BrokenPipe.into()),
        };
        match written {
            Ok(()) => {
                if let Some(id) = write_id {
                    writer.history.remember(id);
                }
                Ok(true)
            }
            Err(e) => {
                tracing::debug!(process = ?self.id, error = %e, "stdin write failed");
                Err(RpcError::stdin_write_failed())
            }
        }
    }
}

impl ManagedProcess {
    /// `process/closeStdin`: after every earlier write (they hold the same queue), closes
    /// the server's end of the stdin pipe so the child reads end of input. `Ok(false)`:
    /// it was closed already. A terminal has no end of input to give; its EOF character
    /// is written like any other byte.
    pub async fn close_stdin(&self) -> Result<bool, RpcError> {
        if self.stdin_mode == StdinMode::Terminal {
            return Err(RpcError::invalid_request(format!(
                "process {} runs on a terminal: write its end-of-file character (^D) with process/write instead",
                self.id
            )));
        }
        let mut writer = self.writer.lock().await;
        let was_open = writer.sink.take().is_some();
        writer.closed_by_client = true;
        Ok(was_open)
    }
}

impl EvictOldest for ManagedProcess {
    fn evict_oldest(&self, charge: usize, cause: EvictionCause) -> usize {
        self.events().evict_oldest(charge, cause)
    }
}

async fn write_all(fd: &AsyncFd<OwnedFd>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        let mut ready = fd.writable().await?;
        match ready.try_io(|fd| sys::write(fd.as_raw_fd(), data)) {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {}
        }
    }
    Ok(())
}

/// The ids of the last `capacity` accepted writes.
struct WriteIdHistory {
    order: VecDeque<String>,
    ids: HashSet<String>,
    capacity: usize,
}

impl WriteIdHistory {
    fn new(capacity: usize) -> Self {
        Self {
            order: VecDeque::new(),
            ids: HashSet::new(),
            capacity,
        }
    }

    fn contains(&self, id: &str) -> bool {
        self.ids.contains(id)
    }

    fn remember(&mut self, id: &str) {
        if self.capacity == 0 || !self.ids.insert(id.to_owned()) {
            return;
        }
        self.order.push_back(id.to_owned());
        if self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.ids.remove(&oldest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_id_history_forgets_the_oldest() {
        let mut history = WriteIdHistory::new(2);
        history.remember("1");
        history.remember("2");
        history.remember("2");
        assert!(history.contains("1") && history.contains("2"));
        history.remember("3");
        assert!(!history.contains("1"));
        assert!(history.contains("2") && history.contains("3"));
        let mut none = WriteIdHistory::new(0);
        none.remember("1");
        assert!(!none.contains("1"));
    }
}

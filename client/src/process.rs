//! Managed processes as the client sees them: a [`ProcessHandle`] with its ordered
//! [`ProcessEvents`] and a cloneable [`ProcessControl`] for writing, resizing, signalling
//! and terminating.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use exec_server_proto::process::{
    OutputStream, ReadParams, ReadResult, SandboxType, Signal, WriteStatus,
};
use futures_util::Stream;
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::{ExecServerClient, ExecServerError};

/// One event of a managed process, in `seq` order (PROTOCOL §4.3–§4.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    /// Bytes the process wrote. Chunk boundaries are arbitrary.
    Output {
        seq: u64,
        stream: OutputStream,
        bytes: Vec<u8>,
    },
    /// The process exited; output of descendants may still follow.
    Exited {
        seq: u64,
        exit_code: i32,
        sandbox_denied: bool,
    },
    /// Every output stream reached end-of-file after the exit: the last event.
    Closed { seq: u64 },
    /// Output events `first..=last` happened while the connection was lost and the server
    /// no longer retained them when the client caught up (PROTOCOL §4.6).
    OutputLost { first: u64, last: u64 },
}

impl ProcessEvent {
    /// The event's `seq` (the first one, for [`ProcessEvent::OutputLost`]).
    pub fn seq(&self) -> u64 {
        match self {
            Self::Output { seq, .. } | Self::Exited { seq, .. } | Self::Closed { seq } => *seq,
            Self::OutputLost { first, .. } => *first,
        }
    }

    /// The last `seq` the event accounts for.
    pub(crate) fn last_seq(&self) -> u64 {
        match self {
            Self::OutputLost { last, .. } => *last,
            other => other.seq(),
        }
    }
}

/// `process/exited` params, lenient about members older servers omit.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExitedParams {
    pub process_id: String,
    pub seq: u64,
    pub exit_code: i32,
    #[serde(default)]
    pub sandbox_denied: bool,
}

/// `process/closed` params; `seq` is missing before G5 (PROTOCOL §9.3).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ClosedParams {
    pub process_id: String,
    #[serde(default)]
    pub seq: Option<u64>,
}

/// What one item of [`ProcessEvents`] is.
pub type EventResult = Result<ProcessEvent, ExecServerError>;

/// A started process: its events and its controls.
#[derive(Debug)]
pub struct ProcessHandle {
    pub(crate) control: ProcessControl,
    pub(crate) events: ProcessEvents,
    pub(crate) sandbox_type: Option<SandboxType>,
}

impl ProcessHandle {
    /// The client-chosen `processId`.
    pub fn id(&self) -> &str {
        self.control.id()
    }

    /// How the server runs the process. `None` only when the `process/start` answer was
    /// lost in a reconnect for a sandboxed start, so the server's choice is not known.
    pub fn sandbox_type(&self) -> Option<SandboxType> {
        self.sandbox_type
    }

    /// The controls, for use alongside [`ProcessHandle::next_event`].
    pub fn control(&self) -> &ProcessControl {
        &self.control
    }

    /// The next event in `seq` order; `None` after [`ProcessEvent::Closed`] or after an
    /// error item (for example [`ExecServerError::SessionLost`]).
    pub async fn next_event(&mut self) -> Option<EventResult> {
        self.events.next_event().await
    }

    /// Splits the handle so events and controls can live in different tasks.
    pub fn into_parts(self) -> (ProcessControl, ProcessEvents) {
        (self.control, self.events)
    }

    /// Writes bytes to the process's stdin (or terminal) with the next `writeId`.
    pub async fn write(&self, bytes: &[u8]) -> Result<WriteStatus, ExecServerError> {
        self.control.write(bytes).await
    }

    /// Collects every event until the process is closed.
    pub async fn wait_with_output(mut self) -> Result<ProcessOutput, ExecServerError> {
        let mut output = ProcessOutput::default();
        while let Some(event) = self.next_event().await {
            match event? {
                ProcessEvent::Output { stream, bytes, .. } => match stream {
                    OutputStream::Stderr => output.stderr.extend_from_slice(&bytes),
                    OutputStream::Stdout | OutputStream::Pty => {
                        output.stdout.extend_from_slice(&bytes)
                    }
                },
                ProcessEvent::Exited {
                    exit_code,
                    sandbox_denied,
                    ..
                } => {
                    output.exit_code = Some(exit_code);
                    output.sandbox_denied = sandbox_denied;
                }
                ProcessEvent::OutputLost { .. } => output.output_lost = true,
                ProcessEvent::Closed { .. } => {}
            }
        }
        Ok(output)
    }
}

/// Everything a process produced, from [`ProcessHandle::wait_with_output`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessOutput {
    /// `stdout` chunks, and every chunk of a terminal process.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// `None` only if the exit event was never seen.
    pub exit_code: Option<i32>,
    pub sandbox_denied: bool,
    /// Some output was evicted by the server before the client could catch up.
    pub output_lost: bool,
}

/// The events of one process, strictly in `seq` order, each exactly once, across
/// reconnects. Also a [`Stream`].
///
/// Events are delivered through a bounded queue: a process whose events are not consumed
/// eventually holds up the whole connection (and, through it, the server's output
/// collection), so consume them concurrently with other calls.
#[derive(Debug)]
pub struct ProcessEvents {
    pub(crate) rx: mpsc::Receiver<EventResult>,
    pub(crate) finished: bool,
    /// Keeps the session alive while events are still wanted.
    pub(crate) _client: ExecServerClient,
}

impl ProcessEvents {
    /// The next event; `None` once the stream is finished.
    pub async fn next_event(&mut self) -> Option<EventResult> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<EventResult>> {
        if self.finished {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(item)) => {
                if matches!(item, Ok(ProcessEvent::Closed { .. }) | Err(_)) {
                    self.finished = true;
                }
                Poll::Ready(Some(item))
            }
            Poll::Ready(None) => {
                self.finished = true;
                Poll::Ready(Some(Err(ExecServerError::Closed)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Stream for ProcessEvents {
    type Item = EventResult;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_event(cx)
    }
}

/// The controls of one process; cheap to clone and usable from any task.
#[derive(Debug, Clone)]
pub struct ProcessControl {
    pub(crate) client: ExecServerClient,
    pub(crate) id: Arc<str>,
    /// The last `writeId` used: writes are numbered "1", "2", … per process, as reference
    /// clients do, and a write keeps its id when it is retried after a reconnect.
    pub(crate) write_ids: Arc<AtomicU64>,
}

impl ProcessControl {
    pub(crate) fn new(client: ExecServerClient, id: &str) -> Self {
        Self {
            client,
            id: Arc::from(id),
            write_ids: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The client-chosen `processId`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The `writeId` of the last [`ProcessControl::write`] (0 before the first), so a
    /// caller sending `process/write` itself can repeat a write with its id.
    pub fn last_write_id(&self) -> u64 {
        self.write_ids.load(Ordering::SeqCst)
    }

    /// Writes bytes to stdin (pipe mode with `pipeStdin`) or to the terminal (PROTOCOL §4.7).
    pub async fn write(&self, bytes: &[u8]) -> Result<WriteStatus, ExecServerError> {
        let write_id = self.write_ids.fetch_add(1, Ordering::SeqCst) + 1;
        self.client
            .write_with_id(&self.id, bytes, Some(write_id.to_string()))
            .await
    }

    /// [ext] Closes the process's stdin after every write made so far: it reads end of
    /// input (`process/closeStdin`).
    pub async fn close_stdin(&self) -> Result<WriteStatus, ExecServerError> {
        self.client.process_close_stdin(&self.id).await
    }

    /// Sends a signal to the process group (PROTOCOL §4.8).
    pub async fn signal(&self, signal: Signal) -> Result<(), ExecServerError> {
        self.client.process_signal(&self.id, signal).await
    }

    /// Changes the terminal size of a `tty` process (PROTOCOL §4.9).
    pub async fn resize(&self, rows: u16, cols: u16) -> Result<(), ExecServerError> {
        self.client.process_resize(&self.id, rows, cols).await
    }

    /// Kills the process group; `true` if the process was running (PROTOCOL §4.10).
    pub async fn terminate(&self) -> Result<bool, ExecServerError> {
        self.client.process_terminate(&self.id).await
    }

    /// `process/read` for this process (PROTOCOL §4.5), independent of the event stream.
    pub async fn read(
        &self,
        after_seq: u64,
        max_bytes: Option<u64>,
        wait_ms: Option<u64>,
    ) -> Result<ReadResult, ExecServerError> {
        self.client
            .process_read(ReadParams {
                process_id: self.id.to_string(),
                after_seq: Some(after_seq),
                max_bytes,
                wait_ms,
            })
            .await
    }
}

//! Drives one [`ReliableStream`] from a tokio task: frames and connection changes come in
//! through the stream's inbox, whole messages go to and come from the JSON-RPC side, and
//! frames go out through the [`Uplink`] of whichever physical connection is current.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::link::FrameQueues;
use crate::proto::{self, Body, RelayMessageFrame, ResetReason};
use crate::reliable::{ReliableStream, Semantics, SendError};

/// Frames a stream's inbox holds before the physical reader drops more (§6.1).
pub const STREAM_INBOX: usize = 256;
/// How long an orderly close waits for acknowledgements (§5.10).
const CLOSE_FLUSH: Duration = Duration::from_secs(5);

/// What the physical side tells a stream task.
#[derive(Debug)]
pub enum StreamEvent {
    Frame(RelayMessageFrame),
    Connected,
    Disconnected,
    /// Drop the stream at once, sending Reset with this reason.
    Abort(ResetReason),
    /// Drop the stream at once; the physical side has already queued its Reset, ahead of
    /// a close that the same event may trigger.
    Retire(ResetReason),
}

/// The sending side of the current physical connection, shared by every stream on it.
/// While there is none, frames are dropped (they count as lost, §5.8).
#[derive(Clone, Default)]
pub struct Uplink {
    current: Arc<Mutex<Option<FrameQueues>>>,
}

impl std::fmt::Debug for Uplink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Uplink")
    }
}

impl Uplink {
    pub fn set(&self, sender: Option<FrameQueues>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = sender;
    }

    pub fn is_connected(&self) -> bool {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Queues one frame without waiting; `false` when there is no connection or no room.
    pub fn try_send(&self, frame: &RelayMessageFrame) -> bool {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.as_ref().is_some_and(|queues| {
            queues
                .for_frame(frame)
                .try_send(proto::encode(frame))
                .is_ok()
        })
    }

    /// Sends one frame, waiting for room in the physical writer's queue.
    pub async fn send(&self, frame: &RelayMessageFrame) {
        let sender = self
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|queues| queues.for_frame(frame).clone());
        if let Some(sender) = sender {
            let _ = sender.send(proto::encode(frame)).await;
        }
    }
}

/// How a stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEnd {
    /// We sent Reset with this reason.
    ResetSent(ResetReason),
    /// The physical side reset the stream (it sent the Reset itself).
    Retired(ResetReason),
    /// The peer sent Reset; the reason text as received (truncated).
    ResetReceived(String),
    /// No physical connection for the whole resume grace.
    Lost,
}

/// The JSON-RPC side of a stream.
pub struct AppSide {
    /// Messages delivered to the application (the driver holds the real queue).
    pub to_app: mpsc::Sender<Bytes>,
    /// Messages the application sends; the stream closes in order when this ends.
    pub from_app: mpsc::Receiver<String>,
}

/// What a stream does when its shutdown token is cancelled.
#[derive(Debug, Clone)]
pub enum ShutdownMode {
    /// Reset{shutdown} at once (the harness dropping its stream without a flush).
    Abort(CancellationToken),
    /// Stop taking messages, wait until every record is acknowledged or 5 s have passed,
    /// then Reset{shutdown} (an executor that is stopping, §5.10).
    Flush(CancellationToken),
}

/// What a stream's physical connection carries besides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// This stream alone (a harness's socket): a codex stream whose application is behind
    /// stops taking frames, so the physical reader waits and TCP makes the sender wait.
    Own,
    /// Other streams too (an executor's socket): it is never held for one stream, whose
    /// records wait within the reorder window and beyond it fail that stream alone.
    Shared,
}

/// Runs a stream until it is reset, closed or lost.
pub async fn drive_stream(
    mut machine: ReliableStream,
    mut inbox: mpsc::Receiver<StreamEvent>,
    uplink: Uplink,
    app: AppSide,
    resume_grace: Duration,
    shutdown: ShutdownMode,
    link: Link,
) -> StreamEnd {
    let (shutdown, flush_on_shutdown) = match shutdown {
        ShutdownMode::Abort(token) => (token, false),
        ShutdownMode::Flush(token) => (token, true),
    };
    let mut shutting_down = false;
    let AppSide {
        to_app,
        mut from_app,
    } = app;
    let mut disconnected_at: Option<Instant> = (!uplink.is_connected()).then(Instant::now);
    if disconnected_at.is_some() {
        if machine.semantics() == Semantics::Codex {
            return StreamEnd::Lost;
        }
        machine.on_disconnected();
    }
    let mut app_open = true;
    let mut close_deadline: Option<Instant> = None;
    let stream_id = machine.stream_id().to_owned();
    let semantics = machine.semantics();
    // A codex stream does not survive its physical connection (CODEX-0169 §4.5).
    let lost_with_link = semantics == Semantics::Codex;
    let end = loop {
        let now = Instant::now();
        match machine.poll_transmit(now) {
            Ok(frames) => {
                for frame in frames {
                    uplink.send(&frame).await;
                }
            }
            Err(reason) => break StreamEnd::ResetSent(reason),
        }
        if let Some(deadline) = close_deadline {
            if machine.is_flushed() || Instant::now() >= deadline {
                break StreamEnd::ResetSent(if shutting_down {
                    ResetReason::Shutdown
                } else {
                    ResetReason::StreamClosed
                });
            }
        }
        let mut deadline = machine.next_deadline();
        for extra in [close_deadline, disconnected_at.map(|t| t + resume_grace)]
            .into_iter()
            .flatten()
        {
            deadline = Some(deadline.map_or(extra, |d| d.min(extra)));
        }
        let deliverable = machine.has_message();
        // A codex sender never waits for acks: records taken while the application is
        // behind would only be parked until 64 were ahead, and the stream would fail with
        // sequence_error in the middle of a large output.
        let hold = link == Link::Own && semantics == Semantics::Codex && machine.is_holding_back();
        tokio::select! {
            biased;
            _ = shutdown.cancelled(), if !shutting_down => {
                if !flush_on_shutdown {
                    break StreamEnd::ResetSent(ResetReason::Shutdown);
                }
                shutting_down = true;
                machine.begin_close();
                close_deadline.get_or_insert_with(|| Instant::now() + CLOSE_FLUSH);
            }
            event = inbox.recv(), if !hold => match event {
                None => break StreamEnd::Lost,
                Some(StreamEvent::Abort(reason)) => break StreamEnd::ResetSent(reason),
                Some(StreamEvent::Retire(reason)) => break StreamEnd::Retired(reason),
                Some(StreamEvent::Connected) => {
                    disconnected_at = None;
                    machine.on_connected(Instant::now());
                }
                Some(StreamEvent::Disconnected) => {
                    if lost_with_link {
                        break StreamEnd::Lost;
                    }
                    disconnected_at.get_or_insert_with(Instant::now);
                    machine.on_disconnected();
                }
                Some(StreamEvent::Frame(frame)) => {
                    if let Some(Body::Reset(r)) = &frame.body {
                        break StreamEnd::ResetReceived(proto::truncate_for_log(&r.reason));
                    }
                    if let Err(reason) = machine.handle_frame(&frame, Instant::now()) {
                        break StreamEnd::ResetSent(reason);
                    }
                }
            },
            permit = to_app.reserve(), if deliverable => {
                let Ok(permit) = permit else {
                    // The application went away: close in order.
                    machine.begin_close();
                    close_deadline.get_or_insert_with(|| Instant::now() + CLOSE_FLUSH);
                    continue;
                };
                match machine.pop_message(Instant::now()) {
                    Ok(Some(message)) => permit.send(message),
                    Ok(None) => {}
                    Err(reason) => break StreamEnd::ResetSent(reason),
                }
            }
            message = from_app.recv(), if app_open && machine.can_send() => match message {
                Some(message) => {
                    queue_message(&mut machine, &message);
                    // Take what the application queued meanwhile before records are cut,
                    // so a burst of small messages shares records (one encryption, one
                    // frame, one socket write) instead of one record each.
                    while machine.can_send() {
                        let Ok(more) = from_app.try_recv() else { break };
                        queue_message(&mut machine, &more);
                    }
                }
                None => {
                    app_open = false;
                    machine.begin_close();
                    close_deadline = Some(Instant::now() + CLOSE_FLUSH);
                }
            },
            _ = sleep_until_opt(deadline) => {
                let now = Instant::now();
                if disconnected_at.is_some_and(|t| now >= t + resume_grace) {
                    break StreamEnd::Lost;
                }
                if let Err(reason) = machine.on_timer(now) {
                    break StreamEnd::ResetSent(reason);
                }
            }
        }
    };
    if let StreamEnd::ResetSent(reason) = &end {
        let reason = semantics.fault_reason(*reason);
        uplink.send(&proto::reset_frame(&stream_id, reason)).await;
    }
    end
}

/// Adds one application message to the stream's outbound bytes; one above the size limit
/// is dropped and logged.
fn queue_message(machine: &mut ReliableStream, message: &str) {
    if let Err(SendError::TooLarge { len, limit }) = machine.send_message(message.as_bytes()) {
        tracing::error!(
            len,
            limit,
            "dropping an outbound relay message above the size limit"
        );
    }
}

/// Sleeps until `deadline`, or forever without one (a `select!` arm that never fires).
pub async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

//! One backend's queue and the thread that writes it: batches, retries, and the two modes
//! (`blocking`: the emitter waits for the write; `batch`: a full queue drops, counted).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use std::panic::AssertUnwindSafe;
use tokio::sync::{mpsc, oneshot};

use super::backend::AuditWriter;
use super::config::{BackendConfig, Mode};
use crate::metrics::{self, Counter};

/// One event on its way to a backend, with the emitter waiting for it in `blocking` mode;
/// `line: None` asks the writer to flush what came before and answer.
struct Item {
    line: Option<Arc<str>>,
    written: Option<oneshot::Sender<bool>>,
}

/// What a `blocking` emitter waits on.
pub(crate) struct Pending(oneshot::Receiver<bool>, Duration);

impl Pending {
    /// `true` once the event is written; `false` if the backend gave up on it or did not
    /// write it within `write_timeout_ms`.
    pub(crate) async fn written(self) -> bool {
        matches!(tokio::time::timeout(self.1, self.0).await, Ok(Ok(true)))
    }
}

/// The counters of one backend in `/metrics`.
#[derive(Clone)]
struct Counters {
    written: Counter,
    dropped: Counter,
    failures: Counter,
}

impl Counters {
    fn new(name: &str) -> Self {
        let labels = [("backend", name)];
        Self {
            written: metrics::counter(
                "exec_server_audit_events_written_total",
                "Audit events written, by backend.",
                &labels,
            ),
            dropped: metrics::counter(
                "exec_server_audit_events_dropped_total",
                "Audit events lost: queue full (batch mode) or given up after retries, by backend.",
                &labels,
            ),
            failures: metrics::counter(
                "exec_server_audit_write_failures_total",
                "Failed audit writes (each retry counts), by backend.",
                &labels,
            ),
        }
    }
}

/// A backend's sending side.
pub(crate) struct BackendQueue {
    /// `file`, `webhook`, … with its position when several share a kind (`webhook#2`).
    pub(crate) name: String,
    pub(crate) mode: Mode,
    sender: mpsc::Sender<Item>,
    timeout: Duration,
    counters: Counters,
    /// Drops since the last warning, and when that was: one warning a second at most.
    drop_warning: Mutex<(u64, Option<Instant>)>,
}

/// How often a backend that keeps dropping is logged.
const DROP_WARNING_EVERY: Duration = Duration::from_secs(1);

impl BackendQueue {
    /// Starts the writer thread of `writer`.
    pub(crate) fn start(
        name: String,
        config: &BackendConfig,
        writer: Box<dyn AuditWriter>,
    ) -> Self {
        let (sender, receiver) = mpsc::channel(config.buffer_events);
        let counters = Counters::new(&name);
        let worker = Worker {
            name: name.clone(),
            writer,
            receiver,
            max_batch: config.max_batch_events,
            retries: config.retries,
            backoff: Duration::from_millis(config.retry_backoff_ms),
            counters: counters.clone(),
            lost_in_a_row: 0,
        };
        std::thread::Builder::new()
            .name(format!("audit-{name}"))
            .spawn(move || worker.run())
            .expect("the audit writer thread starts");
        Self {
            name,
            mode: config.mode,
            sender,
            timeout: Duration::from_millis(config.write_timeout_ms),
            counters,
            drop_warning: Mutex::new((0, None)),
        }
    }

    /// Queues `line`. `blocking`: returns what to wait on (`None`: it could not even be
    /// queued, the event is not written). `batch`: never waits; a full queue drops it.
    pub(crate) fn push(&self, line: &Arc<str>) -> Result<Option<Pending>, ()> {
        let (written, pending) = match self.mode {
            Mode::Blocking => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(Pending(rx, self.timeout)))
            }
            Mode::Batch => (None, None),
        };
        let item = Item {
            line: Some(Arc::clone(line)),
            written,
        };
        match self.sender.try_send(item) {
            Ok(()) => Ok(pending),
            Err(mpsc::error::TrySendError::Full(item)) if self.mode == Mode::Blocking => {
                Ok(self.wait_for_room(item, pending))
            }
            Err(_) => {
                self.dropped(1);
                Err(())
            }
        }
    }

    /// `blocking` with a full queue: the emitter waits for room as long as for the write
    /// (outside a runtime, where nothing can wait, the event is dropped and counted).
    fn wait_for_room(&self, item: Item, pending: Option<Pending>) -> Option<Pending> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.dropped(1);
            return None;
        };
        let sender = self.sender.clone();
        let timeout = self.timeout;
        let (tx, rx) = oneshot::channel();
        let Pending(written, _) = pending?;
        runtime.spawn(async move {
            let queued = tokio::time::timeout(timeout, sender.send(item)).await;
            let ok = matches!(queued, Ok(Ok(()))) && matches!(written.await, Ok(true));
            let _ = tx.send(ok);
        });
        Some(Pending(rx, timeout))
    }

    /// Waits until everything queued before now is written and flushed, `timeout` at most.
    pub(crate) async fn flush(&self, timeout: std::time::Duration) -> bool {
        let (tx, rx) = oneshot::channel();
        let marker = Item {
            line: None,
            written: Some(tx),
        };
        let sent = tokio::time::timeout(timeout, self.sender.send(marker)).await;
        matches!(sent, Ok(Ok(())))
            && matches!(tokio::time::timeout(timeout, rx).await, Ok(Ok(true)))
    }

    fn dropped(&self, count: u64) {
        self.counters.dropped.add(count);
        let mut warning = self.drop_warning.lock().unwrap_or_else(|p| p.into_inner());
        warning.0 += count;
        let due = warning
            .1
            .is_none_or(|at| at.elapsed() >= DROP_WARNING_EVERY);
        if due {
            tracing::warn!(
                backend = %self.name,
                dropped = warning.0,
                total = self.counters.dropped.get(),
                "audit events dropped: the backend's queue is full (audit.backends.buffer_events)"
            );
            *warning = (0, Some(Instant::now()));
        }
    }
}

/// The writer thread's side.
struct Worker {
    name: String,
    writer: Box<dyn AuditWriter>,
    receiver: mpsc::Receiver<Item>,
    max_batch: usize,
    retries: u32,
    backoff: Duration,
    counters: Counters,
    lost_in_a_row: u64,
}

impl Worker {
    /// Runs until every sender is gone (the server ended), writing back what is left.
    fn run(mut self) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the audit writer's runtime starts");
        runtime.block_on(async move {
            let mut batch = Vec::with_capacity(self.max_batch);
            while self.next_batch(&mut batch).await {
                self.write(&mut batch).await;
            }
            if let Err(e) = self.writer.flush().await {
                tracing::warn!(backend = %self.name, error = %e, "audit flush failed at shutdown");
            }
        });
    }

    /// Waits for the next event, then takes what else is queued (after the writer's
    /// linger, if it has one). `false`: the queue is closed and empty.
    async fn next_batch(&mut self, batch: &mut Vec<Item>) -> bool {
        let first = tokio::select! {
            item = self.receiver.recv() => item,
            () = tokio::time::sleep(Duration::from_secs(1)) => {
                let _ = self.writer.flush().await;
                return true;
            }
        };
        let Some(first) = first else { return false };
        let flushing = first.line.is_none();
        batch.push(first);
        // Lingering asleep, not waiting on the queue: events queued meanwhile wake nobody,
        // so a busy server pays one wake-up per linger, not one per event.
        if let Some(linger) = self.writer.linger().filter(|_| !flushing) {
            tokio::time::sleep(linger).await;
        }
        while batch.len() < self.max_batch {
            match self.receiver.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        true
    }

    /// Writes `batch`, retrying with a doubling pause; then tells every waiting emitter.
    /// A flush marker in it makes the writer flush after the events before it.
    async fn write(&mut self, batch: &mut Vec<Item>) {
        while let Some(marker) = batch.iter().position(|item| item.line.is_none()) {
            let mut rest = batch.split_off(marker + 1);
            let marker = batch.pop().expect("the marker is last");
            self.write_events(batch).await;
            let flushed = self.writer.flush().await.is_ok();
            if let Some(tx) = marker.written {
                let _ = tx.send(flushed);
            }
            std::mem::swap(batch, &mut rest);
        }
        self.write_events(batch).await;
    }

    /// Writes `batch` (events only), retrying with a doubling pause; then tells every
    /// waiting emitter.
    async fn write_events(&mut self, batch: &mut Vec<Item>) {
        if batch.is_empty() {
            return;
        }
        let lines: Vec<Arc<str>> = batch.iter().filter_map(|item| item.line.clone()).collect();
        let mut pause = self.backoff;
        let mut attempt = 0;
        let written = loop {
            // A backend that panics fails the batch; the thread keeps serving the queue.
            let attempt_result = AssertUnwindSafe(self.writer.write(&lines))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| Err("the backend panicked".to_owned()));
            match attempt_result {
                Ok(()) => break true,
                Err(error) => {
                    self.counters.failures.inc();
                    tracing::warn!(backend = %self.name, attempt, %error, "audit write failed");
                    if attempt >= self.retries {
                        break false;
                    }
                    attempt += 1;
                    tokio::time::sleep(pause).await;
                    pause = pause.saturating_mul(2);
                }
            }
        };
        let count = lines.len() as u64;
        if written {
            self.counters.written.add(count);
            self.lost_in_a_row = 0;
        } else {
            self.counters.dropped.add(count);
            self.lost_in_a_row += count;
            let lost = self.lost_in_a_row;
            tracing::error!(backend = %self.name, events = count, lost_in_a_row = lost, "audit events lost after retries");
        }
        for item in batch.drain(..) {
            if let Some(tx) = item.written {
                let _ = tx.send(written);
            }
        }
    }
}

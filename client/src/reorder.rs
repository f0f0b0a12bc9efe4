//! The per-process reorder buffer: turns notifications and catch-up reads, which may
//! overlap and arrive out of order, into one gap-free, duplicate-free event sequence.
//!
//! Every event of a process has a `seq` (PROTOCOL §4.3); the buffer delivers `seq` n only
//! after n − 1. Events that arrive early wait (at most `capacity` of them before the owner
//! is asked to fill the gap with a `process/read`); events at or below the cursor are
//! duplicates and dropped. A catch-up read names every event up to its `nextSeq`, which is
//! how the gaps left by a lost connection are closed.

use std::collections::BTreeMap;

use exec_server_proto::process::ReadResult;

use crate::process::ProcessEvent;

/// What [`Reorder::push`] did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Accepted (delivered now or buffered).
    Accepted,
    /// At or below the cursor, or already buffered: dropped.
    Duplicate,
    /// Accepted, but the buffer now holds more than its capacity: a gap is not being
    /// filled by notifications and should be filled with a catch-up read.
    NeedsCatchUp,
}

#[derive(Debug)]
pub(crate) struct Reorder {
    /// The next `seq` to deliver.
    next: u64,
    /// Events that arrived ahead of `next`, by `seq`.
    waiting: BTreeMap<u64, ProcessEvent>,
    /// Events beyond this many waiting ones call for a catch-up read.
    capacity: usize,
    /// An exit event was delivered or is waiting.
    exit_known: bool,
    /// A close event was delivered or is waiting.
    close_known: bool,
}

impl Reorder {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            next: 1,
            waiting: BTreeMap::new(),
            capacity: capacity.max(1),
            exit_known: false,
            close_known: false,
        }
    }

    /// The last delivered `seq`: the `afterSeq` of a catch-up read.
    pub(crate) fn cursor(&self) -> u64 {
        self.next - 1
    }

    /// The `seq` of the last event known, delivered or waiting.
    fn last_known(&self) -> u64 {
        self.waiting
            .last_key_value()
            .map_or(self.cursor(), |(_, e)| e.last_seq())
    }

    /// Adds one event from a notification.
    pub(crate) fn push(&mut self, event: ProcessEvent) -> Pushed {
        let seq = event.seq();
        if seq < self.next || self.waiting.contains_key(&seq) {
            return Pushed::Duplicate;
        }
        match event {
            ProcessEvent::Exited { .. } => self.exit_known = true,
            ProcessEvent::Closed { .. } => self.close_known = true,
            _ => {}
        }
        self.waiting.insert(seq, event);
        if self.waiting.len() > self.capacity && !self.waiting.contains_key(&self.next) {
            Pushed::NeedsCatchUp
        } else {
            Pushed::Accepted
        }
    }

    /// A close notification without `seq` (generations before G5): the close is the last
    /// event, so it goes after everything known.
    pub(crate) fn push_close_without_seq(&mut self) -> Pushed {
        let seq = self.last_known() + 1;
        self.push(ProcessEvent::Closed { seq })
    }

    /// Merges a `process/read` answer that covers every event up to `read.next_seq − 1`
    /// (a read without `maxBytes`). Positions that are neither a retained chunk nor a
    /// known event are the exit, the close, and chunks the server no longer retained.
    pub(crate) fn merge_read(&mut self, read: ReadResult, decode: impl Fn(&str) -> Vec<u8>) {
        let end = read.next_seq; // exclusive
        for chunk in read.chunks {
            if chunk.seq >= self.next && chunk.seq < end {
                self.waiting
                    .entry(chunk.seq)
                    .or_insert_with(|| ProcessEvent::Output {
                        seq: chunk.seq,
                        stream: chunk.stream,
                        bytes: decode(&chunk.chunk),
                    });
            }
        }
        let mut missing = self.missing_before(end);
        if read.closed && !self.close_known {
            if let Some(last) = take_last(&mut missing) {
                self.waiting
                    .insert(last, ProcessEvent::Closed { seq: last });
                self.close_known = true;
            }
        }
        if read.exited && !self.exit_known {
            if let Some(last) = take_last(&mut missing) {
                self.waiting.insert(
                    last,
                    ProcessEvent::Exited {
                        seq: last,
                        exit_code: read.exit_code.unwrap_or(-1),
                        sandbox_denied: read.sandbox_denied,
                    },
                );
                self.exit_known = true;
            }
        }
        // Whatever is still unexplained was evicted from the server's retention buffer.
        for (first, last) in missing {
            self.waiting
                .insert(first, ProcessEvent::OutputLost { first, last });
        }
    }

    /// Ranges `[first, last]` of positions in `[next, end)` that hold no known event.
    fn missing_before(&self, end: u64) -> Vec<(u64, u64)> {
        let mut missing = Vec::new();
        let mut at = self.next;
        for (&seq, event) in self.waiting.range(self.next..end) {
            if seq > at {
                missing.push((at, seq - 1));
            }
            at = at.max(event.last_seq() + 1);
        }
        if at < end {
            missing.push((at, end - 1));
        }
        missing
    }

    /// Moves every event that is next in line to `out`.
    pub(crate) fn drain(&mut self, out: &mut Vec<ProcessEvent>) {
        while let Some(event) = self.waiting.remove(&self.next) {
            self.next = event.last_seq() + 1;
            out.push(event);
        }
    }

    /// True when more events are waiting than a healthy stream ever needs: the gap is
    /// not going to be filled, even by a catch-up read.
    pub(crate) fn overflowed(&self) -> bool {
        self.waiting.len() > self.capacity.saturating_mul(4)
    }
}

/// Removes the highest single position from a list of ranges.
fn take_last(ranges: &mut Vec<(u64, u64)>) -> Option<u64> {
    let (first, last) = ranges.pop()?;
    if first < last {
        ranges.push((first, last - 1));
    }
    Some(last)
}

#[cfg(test)]
#[path = "reorder_tests.rs"]
mod tests;

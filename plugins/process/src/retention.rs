//! What a process has recorded: its `seq` counter, retained output chunks (PROTOCOL §4.6),
//! exit and close state, and the snapshot algorithm of `process/read` (§4.5.3).
//!
//! Retained output is charged to the session's cap and the server's budget
//! ([`crate::output_budget`]) at what it really holds: each chunk is an allocation of its
//! own size, plus [`CHUNK_OVERHEAD_BYTES`] of bookkeeping.

use std::collections::VecDeque;

use bytes::Bytes;
use exec_server_core::proto::process::OutputStream;

use crate::output_budget::{EvictionCause, HolderAccount};

/// What one retained chunk costs beyond its bytes: its slot in the deque (48 bytes), the
/// allocator's header and rounding of its allocation, and the record `Bytes` adds once the
/// chunk is shared with a reader. Charged so that many tiny chunks cannot hide their size:
/// 50,000 one-byte chunks hold about 5 MB, not 50 KB.
pub(crate) const CHUNK_OVERHEAD_BYTES: usize = 96;

/// One recorded output chunk: `data` is an allocation of exactly its own size, never a
/// slice of a larger buffer that it would keep alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub seq: u64,
    pub stream: OutputStream,
    pub data: Bytes,
}

/// The retention limits of one process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetentionLimits {
    pub max_bytes: usize,
    pub max_chunks: usize,
}

/// Retained chunks in ascending `seq` order, within both limits; the oldest go first.
#[derive(Debug)]
pub(crate) struct RetainedOutput {
    chunks: VecDeque<Chunk>,
    bytes: usize,
    limits: RetentionLimits,
    /// This process's entry in the server's retained output budget; `None` in unit tests.
    account: Option<HolderAccount>,
}

impl RetainedOutput {
    pub fn new(limits: RetentionLimits, account: Option<HolderAccount>) -> Self {
        Self {
            chunks: VecDeque::new(),
            bytes: 0,
            limits,
            account,
        }
    }

    /// What the retained chunks hold: their bytes and their bookkeeping.
    pub fn charge(&self) -> usize {
        self.bytes + self.chunks.len() * CHUNK_OVERHEAD_BYTES
    }

    /// Adds a chunk and evicts the oldest ones until both limits hold again (the new chunk
    /// itself, if it alone exceeds the byte limit).
    pub fn push(&mut self, chunk: Chunk) {
        self.bytes += chunk.data.len();
        self.chunks.push_back(chunk);
        let (mut chunks, mut bytes) = (0, 0);
        while self.bytes > self.limits.max_bytes || self.chunks.len() > self.limits.max_chunks {
            let Some(evicted) = self.pop_oldest() else {
                break;
            };
            chunks += 1;
            bytes += evicted.data.len();
        }
        if chunks > 0 {
            EvictionCause::ProcessLimit.record(chunks, bytes);
        }
        self.report();
    }

    /// Evicts the oldest chunks until at least `charge` is freed or nothing is left (for
    /// the session cap or the server budget); returns the charge freed.
    pub fn evict_oldest(&mut self, charge: usize, cause: EvictionCause) -> usize {
        let before = self.charge();
        let (mut chunks, mut bytes) = (0, 0);
        while before - self.charge() < charge {
            let Some(evicted) = self.pop_oldest() else {
                break;
            };
            chunks += 1;
            bytes += evicted.data.len();
        }
        if chunks > 0 {
            cause.record(chunks, bytes);
            self.report();
        }
        before - self.charge()
    }

    fn pop_oldest(&mut self) -> Option<Chunk> {
        let evicted = self.chunks.pop_front()?;
        self.bytes -= evicted.data.len();
        Some(evicted)
    }

    fn report(&self) {
        if let Some(account) = &self.account {
            account.set_charge(self.charge());
        }
    }

    /// Steps 3.1–3.3 of §4.5.3: the chunks after `after_seq`, cut by `max_bytes` with the
    /// first-chunk rule.
    pub fn select(&self, after_seq: u64, max_bytes: Option<u64>) -> Vec<Chunk> {
        let start = self.chunks.partition_point(|c| c.seq <= after_seq);
        let mut selected = Vec::new();
        let mut total: u64 = 0;
        for chunk in self.chunks.range(start..) {
            let size = chunk.data.len() as u64;
            if let Some(max) = max_bytes {
                if !selected.is_empty() && total.saturating_add(size) > max {
                    break;
                }
            }
            total = total.saturating_add(size);
            selected.push(chunk.clone());
            if max_bytes.is_some_and(|max| total >= max) {
                break;
            }
        }
        selected
    }

    #[cfg(test)]
    fn seqs(&self) -> Vec<u64> {
        self.chunks.iter().map(|c| c.seq).collect()
    }
}

/// Every event of one process: one `seq` counter shared by output, exit and close (§4.3).
#[derive(Debug)]
pub(crate) struct EventLog {
    output: RetainedOutput,
    /// The next unused `seq`.
    next_seq: u64,
    exit_code: Option<i32>,
    /// The sandbox classification of the exit (SANDBOX.md §8.5), fixed when it is recorded.
    sandbox_denied: bool,
    closed: bool,
}

/// A consistent view of a process for one `process/read` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub chunks: Vec<Chunk>,
    pub next_seq: u64,
    pub exit_code: Option<i32>,
    pub sandbox_denied: bool,
    pub closed: bool,
}

impl Snapshot {
    /// Step 4 of §4.5.3, without the deadline: is there something the reader has not seen?
    pub fn has_news(&self, after_seq: u64) -> bool {
        !self.chunks.is_empty()
            || self.closed
            || (self.exit_code.is_some() && after_seq < self.next_seq - 1)
    }
}

impl EventLog {
    pub fn new(limits: RetentionLimits, account: Option<HolderAccount>) -> Self {
        Self {
            output: RetainedOutput::new(limits, account),
            next_seq: 1,
            exit_code: None,
            sandbox_denied: false,
            closed: false,
        }
    }

    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Records one output chunk (1 to `output_chunk_bytes` bytes); returns its `seq`.
    pub fn record_output(&mut self, stream: OutputStream, data: Bytes) -> u64 {
        debug_assert!(!data.is_empty() && !self.closed);
        let seq = self.take_seq();
        self.output.push(Chunk { seq, stream, data });
        seq
    }

    /// Records the exit; returns its `seq`.
    pub fn record_exit(&mut self, exit_code: i32) -> u64 {
        debug_assert!(self.exit_code.is_none());
        self.exit_code = Some(exit_code);
        self.take_seq()
    }

    /// Records a sandboxed exit, classified over the retained output of every stream in
    /// `seq` order (SANDBOX.md §8.5); returns its `seq` and the classification.
    pub fn record_sandboxed_exit(&mut self, exit_code: i32) -> (u64, bool) {
        let output: Vec<u8> = self
            .output
            .select(0, None)
            .iter()
            .flat_map(|c| c.data.iter().copied())
            .collect();
        self.sandbox_denied = exec_server_sandbox::denial::sandbox_denied(true, exit_code, &output);
        (self.record_exit(exit_code), self.sandbox_denied)
    }

    /// Records the close, always the last event; returns its `seq`.
    pub fn record_close(&mut self) -> u64 {
        debug_assert!(self.exit_code.is_some() && !self.closed);
        self.closed = true;
        self.take_seq()
    }

    /// See [`RetainedOutput::evict_oldest`].
    pub fn evict_oldest(&mut self, charge: usize, cause: EvictionCause) -> usize {
        self.output.evict_oldest(charge, cause)
    }

    pub fn exit_code(&self) -> Option<i32> {
        self.exit_code
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Step 3 of §4.5.3.
    pub fn snapshot(&self, after_seq: u64, max_bytes: Option<u64>) -> Snapshot {
        let chunks = self.output.select(after_seq, max_bytes);
        let next_seq = match (max_bytes, chunks.last()) {
            (Some(_), Some(last)) => last.seq + 1,
            _ => self.next_seq,
        };
        Snapshot {
            chunks,
            next_seq,
            exit_code: self.exit_code,
            sandbox_denied: self.sandbox_denied,
            closed: self.closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOMY: RetentionLimits = RetentionLimits {
        max_bytes: 1 << 20,
        max_chunks: 50_000,
    };

    fn log_with(sizes: &[usize]) -> EventLog {
        let mut log = EventLog::new(ROOMY, None);
        for size in sizes {
            log.record_output(OutputStream::Stdout, Bytes::from(vec![b'x'; *size]));
        }
        log
    }

    fn seqs(snapshot: &Snapshot) -> Vec<u64> {
        snapshot.chunks.iter().map(|c| c.seq).collect()
    }

    #[test]
    fn eviction_by_bytes_drops_the_oldest_first() {
        let mut out = RetainedOutput::new(
            RetentionLimits {
                max_bytes: 10,
                max_chunks: 100,
            },
            None,
        );
        for seq in 1..=4 {
            out.push(Chunk {
                seq,
                stream: OutputStream::Stdout,
                data: Bytes::from_static(b"abcd"),
            });
        }
        assert_eq!(out.seqs(), [3, 4]);
        out.push(Chunk {
            seq: 5,
            stream: OutputStream::Stderr,
            data: Bytes::from_static(b"0123456789A"),
        });
        assert!(
            out.seqs().is_empty(),
            "a chunk above the byte limit is not kept"
        );
    }

    #[test]
    fn the_charge_counts_bookkeeping_and_eviction_for_the_budget_takes_the_oldest() {
        let mut out = RetainedOutput::new(ROOMY, None);
        for seq in 1..=4 {
            out.push(Chunk {
                seq,
                stream: OutputStream::Stdout,
                data: Bytes::from(vec![b'x'; 100]),
            });
        }
        assert_eq!(out.charge(), 4 * (100 + CHUNK_OVERHEAD_BYTES));
        // Asked for a little more than one chunk: two go, oldest first.
        let freed = out.evict_oldest(100 + CHUNK_OVERHEAD_BYTES + 1, EvictionCause::SessionCap);
        assert_eq!(freed, 2 * (100 + CHUNK_OVERHEAD_BYTES));
        assert_eq!(out.seqs(), [3, 4]);
        assert_eq!(
            out.evict_oldest(usize::MAX, EvictionCause::GlobalBudget),
            out_charge(2)
        );
        assert!(out.seqs().is_empty());
        assert_eq!(out.evict_oldest(1, EvictionCause::GlobalBudget), 0);
    }

    fn out_charge(chunks: usize) -> usize {
        chunks * (100 + CHUNK_OVERHEAD_BYTES)
    }

    #[test]
    fn eviction_by_chunk_count() {
        let mut out = RetainedOutput::new(
            RetentionLimits {
                max_bytes: 1000,
                max_chunks: 3,
            },
            None,
        );
        for seq in 1..=5 {
            out.push(Chunk {
                seq,
                stream: OutputStream::Pty,
                data: Bytes::from_static(b"a"),
            });
        }
        assert_eq!(out.seqs(), [3, 4, 5]);
    }

    #[test]
    fn unlimited_reads_return_everything_after_the_cursor() {
        let mut log = log_with(&[3, 3, 3]);
        let s = log.snapshot(0, None);
        assert_eq!(seqs(&s), [1, 2, 3]);
        assert_eq!(s.next_seq, 4);
        assert_eq!(seqs(&log.snapshot(2, None)), [3]);
        let s = log.snapshot(3, None);
        assert!(s.chunks.is_empty() && !s.has_news(3));
        assert_eq!(s.next_seq, 4);
        log.record_exit(0);
        log.record_close();
        let s = log.snapshot(1, None);
        assert_eq!((seqs(&s), s.next_seq, s.closed), (vec![2, 3], 6, true));
        // afterSeq beyond next: nothing new, but closed still answers at once.
        let s = log.snapshot(100, None);
        assert!(s.chunks.is_empty() && s.has_news(100));
    }

    #[test]
    fn max_bytes_first_chunk_rule_and_next_seq() {
        let log = log_with(&[5, 5, 5, 5]);
        // maxBytes 0 returns exactly one chunk when one is available.
        let s = log.snapshot(0, Some(0));
        assert_eq!((seqs(&s), s.next_seq), (vec![1], 2));
        // The first chunk is taken even when it alone exceeds the budget.
        let s = log.snapshot(1, Some(3));
        assert_eq!((seqs(&s), s.next_seq), (vec![2], 3));
        // Stop at the first chunk that does not fit.
        let s = log.snapshot(0, Some(12));
        assert_eq!((seqs(&s), s.next_seq), (vec![1, 2], 3));
        // Stop right after reaching the budget exactly.
        let s = log.snapshot(0, Some(10));
        assert_eq!((seqs(&s), s.next_seq), (vec![1, 2], 3));
        // Nothing selected with a budget: next unused seq.
        let s = log.snapshot(4, Some(10));
        assert_eq!((seqs(&s), s.next_seq), (vec![], 5));
    }

    #[test]
    fn exit_is_news_until_the_reader_has_passed_it() {
        let mut log = log_with(&[1]);
        let exit_seq = log.record_exit(3);
        assert_eq!(exit_seq, 2);
        let s = log.snapshot(1, None);
        assert!(s.has_news(1), "the exit at seq 2 is unseen");
        assert_eq!(s.exit_code, Some(3));
        assert!(!log.snapshot(2, None).has_news(2));
        let close_seq = log.record_close();
        assert_eq!(close_seq, 3);
        assert!(log.snapshot(3, None).has_news(3), "closed always answers");
    }

    #[test]
    fn gaps_after_eviction_stay_visible_in_seq() {
        let mut log = EventLog::new(
            RetentionLimits {
                max_bytes: 4,
                max_chunks: 10,
            },
            None,
        );
        for _ in 0..4 {
            log.record_output(OutputStream::Stdout, Bytes::from_static(b"ab"));
        }
        let s = log.snapshot(0, None);
        assert_eq!((seqs(&s), s.next_seq), (vec![3, 4], 5));
    }
}

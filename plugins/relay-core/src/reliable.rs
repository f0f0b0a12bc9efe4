//! One stream's records and reliability as a sans-IO state machine (RELAY §4, §5).
//!
//! [`ReliableStream`] owns the stream's record cipher (the Noise transport phase) and everything that happens
//! after the handshake: the outbound byte stream cut into records, sequence numbers, the
//! send window, retransmission with an RFC 6298 timer, the receiver's reorder buffer,
//! duplicate suppression, reassembly of length-prefixed messages, the bounded inbound
//! queue, acknowledgements (piggy-backed, delayed, immediate, keep-alive), Resume and the
//! stall limit. It performs no IO and reads no clock: the driver feeds it frames, messages
//! and the current time, and takes out frames to send, messages to deliver and the next
//! instant at which it wants [`ReliableStream::on_timer`] to be called.
//!
//! A stream follows one of two rule sets, fixed at the handshake ([`Semantics`]): the
//! reliable one above, when both ends announced it, or codex 0.169.0's (CODEX-0169 §4.5),
//! with any peer that did not: seq from 0, `ack`/`ack_bits` always 0, no acks, no
//! retransmission, no Resume, and a receiver that tolerates duplicates and reordering
//! within 64 records. Records, their cipher, framing, reassembly and the inbound queue
//! are the same in both.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::time::Instant;

use crate::noise::RecordCipher;
use crate::proto::{
    self, Body, RelayMessageFrame, ResetReason, MAX_NOISE_MESSAGE, MAX_RECORD_PLAINTEXT,
};

/// Records a sender may have beyond `peer_ack` (§5.6).
pub const WINDOW_RECORDS: u32 = 32;
/// New records after which the receiver acknowledges at once instead of waiting for the
/// delayed ack. The 20 ms delay of §5.4 is an upper bound; a bulk sender that had to wait
/// for it would stall on a full window (32 records per 20 ms), so a quarter window of new
/// records is acknowledged immediately, keeping the window open.
pub const ACK_EVERY_RECORDS: u32 = WINDOW_RECORDS / 4;
/// Ciphertext bytes a sender may have unacknowledged (§5.6).
pub const WINDOW_BYTES: usize = 2 * 1024 * 1024;
/// Highest usable sequence number (§5.1).
pub const MAX_SEQ: u32 = u32::MAX - 1;
/// Plaintext the sender buffers before it refuses further messages (back-pressure).
pub const SEND_BUFFER_BYTES: usize = 1024 * 1024;
/// Records beyond the next expected one that a codex-semantics receiver holds (codex's
/// reorder window, CODEX-0169 §4.5); a record further ahead resets the stream. It also
/// bounds what waits while the inbound queue is full: codex streams have no flow control.
pub const CODEX_REORDER_RECORDS: u32 = 64;

/// The rules a stream follows, decided at the handshake from what both ends announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Semantics {
    /// RELAY §5: seq from 1, acks, retransmission, Resume across reconnects.
    Reliable,
    /// codex 0.169.0 (CODEX-0169 §4.5): seq from 0, no acks, nothing resent, a physical
    /// disconnect ends the stream.
    Codex,
}

impl Semantics {
    /// The semantics of a stream of `suite` whose ends offered `ours` and `theirs`. The
    /// classic suite is always reliable: only RELAY.md v1 peers speak it (codex never does)
    /// and they do not announce anything. With the hybrid suite the peer may be codex, so
    /// a stream is reliable only when both ends announced it.
    pub fn for_stream(
        suite: &dyn crate::noise::NoiseSuite,
        ours: proto::StreamFeatures,
        theirs: proto::StreamFeatures,
    ) -> Self {
        if suite.name() == crate::noise::SUITE_V1 {
            return Self::Reliable;
        }
        Self::negotiated(ours.intersect(theirs))
    }

    /// Reliable only when both ends announced it.
    pub fn negotiated(features: proto::StreamFeatures) -> Self {
        if features.contains(proto::StreamFeatures::RELIABLE) {
            Self::Reliable
        } else {
            Self::Codex
        }
    }

    /// The first record's seq (and the offset between seq and nonce).
    fn first_seq(self) -> u32 {
        match self {
            Self::Reliable => 1,
            Self::Codex => 0,
        }
    }

    /// The Reset reason a protocol fault is reported with: codex peers know one.
    pub fn fault_reason(self, reason: ResetReason) -> ResetReason {
        match (self, reason) {
            (
                Self::Codex,
                ResetReason::SequenceError
                | ResetReason::DecryptFailed
                | ResetReason::RecordError
                | ResetReason::InvalidFrame
                | ResetReason::HandshakeFailed
                | ResetReason::ResumeMismatch,
            ) => ResetReason::NoiseRelayProtocolError,
            _ => reason,
        }
    }
}

/// The relay's timing values. Only tests change them (§6.2 "fixed").
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub ack_delay: Duration,
    pub rto_initial: Duration,
    pub rto_min: Duration,
    pub rto_max: Duration,
    pub stall_limit: Duration,
    pub keepalive_ack: Duration,
    /// Records sent more recently than this are not resent on a Resume.
    pub resume_resend_after: Duration,
    /// An answer never provokes a new harness request within this time.
    pub resume_quiet: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            ack_delay: Duration::from_millis(20),
            rto_initial: Duration::from_millis(500),
            rto_min: Duration::from_millis(200),
            rto_max: Duration::from_secs(10),
            stall_limit: Duration::from_secs(60),
            keepalive_ack: Duration::from_secs(5),
            resume_resend_after: Duration::from_millis(100),
            resume_quiet: Duration::from_secs(1),
        }
    }
}

/// The configurable bounds of one stream.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// `limits.max_message_bytes`, both directions.
    pub max_message_bytes: usize,
    /// `relay.inbound_queue_messages`.
    pub inbound_queue_messages: usize,
    /// `relay.inbound_queue_bytes`.
    pub inbound_queue_bytes: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            max_message_bytes: 67_108_864,
            inbound_queue_messages: 128,
            inbound_queue_bytes: 16 * 1024 * 1024,
        }
    }
}

/// Which end of the stream this machine is; it decides the Resume behaviour (§5.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Executor,
    Harness,
}

/// A message the sender refused locally (§4).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("message of {len} bytes exceeds the maximum message size of {limit} bytes")]
    TooLarge { len: usize, limit: usize },
    #[error("empty messages cannot be sent")]
    Empty,
    #[error("the stream is closing")]
    Closing,
}

/// The RTO estimator of RFC 6298 with the parameters of §5.5.
#[derive(Debug, Clone)]
pub struct RtoEstimator {
    srtt: Option<f64>,
    rttvar: f64,
    rto: Duration,
    timing: Timing,
}

impl RtoEstimator {
    pub fn new(timing: Timing) -> Self {
        Self {
            srtt: None,
            rttvar: 0.0,
            rto: timing.rto_initial,
            timing,
        }
    }

    pub fn rto(&self) -> Duration {
        self.rto
    }

    pub fn sample(&mut self, rtt: Duration) {
        let r = rtt.as_secs_f64() * 1000.0;
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2.0;
            }
            Some(srtt) => {
                self.rttvar = 0.75 * self.rttvar + 0.25 * (srtt - r).abs();
                self.srtt = Some(0.875 * srtt + 0.125 * r);
            }
        }
        let srtt = self.srtt.unwrap_or(r);
        let ms = srtt + (4.0 * self.rttvar).max(1.0);
        self.rto =
            Duration::from_secs_f64(ms / 1000.0).clamp(self.timing.rto_min, self.timing.rto_max);
    }

    pub fn back_off(&mut self) {
        self.rto = (self.rto * 2).min(self.timing.rto_max);
    }
}

#[derive(Debug)]
struct SentRecord {
    ciphertext: Bytes,
    last_sent: Instant,
    retransmitted: bool,
}

/// A harness Resume request waiting for the executor's answer.
#[derive(Debug)]
struct ResumeRequest {
    retry_at: Instant,
    backoff: Duration,
}

/// Counters for tests and logs.
#[derive(Debug, Default, Clone, Copy)]
pub struct StreamStats {
    pub records_sent: u64,
    pub retransmissions: u64,
    pub duplicates_received: u64,
    pub resumes_sent: u64,
}

/// What one stream holds in memory and its send counter, for the fuzz target's bounds
/// (RELAY §5.6, §5.7). Not a stable interface.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default)]
pub struct BufferUsage {
    /// The seq the next new record will take.
    pub next_seq: u32,
    pub pending_bytes: usize,
    pub unacked_records: usize,
    pub unacked_bytes: usize,
    pub resend_records: usize,
    pub reorder_records: usize,
    pub reorder_bytes: usize,
    pub reassembly_bytes: usize,
    pub reassembly_capacity: usize,
    pub inbound_messages: usize,
    pub inbound_bytes: usize,
}

/// The sans-IO machine of one established stream.
pub struct ReliableStream {
    stream_id: String,
    role: Role,
    semantics: Semantics,
    cipher: Box<dyn RecordCipher>,
    limits: StreamLimits,
    timing: Timing,
    connected: bool,
    closing: bool,
    scratch: Vec<u8>,

    // Sending direction.
    /// Plaintext of the outbound byte stream not yet cut into records.
    pending: BytesMut,
    next_seq: u32,
    peer_ack: u32,
    unacked: BTreeMap<u32, SentRecord>,
    unacked_bytes: usize,
    rto: RtoEstimator,
    /// Records to resend at the next transmit, in seq order.
    resend: BTreeSet<u32>,
    last_received: Instant,

    // Receiving direction.
    /// Records decrypted so far; the next expected seq is this plus the first seq.
    delivered: u32,
    highest_received: u32,
    reorder: BTreeMap<u32, Bytes>,
    reassembly: BytesMut,
    inbound: VecDeque<Bytes>,
    inbound_bytes: usize,
    ack_deadline: Option<Instant>,
    ack_now: bool,
    /// New records received since our last frame carried an ack ([`ACK_EVERY_RECORDS`]).
    received_since_ack: u32,
    last_sent_any: Instant,

    // Resume.
    resume_to_send: u32,
    resume_request: Option<ResumeRequest>,
    last_exchange: Option<Instant>,

    stats: StreamStats,
}

impl std::fmt::Debug for ReliableStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReliableStream")
            .field("stream_id", &self.stream_id)
            .field("role", &self.role)
            .field("next_seq", &self.next_seq)
            .field("peer_ack", &self.peer_ack)
            .field("delivered", &self.delivered)
            .finish_non_exhaustive()
    }
}

impl ReliableStream {
    /// A machine for an established stream following `semantics`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        stream_id: String,
        role: Role,
        semantics: Semantics,
        cipher: Box<dyn RecordCipher>,
        limits: StreamLimits,
        timing: Timing,
        now: Instant,
    ) -> Self {
        Self {
            stream_id,
            role,
            semantics,
            cipher,
            limits,
            timing,
            connected: true,
            closing: false,
            scratch: vec![0u8; MAX_NOISE_MESSAGE],
            pending: BytesMut::new(),
            next_seq: semantics.first_seq(),
            peer_ack: 0,
            unacked: BTreeMap::new(),
            unacked_bytes: 0,
            rto: RtoEstimator::new(timing),
            resend: BTreeSet::new(),
            last_received: now,
            delivered: 0,
            highest_received: 0,
            reorder: BTreeMap::new(),
            reassembly: BytesMut::new(),
            inbound: VecDeque::new(),
            inbound_bytes: 0,
            ack_deadline: None,
            ack_now: false,
            received_since_ack: 0,
            last_sent_any: now,
            resume_to_send: 0,
            resume_request: None,
            last_exchange: None,
            stats: StreamStats::default(),
        }
    }

    pub fn stream_id(&self) -> &str {
        &self.stream_id
    }

    pub fn stats(&self) -> StreamStats {
        self.stats
    }

    pub fn semantics(&self) -> Semantics {
        self.semantics
    }

    /// A snapshot of the stream's buffers (the fuzz target checks their bounds).
    #[doc(hidden)]
    pub fn buffer_usage(&self) -> BufferUsage {
        BufferUsage {
            next_seq: self.next_seq,
            pending_bytes: self.pending.len(),
            unacked_records: self.unacked.len(),
            unacked_bytes: self.unacked_bytes,
            resend_records: self.resend.len(),
            reorder_records: self.reorder.len(),
            reorder_bytes: self.reorder.values().map(Bytes::len).sum(),
            reassembly_bytes: self.reassembly.len(),
            reassembly_capacity: self.reassembly.capacity(),
            inbound_messages: self.inbound.len(),
            inbound_bytes: self.inbound_bytes,
        }
    }

    fn is_codex(&self) -> bool {
        self.semantics == Semantics::Codex
    }

    /// The seq of the next record to deliver.
    fn next_expected(&self) -> u32 {
        self.delivered + self.semantics.first_seq()
    }

    /// The receiver state to report: `ack` and `ack_bits` (§5.2); always 0 with codex.
    pub fn ack_fields(&self) -> (u32, u32) {
        if self.is_codex() {
            return (0, 0);
        }
        let mut bits = 0u32;
        for &seq in self.reorder.keys() {
            let offset = seq - self.delivered - 1;
            if (1..32).contains(&offset) {
                bits |= 1 << offset;
            }
        }
        (self.delivered, bits)
    }

    // ---- sending ------------------------------------------------------------------

    /// True while the outbound buffer has room for another message.
    pub fn can_send(&self) -> bool {
        !self.closing && self.pending.len() < SEND_BUFFER_BYTES
    }

    /// Appends one message to the outbound byte stream (§4). Records are formed by
    /// [`ReliableStream::poll_transmit`].
    pub fn send_message(&mut self, message: &[u8]) -> Result<(), SendError> {
        if self.closing {
            return Err(SendError::Closing);
        }
        if message.is_empty() {
            return Err(SendError::Empty);
        }
        if message.len() > self.limits.max_message_bytes || message.len() > u32::MAX as usize {
            return Err(SendError::TooLarge {
                len: message.len(),
                limit: self.limits.max_message_bytes,
            });
        }
        self.pending.reserve(4 + message.len());
        self.pending
            .extend_from_slice(&(message.len() as u32).to_be_bytes());
        self.pending.extend_from_slice(message);
        Ok(())
    }

    /// Appends raw bytes to the outbound byte stream, bypassing the message framing: tests
    /// and the fuzz target play an authenticated peer that breaks the rules of §4.
    #[doc(hidden)]
    pub fn push_raw(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// Stops accepting messages (orderly close, §5.10).
    pub fn begin_close(&mut self) {
        self.closing = true;
    }

    /// Everything sent has been acknowledged and nothing is waiting.
    pub fn is_flushed(&self) -> bool {
        self.pending.is_empty() && self.unacked.is_empty()
    }

    fn highest_sent(&self) -> u32 {
        self.next_seq - 1
    }

    /// Cuts and encrypts new records while the window allows (§4, §5.6, §3.7). Codex
    /// streams have no window and keep nothing for retransmission: their records go
    /// straight to `fresh`.
    fn make_records(
        &mut self,
        now: Instant,
        out: &mut Vec<u32>,
        fresh: &mut Vec<(u32, Bytes)>,
    ) -> Result<(), ResetReason> {
        let codex = self.is_codex();
        while !self.pending.is_empty() {
            let seq = self.next_seq;
            let take = self.pending.len().min(MAX_RECORD_PLAINTEXT);
            if !codex {
                if seq > self.peer_ack.saturating_add(WINDOW_RECORDS) {
                    break;
                }
                if self.unacked_bytes + take + proto::TAG_LEN > WINDOW_BYTES {
                    break;
                }
            }
            if seq > MAX_SEQ {
                return Err(ResetReason::SequenceExhausted);
            }
            let plain = self.pending.split_to(take);
            debug_assert_eq!(
                self.cipher.sending_nonce(),
                u64::from(seq - self.semantics.first_seq())
            );
            let len = self
                .cipher
                .encrypt(&plain, &mut self.scratch)
                .map_err(|_| ResetReason::RecordError)?;
            let ciphertext = Bytes::copy_from_slice(&self.scratch[..len]);
            self.next_seq += 1;
            self.stats.records_sent += 1;
            if codex {
                fresh.push((seq, ciphertext));
                continue;
            }
            self.unacked_bytes += ciphertext.len();
            self.unacked.insert(
                seq,
                SentRecord {
                    ciphertext,
                    last_sent: now,
                    retransmitted: false,
                },
            );
            out.push(seq);
        }
        Ok(())
    }

    /// Applies the ack fields of a received frame (§5.3).
    fn apply_ack(&mut self, ack: u32, bits: u32, now: Instant) -> Result<(), ResetReason> {
        let highest_sent = self.highest_sent();
        if ack > highest_sent || bits & 1 != 0 {
            return Err(ResetReason::SequenceError);
        }
        if bits != 0 {
            let top = 31 - bits.leading_zeros();
            if u64::from(ack) + 1 + u64::from(top) > u64::from(highest_sent) {
                return Err(ResetReason::SequenceError);
            }
        }
        if ack < self.peer_ack {
            return Ok(());
        }
        self.peer_ack = ack;
        let mut released: Vec<u32> = self.unacked.range(..=ack).map(|(s, _)| *s).collect();
        for i in 1..32u32 {
            if bits & (1 << i) != 0 {
                let seq = ack + 1 + i;
                if self.unacked.contains_key(&seq) {
                    released.push(seq);
                }
            }
        }
        let mut newest: Option<(u32, Instant, bool)> = None;
        for seq in released {
            if let Some(record) = self.unacked.remove(&seq) {
                self.unacked_bytes -= record.ciphertext.len();
                self.resend.remove(&seq);
                if newest.is_none_or(|(s, _, _)| seq > s) {
                    newest = Some((seq, record.last_sent, record.retransmitted));
                }
            }
        }
        if let Some((_, sent, false)) = newest {
            self.rto.sample(now.saturating_duration_since(sent));
        }
        Ok(())
    }

    // ---- receiving ----------------------------------------------------------------

    /// Handles one validated frame of this stream (not a `reset`, which the driver
    /// handles). An error means: send Reset with that reason and drop the stream.
    pub fn handle_frame(
        &mut self,
        frame: &RelayMessageFrame,
        now: Instant,
    ) -> Result<(), ResetReason> {
        self.last_received = now;
        if self.is_codex() {
            // Acks, Resume and Heartbeat carry nothing in codex semantics.
            return match &frame.body {
                Some(Body::Data(data)) => self.receive_record(data.seq, data.payload.clone(), now),
                _ => Ok(()),
            };
        }
        match &frame.body {
            Some(Body::Data(data)) => {
                self.apply_ack(frame.ack, frame.ack_bits, now)?;
                self.receive_record(data.seq, data.payload.clone(), now)
            }
            Some(Body::Resume(resume)) => {
                if resume.next_seq == 0 {
                    return Ok(());
                }
                self.receive_resume(resume.next_seq, frame.ack, frame.ack_bits, now)
            }
            Some(Body::Reset(_)) | None => Ok(()),
            Some(_) => self.apply_ack(frame.ack, frame.ack_bits, now),
        }
    }

    fn receive_record(
        &mut self,
        seq: u32,
        payload: Bytes,
        now: Instant,
    ) -> Result<(), ResetReason> {
        if seq < self.semantics.first_seq() {
            return Err(ResetReason::SequenceError);
        }
        let window = if self.is_codex() {
            CODEX_REORDER_RECORDS
        } else {
            WINDOW_RECORDS
        };
        let expected = self.next_expected();
        if u64::from(seq) >= u64::from(expected) + u64::from(window) {
            return Err(ResetReason::SequenceError);
        }
        if seq < expected || self.reorder.contains_key(&seq) {
            self.stats.duplicates_received += 1;
            // A codex peer takes an Ack frame for an invalid one.
            self.ack_now = !self.is_codex();
            return Ok(());
        }
        if !(proto::MIN_RECORD_CIPHERTEXT..=proto::MAX_RECORD_CIPHERTEXT).contains(&payload.len()) {
            return Err(ResetReason::RecordError);
        }
        self.reorder.insert(seq, payload);
        self.highest_received = self.highest_received.max(seq);
        if self.is_codex() {
            self.deliver(now)?;
            return Ok(());
        }
        self.received_since_ack += 1;
        if seq != expected || self.received_since_ack >= ACK_EVERY_RECORDS {
            self.ack_now = true;
        }
        self.deliver(now)?;
        self.schedule_ack(now);
        Ok(())
    }

    fn schedule_ack(&mut self, now: Instant) {
        if self.ack_deadline.is_none() {
            self.ack_deadline = Some(now + self.timing.ack_delay);
        }
    }

    fn queue_has_room(&self) -> bool {
        self.inbound.len() < self.limits.inbound_queue_messages
            && self.inbound_bytes < self.limits.inbound_queue_bytes
    }

    /// True while record `delivered + 1` waits for room in the inbound queue (§5.6).
    pub fn is_holding_back(&self) -> bool {
        !self.queue_has_room() && self.reorder.contains_key(&self.next_expected())
    }

    /// Decrypts and decodes in-order records while the inbound queue has room (§5.7).
    fn deliver(&mut self, _now: Instant) -> Result<bool, ResetReason> {
        let mut progressed = false;
        while self.queue_has_room() {
            let Some(ciphertext) = self.reorder.remove(&self.next_expected()) else {
                break;
            };
            debug_assert_eq!(self.cipher.receiving_nonce(), u64::from(self.delivered));
            let len = self
                .cipher
                .decrypt(&ciphertext, &mut self.scratch)
                .map_err(|_| ResetReason::DecryptFailed)?;
            self.delivered += 1;
            progressed = true;
            self.reassembly.extend_from_slice(&self.scratch[..len]);
            self.decode_messages()?;
        }
        Ok(progressed)
    }

    /// Splits complete length-prefixed messages off the reassembly buffer (§4).
    fn decode_messages(&mut self) -> Result<(), ResetReason> {
        loop {
            if self.reassembly.len() < 4 {
                return Ok(());
            }
            let len =
                u32::from_be_bytes(self.reassembly[..4].try_into().expect("4 bytes")) as usize;
            if len == 0 || len > self.limits.max_message_bytes {
                return Err(ResetReason::RecordError);
            }
            if self.reassembly.len() < 4 + len {
                self.reassembly.reserve(4 + len - self.reassembly.len());
                return Ok(());
            }
            self.reassembly.advance(4);
            let message = self.reassembly.split_to(len).freeze();
            self.inbound_bytes += message.len();
            self.inbound.push_back(message);
        }
    }

    /// Takes the next delivered message, then lets held-back records in (§5.6).
    pub fn pop_message(&mut self, now: Instant) -> Result<Option<Bytes>, ResetReason> {
        let Some(message) = self.inbound.pop_front() else {
            return Ok(None);
        };
        self.inbound_bytes -= message.len();
        if self.deliver(now)? && !self.is_codex() {
            self.schedule_ack(now);
        }
        Ok(Some(message))
    }

    pub fn has_message(&self) -> bool {
        !self.inbound.is_empty()
    }

    fn receive_resume(
        &mut self,
        next_seq: u32,
        ack: u32,
        bits: u32,
        now: Instant,
    ) -> Result<(), ResetReason> {
        if next_seq <= self.highest_received {
            return Err(ResetReason::ResumeMismatch);
        }
        if u64::from(next_seq) - 1 > u64::from(self.delivered) + u64::from(WINDOW_RECORDS) {
            return Err(ResetReason::SequenceError);
        }
        self.apply_ack(ack, bits, now)?;
        for (&seq, record) in &self.unacked {
            if now.saturating_duration_since(record.last_sent) >= self.timing.resume_resend_after {
                self.resend.insert(seq);
            }
        }
        match self.role {
            Role::Executor => self.resume_to_send += 1,
            Role::Harness => {
                if self.resume_request.take().is_some() {
                    self.last_exchange = Some(now);
                } else if self
                    .last_exchange
                    .is_none_or(|t| now.saturating_duration_since(t) >= self.timing.resume_quiet)
                {
                    self.start_resume_request(now);
                }
            }
        }
        Ok(())
    }

    fn start_resume_request(&mut self, now: Instant) {
        let backoff = self.rto.rto();
        self.resume_request = Some(ResumeRequest {
            retry_at: now + backoff,
            backoff,
        });
        self.resume_to_send += 1;
    }

    // ---- physical connection ------------------------------------------------------

    /// The physical connection is gone: nothing is transmitted until it is back (§5.8).
    pub fn on_disconnected(&mut self) {
        self.connected = false;
        self.resume_request = None;
    }

    /// A physical connection is up again: the executor announces, the harness requests.
    /// (A codex stream never sees this: a disconnect ends it.)
    pub fn on_connected(&mut self, now: Instant) {
        self.connected = true;
        // The stall clock does not run while disconnected.
        self.last_received = now;
        if self.is_codex() {
            return;
        }
        match self.role {
            Role::Executor => self.resume_to_send += 1,
            Role::Harness => self.start_resume_request(now),
        }
    }

    /// True while a harness Resume request has not been answered.
    pub fn resume_outstanding(&self) -> bool {
        self.resume_request.is_some()
    }

    // ---- timers and output -----------------------------------------------------------

    /// The next instant at which [`ReliableStream::on_timer`] has work to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.is_codex() {
            return None;
        }
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        if let Some(t) = self.ack_deadline {
            consider(t);
        }
        if let Some(first) = self.unacked.values().map(|r| r.last_sent).min() {
            consider(first + self.rto.rto());
            if self.connected {
                consider(self.last_received + self.timing.stall_limit);
            }
        }
        if self.is_holding_back() || !self.queue_has_room() {
            consider(self.last_sent_any + self.timing.keepalive_ack);
        }
        if let Some(request) = &self.resume_request {
            consider(request.retry_at);
        }
        next
    }

    /// Runs the timers that are due: retransmission, delayed and keep-alive acks, Resume
    /// retries and the stall limit.
    pub fn on_timer(&mut self, now: Instant) -> Result<(), ResetReason> {
        if self.is_codex() {
            return Ok(());
        }
        if let Some(first) = self.unacked.values().map(|r| r.last_sent).min() {
            if self.connected
                && now.saturating_duration_since(self.last_received) >= self.timing.stall_limit
            {
                return Err(ResetReason::PeerUnresponsive);
            }
            let rto = self.rto.rto();
            if now >= first + rto {
                for (&seq, record) in &self.unacked {
                    if now >= record.last_sent + rto {
                        self.resend.insert(seq);
                    }
                }
                self.rto.back_off();
            }
        }
        if (self.is_holding_back() || !self.queue_has_room())
            && now >= self.last_sent_any + self.timing.keepalive_ack
        {
            self.ack_now = true;
        }
        if let Some(request) = &mut self.resume_request {
            if now >= request.retry_at {
                request.backoff = (request.backoff * 2).min(self.timing.rto_max);
                request.retry_at = now + request.backoff;
                self.resume_to_send += 1;
            }
        }
        Ok(())
    }

    fn make_frame(&self, body: Body) -> RelayMessageFrame {
        let (ack, bits) = self.ack_fields();
        proto::frame(&self.stream_id, ack, bits, body)
    }

    /// Frames to send now, control frames first, each carrying the current ack fields.
    /// While disconnected the frames are formed (records are numbered and encrypted, so
    /// the window fills) but returned empty: they count as lost.
    pub fn poll_transmit(&mut self, now: Instant) -> Result<Vec<RelayMessageFrame>, ResetReason> {
        let mut frames = Vec::new();
        while self.resume_to_send > 0 {
            self.resume_to_send -= 1;
            self.stats.resumes_sent += 1;
            frames.push(self.make_frame(proto::resume_body(self.next_seq)));
        }
        let resend: Vec<u32> = std::mem::take(&mut self.resend).into_iter().collect();
        for seq in resend {
            if let Some(record) = self.unacked.get_mut(&seq) {
                record.retransmitted = true;
                record.last_sent = now;
                self.stats.retransmissions += 1;
                let payload = record.ciphertext.clone();
                frames.push(self.make_frame(proto::data_body(seq, payload)));
            }
        }
        let mut new = Vec::new();
        let mut fresh = Vec::new();
        self.make_records(now, &mut new, &mut fresh)?;
        for seq in new {
            let payload = self.unacked[&seq].ciphertext.clone();
            frames.push(self.make_frame(proto::data_body(seq, payload)));
        }
        for (seq, payload) in fresh {
            frames.push(self.make_frame(proto::data_body(seq, payload)));
        }
        let ack_due = self.ack_now || self.ack_deadline.is_some_and(|t| now >= t);
        if frames.is_empty() && ack_due {
            frames.push(self.make_frame(proto::ack_body()));
        }
        if !frames.is_empty() {
            self.ack_now = false;
            self.ack_deadline = None;
            self.received_since_ack = 0;
            self.last_sent_any = now;
        }
        if !self.connected {
            frames.clear();
        }
        Ok(frames)
    }
}

#[cfg(test)]
#[path = "reliable_tests.rs"]
mod tests;

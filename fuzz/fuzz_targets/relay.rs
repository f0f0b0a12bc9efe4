#![no_main]
//! Relay frames and streams (RELAY §2, §3, §5; CODEX-0169 §4.5, §4.6), driven through the
//! real code of `exec-server-relay-core`. The first input byte picks the surface:
//!
//! * frames (`x & 31` = 0 … 7): arbitrary bytes decoded as a `RelayMessageFrame`, then
//!   the stateless validation of §2.5, the reset vocabulary and the log quoting a receiver
//!   applies; a decoded frame must survive an encode/decode round trip.
//! * streams (8 … 27): a harness and an executor [`ReliableStream`] (reliable or codex
//!   semantics; records sealed by the transports of a real Noise handshake or, in most
//!   runs, since a real handshake costs milliseconds of instrumented X25519, by a keyed
//!   test cipher behind the same `RecordCipher` seam) joined by a network the input
//!   controls: frames are delivered in order or out of it, dropped, duplicated, corrupted,
//!   forged (acks, resumes, heartbeats, records, resets, raw bytes), both ends disconnect
//!   and reconnect, time moves on a virtual clock, the applications read or fall behind,
//!   and a peer may break the record framing (§4). Invariants: the bytes each application
//!   receives are a prefix of what the other sent (once, in order) whatever happens, or the
//!   stream ends in a reset; every buffer stays within the configured limits; every frame a
//!   machine emits is valid, a record keeps its seq and ciphertext when resent; and, once
//!   the network heals, a stream that nobody forged frames into delivers everything
//!   (codex semantics: when nothing was lost) without a reset it did not deserve.
//! * handshakes (28 … 31) of both Noise suites: an attacker's msg1 to the responder, an
//!   attacker's msg2 to the initiator, and real messages with attacker edits (which must
//!   be refused, while unedited ones must complete and carry records both ways).

use std::collections::{BTreeMap, VecDeque};
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tokio::time::Instant;

use exec_server_relay_core::noise::{
    NoiseError, NoiseIdentity, NoiseSuite, RecordCipher, MAX_AUTHORIZATION_BYTES, SUITES,
};
use exec_server_relay_core::proto::{
    self, Body, FrameFault, RelayData, RelayHeartbeat, RelayMessageFrame, ResetReason,
    StreamFeatures, MAX_NOISE_MESSAGE, MAX_RECORD_CIPHERTEXT, MAX_RECORD_PLAINTEXT,
};
use exec_server_relay_core::reliable::{
    ReliableStream, Role, Semantics, SendError, StreamLimits, Timing, CODEX_REORDER_RECORDS,
    SEND_BUFFER_BYTES, WINDOW_BYTES, WINDOW_RECORDS,
};

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    // Handshakes cost milliseconds of X25519 and ML-KEM; the cheap surfaces get more runs.
    match input.byte() & 31 {
        0..=7 => fuzz_frame(input.rest()),
        8..=27 => fuzz_stream(&mut input),
        28 | 29 => fuzz_responder(&mut input),
        30 => fuzz_edited_handshake(&mut input),
        _ => fuzz_initiator(&mut input),
    }
});

/// The fuzzer's bytes, read front to back; an exhausted input reads as zeros.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.byte(), self.byte()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// Up to `n` bytes.
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        taken
    }

    /// A length-prefixed chunk (u16 length).
    fn chunk(&mut self) -> &'a [u8] {
        let n = usize::from(self.u16());
        self.bytes(n)
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }

    /// A sequence number or ack: mostly small, sometimes at the edges of the u32 range.
    fn number(&mut self) -> u32 {
        match self.byte() {
            0xF0 => u32::MAX,
            0xF1 => u32::MAX - 1,
            0xF2 => 1 << 31,
            0xF3..=0xFF => self.u32(),
            b => u32::from(b),
        }
    }

    /// An `ack_bits` value: zero, one bit, or any pattern.
    fn bits(&mut self) -> u32 {
        match self.byte() {
            0 => 0,
            1 => self.u32(),
            b => 1 << (b & 31),
        }
    }
}

// ---- frames ---------------------------------------------------------------------------

fn fuzz_frame(bytes: &[u8]) {
    let Ok(frame) = proto::decode(bytes) else {
        return;
    };
    check_received_frame(&frame);
    let again = proto::decode(&proto::encode(&frame)).expect("an encoded frame decodes");
    assert_eq!(again, frame, "encode/decode round trip");
}

/// What a receiver does with a decoded frame before any stream state (§2.5).
fn check_received_frame(frame: &RelayMessageFrame) {
    let _ = proto::kind(frame);
    match proto::validate(frame) {
        Ok(()) => {
            assert_eq!(frame.version, proto::FRAME_VERSION);
            assert!(proto::stream_id_is_valid(&frame.stream_id));
            match &frame.body {
                None => panic!("a frame without a body passed validation"),
                Some(Body::Data(d)) => {
                    assert_eq!((d.segment_index, d.segment_count), (0, 1));
                    assert!((proto::MIN_RECORD_CIPHERTEXT..=MAX_RECORD_CIPHERTEXT)
                        .contains(&d.payload.len()));
                }
                Some(Body::Handshake(h)) => {
                    assert!(!h.payload.is_empty() && h.payload.len() <= MAX_NOISE_MESSAGE);
                    let features = StreamFeatures::announced(h);
                    assert!(features.is_empty() || features == StreamFeatures::RELIABLE);
                }
                Some(_) => {}
            }
        }
        Err(fault) => {
            let reason = fault.reset_reason();
            assert_eq!(reason.is_none(), fault == FrameFault::StreamId);
        }
    }
    if let Some(Body::Reset(reset)) = &frame.body {
        let reason = ResetReason::parse(&reset.reason);
        if reason != ResetReason::Unspecified {
            assert_eq!(reason.as_str(), reset.reason);
        }
        for text in [&reset.reason, &frame.stream_id] {
            let quoted = proto::truncate_for_log(text);
            assert!(
                !quoted.contains(['\n', '\r', '\u{2028}', '\u{2029}']),
                "peer text quoted for a log starts a new line: {quoted:?}"
            );
        }
    }
}

// ---- streams --------------------------------------------------------------------------

const STREAM_ID: &str = "s";
const HARNESS: usize = 0;
const EXECUTOR: usize = 1;
/// Application bytes one end sends at most, so that a run stays fast.
const MAX_SENT_BYTES: usize = 1 << 19;
const MAX_OPS: usize = 600;
const HEAL_ROUNDS: usize = 1_000;
/// Rounds of healing when no liveness is claimed (forged frames, a broken framing).
const HEAL_ROUNDS_UNCLAIMED: usize = 100;

/// Pseudo-random bytes that application messages are cut from.
fn pattern() -> &'static [u8] {
    static PATTERN: OnceLock<Vec<u8>> = OnceLock::new();
    PATTERN.get_or_init(|| {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..2 * MAX_SENT_BYTES)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    })
}

/// The limits a stream runs with: tight ones make the queue and size rules bite.
fn limits(preset: u8) -> StreamLimits {
    match preset & 3 {
        0 => StreamLimits {
            max_message_bytes: 300_000,
            ..StreamLimits::default()
        },
        1 => StreamLimits {
            max_message_bytes: 100,
            inbound_queue_messages: 1,
            inbound_queue_bytes: 1,
        },
        2 => StreamLimits {
            max_message_bytes: 70_000,
            inbound_queue_messages: 3,
            inbound_queue_bytes: 100_000,
        },
        _ => StreamLimits {
            max_message_bytes: 2_000,
            inbound_queue_messages: 128,
            inbound_queue_bytes: 4_096,
        },
    }
}

/// Static keys per suite (executor, harness), made once per process.
fn keys(suite: usize) -> &'static (NoiseIdentity, NoiseIdentity) {
    static KEYS: OnceLock<Vec<(NoiseIdentity, NoiseIdentity)>> = OnceLock::new();
    &KEYS.get_or_init(|| {
        SUITES
            .iter()
            .map(|s| {
                (
                    NoiseIdentity::generate_for(*s),
                    NoiseIdentity::generate_for(*s),
                )
            })
            .collect()
    })[suite]
}

fn prologue(suite: &dyn NoiseSuite) -> Vec<u8> {
    suite.prologue("env", "reg", STREAM_ID)
}

/// Record ciphers from a real handshake of `suite`: (harness, executor).
fn transports(suite_index: usize) -> (Box<dyn RecordCipher>, Box<dyn RecordCipher>) {
    let suite = SUITES[suite_index];
    let (executor, harness) = keys(suite_index);
    let p = prologue(suite);
    let mut initiator = suite.initiator(harness, &executor.public(), &p).unwrap();
    let mut responder = suite.responder(executor, &p).unwrap();
    let mut message = vec![0u8; MAX_NOISE_MESSAGE];
    let mut payload = vec![0u8; MAX_NOISE_MESSAGE];
    let n = initiator.write_message(b"authz", &mut message).unwrap();
    responder.read_message(&message[..n], &mut payload).unwrap();
    let n = responder.write_message(&[], &mut message).unwrap();
    initiator.read_message(&message[..n], &mut payload).unwrap();
    (
        initiator.into_transport().unwrap(),
        responder.into_transport().unwrap(),
    )
}

/// A record cipher for the stream runs that is fast enough to fuzz with: the record is
/// the plaintext and a 16-byte tag, a keyed mix (the key random per process, so no input
/// can carry a valid tag) of the direction, the nonce and the plaintext. Like the Noise
/// transport it refuses a record of another nonce, of the other direction or edited, and
/// counts nonces on success only.
struct TestCipher {
    key: [u64; 2],
    send: (u64, u64),
    receive: (u64, u64),
}

impl TestCipher {
    /// (harness, executor), sharing one key.
    fn pair() -> (Box<dyn RecordCipher>, Box<dyn RecordCipher>) {
        static KEY: OnceLock<[u64; 2]> = OnceLock::new();
        let key = *KEY.get_or_init(|| {
            use std::hash::{BuildHasher, Hasher};
            let state = std::hash::RandomState::new();
            [1u64, 2].map(|i| {
                let mut hasher = state.build_hasher();
                hasher.write_u64(i);
                hasher.finish()
            })
        });
        let end = |send, receive| -> Box<dyn RecordCipher> {
            Box::new(TestCipher {
                key,
                send: (send, 0),
                receive: (receive, 0),
            })
        };
        (end(0, 1), end(1, 0))
    }

    /// Eight bytes at a time: a per-byte hash in this instrumented crate would be the
    /// slowest part of a run.
    fn tag(&self, (direction, nonce): (u64, u64), plaintext: &[u8]) -> [u8; proto::TAG_LEN] {
        const M: [u64; 2] = [0x9E37_79B9_7F4A_7C15, 0xC2B2_AE3D_27D4_EB4F];
        let mut lanes = [0, 1].map(|i| {
            self.key[i] ^ (direction << 62) ^ nonce.wrapping_mul(M[i]) ^ plaintext.len() as u64
        });
        let mut words = plaintext.chunks_exact(8);
        for word in &mut words {
            let w = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            lanes[0] = (lanes[0] ^ w).wrapping_mul(M[0]).rotate_left(31);
            lanes[1] = (lanes[1] ^ w).wrapping_mul(M[1]).rotate_left(27);
        }
        let mut last = [0u8; 8];
        last[..words.remainder().len()].copy_from_slice(words.remainder());
        let w = u64::from_le_bytes(last);
        let mut tag = [0u8; proto::TAG_LEN];
        for (i, out) in tag.chunks_exact_mut(8).enumerate() {
            let mut h = (lanes[i] ^ w).wrapping_mul(M[i]);
            h ^= h >> 29;
            h = h.wrapping_mul(M[1 - i]);
            h ^= h >> 32;
            out.copy_from_slice(&h.to_le_bytes());
        }
        tag
    }
}

impl RecordCipher for TestCipher {
    fn encrypt(&mut self, plaintext: &[u8], record: &mut [u8]) -> Result<usize, NoiseError> {
        let len = plaintext.len() + proto::TAG_LEN;
        if len > MAX_NOISE_MESSAGE || len > record.len() {
            return Err(NoiseError::Protocol("record too long".into()));
        }
        let tag = self.tag(self.send, plaintext);
        record[..plaintext.len()].copy_from_slice(plaintext);
        record[plaintext.len()..len].copy_from_slice(&tag);
        self.send.1 += 1;
        Ok(len)
    }

    fn decrypt(&mut self, record: &[u8], plaintext: &mut [u8]) -> Result<usize, NoiseError> {
        let refused = || NoiseError::Protocol("decrypt".into());
        let Some(len) = record.len().checked_sub(proto::TAG_LEN) else {
            return Err(refused());
        };
        if record.len() > MAX_NOISE_MESSAGE || len > plaintext.len() {
            return Err(refused());
        }
        let (body, tag) = record.split_at(len);
        // Compared without an early exit, so comparison feedback does not spell the tag.
        let expected = self.tag(self.receive, body);
        let diff = expected.iter().zip(tag).fold(0u8, |d, (a, b)| d | (a ^ b));
        if diff != 0 {
            return Err(refused());
        }
        plaintext[..len].copy_from_slice(body);
        self.receive.1 += 1;
        Ok(len)
    }

    fn sending_nonce(&self) -> u64 {
        self.send.1
    }

    fn receiving_nonce(&self) -> u64 {
        self.receive.1
    }
}

/// One end: its machine and what its application sent and received.
struct End {
    machine: ReliableStream,
    /// The outbound byte stream as the application (or a raw peer) wrote it.
    sent: Vec<u8>,
    /// The peer's messages as delivered here, with their length prefixes put back.
    delivered: Vec<u8>,
    messages: usize,
    /// seq → ciphertext of every record this end put on the wire.
    records: BTreeMap<u32, Bytes>,
    last_ack: u32,
    connected: bool,
}

/// Why the stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// An end reset it with this reason (its own fault check or the receive path's).
    Reset(ResetReason),
    /// A Reset frame arrived.
    ResetReceived,
    /// A codex stream lost its physical connection.
    Lost,
}

struct Network {
    ends: [End; 2],
    /// Frames in flight from end `i` to the other one, encoded.
    wire: [VecDeque<Bytes>; 2],
    now: Instant,
    semantics: Semantics,
    limits: StreamLimits,
    ending: Option<Ending>,
    /// Something the network did that voids a promise of the liveness check.
    lost: bool,
    reordered: bool,
    forged: bool,
    raw: bool,
}

fn fuzz_stream(input: &mut Input) {
    // Bits 0–1: the limits; bit 2: codex semantics; bits 3–7 all set: real transports.
    let config = input.byte();
    let limits = limits(config);
    let semantics = if config & 4 == 0 {
        Semantics::Reliable
    } else {
        Semantics::Codex
    };
    // The machine does not care which cipher it holds, and a real handshake costs
    // milliseconds: one run in thirty-two has the transports of a real handshake (of the
    // suite the next byte picks), the others a test cipher.
    let (h, e) = match config >> 3 {
        31 => transports(usize::from(input.byte() & 1)),
        _ => TestCipher::pair(),
    };
    let t0 = Instant::now();
    let timing = Timing::default();
    let end = |role, cipher| End {
        machine: ReliableStream::new(
            STREAM_ID.into(),
            role,
            semantics,
            cipher,
            limits,
            timing,
            t0,
        ),
        sent: Vec::new(),
        delivered: Vec::new(),
        messages: 0,
        records: BTreeMap::new(),
        last_ack: 0,
        connected: true,
    };
    let mut net = Network {
        ends: [end(Role::Harness, h), end(Role::Executor, e)],
        wire: [VecDeque::new(), VecDeque::new()],
        now: t0,
        semantics,
        limits,
        ending: None,
        lost: false,
        reordered: false,
        forged: false,
        raw: false,
    };
    let mut ops = 0;
    while !input.is_empty() && net.ending.is_none() && ops < MAX_OPS {
        ops += 1;
        net.step(input);
        net.check();
    }
    if net.ending.is_none() {
        net.heal();
    }
    net.check();
    net.check_liveness();
}

impl Network {
    fn step(&mut self, input: &mut Input) {
        let op = input.byte();
        let side = usize::from(op >> 7);
        match op & 0x7F {
            0..=29 => {
                let len = match input.byte() {
                    b @ 0..=199 => usize::from(b) + 1,
                    b => usize::from(b - 199) * 2_333,
                };
                self.send(side, len);
            }
            30..=34 => {
                let bytes = input.chunk();
                self.push_raw(side, bytes);
            }
            35..=54 => self.poll(side),
            55..=74 => {
                let count = usize::from(input.byte() % 16) + 1;
                for _ in 0..count {
                    let Some(frame) = self.wire[side].pop_front() else {
                        break;
                    };
                    self.receive(1 - side, &frame);
                }
            }
            75..=78 => {
                let at = usize::from(input.byte());
                if let Some(frame) = take(&mut self.wire[side], at) {
                    self.reordered |= !self.wire[side].is_empty();
                    self.receive(1 - side, &frame);
                }
            }
            79..=81 => {
                let at = usize::from(input.byte());
                if take(&mut self.wire[side], at).is_some() {
                    self.lost = true;
                }
            }
            82..=83 => {
                let at = usize::from(input.byte());
                let len = self.wire[side].len();
                if len > 0 {
                    let copy = self.wire[side][at % len].clone();
                    self.wire[side].push_back(copy);
                    self.reordered = true;
                }
            }
            84..=85 => {
                let at = usize::from(input.byte());
                let position = usize::from(input.u16());
                let flip = input.byte() | 1;
                let len = self.wire[side].len();
                if len > 0 {
                    let mut bytes = self.wire[side][at % len].to_vec();
                    let position = position % bytes.len();
                    bytes[position] ^= flip;
                    self.wire[side][at % len] = Bytes::from(bytes);
                    self.forged = true;
                }
            }
            86..=99 => {
                let count = usize::from(input.byte() % 8) + 1;
                self.pop(side, count);
            }
            100..=109 => {
                let ms = match input.byte() {
                    b @ 0..=199 => u64::from(b),
                    b => u64::from(b - 199) * 1_000,
                };
                self.advance(Duration::from_millis(ms));
            }
            110..=112 => self.disconnect(side),
            113..=115 => self.connect(side),
            116..=123 => {
                let frame = forged_frame(input);
                self.forged = true;
                self.receive(side, &proto::encode(&frame));
            }
            124..=125 => {
                let bytes = input.chunk();
                self.forged = true;
                self.receive(side, bytes);
            }
            _ => self.ends[side].machine.begin_close(),
        }
    }

    fn fail(&mut self, ending: Ending) {
        self.ending.get_or_insert(ending);
    }

    /// One application message of `len` bytes, if the end takes messages now (the driver
    /// reads from the application only while [`ReliableStream::can_send`]).
    fn send(&mut self, side: usize, len: usize) {
        let end = &mut self.ends[side];
        if !end.machine.can_send() || end.sent.len() + len > MAX_SENT_BYTES {
            return;
        }
        // Content that differs with the position in the stream, so that a record or message
        // delivered out of place cannot match.
        let at = end.sent.len() + side * 7_919;
        let message = &pattern()[at..at + len];
        match end.machine.send_message(message) {
            Ok(()) => {
                end.sent.extend_from_slice(&(len as u32).to_be_bytes());
                end.sent.extend_from_slice(message);
            }
            Err(SendError::TooLarge { len: l, limit }) => {
                assert_eq!((l, limit), (len, self.limits.max_message_bytes));
                assert!(len > self.limits.max_message_bytes);
            }
            Err(e) => panic!("a sendable stream refused a message: {e}"),
        }
    }

    /// A peer that breaks the record framing (§4) through the real record layer.
    fn push_raw(&mut self, side: usize, bytes: &[u8]) {
        let end = &mut self.ends[side];
        if bytes.is_empty() || !end.machine.can_send() || end.sent.len() > MAX_SENT_BYTES {
            return;
        }
        end.machine.push_raw(bytes);
        end.sent.extend_from_slice(bytes);
        self.raw = true;
    }

    /// Takes the frames an end wants to send and puts them on the wire, checking each.
    fn poll(&mut self, side: usize) {
        let semantics = self.semantics;
        let end = &mut self.ends[side];
        let before = end.machine.buffer_usage().next_seq;
        let frames = match end.machine.poll_transmit(self.now) {
            Ok(frames) => frames,
            Err(reason) => return self.fail(Ending::Reset(reason)),
        };
        let after = end.machine.buffer_usage().next_seq;
        assert!(after >= before);
        if !end.connected {
            assert!(frames.is_empty(), "frames sent while disconnected");
        }
        let mut next_new = before;
        for frame in frames {
            assert_eq!(proto::validate(&frame), Ok(()), "{frame:?}");
            assert_eq!(frame.stream_id, STREAM_ID);
            assert!(frame.traceparent.is_none() && frame.tracestate.is_none());
            match semantics {
                Semantics::Codex => {
                    assert_eq!((frame.ack, frame.ack_bits), (0, 0));
                    assert!(matches!(frame.body, Some(Body::Data(_))), "{frame:?}");
                }
                Semantics::Reliable => {
                    assert_eq!(frame.ack_bits & 1, 0);
                    assert!(frame.ack >= end.last_ack, "ack went backwards");
                    end.last_ack = frame.ack;
                }
            }
            match frame.body.as_ref().expect("validated") {
                Body::Data(d) => {
                    if d.seq >= before {
                        assert_eq!(d.seq, next_new, "new records are numbered in order");
                        next_new += 1;
                        assert!(end.records.insert(d.seq, d.payload.clone()).is_none());
                    } else {
                        assert_eq!(semantics, Semantics::Reliable, "codex never resends");
                        let first = end.records.entry(d.seq).or_insert(d.payload.clone());
                        assert_eq!(*first, d.payload, "a resent record changed");
                    }
                    if semantics == Semantics::Reliable {
                        assert!(d.seq >= 1);
                    }
                }
                Body::Resume(r) => {
                    assert_eq!(semantics, Semantics::Reliable);
                    assert_eq!(r.next_seq, before);
                }
                Body::AckFrame(_) => assert_eq!(semantics, Semantics::Reliable),
                other => panic!("a stream machine emitted {other:?}"),
            }
            self.wire[side].push_back(proto::encode(&frame));
        }
        if end.connected {
            assert_eq!(next_new, after, "every new record went out");
        }
    }

    /// The receive path of an end for one binary message: decode, route, validate (§2.5),
    /// Reset handling (§5.9), then the machine.
    fn receive(&mut self, to: usize, bytes: &[u8]) {
        let Ok(frame) = proto::decode(bytes) else {
            // The harness resets its stream and closes (row 3); the executor cannot tell
            // which stream an undecodable frame was for.
            if to == HARNESS {
                self.fail(Ending::Reset(ResetReason::InvalidFrame));
            }
            return;
        };
        if frame.stream_id != STREAM_ID {
            return;
        }
        check_received_frame(&frame);
        if let Err(fault) = proto::validate(&frame) {
            if let Some(reason) = fault.reset_reason() {
                self.fail(Ending::Reset(reason));
            }
            return;
        }
        match &frame.body {
            Some(Body::Reset(_)) => return self.fail(Ending::ResetReceived),
            // A second msg1 that differs from the first (executor), a msg2 that differs
            // from the one processed (harness): both reset the stream.
            Some(Body::Handshake(_)) => {
                return self.fail(Ending::Reset(if to == HARNESS {
                    ResetReason::InvalidFrame
                } else {
                    ResetReason::DuplicateStream
                }))
            }
            _ => {}
        }
        if let Err(reason) = self.ends[to].machine.handle_frame(&frame, self.now) {
            self.fail(Ending::Reset(reason));
        }
    }

    /// The application of `side` reads up to `count` messages.
    fn pop(&mut self, side: usize, count: usize) {
        for _ in 0..count {
            match self.ends[side].machine.pop_message(self.now) {
                Ok(Some(message)) => self.deliver(side, &message),
                Ok(None) => break,
                Err(reason) => return self.fail(Ending::Reset(reason)),
            }
        }
    }

    /// The delivery invariant: what reaches an application is the next stretch of what
    /// the other end's application sent, byte for byte.
    fn deliver(&mut self, side: usize, message: &[u8]) {
        assert!(!message.is_empty(), "an empty message was delivered");
        assert!(message.len() <= self.limits.max_message_bytes);
        let [a, b] = &mut self.ends;
        let (end, peer) = if side == HARNESS { (a, b) } else { (b, a) };
        let start = end.delivered.len();
        end.delivered
            .extend_from_slice(&(message.len() as u32).to_be_bytes());
        end.delivered.extend_from_slice(message);
        end.messages += 1;
        let stretch = &end.delivered[start..];
        assert!(
            peer.sent.get(start..end.delivered.len()) == Some(stretch),
            "message {} delivered to end {side} is not the next one sent",
            end.messages
        );
    }

    /// Moves the virtual clock, running each end's timers at its deadlines as the driver
    /// does (and what they transmit goes on the wire).
    fn advance(&mut self, by: Duration) {
        let target = self.now + by;
        for _ in 0..64 {
            let due = self
                .ends
                .iter()
                .filter_map(|e| e.machine.next_deadline())
                .filter(|d| *d <= target)
                .min();
            let Some(due) = due else { break };
            self.now = self.now.max(due);
            if !self.run_timers() {
                return;
            }
        }
        self.now = target;
        self.run_timers();
    }

    /// Runs the timers that are due and transmits; false once the stream has ended.
    fn run_timers(&mut self) -> bool {
        for side in [HARNESS, EXECUTOR] {
            let machine = &mut self.ends[side].machine;
            if machine.next_deadline().is_some_and(|d| d <= self.now) {
                if let Err(reason) = machine.on_timer(self.now) {
                    self.fail(Ending::Reset(reason));
                    return false;
                }
            }
            self.poll(side);
            if self.ending.is_some() {
                return false;
            }
        }
        true
    }

    /// One end loses its physical connection: what is in flight to or from it is lost.
    /// A codex stream ends with its connection (CODEX-0169 §4.5).
    fn disconnect(&mut self, side: usize) {
        if self.semantics == Semantics::Codex {
            return self.fail(Ending::Lost);
        }
        self.lost |= !self.wire[0].is_empty() || !self.wire[1].is_empty();
        self.wire = [VecDeque::new(), VecDeque::new()];
        let end = &mut self.ends[side];
        end.connected = false;
        end.machine.on_disconnected();
    }

    fn connect(&mut self, side: usize) {
        let end = &mut self.ends[side];
        if !end.connected {
            end.connected = true;
            end.machine.on_connected(self.now);
        }
    }

    /// Buffer bounds (RELAY §5.6, §5.7) and the accessors' consistency, for both ends.
    fn check(&self) {
        if self.ending.is_some() {
            return;
        }
        let limits = self.limits;
        for end in &self.ends {
            let machine = &end.machine;
            let u = machine.buffer_usage();
            assert!(
                u.pending_bytes <= SEND_BUFFER_BYTES + 4 + limits.max_message_bytes.max(1 << 16)
            );
            match self.semantics {
                Semantics::Reliable => {
                    assert!(u.unacked_records <= WINDOW_RECORDS as usize, "{u:?}");
                    assert!(u.unacked_bytes <= WINDOW_BYTES, "{u:?}");
                    assert!(u.resend_records <= u.unacked_records, "{u:?}");
                    assert!(u.reorder_records <= WINDOW_RECORDS as usize, "{u:?}");
                }
                Semantics::Codex => {
                    assert_eq!(u.unacked_records + u.unacked_bytes + u.resend_records, 0);
                    assert!(u.reorder_records <= CODEX_REORDER_RECORDS as usize, "{u:?}");
                    assert_eq!(machine.ack_fields(), (0, 0));
                    assert_eq!(machine.next_deadline(), None);
                }
            }
            assert!(u.reorder_bytes <= u.reorder_records * MAX_RECORD_CIPHERTEXT);
            // An incomplete message and its length prefix; no more.
            assert!(u.reassembly_bytes < 4 + limits.max_message_bytes, "{u:?}");
            let record_span = 4 + limits.max_message_bytes + MAX_RECORD_PLAINTEXT;
            assert!(
                u.reassembly_capacity <= 2 * record_span + (1 << 17),
                "{u:?}"
            );
            // The queue is checked before each record is decrypted, and one record completes
            // at most its own bytes' worth of messages (§5.6).
            assert!(
                u.inbound_messages < limits.inbound_queue_messages + MAX_RECORD_PLAINTEXT / 5 + 2,
                "{u:?}"
            );
            assert!(
                u.inbound_bytes
                    <= limits.inbound_queue_bytes + limits.max_message_bytes + MAX_RECORD_PLAINTEXT,
                "{u:?}"
            );
            if machine.is_holding_back() {
                assert!(u.reorder_records > 0);
            }
        }
    }

    /// The network becomes perfect: everything is delivered in order, applications read
    /// all, time runs to each deadline.
    fn heal(&mut self) {
        for side in [HARNESS, EXECUTOR] {
            self.connect(side);
        }
        let rounds = if self.forged || self.raw {
            HEAL_ROUNDS_UNCLAIMED
        } else {
            HEAL_ROUNDS
        };
        for _ in 0..rounds {
            let mut moved = false;
            for side in [HARNESS, EXECUTOR] {
                let before = self.ends[side].messages;
                self.pop(side, usize::MAX);
                moved |= self.ends[side].messages != before;
                self.poll(side);
            }
            for side in [HARNESS, EXECUTOR] {
                while let Some(frame) = self.wire[side].pop_front() {
                    moved = true;
                    self.receive(1 - side, &frame);
                    if self.ending.is_some() {
                        return;
                    }
                }
            }
            if self.ending.is_some() {
                return;
            }
            self.check();
            if moved {
                continue;
            }
            let next = self
                .ends
                .iter()
                .filter_map(|e| e.machine.next_deadline())
                .min();
            match next {
                Some(at) => {
                    self.now = self.now.max(at);
                    if !self.run_timers() {
                        return;
                    }
                }
                None => return,
            }
        }
    }

    /// After [`Network::heal`]: a stream nobody forged into delivers everything, unless
    /// a codex stream lost a frame (nothing is resent there); and a stream whose frames
    /// only arrived in order, or not at all, is never reset except for a silent peer.
    fn check_liveness(&self) {
        if self.forged || self.raw {
            return;
        }
        match self.ending {
            Some(Ending::Reset(reason)) if !self.reordered => assert!(
                reason == ResetReason::PeerUnresponsive
                    || (self.semantics == Semantics::Codex && reason == ResetReason::SequenceError),
                "a stream on an in-order network was reset: {reason}"
            ),
            Some(_) => {}
            None => {
                if self.semantics == Semantics::Codex && self.lost {
                    return;
                }
                for side in [HARNESS, EXECUTOR] {
                    let peer = &self.ends[1 - side];
                    assert_eq!(
                        self.ends[side].delivered.len(),
                        peer.sent.len(),
                        "end {side} did not receive everything once the network healed"
                    );
                }
            }
        }
    }
}

/// Removes the frame at `at` (modulo the queue's length).
fn take(queue: &mut VecDeque<Bytes>, at: usize) -> Option<Bytes> {
    if queue.is_empty() {
        return None;
    }
    let len = queue.len();
    queue.remove(at % len)
}

/// A frame an attacker on the path writes: any body, any ack fields, sometimes outside
/// the validation rules.
fn forged_frame(input: &mut Input) -> RelayMessageFrame {
    let kind = input.byte();
    let ack = input.number();
    let bits = input.bits();
    let body = match kind % 6 {
        0 => proto::ack_body(),
        1 => proto::resume_body(input.number()),
        2 => Body::Heartbeat(RelayHeartbeat {}),
        3 => {
            let seq = input.number();
            let len = match input.byte() {
                0 => 0,
                1 => proto::MIN_RECORD_CIPHERTEXT - 1,
                2 => MAX_RECORD_CIPHERTEXT,
                3 => MAX_RECORD_CIPHERTEXT + 1,
                b => usize::from(b),
            };
            let mut data = RelayData {
                seq,
                segment_index: 0,
                segment_count: 1,
                payload: Bytes::from(vec![0xA5; len]),
            };
            if kind & 0x40 != 0 {
                data.segment_index = u32::from(input.byte());
                data.segment_count = u32::from(input.byte());
            }
            Body::Data(data)
        }
        4 => {
            let reasons = ["", "stream_closed", "sequence_error", "x\n\u{2028}\"y"];
            let reason = reasons[usize::from(input.byte()) % reasons.len()].to_owned();
            Body::Reset(proto::RelayReset { reason })
        }
        _ => proto::handshake_body(input.chunk().to_vec()),
    };
    let mut frame = proto::frame(STREAM_ID, ack, bits, body);
    if kind & 0x80 != 0 {
        frame.version = u32::from(input.byte());
    }
    if kind & 0x20 != 0 {
        frame.body = None;
    }
    frame
}

// ---- handshakes -----------------------------------------------------------------------

/// An attacker's msg1 to the executor's responder (§3.5): refused without a panic.
fn fuzz_responder(input: &mut Input) {
    let suite_index = usize::from(input.byte() & 1);
    let suite = SUITES[suite_index];
    let (executor, _) = keys(suite_index);
    let mut responder = suite.responder(executor, &prologue(suite)).unwrap();
    let msg1 = input.rest();
    let mut payload = vec![0u8; MAX_NOISE_MESSAGE];
    let result = responder.read_message(msg1, &mut payload);
    assert!(result.is_err(), "a forged msg1 was accepted");
    let _ = responder.remote_static();
    assert!(!responder.is_finished());
}

/// An attacker's msg2 to the harness's initiator (§3.4): refused without a panic.
fn fuzz_initiator(input: &mut Input) {
    let suite_index = usize::from(input.byte() & 1);
    let suite = SUITES[suite_index];
    let (executor, harness) = keys(suite_index);
    let mut initiator = suite
        .initiator(harness, &executor.public(), &prologue(suite))
        .unwrap();
    let mut message = vec![0u8; MAX_NOISE_MESSAGE];
    initiator.write_message(b"authz", &mut message).unwrap();
    let msg2 = input.rest();
    let result = initiator.read_message(msg2, &mut message);
    assert!(result.is_err(), "a forged msg2 was accepted");
    assert!(!initiator.is_finished());
}

/// Applies the attacker's edits to a real handshake message or record; true when the
/// bytes changed.
fn edit(input: &mut Input, message: &mut Vec<u8>) -> bool {
    let original = message.clone();
    let ops = input.byte();
    for _ in 0..(ops & 7) {
        if message.is_empty() {
            break;
        }
        let at = usize::from(input.u16()) % message.len();
        message[at] ^= input.byte();
    }
    match ops >> 6 {
        1 => {
            let keep = usize::from(input.u16()) % (message.len() + 1);
            message.truncate(keep);
        }
        2 => {
            let extra = input.chunk();
            message.extend_from_slice(extra);
        }
        _ => {}
    }
    *message != original
}

/// A real handshake whose messages the attacker edits: an edited message is refused, an
/// unedited one completes, authenticates the harness's key and carries records both ways
/// (an edited record is refused too).
fn fuzz_edited_handshake(input: &mut Input) {
    let suite_index = usize::from(input.byte() & 1);
    let suite = SUITES[suite_index];
    let (executor, harness) = keys(suite_index);
    let p = prologue(suite);
    let authz_len = usize::from(input.u16()) % (MAX_AUTHORIZATION_BYTES + 64);
    let authz: Vec<u8> = input
        .bytes(authz_len)
        .iter()
        .copied()
        .chain(std::iter::repeat(b'a'))
        .take(authz_len)
        .collect();
    let mut initiator = suite.initiator(harness, &executor.public(), &p).unwrap();
    let mut buffer = vec![0u8; MAX_NOISE_MESSAGE];
    let Ok(n) = initiator.write_message(&authz, &mut buffer) else {
        return;
    };
    let mut msg1 = buffer[..n].to_vec();
    if !authz.is_empty() && authz.len() <= MAX_AUTHORIZATION_BYTES {
        let (min, max) = suite.msg1_bounds();
        assert!(
            (min..=max).contains(&msg1.len()),
            "msg1 of {} bytes",
            msg1.len()
        );
    }
    let edited = edit(input, &mut msg1);

    let mut responder = suite.responder(executor, &p).unwrap();
    let mut payload = vec![0u8; MAX_NOISE_MESSAGE];
    let read = responder.read_message(&msg1, &mut payload);
    if edited {
        assert!(read.is_err(), "an edited msg1 was accepted");
        return;
    }
    let n = read.expect("a real msg1 is accepted");
    assert_eq!(
        &payload[..n],
        &authz[..],
        "the authorisation arrives as sent"
    );
    assert_eq!(responder.remote_static(), Some(harness.public()));

    let mut msg2 = vec![0u8; suite.msg2_len()];
    let n = responder.write_message(&[], &mut msg2).unwrap();
    assert_eq!(n, suite.msg2_len());
    assert!(responder.is_finished());
    let edited = edit(input, &mut msg2);
    let read = initiator.read_message(&msg2, &mut payload);
    if edited {
        assert!(read.is_err(), "an edited msg2 was accepted");
        return;
    }
    assert_eq!(read, Ok(0));
    assert!(initiator.is_finished());
    assert_eq!(initiator.remote_static(), Some(executor.public()));
    let mut ciphers = [
        initiator.into_transport().unwrap(),
        responder.into_transport().unwrap(),
    ];
    let mut record = vec![0u8; MAX_NOISE_MESSAGE];
    for _ in 0..8 {
        if input.is_empty() {
            break;
        }
        let from = usize::from(input.byte() & 1);
        let plaintext = input.chunk();
        let plaintext = &plaintext[..plaintext.len().min(MAX_RECORD_PLAINTEXT)];
        let [a, b] = &mut ciphers;
        let (sender, receiver) = if from == 0 { (a, b) } else { (b, a) };
        let nonce = receiver.receiving_nonce();
        assert_eq!(sender.sending_nonce(), nonce);
        let n = sender.encrypt(plaintext, &mut record).unwrap();
        assert_eq!(n, plaintext.len() + proto::TAG_LEN);
        let mut sealed = record[..n].to_vec();
        let edited = edit(input, &mut sealed);
        let opened = receiver.decrypt(&sealed, &mut payload);
        if edited {
            assert!(opened.is_err(), "an edited record was accepted");
            return;
        }
        assert_eq!(&payload[..opened.unwrap()], plaintext);
        assert_eq!(receiver.receiving_nonce(), nonce + 1);
    }
}

use super::*;
use crate::noise::{prologue, IkSuite, NoiseIdentity, NoiseSuite, RecordCipher};
use crate::proto::{Body, RelayData};
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

/// Two record ciphers from a real IK handshake: (harness, executor).
fn transport_pair() -> (Box<dyn RecordCipher>, Box<dyn RecordCipher>) {
    let executor = NoiseIdentity::generate();
    let harness = NoiseIdentity::generate();
    let p = prologue("env", "reg", "s");
    let mut init = IkSuite.initiator(&harness, &executor.public(), &p).unwrap();
    let mut resp = IkSuite.responder(&executor, &p).unwrap();
    let mut buf = vec![0u8; 65_535];
    let mut out = vec![0u8; 65_535];
    let n = init.write_message(b"authz", &mut buf).unwrap();
    resp.read_message(&buf[..n], &mut out).unwrap();
    let n = resp.write_message(&[], &mut buf).unwrap();
    init.read_message(&buf[..n], &mut out).unwrap();
    (
        init.into_transport().unwrap(),
        resp.into_transport().unwrap(),
    )
}

fn pair_with(limits: StreamLimits, now: Instant) -> (ReliableStream, ReliableStream) {
    semantics_pair(Semantics::Reliable, limits, now)
}

fn semantics_pair(
    semantics: Semantics,
    limits: StreamLimits,
    now: Instant,
) -> (ReliableStream, ReliableStream) {
    let (h, e) = transport_pair();
    let timing = Timing::default();
    (
        ReliableStream::new("s".into(), Role::Harness, semantics, h, limits, timing, now),
        ReliableStream::new(
            "s".into(),
            Role::Executor,
            semantics,
            e,
            limits,
            timing,
            now,
        ),
    )
}

fn pair(now: Instant) -> (ReliableStream, ReliableStream) {
    pair_with(StreamLimits::default(), now)
}

fn data_seqs(frames: &[RelayMessageFrame]) -> Vec<u32> {
    frames
        .iter()
        .filter_map(|f| match &f.body {
            Some(Body::Data(d)) => Some(d.seq),
            _ => None,
        })
        .collect()
}

fn kinds(frames: &[RelayMessageFrame]) -> Vec<&'static str> {
    frames.iter().map(proto::kind).collect()
}

/// `n` data frames of one small message each, produced one at a time.
fn records(sender: &mut ReliableStream, n: usize, now: Instant) -> Vec<RelayMessageFrame> {
    let mut out = Vec::new();
    for i in 0..n {
        sender
            .send_message(format!("{{\"n\":{i}}}").as_bytes())
            .unwrap();
        out.extend(sender.poll_transmit(now).unwrap());
    }
    out
}

fn drain(receiver: &mut ReliableStream, now: Instant) -> Vec<Bytes> {
    let mut out = Vec::new();
    while let Some(m) = receiver.pop_message(now).unwrap() {
        out.push(m);
    }
    out
}

#[test]
fn receiver_ack_vectors() {
    let now = Instant::now();
    let cases: &[(&[u32], u32, u32)] = &[
        (&[1, 2, 3], 3, 0),
        (&[2], 0, 0x2),
        (&[2, 4], 0, 0xA),
        (&[1, 2, 4], 2, 0x2),
        (&[1, 2, 3, 4], 4, 0),
        (&[1, 2, 3, 4, 5, 7, 9, 37], 5, 0x8000_000A),
        (&(2..=32).collect::<Vec<_>>(), 0, 0xFFFF_FFFE),
        (&(1..=32).collect::<Vec<_>>(), 32, 0),
    ];
    for (received, ack, bits) in cases {
        let (mut h, mut e) = pair(now);
        // Let the sender go past 32 records: acknowledge the first few as they are made.
        let mut frames = records(&mut h, 32, now);
        h.handle_frame(&proto::frame("s", 5, 0, proto::ack_body()), now)
            .unwrap_or(());
        frames.extend(records(&mut h, 5, now));
        for &seq in *received {
            let f = frames
                .iter()
                .find(|f| data_seqs(&[(*f).clone()]) == [seq])
                .unwrap();
            e.handle_frame(f, now).unwrap();
        }
        assert_eq!(e.ack_fields(), (*ack, *bits), "received {received:?}");
    }
    // Vector 9: seq 33 with nothing delivered is a window violation.
    let (mut h, mut e) = pair(now);
    let frames = records(&mut h, 32, now);
    h.handle_frame(&proto::frame("s", 1, 0, proto::ack_body()), now)
        .unwrap();
    let more = records(&mut h, 1, now);
    assert_eq!(data_seqs(&more), [33]);
    drop(frames);
    assert_eq!(
        e.handle_frame(&more[0], now),
        Err(ResetReason::SequenceError)
    );
}

#[test]
fn sender_processes_the_worked_example() {
    let now = Instant::now();
    let (mut h, _e) = pair(now);
    let first = records(&mut h, 32, now);
    assert_eq!(data_seqs(&first), (1..=32).collect::<Vec<_>>());
    h.send_message(b"{}").unwrap();
    assert!(
        h.poll_transmit(now).unwrap().is_empty(),
        "window of 32 records"
    );
    h.handle_frame(&proto::frame("s", 5, 0, proto::ack_body()), now)
        .unwrap();
    let mut more = h.poll_transmit(now).unwrap();
    more.extend(records(&mut h, 4, now));
    assert_eq!(data_seqs(&more), (33..=37).collect::<Vec<_>>());
    h.handle_frame(&proto::frame("s", 5, 0x8000_000A, proto::ack_body()), now)
        .unwrap();
    let outstanding: Vec<u32> = h.unacked.keys().copied().collect();
    let mut expected = vec![6, 8];
    expected.extend(10..=36);
    assert_eq!(outstanding, expected);
    assert_eq!(outstanding.len(), 29);
    assert!(
        data_seqs(&h.poll_transmit(now).unwrap()).is_empty(),
        "window still at 37"
    );
    // A stale ack (lower than peer_ack) is ignored, not an error.
    h.handle_frame(&proto::frame("s", 2, 0, proto::ack_body()), now)
        .unwrap();
    assert_eq!(h.peer_ack, 5);
}

#[test]
fn sender_rejects_inconsistent_acks() {
    let now = Instant::now();
    for (ack, bits) in [(11, 0), (3, 0x1), (3, 0x80)] {
        let (mut h, _e) = pair(now);
        records(&mut h, 10, now);
        assert_eq!(
            h.handle_frame(&proto::frame("s", ack, bits, proto::ack_body()), now),
            Err(ResetReason::SequenceError),
            "ack {ack} bits {bits:#x}"
        );
    }
}

#[test]
fn rto_follows_rfc6298() {
    let mut rto = RtoEstimator::new(Timing::default());
    assert_eq!(rto.rto(), 500 * MS);
    rto.sample(100 * MS);
    assert_eq!(rto.rto(), 300 * MS);
    rto.sample(140 * MS);
    assert_eq!(rto.rto(), 295 * MS);
    let mut rto = RtoEstimator::new(Timing::default());
    rto.sample(10 * MS);
    assert_eq!(rto.rto(), 200 * MS, "clamped");
    let mut rto = RtoEstimator::new(Timing::default());
    let mut seen = vec![rto.rto()];
    for _ in 0..6 {
        rto.back_off();
        seen.push(rto.rto());
    }
    let ms: Vec<u128> = seen.iter().map(Duration::as_millis).collect();
    assert_eq!(ms, [500, 1000, 2000, 4000, 8000, 10000, 10000]);
}

#[test]
fn retransmissions_follow_the_backoff_and_are_byte_identical() {
    let t0 = Instant::now();
    let (mut h, _e) = pair(t0);
    let first = records(&mut h, 1, t0);
    let Some(Body::Data(RelayData { payload, .. })) = &first[0].body else {
        panic!()
    };
    let mut at = t0;
    let mut gaps = Vec::new();
    for _ in 0..7 {
        let due = h.next_deadline().unwrap();
        // Nothing is resent before the deadline.
        h.on_timer(due - MS).unwrap();
        assert!(h.poll_transmit(due - MS).unwrap().is_empty());
        // The stall limit would fire at 60 s; keep the peer "alive" with a heartbeat.
        h.handle_frame(
            &proto::frame("s", 0, 0, Body::Heartbeat(proto::RelayHeartbeat {})),
            due - MS,
        )
        .unwrap();
        h.on_timer(due).unwrap();
        let again = h.poll_transmit(due).unwrap();
        assert_eq!(data_seqs(&again), [1]);
        let Some(Body::Data(d)) = &again[0].body else {
            panic!()
        };
        assert_eq!(&d.payload, payload, "byte-identical retransmission");
        gaps.push((due - at).as_millis());
        at = due;
    }
    assert_eq!(gaps, [500, 1000, 2000, 4000, 8000, 10000, 10000]);
}

#[test]
fn karn_rule_skips_retransmitted_samples() {
    let t0 = Instant::now();
    let (mut h, _e) = pair(t0);
    records(&mut h, 1, t0);
    h.on_timer(t0 + 500 * MS).unwrap();
    h.poll_transmit(t0 + 500 * MS).unwrap();
    assert_eq!(h.rto.rto(), 1000 * MS);
    h.handle_frame(&proto::frame("s", 1, 0, proto::ack_body()), t0 + 510 * MS)
        .unwrap();
    assert_eq!(
        h.rto.rto(),
        1000 * MS,
        "no sample from a retransmitted record"
    );
    records(&mut h, 1, t0 + 600 * MS);
    h.handle_frame(&proto::frame("s", 2, 0, proto::ack_body()), t0 + 700 * MS)
        .unwrap();
    assert_eq!(h.rto.rto(), 300 * MS);
}

#[test]
fn acknowledgement_timing() {
    let t0 = Instant::now();
    let (mut h, mut e) = pair(t0);
    let frames = records(&mut h, 3, t0);
    // In order: no immediate ack, a standalone one once 20 ms have passed.
    e.handle_frame(&frames[0], t0).unwrap();
    assert!(e.poll_transmit(t0).unwrap().is_empty());
    assert_eq!(e.next_deadline(), Some(t0 + 20 * MS));
    e.on_timer(t0 + 20 * MS).unwrap();
    let acks = e.poll_transmit(t0 + 20 * MS).unwrap();
    assert_eq!(kinds(&acks), ["ack_frame"]);
    assert_eq!((acks[0].ack, acks[0].ack_bits), (1, 0));
    // Out of order: an immediate ack reporting the gap.
    e.handle_frame(&frames[2], t0 + 30 * MS).unwrap();
    let acks = e.poll_transmit(t0 + 30 * MS).unwrap();
    assert_eq!(kinds(&acks), ["ack_frame"]);
    assert_eq!((acks[0].ack, acks[0].ack_bits), (1, 0x2));
    // Duplicate: an immediate ack.
    e.handle_frame(&frames[0], t0 + 40 * MS).unwrap();
    assert_eq!(
        kinds(&e.poll_transmit(t0 + 40 * MS).unwrap()),
        ["ack_frame"]
    );
    assert_eq!(e.stats().duplicates_received, 1);
    // An ack frame never produces an ack.
    e.handle_frame(&proto::frame("s", 0, 0, proto::ack_body()), t0 + 50 * MS)
        .unwrap();
    e.on_timer(t0 + 100 * MS).unwrap();
    assert!(e.poll_transmit(t0 + 100 * MS).unwrap().is_empty());
    // A pending ack rides on an outgoing data frame instead of a standalone one.
    e.handle_frame(&frames[1], t0 + 110 * MS).unwrap();
    e.send_message(b"{}").unwrap();
    let out = e.poll_transmit(t0 + 110 * MS).unwrap();
    assert_eq!(kinds(&out), ["data"]);
    assert_eq!(out[0].ack, 3);
    e.on_timer(t0 + 200 * MS).unwrap();
    assert!(e.poll_transmit(t0 + 200 * MS).unwrap().is_empty());
    assert_eq!(drain(&mut e, t0).len(), 3);
}

#[test]
fn a_quarter_window_of_new_records_is_acknowledged_at_once() {
    let t0 = Instant::now();
    let (mut h, mut e) = pair(t0);
    let frames = records(&mut h, 2 * ACK_EVERY_RECORDS as usize, t0);
    for (i, frame) in frames.iter().enumerate() {
        e.handle_frame(frame, t0).unwrap();
        let out = e.poll_transmit(t0).unwrap();
        if (i + 1) % ACK_EVERY_RECORDS as usize == 0 {
            // A bulk sender never waits the 20 ms delay with a full window.
            assert_eq!(kinds(&out), ["ack_frame"], "after record {}", i + 1);
            assert_eq!(out[0].ack, i as u32 + 1);
        } else {
            assert!(out.is_empty(), "after record {}: {:?}", i + 1, kinds(&out));
        }
    }
    assert_eq!(drain(&mut e, t0).len(), frames.len());
}

#[test]
fn acks_before_the_handshake_completes_are_not_applied() {
    // The machine exists only after the handshake; the connection code drops ack fields of
    // earlier frames. Here: a fresh machine has sent nothing, so ack 9 is an error, which
    // is why those frames must never reach it.
    let now = Instant::now();
    let (mut h, _e) = pair(now);
    assert_eq!(
        h.handle_frame(&proto::frame("s", 9, 0, proto::ack_body()), now),
        Err(ResetReason::SequenceError)
    );
}

#[test]
fn large_messages_span_records_and_small_ones_share() {
    let now = Instant::now();
    let (mut h, mut e) = pair(now);
    let big = vec![b'x'; 128 * 1024];
    let mut json = b"\"".to_vec();
    json.extend_from_slice(&big);
    json.push(b'"');
    h.send_message(&json).unwrap();
    let frames = h.poll_transmit(now).unwrap();
    assert!(frames.len() >= 3);
    for f in &frames {
        let Some(Body::Data(d)) = &f.body else {
            panic!()
        };
        assert!(d.payload.len() <= proto::MAX_RECORD_CIPHERTEXT);
        e.handle_frame(f, now).unwrap();
    }
    assert_eq!(drain(&mut e, now), [Bytes::from(json)]);

    let (mut h, mut e) = pair(now);
    h.send_message(&[b'a'; 30]).unwrap();
    h.send_message(&[b'b'; 40]).unwrap();
    let frames = h.poll_transmit(now).unwrap();
    assert_eq!(frames.len(), 1);
    let Some(Body::Data(d)) = &frames[0].body else {
        panic!()
    };
    assert_eq!(d.payload.len(), 78 + 16);
    e.handle_frame(&frames[0], now).unwrap();
    assert_eq!(drain(&mut e, now).len(), 2);

    // 150,000 bytes: records of 61,440, 61,440 and 27,124 plaintext bytes.
    let (mut h, _e) = pair(now);
    h.send_message(&vec![b'z'; 150_000]).unwrap();
    let sizes: Vec<usize> = h
        .poll_transmit(now)
        .unwrap()
        .iter()
        .map(|f| match &f.body {
            Some(Body::Data(d)) => d.payload.len() - 16,
            _ => 0,
        })
        .collect();
    assert_eq!(sizes, [61_440, 61_440, 27_124]);
}

#[test]
fn length_prefix_rules() {
    let now = Instant::now();
    let limits = StreamLimits {
        max_message_bytes: 1000,
        ..StreamLimits::default()
    };
    // A declared length above the limit is refused before the body arrives.
    let (mut h, mut e) = pair_with(limits, now);
    h.push_raw(&1001u32.to_be_bytes());
    let f = h.poll_transmit(now).unwrap();
    assert_eq!(e.handle_frame(&f[0], now), Err(ResetReason::RecordError));
    // Length zero.
    let (mut h, mut e) = pair_with(limits, now);
    h.push_raw(&0u32.to_be_bytes());
    let f = h.poll_transmit(now).unwrap();
    assert_eq!(e.handle_frame(&f[0], now), Err(ResetReason::RecordError));
    // The sender refuses oversized messages locally.
    assert!(matches!(
        h.send_message(&[b'x'; 1001]),
        Err(SendError::TooLarge {
            len: 1001,
            limit: 1000
        })
    ));
    // Invalid JSON is not a relay error: it is delivered like any message.
    let (mut h, mut e) = pair_with(limits, now);
    h.send_message(b"not json").unwrap();
    let f = h.poll_transmit(now).unwrap();
    e.handle_frame(&f[0], now).unwrap();
    assert_eq!(drain(&mut e, now), [Bytes::from_static(b"not json")]);
}

#[test]
fn tampering_is_detected() {
    let now = Instant::now();
    let (mut h, mut e) = pair(now);
    let mut frames = records(&mut h, 1, now);
    if let Some(Body::Data(d)) = &mut frames[0].body {
        let mut bytes = d.payload.to_vec();
        bytes[3] ^= 1;
        d.payload = Bytes::from(bytes);
    }
    assert_eq!(
        e.handle_frame(&frames[0], now),
        Err(ResetReason::DecryptFailed)
    );
    assert!(e.pop_message(now).unwrap().is_none());

    // Two records whose seq values were swapped by a hostile router.
    let (mut h, mut e) = pair(now);
    let mut frames = records(&mut h, 2, now);
    let (a, b) = frames.split_at_mut(1);
    if let (Some(Body::Data(x)), Some(Body::Data(y))) = (&mut a[0].body, &mut b[0].body) {
        std::mem::swap(&mut x.seq, &mut y.seq);
    }
    e.handle_frame(&frames[1], now)
        .and_then(|_| e.handle_frame(&frames[0], now))
        .expect_err("swapped records");
    assert!(e.pop_message(now).unwrap().is_none());
}

#[test]
fn inbound_queue_back_pressure_and_keepalive() {
    let t0 = Instant::now();
    let limits = StreamLimits {
        inbound_queue_messages: 2,
        ..StreamLimits::default()
    };
    let (mut h, mut e) = pair_with(limits, t0);
    // One record completing three messages: all three are queued.
    h.send_message(b"1").unwrap();
    h.send_message(b"2").unwrap();
    h.send_message(b"3").unwrap();
    let f = h.poll_transmit(t0).unwrap();
    e.handle_frame(&f[0], t0).unwrap();
    let f = records(&mut h, 1, t0);
    e.handle_frame(&f[0], t0).unwrap();
    assert_eq!(e.ack_fields(), (1, 0), "record 2 held back, not reported");
    assert!(e.is_holding_back());
    // Keep-alive acks at least every 5 s, however long the consumer pauses.
    let mut t = t0;
    e.poll_transmit(t).unwrap();
    for _ in 0..20 {
        let due = e.next_deadline().unwrap();
        assert!(due <= t + Duration::from_secs(5));
        e.on_timer(due).unwrap();
        let out = e.poll_transmit(due).unwrap();
        assert_eq!(kinds(&out), ["ack_frame"]);
        t = due;
    }
    // Reading again lets record 2 in; the new ack goes out within 20 ms.
    let messages = drain(&mut e, t);
    assert_eq!(messages.len(), 4);
    e.on_timer(t + 20 * MS).unwrap();
    let out = e.poll_transmit(t + 20 * MS).unwrap();
    assert_eq!(out[0].ack, 2);
}

#[test]
fn resume_rules() {
    let now = Instant::now();
    let setup = || {
        let (mut h, mut e) = pair(now);
        let frames = records(&mut h, 5, now);
        // The executor has records 1, 2 and 4: H = 4, delivered = 2.
        for i in [0, 1, 3] {
            e.handle_frame(&frames[i], now).unwrap();
        }
        e.poll_transmit(now).unwrap();
        (h, e)
    };
    let resume = |next| proto::frame("s", 0, 0, proto::resume_body(next));
    let (_h, mut e) = setup();
    e.handle_frame(&resume(0), now).unwrap();
    assert!(
        e.poll_transmit(now).unwrap().is_empty(),
        "resume{{0}} ignored"
    );
    for ok in [5, 7] {
        let (_h, mut e) = setup();
        e.handle_frame(&resume(ok), now).unwrap();
        assert_eq!(
            kinds(&e.poll_transmit(now).unwrap()),
            ["resume"],
            "executor answers"
        );
    }
    for bad in [4, 3] {
        let (_h, mut e) = setup();
        assert_eq!(
            e.handle_frame(&resume(bad), now),
            Err(ResetReason::ResumeMismatch)
        );
    }
    let (_h, mut e) = setup();
    assert_eq!(
        e.handle_frame(&resume(2 + 32 + 2), now),
        Err(ResetReason::SequenceError)
    );
}

#[test]
fn stall_limit_needs_silence() {
    let t0 = Instant::now();
    let (mut h, _e) = pair(t0);
    records(&mut h, 1, t0);
    let mut t = t0;
    // A peer whose ack stands still but keeps sending frames is never reset.
    for _ in 0..30 {
        t += Duration::from_secs(5);
        h.handle_frame(&proto::frame("s", 0, 0, proto::ack_body()), t)
            .unwrap();
        h.on_timer(t).unwrap();
        h.poll_transmit(t).unwrap();
    }
    // Silence: not before 60 s, then Reset{peer_unresponsive}.
    h.on_timer(t + Duration::from_secs(59)).unwrap();
    assert_eq!(
        h.on_timer(t + Duration::from_secs(60)),
        Err(ResetReason::PeerUnresponsive)
    );
}

#[test]
fn heartbeat_frames_only_carry_acks() {
    let now = Instant::now();
    let (mut h, _e) = pair(now);
    records(&mut h, 2, now);
    h.handle_frame(
        &proto::frame("s", 2, 0, Body::Heartbeat(proto::RelayHeartbeat {})),
        now,
    )
    .unwrap();
    assert!(h.is_flushed());
    assert!(h.poll_transmit(now).unwrap().is_empty());
}

/// A small deterministic PRNG for the lossy network below.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// A network that drops, duplicates, reorders and delays frames in both directions.
fn lossy_exchange(seed: u64, disconnect_at: Option<usize>) {
    let t0 = Instant::now();
    let (mut h, mut e) = pair(t0);
    let mut rng = XorShift(seed);
    let mut now = t0;
    let to_send_h: Vec<Vec<u8>> = (0..200)
        .map(|i| {
            format!(
                "{{\"h\":{i},\"pad\":\"{}\"}}",
                "p".repeat((i * 997) % 90_000)
            )
            .into_bytes()
        })
        .collect();
    let to_send_e: Vec<Vec<u8>> = (0..200)
        .map(|i| {
            format!(
                "{{\"e\":{i},\"pad\":\"{}\"}}",
                "q".repeat((i * 613) % 70_000)
            )
            .into_bytes()
        })
        .collect();
    let (mut next_h, mut next_e) = (0, 0);
    let (mut got_h, mut got_e) = (Vec::new(), Vec::new());
    // In flight: (deliver_at, to_executor, frame).
    let mut wire: Vec<(Instant, bool, RelayMessageFrame)> = Vec::new();
    let mut step = 0usize;
    while got_e.len() < to_send_h.len() || got_h.len() < to_send_e.len() {
        step += 1;
        assert!(
            step < 200_000,
            "no progress: h {} e {}",
            got_h.len(),
            got_e.len()
        );
        if Some(step) == disconnect_at {
            h.on_disconnected();
            e.on_disconnected();
            wire.clear();
            now += Duration::from_secs(2);
            e.on_connected(now);
            h.on_connected(now);
        }
        while next_h < to_send_h.len() && h.can_send() {
            h.send_message(&to_send_h[next_h]).unwrap();
            next_h += 1;
        }
        while next_e < to_send_e.len() && e.can_send() {
            e.send_message(&to_send_e[next_e]).unwrap();
            next_e += 1;
        }
        for (to_executor, side) in [(true, &mut h), (false, &mut e)] {
            side.on_timer(now).unwrap();
            for f in side.poll_transmit(now).unwrap() {
                if rng.chance(10) {
                    continue;
                }
                let copies = if rng.chance(10) { 2 } else { 1 };
                for _ in 0..copies {
                    let delay = Duration::from_millis(5 + rng.next() % 40);
                    wire.push((now + delay, to_executor, f.clone()));
                }
            }
        }
        // Deliver everything due, in a shuffled order.
        let mut due: Vec<_> = Vec::new();
        wire.retain(|(at, to_e, f)| {
            if *at <= now {
                due.push((*to_e, f.clone()));
                false
            } else {
                true
            }
        });
        for i in (1..due.len()).rev() {
            let j = (rng.next() % (i as u64 + 1)) as usize;
            due.swap(i, j);
        }
        for (to_executor, f) in due {
            let side = if to_executor { &mut e } else { &mut h };
            side.handle_frame(&f, now).unwrap();
        }
        got_e.extend(drain(&mut e, now));
        got_h.extend(drain(&mut h, now));
        let next = [h.next_deadline(), e.next_deadline()]
            .into_iter()
            .flatten()
            .chain(wire.iter().map(|(at, _, _)| *at))
            .min()
            .unwrap_or(now + MS);
        now = next.max(now + MS);
    }
    assert_eq!(
        got_e,
        to_send_h
            .iter()
            .map(|m| Bytes::from(m.clone()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        got_h,
        to_send_e
            .iter()
            .map(|m| Bytes::from(m.clone()))
            .collect::<Vec<_>>()
    );
    assert!(h.stats().retransmissions > 0);
}

#[test]
fn lossy_network_delivers_byte_for_byte() {
    for seed in [1, 7, 42] {
        lossy_exchange(seed, None);
    }
}

#[test]
fn resume_after_a_disconnect_delivers_everything() {
    lossy_exchange(99, Some(50));
}

// ---- codex semantics (CODEX-0169 §4.5) ------------------------------------------------

fn codex_pair(now: Instant) -> (ReliableStream, ReliableStream) {
    semantics_pair(Semantics::Codex, StreamLimits::default(), now)
}

#[test]
fn negotiation_needs_both_announcements() {
    use crate::proto::StreamFeatures;
    let both = StreamFeatures::RELIABLE.intersect(StreamFeatures::RELIABLE);
    assert_eq!(Semantics::negotiated(both), Semantics::Reliable);
    for one_side in [
        StreamFeatures::RELIABLE.intersect(StreamFeatures::NONE),
        StreamFeatures::NONE.intersect(StreamFeatures::RELIABLE),
    ] {
        assert_eq!(Semantics::negotiated(one_side), Semantics::Codex);
    }
    // Unknown bits from a peer are ignored.
    let handshake = proto::RelayHandshake {
        payload: Bytes::from_static(b"x"),
        stream_features: Some(0xFFFF_FFFE),
    };
    assert_eq!(StreamFeatures::announced(&handshake), StreamFeatures::NONE);
}

/// Codex frames: seq from 0 up by one, ack fields always 0, no Ack, Resume or Heartbeat
/// frames, nothing kept for retransmission, nothing ever resent on a timer.
#[test]
fn codex_sender_numbers_from_zero_and_never_acks_or_resends() {
    let now = Instant::now();
    let (mut h, mut e) = codex_pair(now);
    let frames = records(&mut h, 40, now);
    assert_eq!(data_seqs(&frames), (0..40).collect::<Vec<_>>());
    assert!(frames.iter().all(|f| f.ack == 0 && f.ack_bits == 0));
    for f in &frames {
        e.handle_frame(f, now).unwrap();
    }
    let got = drain(&mut e, now);
    assert_eq!(got.len(), 40);
    assert_eq!(got[39].as_ref(), b"{\"n\":39}");
    // The receiver has nothing to say, now or later.
    assert!(e.poll_transmit(now).unwrap().is_empty());
    assert_eq!(e.next_deadline(), None);
    let later = now + Duration::from_secs(120);
    e.on_timer(later).unwrap();
    h.on_timer(later).unwrap();
    assert!(e.poll_transmit(later).unwrap().is_empty());
    assert!(h.poll_transmit(later).unwrap().is_empty());
    assert!(h.is_flushed());
    assert_eq!(h.stats().retransmissions, 0);
}

/// Duplicates are dropped, reordering within the window is repaired, and a message cut
/// across records comes out whole, once.
#[test]
fn codex_receiver_drops_duplicates_and_reorders() {
    let now = Instant::now();
    let (mut h, mut e) = codex_pair(now);
    let big = vec![b'x'; 3 * 61_440];
    h.send_message(&big).unwrap();
    let mut frames = h.poll_transmit(now).unwrap();
    frames.extend(records(&mut h, 3, now));
    assert_eq!(data_seqs(&frames), (0..7).collect::<Vec<_>>());
    let order = [1usize, 0, 0, 3, 2, 1, 6, 5, 4, 6];
    for i in order {
        e.handle_frame(&frames[i], now).unwrap();
    }
    let got = drain(&mut e, now);
    assert_eq!(got.len(), 4);
    assert_eq!(got[0].len(), big.len());
    assert_eq!(got[3].as_ref(), b"{\"n\":2}");
    assert!(e.stats().duplicates_received >= 3);
    assert!(e.poll_transmit(now).unwrap().is_empty(), "no Ack frames");
}

/// Ack, Resume and Heartbeat frames from a peer change nothing; a record beyond the
/// 64-record window or a tampered one is a protocol error, reported to codex with the one
/// reason it knows.
#[test]
fn codex_receiver_limits() {
    let now = Instant::now();
    let (mut h, mut e) = codex_pair(now);
    let frames = records(&mut h, 66, now);
    for body in [
        proto::ack_body(),
        proto::resume_body(0),
        proto::resume_body(9),
    ] {
        e.handle_frame(&proto::frame("s", 7, 3, body), now).unwrap();
    }
    assert!(e.poll_transmit(now).unwrap().is_empty());
    assert_eq!(
        e.handle_frame(&frames[64], now),
        Err(ResetReason::SequenceError)
    );
    let (mut h, mut e) = codex_pair(now);
    let mut frames = records(&mut h, 1, now);
    if let Some(Body::Data(d)) = &mut frames[0].body {
        let mut bytes = d.payload.to_vec();
        bytes[3] ^= 0x40;
        d.payload = Bytes::from(bytes);
    }
    assert_eq!(
        e.handle_frame(&frames[0], now),
        Err(ResetReason::DecryptFailed)
    );
    assert_eq!(
        Semantics::Codex.fault_reason(ResetReason::DecryptFailed),
        ResetReason::NoiseRelayProtocolError
    );
    assert_eq!(
        Semantics::Reliable.fault_reason(ResetReason::DecryptFailed),
        ResetReason::DecryptFailed
    );
    assert_eq!(
        Semantics::Codex.fault_reason(ResetReason::StreamClosed),
        ResetReason::StreamClosed
    );
}

/// A reliable stream still refuses seq 0, which is only codex's first record.
#[test]
fn reliable_receiver_refuses_seq_zero() {
    let now = Instant::now();
    let (_h, mut e) = pair(now);
    let frame = proto::frame("s", 0, 0, proto::data_body(0, Bytes::from(vec![0u8; 17])));
    assert_eq!(e.handle_frame(&frame, now), Err(ResetReason::SequenceError));
}

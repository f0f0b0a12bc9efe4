use super::*;

const PROTO: &str = "src/proto/codex.exec_server.relay.v1.proto";
const GENERATED: &str = "src/proto/codex.exec_server.relay.v1.rs";

/// The checked-in Rust matches a fresh `protox` + `prost-build` run (RELAY §10 test 3).
/// `RELAY_REGENERATE_PROTO=1` rewrites it instead.
#[test]
fn generated_code_matches_the_proto_file() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let fds =
        protox::compile([root.join(PROTO)], [root.join("src/proto")]).expect("the .proto compiles");
    let out = tempfile_dir();
    prost_build::Config::new()
        .bytes(["."])
        .out_dir(&out)
        .compile_fds(fds)
        .expect("prost-build generates code");
    let fresh = std::fs::read_to_string(out.join("codex.exec_server.relay.v1.rs")).unwrap();
    let _ = std::fs::remove_dir_all(&out);
    if std::env::var_os("RELAY_REGENERATE_PROTO").is_some() {
        std::fs::write(root.join(GENERATED), &fresh).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(root.join(GENERATED)).unwrap();
    assert!(
        checked_in == fresh,
        "{GENERATED} is out of date; run with RELAY_REGENERATE_PROTO=1"
    );
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("relay-proto-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn hex(text: &str) -> Vec<u8> {
    let text: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

const SID: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";

fn golden(rest: &str) -> Vec<u8> {
    let mut bytes = hex("0801 1224");
    bytes.extend_from_slice(SID.as_bytes());
    bytes.extend(hex(rest));
    bytes
}

/// RELAY §2.4: every vector decodes to its frame and our encoder produces its bytes.
#[test]
fn golden_encodings() {
    let cases: Vec<(RelayMessageFrame, &str)> = vec![
        (
            frame(SID, 0, 0, handshake_body(hex("a1b2c3"))),
            "5205 0a03 a1b2c3",
        ),
        (
            frame(
                SID,
                3,
                0x0000_000a,
                data_body(4, Bytes::from(hex("deadbeef"))),
            ),
            "1803 200a 2a0a 0804 1801 2204 deadbeef",
        ),
        (
            frame(SID, 5, 0x8000_000a, ack_body()),
            "1805 208a80808008 3200",
        ),
        (frame(SID, 4, 0, resume_body(7)), "1804 3a02 0807"),
        (frame(SID, 0, 0, resume_body(0)), "3a00"),
        (
            frame(SID, 0, 0, reset_body(ResetReason::DecryptFailed)),
            "4210 0a0e 646563727970745f6661696c6564",
        ),
        (frame(SID, 0, 0, Body::Heartbeat(RelayHeartbeat {})), "4a00"),
    ];
    for (expected, rest) in cases {
        let bytes = golden(rest);
        assert_eq!(decode(&bytes).unwrap(), expected, "decoding {rest}");
        assert_eq!(encode(&expected).to_vec(), bytes, "encoding {rest}");
    }
}

#[test]
fn unknown_fields_are_ignored_and_trace_fields_round_trip() {
    let mut bytes = golden("4a00");
    // Field 99, varint 1: a future field.
    bytes.extend(hex("98 06 01"));
    let decoded = decode(&bytes).unwrap();
    assert_eq!(
        decoded,
        frame(SID, 0, 0, Body::Heartbeat(RelayHeartbeat {}))
    );

    let mut traced = frame(SID, 0, 0, handshake_body(vec![1u8; 97]));
    traced.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
    traced.tracestate = Some("vendor=value".into());
    assert_eq!(decode(&encode(&traced)).unwrap(), traced);
}

#[test]
fn validation_rows() {
    let ok = |body| frame(SID, 0, 0, body);
    let mut v2 = ok(ack_body());
    v2.version = 2;
    assert_eq!(validate(&v2), Err(FrameFault::Version));
    assert_eq!(
        FrameFault::Version.reset_reason(),
        Some(ResetReason::InvalidFrame)
    );
    for bad in ["", " x", "x\n", &"a".repeat(129)] {
        assert_eq!(
            validate(&frame(bad, 0, 0, ack_body())),
            Err(FrameFault::StreamId)
        );
    }
    assert!(stream_id_is_valid(&"a".repeat(128)));
    let mut none = ok(ack_body());
    none.body = None;
    assert_eq!(validate(&none), Err(FrameFault::NoBody));
    let mut segmented = RelayData {
        seq: 1,
        segment_index: 0,
        segment_count: 2,
        payload: Bytes::from(vec![0u8; 17]),
    };
    assert_eq!(
        validate(&ok(Body::Data(segmented.clone()))),
        Err(FrameFault::Segments)
    );
    segmented.segment_count = 1;
    assert_eq!(validate(&ok(Body::Data(segmented.clone()))), Ok(()));
    for size in [16, 61_457] {
        let d = data_body(1, Bytes::from(vec![0u8; size]));
        assert_eq!(validate(&ok(d)), Err(FrameFault::PayloadSize));
    }
    assert_eq!(
        FrameFault::PayloadSize.reset_reason(),
        Some(ResetReason::RecordError)
    );
    // seq 0 is codex's first record; only a reliable stream refuses it.
    assert_eq!(
        validate(&ok(data_body(0, Bytes::from(vec![0u8; 17])))),
        Ok(())
    );
    assert_eq!(
        validate(&ok(handshake_body(Vec::new()))),
        Err(FrameFault::HandshakeSize)
    );
    assert_eq!(
        validate(&ok(handshake_body(vec![0u8; 65_536]))),
        Err(FrameFault::HandshakeSize)
    );
}

#[test]
fn reset_reasons_parse_leniently() {
    assert_eq!(
        ResetReason::parse("decrypt_failed"),
        ResetReason::DecryptFailed
    );
    assert_eq!(ResetReason::parse(""), ResetReason::Unspecified);
    assert_eq!(ResetReason::parse("made up"), ResetReason::Unspecified);
    assert_eq!(
        ResetReason::parse("noise_relay_protocol_error"),
        ResetReason::NoiseRelayProtocolError
    );
    for r in ResetReason::ALL {
        assert!(r.as_str().len() <= 64);
        assert_eq!(ResetReason::parse(r.as_str()), r);
    }
}

#[test]
fn peer_text_in_logs_is_cut_and_cannot_start_a_line() {
    let forged = "reason\n2026-01-01T00:00:00Z  INFO forged line \u{1b}[31m";
    let logged = truncate_for_log(forged);
    assert!(
        !logged.contains('\n') && !logged.contains('\u{1b}'),
        "{logged}"
    );
    assert!(logged.starts_with("reason\\n"));
    let long = "é".repeat(200);
    assert!(truncate_for_log(&long).len() <= 256);
}

//! Executor side: streams multiplexed on one socket, handshake admission and its failures
//! (each the failing stream's alone), invalid frames from a router that does not validate, resume across its own
//! reconnects, and stopping.

use std::sync::atomic::Ordering;
use std::time::Duration;

use exec_server_relay_core::harness::RelayError;
use exec_server_relay_core::noise::NoiseIdentity;
use exec_server_relay_core::proto::{self, Body};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use super::fixtures::*;
use crate::util::STEP_TIMEOUT;

#[tokio::test]
async fn two_streams_share_one_executor_socket_without_cross_talk() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-two");
    let mut a = RelayClient::open(harness_args(&rdv.url, "env-two")).await;
    let mut b = RelayClient::open(harness_args(&rdv.url, "env-two")).await;
    assert_ne!(a.conn.stream_id(), b.conn.stream_id());
    for _ in 0..5 {
        let (ra, rb) = tokio::join!(
            a.call("environment/status", json!({})),
            b.call("environment/status", json!({}))
        );
        assert_eq!(ra["status"], "ready");
        assert_eq!(rb["status"], "ready");
    }
    assert!(
        a.pending.is_empty() && b.pending.is_empty(),
        "no stray messages"
    );
    // Closing one stream leaves the other working.
    a.conn.abort();
    assert_eq!(
        b.call("environment/status", json!({})).await["status"],
        "ready"
    );
}

#[tokio::test]
async fn process_start_through_the_relay_streams_output_exit_and_close() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-process");
    let mut client = RelayClient::open(harness_args(&rdv.url, "env-process")).await;
    let started = client
        .call(
            "process/start",
            json!({
                "processId": "relay-proc",
                "argv": ["/bin/sh", "-c", "IFS= read -r line; printf 'out:%s\\n' \"$line\"; printf 'err-line\\n' >&2; exit 3"],
                "cwd": "file:///tmp",
                "env": {"PATH": "/usr/bin:/bin"},
                "tty": false,
                "pipeStdin": true,
            }),
        )
        .await;
    assert_eq!(started["processId"], "relay-proc");
    let written = client
        .call(
            "process/write",
            json!({"processId": "relay-proc", "chunk": crate::util::b64("through-the-relay\n"), "writeId": "w1"}),
        )
        .await;
    assert_eq!(written["accepted"], true, "{written}");
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut last_seq = 0;
    let mut exit_code = None;
    loop {
        let event = if client.pending.is_empty() {
            client.next().await
        } else {
            client.pending.remove(0)
        };
        assert_eq!(event["params"]["processId"], "relay-proc", "{event}");
        let seq = event["params"]["seq"].as_u64().unwrap();
        assert!(seq > last_seq, "notification seq goes up: {event}");
        last_seq = seq;
        match event["method"].as_str().unwrap() {
            "process/output" => {
                let chunk = crate::util::b64decode(&event["params"]["chunk"]);
                match event["params"]["stream"].as_str().unwrap() {
                    "stdout" => stdout.extend(chunk),
                    "stderr" => stderr.extend(chunk),
                    other => panic!("unexpected stream {other}"),
                }
            }
            "process/exited" => {
                assert!(exit_code.is_none(), "exited twice");
                exit_code = event["params"]["exitCode"].as_i64();
            }
            "process/closed" => break,
            other => panic!("unexpected notification {other}"),
        }
    }
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        "out:through-the-relay\n"
    );
    assert_eq!(String::from_utf8(stderr).unwrap(), "err-line\n");
    assert_eq!(exit_code, Some(3), "process/exited precedes process/closed");
}

#[tokio::test]
async fn executor_behind_a_non_validating_router_counts_invalid_frames() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor_with(
        &rdv.direct,
        "env-invalid",
        "[relay]\nreconnect_initial_backoff_ms = 50\nreconnect_max_backoff_ms = 200\n",
    );
    let mut a = RelayClient::open(harness_args(&rdv.direct, "env-invalid")).await;
    let mut b = RelayClient::open(harness_args(&rdv.direct, "env-invalid")).await;
    let mut c = RelayClient::open(harness_args(&rdv.direct, "env-invalid")).await;
    assert_eq!(proxy.executor_sockets(), 1);

    // An invalid frame naming an active stream resets that stream only.
    proxy
        .inject(Message::Binary(proto::encode(&version_two(
            b.conn.stream_id(),
        ))))
        .await;
    assert_eq!(
        b.ended().await,
        Some(RelayError::Reset("invalid_frame".into()))
    );
    // A data payload above 61,456 bytes is a record error, before any decryption.
    let oversized = proto::frame(
        c.conn.stream_id(),
        0,
        0,
        proto::data_body(1, vec![0u8; 61_457].into()),
    );
    proxy
        .inject(Message::Binary(proto::encode(&oversized)))
        .await;
    assert_eq!(
        c.ended().await,
        Some(RelayError::Reset("record_error".into()))
    );
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );

    // Those two were their streams' failures, charged to nothing shared. Seven
    // undecodable frames, which name no stream: the connection stays.
    for _ in 0..7 {
        proxy.inject(Message::binary(vec![0xffu8; 9])).await;
    }
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );
    assert_eq!(proxy.executor_sockets(), 1);
    assert!(proxy.closes(Side::Executor).is_empty());

    // The 8th closes it with 1002; the executor reconnects and the stream resumes.
    proxy.inject(Message::binary(vec![0xffu8; 9])).await;
    proxy
        .wait_for("close 1002", |p| p.closes(Side::Executor) == [Some(1002)])
        .await;
    proxy
        .wait_for("a reconnect", |p| p.executor_sockets() == 2)
        .await;
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );

    // A text message: 1003, reconnect, resume.
    proxy.inject(Message::text("not a frame")).await;
    proxy
        .wait_for("close 1003", |p| {
            p.closes(Side::Executor).contains(&Some(1003))
        })
        .await;
    proxy
        .wait_for("a reconnect", |p| p.executor_sockets() == 3)
        .await;
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );

    // A message above 256 KiB: 1009, reconnect, resume.
    proxy.inject(Message::binary(vec![0u8; 262_145])).await;
    proxy
        .wait_for("close 1009", |p| {
            p.closes(Side::Executor).contains(&Some(1009))
        })
        .await;
    proxy
        .wait_for("a reconnect", |p| p.executor_sockets() == 4)
        .await;
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );
}

#[tokio::test]
async fn failed_handshakes_reset_only_their_streams_and_the_executor_socket_stays() {
    use exec_server_relay_core::noise::{prologue, IkSuite, NoiseSuite};
    let (proxy, rdv) = proxied_rendezvous("").await;
    let gate = start_gate(&rdv.direct).await;
    let _executor = start_executor_with(
        &gate.url,
        "env-budget",
        "[relay]\nsecurity_profile = \"noise_ik_v1\"\nwarn_failed_handshakes = 3\nreconnect_initial_backoff_ms = 50\n",
    );
    let mut a = RelayClient::open(harness_args(&rdv.direct, "env-budget")).await;
    let validations = gate.validates.load(Ordering::SeqCst);
    let identity = NoiseIdentity::generate();
    let bundle = registry_as(&rdv.direct, HARNESS_TOKEN)
        .connect("env-budget", &identity.public())
        .await
        .unwrap();
    // A real msg1 whose authorisation is not UTF-8 (§3.5 row 9).
    let not_utf8 = |sid: &str| {
        let p = prologue("env-budget", &bundle.executor_registration_id, sid);
        let mut initiator = IkSuite
            .initiator(&identity, &bundle.executor_public_key, &p)
            .unwrap();
        let mut buf = vec![0u8; 65_535];
        let n = initiator
            .write_message(&[0xff, 0xfe, 0x80], &mut buf)
            .unwrap();
        buf.truncate(n);
        buf
    };
    // Three rounds of the three kinds: more failures than the old per-connection budget.
    for attempt in 1..=9 {
        let mut ws = open_raw(&bundle.url).await;
        let sid = new_stream_id();
        let msg1 = match attempt % 3 {
            // Row 7: shorter than 97 bytes, no DH work.
            0 => vec![0x42u8; 96],
            // Row 8: not a Noise message for this executor.
            1 => vec![0x42u8; 100],
            _ => not_utf8(&sid),
        };
        send_frame(
            &mut ws,
            &proto::frame(&sid, 0, 0, proto::handshake_body(msg1)),
        )
        .await;
        assert_eq!(
            raw_reset(&mut ws).await,
            (sid, "handshake_failed".to_owned()),
            "attempt {attempt}"
        );
        assert!(proxy.closes(Side::Executor).is_empty(), "attempt {attempt}");
    }
    assert_eq!(
        gate.validates.load(Ordering::SeqCst),
        validations,
        "no /validate call for a failed handshake"
    );
    // The stream established before is served on the same socket: it never had to
    // resume, the executor never reconnected.
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );
    assert!(proxy.closes(Side::Executor).is_empty());
    assert_eq!(proxy.executor_sockets(), 1);
    assert_eq!(gate.registers.load(Ordering::SeqCst), 1, "no new register");
}

#[tokio::test]
async fn executor_drops_streams_after_its_grace_and_the_session_can_be_taken_over() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor_with(
        &rdv.direct,
        "env-xgrace",
        "[relay]\nresume_grace_ms = 300\nreconnect_initial_backoff_ms = 50\nreconnect_max_backoff_ms = 200\n",
    );
    let (mut client, init) = RelayClient::open_with(
        harness_args(&rdv.direct, "env-xgrace"),
        json!({"clientName": "relay-tests-client"}),
    )
    .await;
    let session = init["sessionId"].as_str().unwrap().to_owned();
    // Keep the executor away: its reconnect attempts are refused. Between five refused
    // attempts it sleeps 50, 100, 200 and 200 ms, more than its 300 ms grace.
    proxy.faults.refuse_executor.store(true, Ordering::SeqCst);
    proxy.faults.cut.notify_waiters();
    proxy
        .wait_for("refused reconnects", |p| {
            p.faults.refused_executor.load(Ordering::SeqCst) >= 5
        })
        .await;
    proxy.faults.refuse_executor.store(false, Ordering::SeqCst);
    proxy
        .wait_for("a reconnect", |p| p.executor_sockets() == 2)
        .await;
    // The executor dropped the stream and, back on a socket, says so unasked: the
    // harness's stream ends with unknown_stream instead of waiting.
    assert_eq!(
        client.ended().await,
        Some(RelayError::Reset("unknown_stream".into()))
    );
    // The stream's session was detached, not killed: a new stream takes it over.
    let (_taken, resumed) = RelayClient::open_with(
        harness_args(&rdv.direct, "env-xgrace"),
        json!({"clientName": "relay-tests-client", "resumeSessionId": session}),
    )
    .await;
    assert_eq!(resumed["sessionId"], session.as_str());
}

#[tokio::test]
async fn executor_stopping_flushes_then_resets_streams_with_shutdown_and_exits_0() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let mut executor = start_executor_with(&rdv.direct, "env-stop", "");
    let mut client = RelayClient::open(harness_args(&rdv.direct, "env-stop")).await;
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
    let pid = executor.child.id().unwrap() as libc::pid_t;
    // SAFETY: sending SIGTERM to a child process this test started and still owns.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    assert_eq!(
        client.ended().await,
        Some(RelayError::Reset("shutdown".into()))
    );
    let status = tokio::time::timeout(STEP_TIMEOUT, executor.child.wait())
        .await
        .expect("the executor exits")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    // The proxy records the close when its own read of it completes, which may come after
    // the executor has exited.
    proxy
        .wait_for("the executor's close to reach the proxy", |p| {
            !p.closes(Side::Executor).is_empty()
        })
        .await;
    assert_eq!(proxy.closes(Side::Executor), [Some(1000)]);
}

#[tokio::test]
async fn retransmitted_msg1_gets_the_cached_msg2_and_another_msg1_is_a_duplicate() {
    use exec_server_relay_core::noise::{prologue, IkSuite, NoiseSuite};
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor_with(
        &rdv.direct,
        "env-dup",
        "[relay]\nsecurity_profile = \"noise_ik_v1\"\nreconnect_initial_backoff_ms = 50\n",
    );
    // Wait for the executor with a throw-away key, then connect with the test's own key.
    harness_bundle(&rdv.direct, "env-dup").await;
    let identity = NoiseIdentity::generate();
    let bundle = registry_as(&rdv.direct, HARNESS_TOKEN)
        .connect("env-dup", &identity.public())
        .await
        .unwrap();
    let sid = new_stream_id();
    let p = prologue("env-dup", &bundle.executor_registration_id, &sid);
    let authorization = bundle
        .harness_key_authorization
        .expose()
        .as_bytes()
        .to_vec();
    let msg1 = || {
        let mut initiator = IkSuite
            .initiator(&identity, &bundle.executor_public_key, &p)
            .unwrap();
        let mut buf = vec![0u8; 65_535];
        let n = initiator.write_message(&authorization, &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    let first = msg1();
    let mut ws = open_raw(&bundle.url).await;
    let handshake =
        |payload: &[u8]| proto::frame(&sid, 0, 0, proto::handshake_body(payload.to_vec()));
    let next_msg2 = |frame: Raw| match frame {
        Raw::Frame(f) => match f.body {
            Some(Body::Handshake(h)) => h.payload,
            other => panic!("expected msg2, got {other:?}"),
        },
        Raw::Closed(code) => panic!("closed {code:?}"),
    };
    send_frame(&mut ws, &handshake(&first)).await;
    let msg2 = next_msg2(raw_next(&mut ws).await);
    assert_eq!(msg2.len(), 48);
    // The identical msg1 again, before any data: the cached msg2, byte for byte.
    send_frame(&mut ws, &handshake(&first)).await;
    assert_eq!(next_msg2(raw_next(&mut ws).await), msg2);
    assert!(proxy.closes(Side::Executor).is_empty());
    // Another msg1 (a new ephemeral key) for the same id: Reset{duplicate_stream}, which
    // ends that stream and nothing else.
    let second = msg1();
    assert_ne!(second, first);
    send_frame(&mut ws, &handshake(&second)).await;
    assert_eq!(
        raw_reset(&mut ws).await,
        (sid.clone(), "duplicate_stream".to_owned())
    );
    let mut other = RelayClient::open(harness_args(&rdv.direct, "env-dup")).await;
    assert_eq!(
        other.call("environment/status", json!({})).await["status"],
        "ready"
    );
    assert!(proxy.closes(Side::Executor).is_empty());
    assert_eq!(proxy.executor_sockets(), 1);
}

#[tokio::test]
async fn executor_declares_a_socket_dead_without_pongs_and_resumes_on_a_new_one() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor_with(
        &rdv.direct,
        "env-pong",
        "[relay]\nping_interval_ms = 100\npong_timeout_ms = 300\nreconnect_initial_backoff_ms = 50\n",
    );
    let mut client = RelayClient::open(harness_args(&rdv.direct, "env-pong")).await;
    let first = proxy
        .faults
        .sockets
        .lock()
        .unwrap()
        .iter()
        .position(|s| *s == Side::Executor)
        .unwrap();
    // Nothing the executor sends on its socket is read any more, so no Pong answers it,
    // while frames towards it still flow.
    proxy.faults.freeze.store(first + 1, Ordering::SeqCst);
    proxy
        .wait_for("a new executor socket", |p| p.executor_sockets() == 2)
        .await;
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
}

/// An executor killed without a goodbye and started again with the same environment id
/// serves at once: the rendezvous hands its environment to the new key instead of
/// answering 409 `environment_busy` until the grace (here an hour) has passed.
#[tokio::test]
async fn a_restarted_executor_takes_over_its_environment_at_once() {
    let rdv = start_rendezvous_with(None, "grace_secs = 3600").await;
    // The classic suite keeps this test about restarts alone (and runnable against builds
    // that predate the hybrid suite).
    const CLASSIC: &str = "[relay]\nsecurity_profile = \"noise_ik_v1\"\n";
    let mut first = start_executor_with(&rdv.url, "env-restart", CLASSIC);
    let classic_args = || {
        let mut args = harness_args(&rdv.url, "env-restart");
        args.identity = Some(std::sync::Arc::new(NoiseIdentity::generate()));
        args
    };
    let mut client = RelayClient::open(classic_args()).await;
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
    let harness = registry_as(&rdv.url, HARNESS_TOKEN);
    let probe = NoiseIdentity::generate().public();
    let old_key = harness
        .connect("env-restart", &probe)
        .await
        .unwrap()
        .executor_public_key;
    // SIGKILL: the socket ends without a close code, as after a crash.
    first.child.kill().await.unwrap();
    let _second = start_executor_with(&rdv.url, "env-restart", CLASSIC);
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        let bundle = harness.connect("env-restart", &probe).await;
        if bundle.is_ok_and(|b| b.executor_public_key != old_key) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the restarted executor never took over"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut again = RelayClient::open(classic_args()).await;
    assert_eq!(
        again.call("environment/status", json!({})).await["status"],
        "ready"
    );
    client.conn.abort();
}

/// `--registration-bearer-stdin`: the executor reads its registry token from the first
/// line of stdin — it registers and serves — and the token is in neither its command
/// line nor its environment.
#[tokio::test]
async fn the_executor_reads_its_bearer_from_stdin() {
    use tokio::io::AsyncWriteExt;
    let rdv = start_rendezvous(None).await;
    let mut cmd = crate::util::server_command(&[
        "--remote",
        &rdv.url,
        "--environment-id",
        "env-stdin",
        "--registration-bearer-stdin",
    ]);
    cmd.env_remove("EXEC_SERVER_RELAY_TOKEN");
    let mut executor = cmd.spawn().expect("spawn executor");
    let mut stdin = executor.stdin.take().unwrap();
    stdin
        .write_all(format!("{EXECUTOR_TOKEN}\n").as_bytes())
        .await
        .unwrap();
    stdin.flush().await.unwrap();
    let mut client = RelayClient::open(harness_args(&rdv.url, "env-stdin")).await;
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
    let pid = executor.id().unwrap();
    for part in ["cmdline", "environ"] {
        let bytes = std::fs::read(format!("/proc/{pid}/{part}")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(EXECUTOR_TOKEN),
            "the token is in /proc/{pid}/{part}"
        );
    }
    client.conn.abort();

    // Without a newline-terminated line the executor refuses to start, in codex's words.
    let mut cmd = crate::util::server_command(&[
        "--remote",
        &rdv.url,
        "--environment-id",
        "env-stdin-2",
        "--registration-bearer-stdin",
    ]);
    cmd.env_remove("EXEC_SERVER_RELAY_TOKEN")
        .stderr(std::process::Stdio::piped());
    let mut refused = cmd.spawn().expect("spawn executor");
    let mut stdin = refused.stdin.take().unwrap();
    stdin.write_all(EXECUTOR_TOKEN.as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(STEP_TIMEOUT, refused.wait_with_output())
        .await
        .expect("the executor exits")
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("expected a newline-terminated registration bearer of at most 16 KiB"),
        "{stderr}"
    );
    assert!(!stderr.contains(EXECUTOR_TOKEN), "{stderr}");
}

/// When the rendezvous refuses the executor's socket (here: the URL it signed before a
/// restart under another key), the executor says why at WARN, with the rendezvous's own
/// reason, and registers again; the operator does not need the rendezvous's log.
#[tokio::test]
async fn a_refused_executor_socket_is_logged_with_its_reason_and_registered_again() {
    let mut rdv = start_rendezvous(None).await;
    let mut cmd =
        crate::util::server_command(&["--remote", &rdv.url, "--environment-id", "env-resigned"]);
    cmd.env("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN)
        .env("EXEC_SERVER_RELAY__RECONNECT_INITIAL_BACKOFF_MS", "50")
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped());
    let mut executor = cmd.spawn().expect("spawn executor");
    let log = capture_stderr(&mut executor);
    drop(connect(harness_args(&rdv.url, "env-resigned")).await);

    rdv.restart_with_signing_key("ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=")
        .await;
    wait_for_log(
        &log,
        "the rendezvous refused the upgrade with HTTP 401: ",
        1,
    )
    .await;
    let text = log.lock().unwrap().clone();
    let line = text
        .lines()
        .find(|l| l.contains("refused the upgrade with HTTP 401"))
        .unwrap();
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("registering again"), "{line}");
    assert!(
        line.contains("HTTP 401: invalid_signature"),
        "the rendezvous's reason is shown: {line}"
    );
    // It registered again under the new key and serves.
    let mut client = RelayClient::open(harness_args(&rdv.url, "env-resigned")).await;
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
}

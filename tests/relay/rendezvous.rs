//! The rendezvous service: frame rules on harness sockets, upgrade checks, standby and
//! expiry, capacity and parked routes, socket binding, and shutdown.

use exec_server_relay_core::noise::NoiseIdentity;
use exec_server_relay_core::proto::{self, Body};
use futures_util::SinkExt;
use tokio_tungstenite::tungstenite::Message;

use super::fixtures::*;

#[tokio::test]
async fn rendezvous_closes_harness_sockets_for_text_oversize_and_invalid_frames() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-frames");
    let bundle = harness_bundle(&rdv.url, "env-frames").await;

    let mut ws = open_raw(&bundle.url).await;
    ws.send(Message::text("{}")).await.unwrap();
    assert_eq!(raw_close_code(&mut ws).await, Some(1003), "text message");

    let mut ws = open_raw(&bundle.url).await;
    let _ = ws.send(Message::binary(vec![0u8; 262_145])).await;
    assert_eq!(raw_close_code(&mut ws).await, Some(1009), "262,145 bytes");

    // Rows 3–9 of §2.5: seven invalid frames are dropped and the socket stays open.
    let sid = new_stream_id();
    let mut segmented = proto::frame(&sid, 0, 0, proto::data_body(1, vec![0u8; 32].into()));
    if let Some(Body::Data(d)) = &mut segmented.body {
        d.segment_count = 2;
    }
    let mut no_body = proto::frame(&sid, 0, 0, proto::ack_body());
    no_body.body = None;
    let invalid: Vec<Vec<u8>> = vec![
        vec![0xff, 0xff, 0xff],
        proto::encode(&version_two(&sid)).to_vec(),
        proto::encode(&segmented).to_vec(),
        proto::encode(&proto::frame(
            &sid,
            0,
            0,
            proto::data_body(1, vec![0u8; 61_457].into()),
        ))
        .to_vec(),
        proto::encode(&proto::frame(
            &sid,
            0,
            0,
            proto::data_body(2, vec![0u8; 16].into()),
        ))
        .to_vec(),
        proto::encode(&proto::frame(&sid, 0, 0, proto::handshake_body(Vec::new()))).to_vec(),
        proto::encode(&no_body).to_vec(),
        proto::encode(&proto::frame(
            &sid,
            0,
            0,
            proto::handshake_body(vec![1u8; 65_536]),
        ))
        .to_vec(),
    ];
    assert_eq!(invalid.len(), 8);
    let mut ws = open_raw(&bundle.url).await;
    for bytes in &invalid[..7] {
        ws.send(Message::binary(bytes.clone())).await.unwrap();
    }
    assert_alive(&mut ws).await;
    ws.send(Message::binary(invalid[7].clone())).await.unwrap();
    assert_eq!(
        raw_close_code(&mut ws).await,
        Some(1002),
        "the 8th invalid frame"
    );
}

#[tokio::test]
async fn rendezvous_upgrade_answers_standby_and_registration_expiry() {
    let rdv = start_rendezvous_with(None, "grace_secs = 1\nregistration_ttl_secs = 2").await;
    let executor = registry_as(&rdv.url, EXECUTOR_TOKEN);
    let harness = registry_as(&rdv.url, HARNESS_TOKEN);
    let (key_a, key_b) = (
        NoiseIdentity::generate().public(),
        NoiseIdentity::generate().public(),
    );
    let reg_a = executor
        .register("env-upgrade", &key_a, None)
        .await
        .unwrap();
    // Same key: the same registration again.
    let again = executor
        .register("env-upgrade", &key_a, None)
        .await
        .unwrap();
    assert_eq!(
        again.executor_registration_id,
        reg_a.executor_registration_id
    );

    // §8.4 upgrade checks, in order.
    assert_eq!(
        upgrade(&with_query(&reg_a.url, "exp", None)).await.err(),
        Some(400)
    );
    assert_eq!(
        upgrade(&with_query(&reg_a.url, "role", Some("auditor")))
            .await
            .err(),
        Some(400)
    );
    let sig = query_value(&reg_a.url, "sig");
    let tampered = format!(
        "{}{}",
        if sig.starts_with('A') { "B" } else { "A" },
        &sig[1..]
    );
    assert_eq!(
        upgrade(&with_query(&reg_a.url, "sig", Some(&tampered)))
            .await
            .err(),
        Some(401)
    );
    assert_eq!(
        upgrade(&with_query(&reg_a.url, "sig", None)).await.err(),
        Some(401)
    );
    let exp: u64 = query_value(&reg_a.url, "exp").parse().unwrap();
    let later = (exp + 1).to_string();
    assert_eq!(
        upgrade(&with_query(&reg_a.url, "exp", Some(&later)))
            .await
            .err(),
        Some(401)
    );

    let mut socket_a = open_raw(&reg_a.url).await;
    // A harness URL used as an executor URL: the signature covers the role.
    let bundle = harness_bundle(&rdv.url, "env-upgrade").await;
    let as_executor = with_query(
        &with_query(&bundle.url, "role", Some("environment")),
        "kh",
        None,
    );
    assert_eq!(upgrade(&as_executor).await.err(), Some(401));
    // Standby: another key gets 409 while the first executor is attached.
    assert_eq!(
        status_of(executor.register("env-upgrade", &key_b, None).await),
        409
    );
    socket_a.close(None).await.unwrap();
    // After the grace the second executor takes over.
    let reg_b = until_status("register B", 200, || {
        executor.register("env-upgrade", &key_b, None)
    })
    .await
    .unwrap();
    assert_ne!(
        reg_b.executor_registration_id,
        reg_a.executor_registration_id
    );
    let mut socket_b = open_raw(&reg_b.url).await;
    let _ = harness_bundle(&rdv.url, "env-upgrade").await;
    // The first executor returns: 410 on its upgrade, 409 on its register.
    assert_eq!(upgrade(&reg_a.url).await.err(), Some(410));
    assert_eq!(
        status_of(executor.register("env-upgrade", &key_a, None).await),
        409
    );
    assert_alive(&mut socket_b).await;

    // A harness upgrade while no executor is attached and none in its grace: 503.
    let bundle = harness_bundle(&rdv.url, "env-upgrade").await;
    socket_b.close(None).await.unwrap();
    let probe_key = NoiseIdentity::generate().public();
    until_status("connect", 503, || {
        harness.connect("env-upgrade", &probe_key)
    })
    .await;
    assert_eq!(upgrade(&bundle.url).await.err(), Some(503));
    // The detached registration is deleted after registration_ttl_secs: 404.
    until_status("connect", 404, || {
        harness.connect("env-upgrade", &probe_key)
    })
    .await;
    assert_eq!(upgrade(&reg_b.url).await.err(), Some(404));
}

#[tokio::test]
async fn rendezvous_capacity_limits_and_parked_routes() {
    let rdv = start_rendezvous_with(
        None,
        "grace_secs = 1\nmax_environments = 2\nmax_harness_sockets_per_environment = 1\nmax_parked_streams_per_environment = 2",
    )
    .await;
    let executor = registry_as(&rdv.url, EXECUTOR_TOKEN);
    let key = NoiseIdentity::generate().public();
    let reg = executor.register("env-cap-1", &key, None).await.unwrap();
    executor.register("env-cap-2", &key, None).await.unwrap();
    let error = executor
        .register("env-cap-3", &key, None)
        .await
        .unwrap_err();
    assert_eq!(error.status(), Some(503));
    assert!(error.to_string().contains("overloaded"), "{error}");

    let mut exec_ws = open_raw(&reg.url).await;
    let bundle = harness_bundle(&rdv.url, "env-cap-1").await;
    let mut harness_ws = open_raw(&bundle.url).await;
    assert_eq!(
        upgrade(&bundle.url).await.err(),
        Some(503),
        "second harness socket"
    );

    // Frames from the executor for streams no harness has bound yet park their routes,
    // up to two; the third gets Reset{unknown_stream}.
    let (s1, s2, s3) = (new_stream_id(), new_stream_id(), new_stream_id());
    let held = proto::frame(&s1, 4, 0, proto::resume_body(7));
    send_frame(&mut exec_ws, &held).await;
    send_frame(
        &mut exec_ws,
        &proto::frame(&s2, 0, 0, proto::resume_body(3)),
    )
    .await;
    send_frame(
        &mut exec_ws,
        &proto::frame(&s3, 0, 0, proto::resume_body(3)),
    )
    .await;
    assert_eq!(
        raw_reset(&mut exec_ws).await,
        (s3, "unknown_stream".to_owned())
    );
    // A harness binding to s1 receives the held resume, byte for byte.
    send_frame(
        &mut harness_ws,
        &proto::frame(&s1, 0, 0, proto::resume_body(0)),
    )
    .await;
    match raw_next(&mut harness_ws).await {
        Raw::Frame(f) => assert_eq!(f, held),
        Raw::Closed(code) => panic!("closed {code:?}"),
    }
    // s2 stays parked past the grace: the executor learns harness_unavailable.
    let (sid, reason) = loop {
        let (sid, reason) = raw_reset(&mut exec_ws).await;
        if sid != s1 {
            break (sid, reason);
        }
    };
    assert_eq!((sid, reason.as_str()), (s2, "harness_unavailable"));
    assert_alive(&mut harness_ws).await;
    // A text message on the executor socket: 1003.
    exec_ws.send(Message::text("{}")).await.unwrap();
    assert_eq!(raw_close_code(&mut exec_ws).await, Some(1003));
}

#[tokio::test]
async fn harness_sockets_are_bound_to_one_stream_and_one_key() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-bind");
    let mine = harness_bundle(&rdv.url, "env-bind").await;
    let other = harness_bundle(&rdv.url, "env-bind").await;
    let sid = new_stream_id();
    let claim = proto::frame(&sid, 0, 0, proto::resume_body(0));
    let mut ws = open_raw(&mine.url).await;
    send_frame(&mut ws, &claim).await;
    assert_alive(&mut ws).await;
    // Another harness key naming the same stream: 1008.
    let mut intruder = open_raw(&other.url).await;
    send_frame(&mut intruder, &claim).await;
    assert_eq!(raw_close_code(&mut intruder).await, Some(1008));
    // The same key on a new socket takes the stream over; the old socket gets 4002.
    let mut takeover = open_raw(&mine.url).await;
    send_frame(&mut takeover, &claim).await;
    assert_eq!(raw_close_code(&mut ws).await, Some(4002));
    // A second stream id on a bound socket: 1008.
    send_frame(
        &mut takeover,
        &proto::frame(&new_stream_id(), 0, 0, proto::resume_body(0)),
    )
    .await;
    assert_eq!(raw_close_code(&mut takeover).await, Some(1008));
}

#[tokio::test]
async fn stopping_rendezvous_closes_every_socket_with_1001() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor(&rdv.direct, "env-1001");
    let _client = RelayClient::open(harness_args(&rdv.direct, "env-1001")).await;
    let pid = rdv.child.id().unwrap() as libc::pid_t;
    // SAFETY: sending SIGTERM to a child process this test started and still owns.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    proxy
        .wait_for("1001 on both sockets", |p| {
            let closes = p.faults.router_closes.lock().unwrap();
            closes.contains(&(Side::Executor, Some(1001)))
                && closes.contains(&(Side::Harness, Some(1001)))
        })
        .await;
}

/// A rendezvous without tokens would refuse every request: it does not start, and says
/// what to do. `--insecure-no-auth` starts it on a loopback address, accepting any bearer
/// token; it is refused anywhere else and together with tokens.
#[tokio::test]
async fn a_rendezvous_without_tokens_needs_insecure_no_auth() {
    let run = |args: &[&str]| {
        let mut command = std::process::Command::new(crate::util::server_bin());
        command.args(args).env("RUST_LOG", "warn");
        command.stdin(std::process::Stdio::null());
        command
    };
    let out = run(&["rendezvous", "--listen", "http://127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("rendezvous.tokens is empty") && stderr.contains("--insecure-no-auth"),
        "{stderr}"
    );
    let out = run(&[
        "rendezvous",
        "--listen",
        "http://0.0.0.0:0",
        "--public-url",
        "https://relay.example",
        "--insecure-no-auth",
    ])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("non-loopback"));

    // On loopback, any bearer token registers an environment.
    let mut child = tokio::process::Command::from(run(&[
        "rendezvous",
        "--listen",
        "http://127.0.0.1:0",
        "--insecure-no-auth",
    ]));
    child
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = child.spawn().unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut url = String::new();
    use tokio::io::AsyncBufReadExt;
    tokio::time::timeout(crate::util::STEP_TIMEOUT, stdout.read_line(&mut url))
        .await
        .unwrap()
        .unwrap();
    let base = url.trim().to_owned();
    let key = exec_server_relay_core::noise::NoiseIdentity::generate().public();
    let registration = registry_as(&base, "anything-at-all")
        .register("env-open", &key, None)
        .await;
    assert!(registration.is_ok(), "{registration:?}");
    let without_token = reqwest_free_post(&base, "env-open2").await;
    assert_eq!(without_token, 401, "a bearer token is still required");

    // Not together with tokens.
    let config = crate::util::config_file(&format!(
        "[[rendezvous.tokens]]\nname = \"t\"\nsha256 = \"{}\"\nrole = \"any\"\n",
        "a".repeat(64)
    ));
    let out = run(&[
        "rendezvous",
        "--config",
        config.to_str().unwrap(),
        "--insecure-no-auth",
    ])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("rendezvous.insecure_no_auth cannot be combined with rendezvous.tokens"));
}

/// A registration request without any `Authorization` header; the HTTP status.
async fn reqwest_free_post(base: &str, environment: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = base.trim_start_matches("http://").trim_end_matches('/');
    let mut tcp = tokio::net::TcpStream::connect(authority).await.unwrap();
    let body = "{}";
    let request = format!(
        "POST /cloud/environment/{environment}/register HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.unwrap();
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// A public URL naming this machine on another port than the listener's is warned about at
/// start (right only with a local proxy); the service still starts.
#[tokio::test]
async fn a_public_url_on_another_local_port_is_warned_about() {
    let mut cmd = crate::util::server_command(&[
        "rendezvous",
        "--insecure-no-auth",
        "--listen",
        "http://127.0.0.1:0",
        "--public-url",
        "http://127.0.0.1:9",
    ]);
    cmd.env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let log = super::fixtures::capture_stderr(&mut child);
    super::fixtures::wait_for_log(&log, "another port than the listener's", 1).await;
    assert!(log.lock().unwrap().contains("WARN"));
    assert!(child.try_wait().unwrap().is_none(), "it still serves");
}

/// A token digest pasted as a whole `sha256sum` line is recognised, and the error is blamed
/// on the file that holds it (a key inside an array used to read "(default)").
#[tokio::test]
async fn a_pasted_sha256sum_line_is_named_with_its_file() {
    let digest = super::fixtures::sha256_hex("some-token");
    let config = crate::util::config_file(&format!(
        "[[rendezvous.tokens]]\nname = \"a\"\nrole = \"harness\"\nsha256 = \"{digest}  -\"\n"
    ));
    let path = config.to_str().unwrap();
    let stderr = super::fixtures::refused_at_start(crate::util::server_command(&[
        "rendezvous",
        "--config",
        path,
        "--listen",
        "http://127.0.0.1:0",
    ]))
    .await;
    assert!(
        stderr.contains("rendezvous.tokens.0.sha256 must be 64 hex digits; this looks like a whole `sha256sum` line"),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("(from {path})")), "{stderr}");
}

/// `--insecure-no-auth` is for one machine: a public or node URL naming another host means a
/// proxy publishes the loopback listener, and anyone could register and connect.
#[tokio::test]
async fn insecure_no_auth_is_refused_when_published_beyond_this_machine() {
    for (flag, url) in [
        ("--public-url", "https://exec.example.com"),
        ("--node-url", "http://10.0.0.5:8701"),
    ] {
        let stderr = super::fixtures::refused_at_start(crate::util::server_command(&[
            "rendezvous",
            "--insecure-no-auth",
            "--listen",
            "http://127.0.0.1:0",
            flag,
            url,
        ]))
        .await;
        assert!(
            stderr.contains("publishes the service beyond this machine") && stderr.contains(url),
            "{stderr}"
        );
    }
}

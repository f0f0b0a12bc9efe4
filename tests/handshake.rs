//! Envelope, handshake, gating and sessions (PROTOCOL §2, §3), over stdio and WebSocket.

use serde_json::{json, Value};

use crate::util::{assert_error, config_file, Client, WsServer};

const STDIO_PREFIX: &str = "failed to parse JSON-RPC message from exec-server stdio: ";

/// The id -1 reply prefix of whichever transport `client` uses.
async fn parse_error_prefix(client: &mut Client) -> String {
    client.send_raw("not json").await;
    let reply = client.next_message().await;
    assert_eq!(reply["id"], -1, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap().to_owned();
    let end = message.find(": ").expect("prefix ends with `: `") + 2;
    message[..end].to_owned()
}

both_transports!(handshake_and_gating, |mut client: Client| async move {
    // Lookup comes first: unknown methods are -32601 even before initialize.
    let err = client.call_err("nope/nothing", json!({})).await;
    assert_error(&err, -32601, "unknown method `nope/nothing`");
    // `initialized` with an id is a request for an unknown method.
    let err = client.call_err("initialized", json!({})).await;
    assert_error(&err, -32601, "unknown method `initialized`");

    let err = client.call_err("environment/status", json!({})).await;
    assert_error(
        &err,
        -32600,
        "client must call initialize before using environment status methods",
    );
    client.send(json!({"method": "initialized"})).await;
    let reply = client.next_message().await;
    assert_eq!(
        reply,
        json!({"error": {"code": -32600, "message": "client must call initialize before sending initialized"}, "id": -1})
    );

    // A failed initialize leaves the connection uninitialized.
    let err = client.call_err("initialize", json!({})).await;
    assert_eq!(err["code"], -32602);
    assert!(
        err["message"].as_str().unwrap().contains("clientName"),
        "{err}"
    );

    let result = client
        .call("initialize", json!({"clientName": "tests"}))
        .await;
    let session_id = result["sessionId"].as_str().unwrap();
    assert_uuid_v4(session_id);
    // Pipelined before `initialized`: row 3 of the gating table, in wire order.
    let id = client.send_request("environment/info", json!({})).await;
    let err = client.response(id).await.unwrap_err();
    assert_error(
        &err,
        -32600,
        "client must send initialized before using environment info methods",
    );

    let err = client
        .call_err("initialize", json!({"clientName": "again"}))
        .await;
    assert_error(
        &err,
        -32600,
        "initialize may only be sent once per connection",
    );

    client
        .send(json!({"method": "initialized", "params": {"ignored": true}}))
        .await;
    assert_eq!(
        client.call("environment/status", json!({})).await,
        json!({"status": "ready"})
    );
    // A second `initialized` is harmless.
    client
        .send(json!({"method": "initialized", "params": {}}))
        .await;
    assert_eq!(
        client.call("environment/status", json!({})).await,
        json!({"status": "ready"})
    );
    assert!(
        client.pending().is_empty(),
        "unexpected messages: {:?}",
        client.pending()
    );
});

both_transports!(
    malformed_messages_get_id_minus_one,
    |mut client: Client| async move {
        client.handshake().await;
        let prefix = parse_error_prefix(&mut client).await;
        let cases: &[(&str, &str)] = &[
            ("{\"id\":1,", "EOF"),
            ("[{\"id\":1,\"method\":\"environment/status\"}]", "batch"),
            ("42", "expected a JSON object"),
            (
                "{\"id\":null,\"method\":\"environment/status\"}",
                "request id",
            ),
            (
                "{\"id\":1.5,\"method\":\"environment/status\"}",
                "request id",
            ),
            (
                "{\"id\":true,\"method\":\"environment/status\"}",
                "request id",
            ),
            (
                "{\"id\":{},\"method\":\"environment/status\"}",
                "request id",
            ),
            (
                "{\"id\":9223372036854775808,\"method\":\"environment/status\"}",
                "request id",
            ),
            (
                "{\"id\":1,\"method\":\"environment/status\",\"params\":{\"a\":1,\"a\":2}}",
                "duplicate key `a`",
            ),
            (
                "{\"id\":1,\"id\":2,\"method\":\"environment/status\"}",
                "duplicate key `id`",
            ),
            ("{\"id\":1,\"error\":{\"code\":1}}", "error object"),
            ("{\"id\":1}", "neither"),
            ("{\"id\":1,\"method\":7}", "method must be a string"),
        ];
        for (raw, detail) in cases {
            client.send_raw(raw).await;
            let reply = client.next_message().await;
            assert_eq!(reply["id"], -1, "{raw} -> {reply}");
            assert_eq!(reply["error"]["code"], -32600, "{raw} -> {reply}");
            let message = reply["error"]["message"].as_str().unwrap();
            assert!(message.starts_with(&prefix), "{raw} -> {message}");
            assert!(
                message.contains(detail),
                "{raw}: expected {detail:?} in {message}"
            );
            assert!(reply["error"].get("data").is_none());
        }
        // Notifications other than `initialized` get id -1 and the connection stays open.
        client
            .send(json!({"method": "process/started", "params": {}}))
            .await;
        assert_eq!(
            client.next_message().await,
            json!({"error": {"code": -32600, "message": "unknown notification method `process/started`"}, "id": -1})
        );
        // Responses from the client are dropped without a reply.
        client.send(json!({"id": 5, "result": {}})).await;
        client
            .send(json!({"id": 6, "error": {"code": 1, "message": "x"}}))
            .await;
        // `jsonrpc` is accepted with any value; string and integer ids are echoed unchanged.
        client
            .send(json!({"jsonrpc": "2.0", "id": "abc", "method": "environment/status"}))
            .await;
        assert_eq!(
            client.next_message().await,
            json!({"id": "abc", "result": {"status": "ready"}})
        );
        client.send(json!({"jsonrpc": 3, "id": -9223372036854775807i64, "method": "environment/status"})).await;
        assert_eq!(
            client.next_message().await,
            json!({"id": -9223372036854775807i64, "result": {"status": "ready"}})
        );
        client
            .send(json!({"id": 0, "method": "environment/status"}))
            .await;
        let reply = client.next_message().await;
        assert_eq!(reply["id"], 0, "{reply}");
        assert!(
            client.pending().is_empty(),
            "unexpected: {:?}",
            client.pending()
        );
    }
);

fn assert_uuid_v4(id: &str) {
    let parts: Vec<&str> = id.split('-').collect();
    assert_eq!(
        parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
        [8, 4, 4, 4, 12],
        "{id}"
    );
    assert!(id
        .chars()
        .all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    assert!(parts[2].starts_with('4'), "{id}");
}

#[tokio::test]
async fn stdio_exact_bytes_and_message_limits() {
    let config = config_file("[limits]\nmax_message_bytes = 200\nmax_json_values = 10\n");
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    client.handshake().await;
    // A line above the limit is skipped unbuffered and answered; the next line still works.
    let long = format!(
        "{{\"id\":1,\"method\":\"environment/status\",\"params\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(400)
    );
    client.send_raw(&long).await;
    assert_eq!(
        client.next_message().await,
        json!({"error": {"code": -32600, "message": format!("{STDIO_PREFIX}message exceeds the maximum size of 200 bytes")}, "id": -1})
    );
    client
        .send_raw("{\"id\":2,\"method\":\"environment/status\"}\r")
        .await;
    assert_eq!(
        client.next_message().await,
        json!({"id": 2, "result": {"status": "ready"}})
    );
    // Too many values: object + params object + 9 numbers = 11 > 10.
    client
        .send_raw(
            "{\"id\":3,\"method\":\"environment/status\",\"params\":{\"a\":[1,2,3,4,5,6,7,8]}}",
        )
        .await;
    let reply = client.next_message().await;
    assert_eq!(reply["id"], -1);
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("more than 10 JSON values"),
        "{reply}"
    );
    // Blank lines are skipped without a reply.
    client.send_raw("   ").await;
    client
        .send_raw("{\"id\":4,\"method\":\"environment/status\"}")
        .await;
    assert_eq!(client.next_message().await["id"], 4);
}

#[tokio::test]
async fn nesting_deeper_than_128_is_malformed() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let params = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    // Depth counts the message object (1) and params (2..): 126 arrays → 127 levels.
    client
        .send_raw(&format!(
            "{{\"id\":1,\"method\":\"environment/status\",\"params\":{{\"a\":{}}}}}",
            params(126)
        ))
        .await;
    assert_eq!(client.next_message().await["id"], 1);
    client
        .send_raw(&format!(
            "{{\"id\":2,\"method\":\"environment/status\",\"params\":{{\"a\":{}}}}}",
            params(127)
        ))
        .await;
    let reply = client.next_message().await;
    assert_eq!(reply["id"], -1, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum depth of 128"),
        "{reply}"
    );
}

#[tokio::test]
async fn stdio_eof_exits_zero() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    client.close().await;
    assert!(client.read_wire().await.is_none());
    let status = tokio::time::timeout(crate::util::STEP_TIMEOUT, client.child().wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn sessions_detach_resume_and_expire() {
    let config = config_file("[session]\ndetached_ttl_ms = 1500\n");
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let mut first = server.connect_initialized().await;
    let session = first.session_id.clone().unwrap();

    // While attached: -32010, and the failed attempt leaves the connection uninitialized.
    let mut second = server.connect().await;
    let err = second.resume(&session).await.unwrap_err();
    assert_error(
        &err,
        -32010,
        &format!("session {session} is already attached to another connection"),
    );
    let err = second.call_err("environment/status", json!({})).await;
    assert_error(
        &err,
        -32600,
        "client must call initialize before using environment status methods",
    );

    let err = second
        .resume("00000000-0000-4000-8000-000000000000")
        .await
        .unwrap_err();
    assert_error(
        &err,
        -32600,
        "unknown session id 00000000-0000-4000-8000-000000000000",
    );

    // Drop the first connection; the session detaches and can be resumed (retry -32010 until
    // the server has seen the close).
    first.close().await;
    drop(first);
    let resumed = retry_resume(&mut second, &session).await;
    assert_eq!(resumed["sessionId"], json!(session));
    assert!(resumed["environmentInfo"].is_object(), "{resumed}");
    assert_eq!(
        second.call("environment/status", json!({})).await,
        json!({"status": "ready"})
    );

    // Detach again and let it expire.
    second.close().await;
    drop(second);
    // Expiry: once the TTL has run out the id is unknown.
    tokio::time::sleep(std::time::Duration::from_millis(3000)).await;
    let mut third = server.connect().await;
    let err = third.resume(&session).await.unwrap_err();
    assert_error(&err, -32600, &format!("unknown session id {session}"));
}

/// Resumes `session`, retrying while the server still sees the old connection (-32010).
pub async fn retry_resume(client: &mut Client, session: &str) -> Value {
    for _ in 0..250 {
        match client.resume(session).await {
            Ok(result) => return result,
            Err(err) if err["code"] == -32010 => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            Err(err) => panic!("resume failed: {err}"),
        }
    }
    panic!("session stayed attached");
}

#[tokio::test]
async fn stdio_session_cannot_be_taken_over() {
    let server_cfg = config_file("");
    // A server with both stdio and websocket: the stdio session stays attached.
    let mut cmd = crate::util::server_command(&[
        "--listen",
        "stdio",
        "--listen",
        "ws://127.0.0.1:0",
        "--config",
        server_cfg.to_str().unwrap(),
    ]);
    cmd.stderr(std::process::Stdio::piped());
    let mut stdio = Client::stdio_with(cmd);
    // The ws:// line goes to stderr because stdout belongs to JSON-RPC.
    let stderr = stdio.child().stderr.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stderr));
    let url = loop {
        let line = lines.next_line().await.unwrap().expect("ws line on stderr");
        if line.starts_with("ws://") {
            break line;
        }
    };
    let session = stdio.handshake().await;
    let mut ws = Client::websocket(&url).await;
    let err = ws.resume(&session).await.unwrap_err();
    assert_eq!(err["code"], -32010);
    // Ending stdio shuts down the whole server, websocket included.
    stdio.close().await;
    assert!(ws.read_wire().await.is_none());
    assert_eq!(stdio.child().wait().await.unwrap().code(), Some(0));
}

/// `printf '<a whole session>' | exec-server --listen stdio`: end of input comes right
/// after the last request, yet every request is answered and the output and exit of a
/// process that finishes within the drain window are delivered, then the server exits 0.
#[tokio::test]
async fn end_of_input_on_stdio_answers_everything_already_received() {
    let session = [
        json!({"id": 1, "method": "initialize", "params": {"clientName": "piped"}}),
        json!({"method": "initialized", "params": {}}),
        json!({"id": 2, "method": "environment/status"}),
        json!({"id": 3, "method": "process/start", "params": {
            "processId": "p", "argv": ["sh", "-c", "echo first; sleep 0.3; echo second; exit 3"],
            "cwd": "/", "env": {"PATH": "/usr/bin:/bin"}, "tty": false}}),
        json!({"id": 4, "method": "fs/getMetadata", "params": {"path": "/"}}),
    ]
    .iter()
    .map(|m| format!("{m}\n"))
    .collect::<String>();
    let (code, lines) = crate::util::piped_stdio_session(&session, &[]).await;
    assert_eq!(code, Some(0), "{lines:?}");
    for id in 1..=4 {
        let answer = lines.iter().find(|m| m["id"] == id);
        assert!(
            answer.is_some_and(|m| m.get("result").is_some()),
            "request {id} unanswered: {lines:?}"
        );
    }
    let output: String = lines
        .iter()
        .filter(|m| m["method"] == "process/output")
        .map(|m| {
            let chunk = m["params"]["chunk"].as_str().unwrap();
            String::from_utf8(exec_server_core::proto::bytes::decode_base64(chunk).unwrap())
                .unwrap()
        })
        .collect();
    assert_eq!(output, "first\nsecond\n", "{lines:?}");
    let exited = lines.iter().find(|m| m["method"] == "process/exited");
    assert_eq!(exited.map(|m| &m["params"]["exitCode"]), Some(&json!(3)));
    assert!(
        lines.iter().any(|m| m["method"] == "process/closed"),
        "{lines:?}"
    );
}

/// The drain window bounds the wait: a process that outlives it is killed with the session
/// and the server still exits 0 after answering what it received.
#[tokio::test]
async fn end_of_input_on_stdio_stops_waiting_at_the_drain_window() {
    let marker = tempfile::NamedTempFile::new().unwrap();
    let script = format!("echo $$ > {}; exec sleep 600", marker.path().display());
    let session = [
        json!({"id": 1, "method": "initialize", "params": {"clientName": "piped"}}),
        json!({"method": "initialized", "params": {}}),
        json!({"id": 2, "method": "process/start", "params": {
            "processId": "long", "argv": ["sh", "-c", script],
            "cwd": "/", "env": {"PATH": "/usr/bin:/bin"}, "tty": false}}),
    ]
    .iter()
    .map(|m| format!("{m}\n"))
    .collect::<String>();
    let (code, lines) = crate::util::piped_stdio_session(
        &session,
        &[("EXEC_SERVER_CONNECTION__STDIO_DRAIN_MS", "200")],
    )
    .await;
    assert_eq!(code, Some(0), "{lines:?}");
    assert!(lines
        .iter()
        .any(|m| m["id"] == 2 && m.get("result").is_some()));
    let pid: i32 = std::fs::read_to_string(marker.path())
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: signal 0 only checks whether the pid exists.
    let alive = || unsafe { libc::kill(pid, 0) } == 0;
    // Killed with the session; reaping it may take a moment after the server exited.
    let deadline = std::time::Instant::now() + crate::util::STEP_TIMEOUT;
    while alive() {
        assert!(
            std::time::Instant::now() < deadline,
            "the process outlived the server"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits until no process with `pid` exists any more.
async fn wait_until_gone(pid: i32) {
    let deadline = std::time::Instant::now() + crate::util::STEP_TIMEOUT;
    // SAFETY: signal 0 only checks whether the pid exists.
    while unsafe { libc::kill(pid, 0) } == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} still runs"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Starts `sleep 600` and returns its pid.
async fn start_sleeper(client: &mut Client, process_id: &str) -> i32 {
    let marker = tempfile::NamedTempFile::new().unwrap();
    let script = format!("echo $$ > {}; exec sleep 600", marker.path().display());
    client
        .call(
            "process/start",
            json!({"processId": process_id, "argv": ["sh", "-c", script], "cwd": "/",
                   "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
        )
        .await;
    let deadline = std::time::Instant::now() + crate::util::STEP_TIMEOUT;
    loop {
        if let Ok(pid) = std::fs::read_to_string(marker.path())
            .unwrap()
            .trim()
            .parse()
        {
            return pid;
        }
        assert!(std::time::Instant::now() < deadline, "no pid written");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

// A client that is done says so: the session ends at once (its processes are killed), the
// answer is `{}`, and the server closes the connection.
both_transports!(
    session_close_ends_the_session_at_once,
    |mut client: Client| async move {
        let err = client.call_err("session/close", json!({})).await;
        assert_error(
            &err,
            -32600,
            "client must call initialize before using session methods",
        );
        client.handshake().await;
        let pid = start_sleeper(&mut client, "sleeper").await;
        assert_eq!(client.call("session/close", json!({})).await, json!({}));
        wait_until_gone(pid).await;
        assert_eq!(
            client.read_wire().await,
            None,
            "the server closes the connection"
        );
    }
);

/// Over a websocket the closed session cannot be resumed (it is gone, not detached).
#[tokio::test]
async fn a_closed_session_cannot_be_resumed() {
    let server = WsServer::start(&[]).await;
    let mut client = server.connect().await;
    let session_id = client.handshake().await;
    assert_eq!(client.call("session/close", json!({})).await, json!({}));
    let mut again = server.connect().await;
    let err = again
        .call_err(
            "initialize",
            json!({"clientName": "t", "resumeSessionId": session_id}),
        )
        .await;
    assert_error(&err, -32600, &format!("unknown session id {session_id}"));
}

/// `exec-server run` closes its session when the command is done, so nothing lingers
/// detached on the server.
#[tokio::test]
async fn run_closes_its_session_when_done() {
    let server = WsServer::start(&[]).await;
    let output = tokio::process::Command::new(crate::util::server_bin())
        .args([
            "run",
            "--url",
            &server.url,
            "--no-stdin",
            "--",
            "sh",
            "-c",
            "echo done",
        ])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "done\n");
    assert_eq!(output.status.code(), Some(0));
    let (_, body) = crate::util::http_body(&server.http_base(), "/metrics", "").await;
    for state in ["attached", "detached"] {
        assert_eq!(
            crate::websocket::prometheus_value(
                &body,
                &format!("exec_server_sessions{{state=\"{state}\"}}")
            ),
            Some(0.0),
            "{body}"
        );
    }
}

/// `RUST_LOG=debug` writes one line per request with its method, id, session, process (when
/// it names one), W3C `traceparent` (when the request carries a well-formed one), duration
/// and outcome.
#[tokio::test]
async fn debug_logs_one_line_per_request() {
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let session = [
        json!({"id": 1, "method": "initialize", "params": {"clientName": "logged"}}),
        json!({"method": "initialized", "params": {}}),
        json!({"id": 2, "method": "environment/status", "trace": {"traceparent": traceparent}}),
        json!({"id": 3, "method": "process/start", "params": {
            "processId": "logged-proc", "argv": ["true"], "cwd": "/", "env": {}, "tty": false}}),
        json!({"id": 4, "method": "fs/readFile", "params": {"path": "/nonexistent/file"}}),
    ]
    .iter()
    .map(|m| format!("{m}\n"))
    .collect::<String>();
    use tokio::io::AsyncWriteExt;
    let mut cmd = crate::util::server_command(&["--listen", "stdio"]);
    cmd.env("RUST_LOG", "debug")
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(session.as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(crate::util::STEP_TIMEOUT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    let answered: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("request answered"))
        .collect();
    assert_eq!(answered.len(), 3, "{log}");
    let line_of = |method: &str| {
        *answered
            .iter()
            .find(|line| line.contains(&format!("method={method}")))
            .unwrap_or_else(|| panic!("no line for {method}:\n{log}"))
    };
    let status = line_of("environment/status");
    for part in [
        "id=2",
        "session=",
        &format!("traceparent=\"{traceparent}\""),
        "duration_us=",
        "outcome=\"ok\"",
    ] {
        assert!(status.contains(part), "{part} missing: {status}");
    }
    assert!(line_of("process/start").contains("process=\"logged-proc\""));
    let failed = line_of("fs/readFile");
    assert!(failed.contains("outcome=\"error\""), "{failed}");
    assert!(failed.contains("code=-32004"), "{failed}");
    assert!(
        failed.contains("error=No such file or directory"),
        "{failed}"
    );
}

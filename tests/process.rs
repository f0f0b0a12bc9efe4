//! `process/*` (PROTOCOL §4) against the real binary: real children on pipes and
//! pseudo-terminals, over stdio and WebSocket.

use std::time::Duration;

use serde_json::{json, Value};

use crate::util::{
    assert_error, b64, b64decode, config_file, server_command, Client, WsServer, STEP_TIMEOUT,
};

const ECHO_LOOP: &str =
    "printf 'ready\\n'; while IFS= read -r line; do printf 'echo:%s\\n' \"$line\"; done";

fn start_params(id: &str, argv: &[&str], tty: bool) -> Value {
    json!({
        "processId": id,
        "argv": argv,
        "cwd": "file:///tmp",
        "env": {"PATH": "/usr/bin:/bin"},
        "tty": tty,
    })
}

fn with(mut params: Value, extra: Value) -> Value {
    for (key, value) in extra.as_object().unwrap() {
        params[key] = value.clone();
    }
    params
}

/// The next notification of process `id`, in wire order. Anything else is a test bug.
async fn next_event(client: &mut Client, id: &str) -> Value {
    let message = client.next_message().await;
    assert_eq!(
        message["params"]["processId"], id,
        "expected a notification of {id}, got {message}"
    );
    message
}

/// Follows the notifications of `id` until its output contains `needle`; returns the output
/// seen and the last seq.
async fn output_until(client: &mut Client, id: &str, needle: &str) -> (String, u64) {
    let mut text = String::new();
    let mut last_seq = 0;
    while !text.contains(needle) {
        let event = next_event(client, id).await;
        assert_eq!(
            event["method"], "process/output",
            "{event} before {needle:?}"
        );
        let seq = event["params"]["seq"].as_u64().unwrap();
        assert!(seq > last_seq, "seq goes up");
        last_seq = seq;
        text.push_str(&String::from_utf8(b64decode(&event["params"]["chunk"])).unwrap());
    }
    (text, last_seq)
}

/// Follows `id` to its close: returns (output, exit code, exited seq, closed seq).
async fn until_closed(client: &mut Client, id: &str) -> (String, i64, u64, u64) {
    let mut text = String::new();
    let mut exit = None;
    let mut last_seq = 0;
    loop {
        let event = next_event(client, id).await;
        let seq = event["params"]["seq"].as_u64().unwrap();
        assert!(seq > last_seq, "notifications come in seq order: {event}");
        last_seq = seq;
        match event["method"].as_str().unwrap() {
            "process/output" => text.push_str(&String::from_utf8_lossy(&b64decode(
                &event["params"]["chunk"],
            ))),
            "process/exited" => {
                assert!(exit.is_none(), "one exit event");
                assert_eq!(event["params"]["sandboxDenied"], false);
                exit = Some((event["params"]["exitCode"].as_i64().unwrap(), seq));
            }
            "process/closed" => {
                let (code, exit_seq) = exit.expect("exited comes before closed");
                return (text, code, exit_seq, seq);
            }
            other => panic!("unexpected {other}"),
        }
    }
}

/// Sends `process/start` and checks that its response precedes every notification of the
/// process on the wire (§2.9 rule 4).
async fn start(client: &mut Client, params: Value) -> Value {
    let id = client.send_request("process/start", params.clone()).await;
    loop {
        let message = client.next_message().await;
        if message["id"] == id {
            assert!(message.get("error").is_none(), "start failed: {message}");
            assert_eq!(message["result"]["processId"], params["processId"]);
            assert_eq!(message["result"]["sandboxType"], "none");
            return message["result"].clone();
        }
        assert_ne!(
            message["params"]["processId"], params["processId"],
            "a notification before the start response: {message}"
        );
    }
}

/// The pid a child printed as its first line (`echo $$; exec …`).
async fn printed_pid(client: &mut Client, id: &str) -> i32 {
    let (text, _) = output_until(client, id, "\n").await;
    text.trim().parse().unwrap()
}

/// True once `pid` no longer runs (gone, or a zombie nobody reaped yet).
fn pid_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_pid_gone(pid: i32) {
    tokio::time::timeout(STEP_TIMEOUT, async {
        while !pid_gone(pid) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("process {pid} still alive"));
}

// ---- the §8 example session ------------------------------------------------------------

async fn example_session(mut client: Client, tty: bool) {
    client.handshake().await;
    let params = with(
        start_params("proc-1", &["bash", "-c", ECHO_LOOP], tty),
        json!({"pipeStdin": true, "arg0": null}),
    );
    start(&mut client, params).await;
    let newline = if tty { "\r\n" } else { "\n" };
    let (ready, _) = output_until(&mut client, "proc-1", &format!("ready{newline}")).await;
    let stream = if tty { "pty" } else { "stdout" };
    if !tty {
        assert_eq!(ready, "ready\n");
    }

    let result = client
        .call(
            "process/write",
            json!({"processId": "proc-1", "chunk": b64("hello\n"), "writeId": "1"}),
        )
        .await;
    assert_eq!(result, json!({"status": "accepted", "accepted": true}));
    let (echoed, last_seq) =
        output_until(&mut client, "proc-1", &format!("echo:hello{newline}")).await;
    if tty {
        // The terminal echoes the input and turns \n into \r\n.
        assert!(echoed.contains("hello\r\n"), "{echoed:?}");
    } else {
        assert_eq!(echoed, "echo:hello\n");
    }

    let read = client
        .call(
            "process/read",
            json!({"processId": "proc-1", "afterSeq": 0, "maxBytes": null, "waitMs": 0}),
        )
        .await;
    let chunks = read["chunks"].as_array().unwrap();
    let text: Vec<u8> = chunks.iter().flat_map(|c| b64decode(&c["chunk"])).collect();
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.starts_with("ready") && text.contains("echo:hello"),
        "{text:?}"
    );
    assert!(chunks.iter().all(|c| c["stream"] == stream));
    let seqs: Vec<u64> = chunks.iter().map(|c| c["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=last_seq).collect::<Vec<_>>());
    assert_eq!(read["nextSeq"], last_seq + 1);
    assert_eq!(
        (&read["exited"], &read["exitCode"], &read["closed"]),
        (&json!(false), &Value::Null, &json!(false))
    );
    assert_eq!(
        (&read["failure"], &read["sandboxDenied"]),
        (&Value::Null, &json!(false))
    );

    let result = client
        .call("process/terminate", json!({"processId": "proc-1"}))
        .await;
    assert_eq!(result, json!({"running": true}));
    let (rest, code, exit_seq, close_seq) = until_closed(&mut client, "proc-1").await;
    assert_eq!(rest, "");
    assert_eq!(code, 137);
    assert_eq!((exit_seq, close_seq), (last_seq + 1, last_seq + 2));

    let read = client
        .call(
            "process/read",
            json!({"processId": "proc-1", "afterSeq": last_seq, "waitMs": 1000}),
        )
        .await;
    assert_eq!(
        read,
        json!({"chunks": [], "nextSeq": close_seq + 1, "exited": true, "exitCode": 137,
               "closed": true, "failure": null, "sandboxDenied": false})
    );
    // Within the closed retention the id stays taken and terminate reports not running.
    let err = client
        .call_err("process/start", start_params("proc-1", &["true"], false))
        .await;
    assert_error(&err, -32600, "process proc-1 already exists");
    let result = client
        .call("process/terminate", json!({"processId": "proc-1"}))
        .await;
    assert_eq!(result, json!({"running": false}));
}

async fn example_session_pipe(client: Client) {
    example_session(client, false).await;
}

async fn example_session_pty(client: Client) {
    example_session(client, true).await;
}

both_transports!(example_session_on_pipes, example_session_pipe);
both_transports!(example_session_on_a_terminal, example_session_pty);

// ---- output, exit codes, reads ---------------------------------------------------------

#[tokio::test]
async fn stdout_and_stderr_are_separate_streams() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let script = "echo out; echo err >&2; echo more";
    start(&mut client, start_params("p", &["sh", "-c", script], false)).await;
    let (_, code, _, _) = until_closed(&mut client, "p").await;
    assert_eq!(code, 0);
    let read = client.call("process/read", json!({"processId": "p"})).await;
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    for chunk in read["chunks"].as_array().unwrap() {
        match chunk["stream"].as_str().unwrap() {
            "stdout" => stdout.extend(b64decode(&chunk["chunk"])),
            "stderr" => stderr.extend(b64decode(&chunk["chunk"])),
            other => panic!("stream {other}"),
        }
    }
    assert_eq!(stdout, b"out\nmore\n");
    assert_eq!(stderr, b"err\n");
    assert_eq!(read["closed"], true);
}

#[tokio::test]
async fn exit_codes_are_the_status_or_128_plus_the_signal() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let cases = [
        ("exit 3", 3),
        ("exit 0", 0),
        ("kill -TERM $$", 143),
        ("kill -INT $$", 130),
        ("kill -PIPE $$", 141),
    ];
    for (i, (script, expected)) in cases.into_iter().enumerate() {
        let id = format!("p{i}");
        start(&mut client, start_params(&id, &["sh", "-c", script], false)).await;
        let (_, code, _, _) = until_closed(&mut client, &id).await;
        assert_eq!(code, expected, "{script}");
        let read = client.call("process/read", json!({"processId": id})).await;
        assert_eq!(read["exitCode"], expected);
    }

    // process/signal reaches the group; a terminal child gets the same codes.
    let script = "echo ready; exec sleep 1000";
    start(&mut client, start_params("s", &["sh", "-c", script], true)).await;
    output_until(&mut client, "s", "ready").await;
    let result = client
        .call(
            "process/signal",
            json!({"processId": "s", "signal": "interrupt"}),
        )
        .await;
    assert_eq!(result, json!({}));
    let (_, code, _, _) = until_closed(&mut client, "s").await;
    assert_eq!(code, 130);
    let result = client
        .call(
            "process/signal",
            json!({"processId": "s", "signal": "kill"}),
        )
        .await;
    assert_eq!(result, json!({}), "a closed process is not signalled");
}

#[tokio::test]
async fn long_polls_wake_on_output_and_on_exit() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let script = "read x; echo got; read y; exit 5";
    let params = with(
        start_params("p", &["sh", "-c", script], false),
        json!({"pipeStdin": true}),
    );
    start(&mut client, params).await;

    let waiting = client
        .send_request("process/read", json!({"processId": "p", "waitMs": 600000}))
        .await;
    // A waiting read holds up nothing.
    assert_eq!(
        client.call("environment/status", json!({})).await,
        json!({"status": "ready"})
    );
    client
        .call(
            "process/write",
            json!({"processId": "p", "chunk": b64("a\n")}),
        )
        .await;
    let read = client.response(waiting).await.unwrap();
    assert_eq!(read["chunks"][0]["seq"], 1);
    assert_eq!(b64decode(&read["chunks"][0]["chunk"]), b"got\n");
    assert_eq!(read["exited"], false);

    let waiting = client
        .send_request(
            "process/read",
            json!({"processId": "p", "afterSeq": 1, "waitMs": 600000}),
        )
        .await;
    client
        .call(
            "process/write",
            json!({"processId": "p", "chunk": b64("b\n")}),
        )
        .await;
    let read = client.response(waiting).await.unwrap();
    assert_eq!(read["chunks"], json!([]));
    assert_eq!(
        (&read["exited"], &read["exitCode"]),
        (&json!(true), &json!(5))
    );
    // The exit took seq 2; the close (seq 3) may already be recorded as well.
    let next = if read["closed"] == true { 4 } else { 3 };
    assert_eq!(read["nextSeq"], next);
}

#[tokio::test]
async fn max_bytes_and_next_seq_follow_the_read_algorithm() {
    let config = config_file("[process]\noutput_chunk_bytes = 4\n");
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    client.handshake().await;
    // One write of 12 bytes is one atomic pipe write: three chunks of 4, then exit and close.
    start(
        &mut client,
        start_params("p", &["printf", "abcdefghijkl"], false),
    )
    .await;
    let (text, code, exit_seq, close_seq) = until_closed(&mut client, "p").await;
    assert_eq!(
        (text.as_str(), code, exit_seq, close_seq),
        ("abcdefghijkl", 0, 4, 5)
    );

    let read =
        |after: u64, max: Value| json!({"processId": "p", "afterSeq": after, "maxBytes": max});
    let cases = [
        (read(0, json!(0)), vec![1], 2),
        (read(1, json!(5)), vec![2], 3),
        (read(0, json!(8)), vec![1, 2], 3),
        (read(0, json!(9)), vec![1, 2], 3),
        (read(0, json!(12)), vec![1, 2, 3], 4),
        (read(0, Value::Null), vec![1, 2, 3], 6),
        (read(3, json!(10)), vec![], 6),
        (read(100, Value::Null), vec![], 6),
    ];
    for (params, seqs, next) in cases {
        let result = client.call("process/read", params.clone()).await;
        let got: Vec<u64> = result["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(
            (got, result["nextSeq"].as_u64().unwrap()),
            (seqs, next),
            "{params}"
        );
        assert_eq!(result["closed"], true);
    }
}

async fn retained_seqs(config: &str) -> (Vec<u64>, u64) {
    let config = config_file(config);
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    client.handshake().await;
    start(
        &mut client,
        start_params("p", &["printf", "aaaabbbbccccddddeeee"], false),
    )
    .await;
    until_closed(&mut client, "p").await;
    let result = client.call("process/read", json!({"processId": "p"})).await;
    let seqs = result["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["seq"].as_u64().unwrap())
        .collect();
    (seqs, result["nextSeq"].as_u64().unwrap())
}

#[tokio::test]
async fn retention_evicts_the_oldest_chunks_by_bytes_and_by_count() {
    let by_bytes = "[process]\noutput_chunk_bytes = 4\nretained_output_bytes = 10\n";
    assert_eq!(retained_seqs(by_bytes).await, (vec![4, 5], 8));
    let by_count = "[process]\noutput_chunk_bytes = 4\nretained_output_chunks = 3\n";
    assert_eq!(retained_seqs(by_count).await, (vec![3, 4, 5], 8));
}

#[tokio::test]
async fn wait_ms_is_capped_by_max_wait_ms() {
    let config = config_file("[process]\nmax_wait_ms = 0\n");
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    client.handshake().await;
    start(&mut client, start_params("p", &["sleep", "1000"], false)).await;
    let read = client
        .call("process/read", json!({"processId": "p", "waitMs": 600000}))
        .await;
    assert_eq!((&read["chunks"], &read["nextSeq"]), (&json!([]), &json!(1)));
}

// ---- writes ----------------------------------------------------------------------------

#[tokio::test]
async fn writes_are_deduplicated_by_write_id() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let params = with(
        start_params("cat", &["cat"], false),
        json!({"pipeStdin": true}),
    );
    start(&mut client, params).await;
    let write = |chunk: &str, id: Option<&str>| {
        let mut params = json!({"processId": "cat", "chunk": b64(chunk)});
        if let Some(id) = id {
            params["writeId"] = json!(id);
        }
        params
    };
    let accepted = json!({"status": "accepted", "accepted": true});
    for (chunk, id) in [
        ("a", Some("1")),
        ("a", Some("1")),
        ("b", Some("2")),
        ("c", None),
        ("c", None),
        ("", Some("3")),
        ("\n", Some("4")),
        ("b", Some("2")),
    ] {
        assert_eq!(
            client.call("process/write", write(chunk, id)).await,
            accepted
        );
    }
    let (text, _) = output_until(&mut client, "cat", "\n").await;
    assert_eq!(text, "abcc\n");

    client
        .call("process/terminate", json!({"processId": "cat"}))
        .await;
    until_closed(&mut client, "cat").await;
    // After the close: a remembered id is still accepted, anything else fails.
    assert_eq!(
        client.call("process/write", write("x", Some("2"))).await,
        accepted
    );
    let err = client
        .call_err("process/write", write("x", Some("5")))
        .await;
    assert_error(&err, -32603, "failed to write to process stdin");
}

#[tokio::test]
async fn write_statuses_and_stdin_errors() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let status = |s: &str| json!({"status": s, "accepted": s == "accepted"});

    let result = client
        .call("process/write", json!({"processId": "none", "chunk": ""}))
        .await;
    assert_eq!(result, status("unknownProcess"));

    start(
        &mut client,
        start_params("closed", &["sleep", "1000"], false),
    )
    .await;
    let result = client
        .call(
            "process/write",
            json!({"processId": "closed", "chunk": b64("x")}),
        )
        .await;
    assert_eq!(result, status("stdinClosed"));

    let err = client
        .call_err(
            "process/write",
            json!({"processId": "closed", "chunk": "", "writeId": ""}),
        )
        .await;
    assert_error(&err, -32602, "writeId must not be empty");
    let err = client
        .call_err(
            "process/write",
            json!({"processId": "closed", "chunk": "a b="}),
        )
        .await;
    assert_eq!(err["code"], -32602);

    // A child that closed its stdin: the write fails, the server carries on.
    let script = "exec 0<&-; echo closed; exec sleep 1000";
    let params = with(
        start_params("gone", &["sh", "-c", script], false),
        json!({"pipeStdin": true}),
    );
    start(&mut client, params).await;
    output_until(&mut client, "gone", "closed").await;
    let err = client
        .call_err(
            "process/write",
            json!({"processId": "gone", "chunk": b64("x")}),
        )
        .await;
    assert_error(&err, -32603, "failed to write to process stdin");
    for id in ["closed", "gone"] {
        client
            .call("process/terminate", json!({"processId": id}))
            .await;
    }
}

#[tokio::test]
async fn a_write_to_a_child_that_does_not_read_blocks_nothing_else() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let params = with(
        start_params("p", &["sleep", "1000"], false),
        json!({"pipeStdin": true}),
    );
    start(&mut client, params).await;
    let big = vec![b'x'; 8 << 20];
    let pending = client
        .send_request(
            "process/write",
            json!({"processId": "p", "chunk": b64(&big)}),
        )
        .await;
    assert_eq!(
        client.call("environment/status", json!({})).await,
        json!({"status": "ready"})
    );
    let read = client.call("process/read", json!({"processId": "p"})).await;
    assert_eq!(read["exited"], false);
    start(&mut client, start_params("q", &["true"], false)).await;
    until_closed(&mut client, "q").await;
    // Killing the child fails the pending write.
    let result = client
        .call("process/terminate", json!({"processId": "p"}))
        .await;
    assert_eq!(result, json!({"running": true}));
    let err = client.response(pending).await.unwrap_err();
    assert_error(&err, -32603, "failed to write to process stdin");
}

#[tokio::test]
async fn requests_pipelined_after_a_start_see_the_process() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    for round in 0..20 {
        let id = format!("p{round}");
        let params = with(
            start_params(&id, &["cat"], false),
            json!({"pipeStdin": true}),
        );
        let started = client.send_request("process/start", params).await;
        let write = client
            .send_request("process/write", json!({"processId": id, "chunk": b64("x")}))
            .await;
        let read = client
            .send_request("process/read", json!({"processId": id}))
            .await;
        client.response(started).await.unwrap();
        let status = client.response(write).await.unwrap()["status"].clone();
        assert!(status == "accepted" || status == "starting", "{status}");
        match client.response(read).await {
            Ok(_) => {}
            Err(err) => assert_error(&err, -32600, &format!("process id {id} is starting")),
        }
        client
            .call("process/terminate", json!({"processId": id}))
            .await;
    }
}

// ---- terminals -------------------------------------------------------------------------

#[tokio::test]
async fn resize_changes_the_size_the_child_sees_and_sends_sigwinch() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let script = "stty size; trap 'stty size; exit 7' WINCH; echo ready; \
                  while :; do sleep 0.05; done";
    start(&mut client, start_params("t", &["sh", "-c", script], true)).await;
    let (text, _) = output_until(&mut client, "t", "ready\r\n").await;
    assert!(text.starts_with("24 80\r\n"), "{text:?}");
    let result = client
        .call(
            "process/resize",
            json!({"processId": "t", "rows": 50, "cols": 132}),
        )
        .await;
    assert_eq!(result, json!({}));
    let (text, code, _, _) = until_closed(&mut client, "t").await;
    assert_eq!((text.as_str(), code), ("50 132\r\n", 7));
    // Exited: no effect, no error.
    let result = client
        .call(
            "process/resize",
            json!({"processId": "t", "rows": 5, "cols": 5}),
        )
        .await;
    assert_eq!(result, json!({}));

    let params = with(
        start_params("sized", &["stty", "size"], true),
        json!({"size": {"rows": 30, "cols": 100}}),
    );
    start(&mut client, params).await;
    let (text, _, _, _) = until_closed(&mut client, "sized").await;
    assert_eq!(text, "30 100\r\n");
}

// ---- environment -----------------------------------------------------------------------

#[tokio::test]
async fn the_child_environment_is_exactly_what_was_asked_for() {
    let mut cmd = server_command(&["--listen", "stdio"]);
    cmd.env("MY_API_KEY", "k")
        .env("EXEC_SERVER_SOMETHING", "s")
        .env("VISIBLE_VAR", "v");
    let mut client = Client::stdio_with(cmd);
    client.handshake().await;

    let mut params = start_params("plain", &["env"], false);
    params["env"] = json!({"ONLY": "1", "NODE_REPL_AUTH_TOKEN": "scrubbed"});
    start(&mut client, params).await;
    let (text, _, _, _) = until_closed(&mut client, "plain").await;
    assert_eq!(text, "ONLY=1\n");

    let mut params = start_params("policy", &["env"], false);
    params["env"] = json!({"ADDED": "1"});
    params["envPolicy"] = json!({
        "inherit": "all", "ignoreDefaultExcludes": false, "exclude": ["HOME"],
        "set": {"SET_VAR": "2"}, "includeOnly": []
    });
    start(&mut client, params).await;
    let (text, _, _, _) = until_closed(&mut client, "policy").await;
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(n, _)| n)
        .collect();
    for wanted in ["VISIBLE_VAR", "ADDED", "SET_VAR", "PATH"] {
        assert!(names.contains(&wanted), "{wanted} missing from {names:?}");
    }
    for unwanted in ["MY_API_KEY", "EXEC_SERVER_SOMETHING", "HOME"] {
        assert!(
            !names.contains(&unwanted),
            "{unwanted} inherited: {names:?}"
        );
    }

    let params = with(
        start_params(
            "arg0",
            &["sh", "-c", "tr '\\0' ' ' < /proc/$$/cmdline"],
            false,
        ),
        json!({"arg0": "renamed"}),
    );
    start(&mut client, params).await;
    let (text, _, _, _) = until_closed(&mut client, "arg0").await;
    assert!(text.starts_with("renamed -c "), "{text:?}");
}

// ---- lifetime --------------------------------------------------------------------------

#[tokio::test]
async fn a_resumed_session_continues_reading_by_seq_with_nothing_lost() {
    let server = WsServer::start(&[]).await;
    let mut first = server.connect_initialized().await;
    let session = first.session_id.clone().unwrap();
    let script = "i=1; while [ $i -le 300 ]; do echo a$i; i=$((i+1)); done; read x; \
                  i=1; while [ $i -le 300 ]; do echo b$i; i=$((i+1)); done";
    let params = with(
        start_params("p", &["sh", "-c", script], false),
        json!({"pipeStdin": true}),
    );
    start(&mut first, params).await;
    let (mut text, last_seq) = output_until(&mut first, "p", "a300\n").await;
    drop(first);

    let mut second = server.connect().await;
    crate::handshake::retry_resume(&mut second, &session).await;
    second
        .call(
            "process/write",
            json!({"processId": "p", "chunk": b64("go\n"), "writeId": "1"}),
        )
        .await;
    let mut after = last_seq;
    loop {
        let read = second
            .call(
                "process/read",
                json!({"processId": "p", "afterSeq": after, "waitMs": 10000}),
            )
            .await;
        for chunk in read["chunks"].as_array().unwrap() {
            assert_eq!(chunk["seq"].as_u64().unwrap(), after + 1, "no gap");
            after += 1;
            text.push_str(&String::from_utf8(b64decode(&chunk["chunk"])).unwrap());
        }
        if read["closed"] == true {
            assert_eq!(read["exitCode"], 0);
            break;
        }
        after = read["nextSeq"].as_u64().unwrap() - 1;
    }
    let expected: String = (1..=300)
        .map(|i| format!("a{i}\n"))
        .chain((1..=300).map(|i| format!("b{i}\n")))
        .collect();
    assert_eq!(text, expected);
}

#[tokio::test]
async fn an_expired_session_kills_its_processes() {
    let config = config_file("[session]\ndetached_ttl_ms = 200\n");
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let mut client = server.connect_initialized().await;
    let session = client.session_id.clone().unwrap();
    let script = "echo $$; exec sleep 1000";
    start(
        &mut client,
        start_params("pipe", &["sh", "-c", script], false),
    )
    .await;
    let pipe_pid = printed_pid(&mut client, "pipe").await;
    start(
        &mut client,
        start_params("tty", &["sh", "-c", script], true),
    )
    .await;
    let tty_pid = printed_pid(&mut client, "tty").await;
    drop(client);
    wait_pid_gone(pipe_pid).await;
    wait_pid_gone(tty_pid).await;
    let mut client = server.connect().await;
    let err = client.resume(&session).await.unwrap_err();
    assert_error(&err, -32600, &format!("unknown session id {session}"));
}

#[tokio::test]
async fn no_child_outlives_a_killed_server() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let script = "echo $$; exec sleep 1000";
    start(
        &mut client,
        start_params("pipe", &["sh", "-c", script], false),
    )
    .await;
    let pipe_pid = printed_pid(&mut client, "pipe").await;
    start(
        &mut client,
        start_params("tty", &["sh", "-c", script], true),
    )
    .await;
    let tty_pid = printed_pid(&mut client, "tty").await;
    client.child().start_kill().unwrap();
    client.child().wait().await.unwrap();
    wait_pid_gone(pipe_pid).await;
    wait_pid_gone(tty_pid).await;
}

#[tokio::test]
async fn stdio_end_kills_every_process() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    start(
        &mut client,
        start_params("p", &["sh", "-c", "echo $$; exec sleep 1000"], false),
    )
    .await;
    let pid = printed_pid(&mut client, "p").await;
    client.close().await;
    let status = tokio::time::timeout(STEP_TIMEOUT, client.child().wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    wait_pid_gone(pid).await;
}

// ---- bad input -------------------------------------------------------------------------

#[tokio::test]
async fn bad_input_gets_the_spec_answer_and_the_server_keeps_serving() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let base = start_params("p", &["true"], false);
    let start_err = |extra: Value| with(base.clone(), extra);
    let cases: Vec<(Value, i64, &str)> = vec![
        (
            start_err(json!({"argv": []})),
            -32602,
            "argv must not be empty",
        ),
        (
            start_err(json!({"argv": ["no-such-program-xyz"]})),
            -32603,
            "failed to spawn process: No such file or directory (os error 2)",
        ),
        (
            start_err(json!({"cwd": "/no/such/dir"})),
            -32603,
            "failed to spawn process: No such file or directory (os error 2)",
        ),
        (
            start_err(json!({"tty": true, "size": {"rows": 0, "cols": 80}})),
            -32602,
            "size rows and cols must be greater than zero",
        ),
        (
            start_err(json!({"env": {"A=B": "1"}})),
            -32602,
            "invalid environment variable name `A=B`",
        ),
        (
            start_err(json!({"env": {"": "1"}})),
            -32602,
            "invalid environment variable name ``",
        ),
        (
            start_err(json!({"env": {"A": "x\u{0}y"}})),
            -32602,
            "environment variable `A` contains a NUL byte",
        ),
        (
            start_err(
                json!({"envPolicy": {"inherit": "none", "ignoreDefaultExcludes": false,
                "exclude": [], "set": {"B=": "1"}, "includeOnly": []}}),
            ),
            -32602,
            "invalid environment variable name `B=`",
        ),
        (
            start_err(json!({"networkProxy": {}})),
            -32602,
            "missing field `proxy`",
        ),
        (
            start_err(json!({"sandbox": {}})),
            -32602,
            "sandbox must contain either permissions or sandboxPolicy",
        ),
    ];
    for (params, code, message) in cases {
        let err = client.call_err("process/start", params.clone()).await;
        assert_error(&err, code, message);
        // No reservation is left behind.
        let err = client
            .call_err("process/read", json!({"processId": "p"}))
            .await;
        assert_error(&err, -32600, "unknown process id p");
    }

    let err = client
        .call_err("process/start", start_err(json!({"cwd": "tmp"})))
        .await;
    assert_eq!(err["code"], -32602);
    let message = err["message"].as_str().unwrap();
    assert!(
        message.starts_with("cwd URI `tmp` is not valid on this exec-server host: "),
        "{message}"
    );
    let err = client
        .call_err("process/start", json!({"processId": "p", "argv": ["true"]}))
        .await;
    assert_eq!(err["code"], -32602);

    // Members that are ignored or allowed.
    let ok = start_err(json!({
        "size": {"rows": 0, "cols": 0}, "networkProxy": null, "enforceManagedNetwork": false,
        "managedNetwork": {"x": 1}, "shellSnapshot": {}, "metadata": {},
        "sandbox": {"sandboxPolicy": {"type": "danger-full-access"}}
    }));
    start(&mut client, ok).await;
    until_closed(&mut client, "p").await;

    // Unknown ids.
    let err = client
        .call_err("process/read", json!({"processId": "nope"}))
        .await;
    assert_error(&err, -32600, "unknown process id nope");
    let err = client
        .call_err(
            "process/resize",
            json!({"processId": "nope", "rows": 1, "cols": 1}),
        )
        .await;
    assert_error(&err, -32600, "unknown process id nope");
    let result = client
        .call(
            "process/signal",
            json!({"processId": "nope", "signal": "terminate"}),
        )
        .await;
    assert_eq!(result, json!({}));
    let result = client
        .call("process/terminate", json!({"processId": "nope"}))
        .await;
    assert_eq!(result, json!({"running": false}));
    let err = client
        .call_err(
            "process/signal",
            json!({"processId": "p", "signal": "pause"}),
        )
        .await;
    assert_eq!(err["code"], -32602);

    // Resize checks.
    start(&mut client, start_params("pipe", &["sleep", "1000"], false)).await;
    let err = client
        .call_err(
            "process/resize",
            json!({"processId": "pipe", "rows": 0, "cols": 10}),
        )
        .await;
    assert_error(&err, -32602, "rows and cols must be greater than zero");
    let err = client
        .call_err(
            "process/resize",
            json!({"processId": "nope", "rows": 10, "cols": 0}),
        )
        .await;
    assert_error(&err, -32602, "rows and cols must be greater than zero");
    let err = client
        .call_err(
            "process/resize",
            json!({"processId": "pipe", "rows": 10, "cols": 10}),
        )
        .await;
    assert_error(&err, -32600, "process pipe does not have a tty");
    let err = client
        .call_err("process/start", start_params("pipe", &["true"], false))
        .await;
    assert_error(&err, -32600, "process pipe already exists");
    client
        .call("process/terminate", json!({"processId": "pipe"}))
        .await;

    assert_eq!(
        client.call("environment/status", json!({})).await,
        json!({"status": "ready"})
    );
}

#[tokio::test]
async fn zero_config_values_are_refused_at_start_up() {
    let cases = [
        "[process]\nretained_output_chunks = 0\n",
        // Checked even when the plugin is switched off.
        "[process]\nretained_output_chunks = 0\n[plugins.process]\nenabled = false\n",
    ];
    for toml in cases {
        let config = config_file(toml);
        let output = std::process::Command::new(crate::util::server_bin())
            .args(["--listen", "stdio", "--config", config.to_str().unwrap()])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{toml}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(
                "invalid config: process.retained_output_chunks must be greater than zero, got 0"
            ),
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn a_closed_process_is_removed_after_its_retention_time() {
    let config = config_file("[process]\nclosed_retention_ms = 100\n");
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    client.handshake().await;
    let params = with(
        start_params("p", &["true"], false),
        json!({"pipeStdin": true}),
    );
    start(&mut client, params.clone()).await;
    until_closed(&mut client, "p").await;
    tokio::time::timeout(STEP_TIMEOUT, async {
        while client
            .request("process/read", json!({"processId": "p"}))
            .await
            .is_ok()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the closed process is removed");
    let err = client
        .call_err("process/read", json!({"processId": "p"}))
        .await;
    assert_error(&err, -32600, "unknown process id p");
    let result = client
        .call("process/write", json!({"processId": "p", "chunk": ""}))
        .await;
    assert_eq!(
        result,
        json!({"status": "unknownProcess", "accepted": false})
    );
    // The id is free again.
    start(&mut client, params).await;
    until_closed(&mut client, "p").await;
}

/// The server raises its own soft descriptor limit to the hard one (for its listeners);
/// children get back the soft limit the server started with, since programs that
/// `select(2)` or close every descriptor up to the limit expect the usual value.
#[tokio::test]
async fn children_start_with_the_descriptor_limit_the_server_started_with() {
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -S -n 1000 && exec \"$0\" --listen stdio")
        .arg(crate::util::server_bin())
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    let mut client = Client::stdio_with(cmd);
    client.handshake().await;
    start(
        &mut client,
        start_params("limits", &["sh", "-c", "ulimit -S -n"], false),
    )
    .await;
    let (text, _) = output_until(&mut client, "limits", "\n").await;
    assert_eq!(text.trim(), "1000");
}

// [ext] `process/closeStdin`: the child reads end of input after every earlier write; later
// writes and closes answer `stdinClosed`; a terminal refuses it with the way to do it.
both_transports!(
    close_stdin_gives_the_child_end_of_input,
    |mut client: Client| async move {
        client.handshake().await;
        let status = |v: Value| v["status"].as_str().unwrap().to_owned();
        assert_eq!(
            status(
                client
                    .call("process/closeStdin", json!({"processId": "nope"}))
                    .await
            ),
            "unknownProcess"
        );
        start(
            &mut client,
            with(
                start_params("cat", &["sh", "-c", "cat; echo after-eof"], false),
                json!({"pipeStdin": true}),
            ),
        )
        .await;
        let chunk = b64(b"abc\n");
        let write = client
            .call("process/write", json!({"processId": "cat", "chunk": chunk}))
            .await;
        assert_eq!(status(write), "accepted");
        let closed = client
            .call("process/closeStdin", json!({"processId": "cat"}))
            .await;
        assert_eq!(status(closed), "accepted");
        let (text, code, _, _) = until_closed(&mut client, "cat").await;
        assert_eq!(text, "abc\nafter-eof\n");
        assert_eq!(code, 0);
        let again = client
            .call("process/closeStdin", json!({"processId": "cat"}))
            .await;
        assert_eq!(status(again), "stdinClosed");

        // Without pipeStdin the stdin is at end of input from the start.
        start(&mut client, start_params("nopipe", &["true"], false)).await;
        let closed = client
            .call("process/closeStdin", json!({"processId": "nopipe"}))
            .await;
        assert_eq!(status(closed), "stdinClosed");
        until_closed(&mut client, "nopipe").await;

        start(&mut client, start_params("tty", &["sleep", "30"], true)).await;
        let err = client
            .call_err("process/closeStdin", json!({"processId": "tty"}))
            .await;
        assert_error(
        &err,
        -32600,
        "process tty runs on a terminal: write its end-of-file character (^D) with process/write instead",
    );
    }
);

/// A write queued behind the close answers `stdinClosed`, never an I/O error.
#[tokio::test]
async fn writes_after_close_stdin_answer_stdin_closed() {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    start(
        &mut client,
        with(
            start_params("p", &["sh", "-c", "cat >/dev/null; sleep 5"], false),
            json!({"pipeStdin": true}),
        ),
    )
    .await;
    let closed = client
        .call("process/closeStdin", json!({"processId": "p"}))
        .await;
    assert_eq!(closed["status"], "accepted");
    let write = client
        .call(
            "process/write",
            json!({"processId": "p", "chunk": b64(b"late")}),
        )
        .await;
    assert_eq!(write["status"], "stdinClosed");
    assert_eq!(write["accepted"], false);
}

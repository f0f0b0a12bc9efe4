//! Events of real sessions: who, what, in which order, and no secret anywhere.

use serde_json::{json, Value};

use super::{find, of_session, shape, AuditFile};
use crate::sandbox::{entry, landlock_available, managed};
use crate::util::*;
use crate::ws_auth::{jwt, now, secret_file};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const ENV_SECRET: &str = "env-secret-value-7f3a";
const TOKEN: &str = "audit-capability-token-9c1e";

/// Sends `method` with a W3C trace context and waits for its answer.
async fn traced(client: &mut Client, method: &str, params: Value) -> Result<Value, Value> {
    let trace = json!({"trace": {"traceparent": TRACEPARENT}});
    let id = client.send_request_with(method, params, trace).await;
    client.response(id).await
}

/// A WebSocket session with a capability token and a blocking file backend: a refused
/// upgrade, a process that runs and exits, one refused by the session's quota, file
/// changes, a sandbox refusal, and the session's detach, each recorded once, in order,
/// with the identity the server knows.
#[tokio::test]
async fn a_websocket_session_is_recorded_in_order_with_its_identity() {
    let audit = AuditFile::new();
    let work = tempfile::tempdir().unwrap();
    let work_dir = std::fs::canonicalize(work.path()).unwrap();
    let toml = audit.config("blocking", "levels = { request = \"request\" }")
        + "[process]\nmax_processes_per_session = 1\n";
    let config = config_file(&toml);
    let token_file = secret_file(&work, "token", TOKEN);
    let server = super::server_with_token(&config, &token_file).await;
    // A refused upgrade.
    let (status, _) = http_get(&server.http_base(), "/", "Authorization: Bearer wrong-token\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n").await;
    assert_eq!(status, 401);

    let mut client = Client::websocket_with_bearer(&server.url, TOKEN).await;
    let session = client.handshake().await;
    let start = json!({"processId": "p1", "argv": ["/bin/sh", "-c", "printf hello"],
        "cwd": work_dir, "env": {"PATH": "/usr/bin:/bin", "API_KEY": ENV_SECRET}, "tty": false});
    traced(&mut client, "process/start", start).await.unwrap();
    let exited = client.notification("process/exited").await;
    assert_eq!(exited["exitCode"], 0);
    // The quota refusal in a session of its own, where nothing else holds the quota
    // (an exited process is let go of asynchronously).
    let mut quota_client = Client::websocket_with_bearer(&server.url, TOKEN).await;
    let quota_session = quota_client.handshake().await;
    let sleeper = json!({"processId": "p2", "argv": ["/bin/sleep", "30"], "cwd": work_dir,
        "env": {}, "tty": false});
    quota_client.call("process/start", sleeper).await;
    let over_quota = json!({"processId": "p3", "argv": ["/bin/true"], "cwd": work_dir,
        "env": {}, "tty": false});
    let quota_error = quota_client.call_err("process/start", over_quota).await;
    quota_client
        .call("process/terminate", json!({"processId": "p2"}))
        .await;
    quota_client.close().await;
    let file = work_dir.join("f.txt");
    client
        .call(
            "fs/writeFile",
            json!({"path": file, "dataBase64": b64("twelve bytes")}),
        )
        .await;
    client.call("fs/remove", json!({"path": file})).await;
    let sandbox_error = if landlock_available() {
        let policy = managed(vec![entry(work_dir.to_str().unwrap(), "write")]);
        let error = client
            .call_err(
                "fs/writeFile",
                json!({"path": "/etc/audit-denied", "dataBase64": "",
                "sandbox": policy}),
            )
            .await;
        Some(error)
    } else {
        None
    };
    client.close().await;

    audit
        .wait_for("both sessions detached", |e| {
            e["kind"] == "session.detached" && e["session"] == session
        })
        .await;
    let events = audit
        .wait_for("both sessions detached", |e| {
            e["kind"] == "session.detached" && e["session"] == quota_session
        })
        .await;
    let refused = find(&events, "auth.refused");
    assert_eq!(
        refused["outcome"]["message"],
        "invalid websocket bearer token"
    );
    assert_eq!(refused["who"]["transport"], "websocket");
    assert_eq!(refused["details"]["target"], "/");

    let mine = of_session(&events, &session);
    let shapes: Vec<String> = mine.iter().map(|e| shape(e)).collect();
    let mut expected = vec![
        "session.opened",
        "request process/start received",
        "request process/start completed",
        "process.exited",
    ];
    expected.extend([
        "request fs/writeFile received",
        "request fs/writeFile completed",
        "request fs/remove received",
        "request fs/remove completed",
    ]);
    if sandbox_error.is_some() {
        expected.extend([
            "request fs/writeFile received",
            "request fs/writeFile completed",
        ]);
    }
    expected.push("session.detached");
    assert_eq!(shapes, expected, "{mine:#?}");
    // The quota session: its sleeper's exit (it is terminated) comes when it comes.
    let quota_events = of_session(&events, &quota_session);
    let quota_shapes: Vec<String> = quota_events
        .iter()
        .map(|e| shape(e))
        .filter(|s| s != "process.exited")
        .collect();
    assert_eq!(
        quota_shapes,
        [
            "session.opened",
            "request process/start received",
            "request process/start completed",
            "request process/start received",
            "request process/start completed",
            "request process/terminate received",
            "request process/terminate completed",
            "session.detached",
        ]
    );

    // Every event of the session names who made it.
    for event in &mine {
        let who = &event["who"];
        assert_eq!(who["transport"], "websocket", "{event}");
        assert!(
            who["peer"].as_str().unwrap().starts_with("127.0.0.1:"),
            "{event}"
        );
        assert_eq!(who["auth"]["mode"], "capability-token", "{event}");
        let subject = who["auth"]["subject"].as_str().unwrap();
        assert!(
            subject.starts_with("sha256:") && subject.len() == 23,
            "{event}"
        );
        assert_eq!(event["schema"], "exec-server.audit/v1");
    }
    let started = mine
        .iter()
        .find(|e| shape(e) == "request process/start completed")
        .unwrap();
    assert_eq!(started["traceparent"], TRACEPARENT);
    assert_eq!(started["outcome"]["status"], "ok");
    let details = &started["details"];
    assert_eq!(details["processId"], "p1");
    assert_eq!(details["argv"], json!(["/bin/sh", "-c", "printf hello"]));
    assert_eq!(details["envNames"], json!(["API_KEY", "PATH"]));
    assert_eq!(details["cwd"], json!(work_dir));
    assert!(details["pid"].as_i64().unwrap() > 0, "{started}");
    let exit = mine.iter().find(|e| e["kind"] == "process.exited").unwrap();
    assert_eq!(exit["details"]["processId"], "p1");
    assert_eq!(exit["details"]["exitCode"], 0);
    assert_eq!(exit["details"]["bytesOut"], 5);
    assert_eq!(exit["traceparent"], TRACEPARENT);
    // The refusals carry the reason the client was given.
    let refused_start = quota_events
        .iter()
        .filter(|e| shape(e) == "request process/start completed")
        .nth(1)
        .unwrap();
    assert_eq!(refused_start["details"]["processId"], "p3");
    assert_eq!(refused_start["outcome"]["message"], quota_error["message"]);
    let write = mine
        .iter()
        .find(|e| shape(e) == "request fs/writeFile completed")
        .unwrap();
    assert_eq!(write["details"]["path"], json!(file));
    assert_eq!(write["details"]["bytes"], 12);
    if let Some(error) = sandbox_error {
        let denied = mine
            .iter()
            .filter(|e| shape(e) == "request fs/writeFile completed")
            .nth(1)
            .unwrap();
        assert_eq!(denied["outcome"]["sandboxDenied"], true, "{denied}");
        assert_eq!(denied["outcome"]["message"], error["message"]);
    }
    // Numbered without a gap.
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    // The first event is the configuration the server started with.
    assert_eq!(events[0]["kind"], "config.loaded");
    assert_eq!(
        events[0]["details"]["configSha256"].as_str().unwrap().len(),
        64
    );
    // No secret, and the file is the owner's alone.
    let text = audit.text();
    for secret in [ENV_SECRET, TOKEN] {
        assert!(!text.contains(secret), "{secret} in the audit trail");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&audit.path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// A stdio session with a signed bearer token's neighbour, the JWT, kept out: the JWT's
/// `sub` and `iss` name the WebSocket peer, the token and its secret never appear; a stdio
/// session ends with its connection.
#[tokio::test]
async fn jwt_subjects_are_recorded_and_tokens_never() {
    let audit = AuditFile::new();
    let dir = tempfile::tempdir().unwrap();
    let secret = "audit-jwt-shared-secret-0123456789abcdef";
    let secret_path = secret_file(&dir, "jwt-secret", secret);
    let config = config_file(&audit.config("batch", ""));
    let server = WsServer::start(&[
        "--config",
        config.to_str().unwrap(),
        "--ws-auth",
        "signed-bearer-token",
        "--ws-shared-secret-file",
        &secret_path,
        "--ws-issuer",
        "issuer-a",
    ])
    .await;
    let token = jwt(
        "HS256",
        &json!({"exp": now() + 300, "iss": "issuer-a", "sub": "ci-bot"}),
        secret,
    );
    let mut client = Client::websocket_with_bearer(&server.url, &token).await;
    let session = client.handshake().await;
    client.close().await;
    let events = audit
        .wait_for("session.detached", |e| e["kind"] == "session.detached")
        .await;
    let opened = find(&events, "session.opened");
    assert_eq!(opened["session"], session);
    assert_eq!(
        opened["who"]["auth"],
        json!({"mode": "signed-bearer-token", "subject": "ci-bot", "issuer": "issuer-a"})
    );
    let text = audit.text();
    let signature = token.rsplit('.').next().unwrap();
    assert!(
        !text.contains(signature) && !text.contains(secret),
        "{text}"
    );

    // stdio: the session closes with its connection.
    let stdio_audit = AuditFile::new();
    let config = config_file(&stdio_audit.config("batch", ""));
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    let session = client.handshake().await;
    client.close().await;
    let events = stdio_audit
        .wait_for("session.closed", |e| e["kind"] == "session.closed")
        .await;
    let shapes: Vec<String> = of_session(&events, &session)
        .iter()
        .map(|e| shape(e))
        .collect();
    assert_eq!(shapes, ["session.opened", "session.closed"]);
    let closed = find(&events, "session.closed");
    assert_eq!(closed["who"]["transport"], "stdio");
    assert_eq!(closed["details"]["reason"], "its connection ended");
}

/// What an attacker tried to get into the trail, found in review: values of variables an
/// `envPolicy` sets, credentials in a URL quoted by a failed `http/request`, a value a
/// decoder quotes when it refuses it, and megabyte-long paths that would rotate the
/// history away. None reaches the trail; long values become their length and hash.
#[tokio::test]
async fn values_a_client_sends_reach_the_trail_bounded_and_without_secrets() {
    let audit = AuditFile::new();
    let config = config_file(&audit.config("batch", "levels = { request = \"request\" }"));
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    let session = client.handshake().await;
    let start = json!({"processId": "p", "argv": ["/bin/true"], "cwd": "/", "tty": false,
        "env": {"PATH": "/usr/bin:/bin"},
        "envPolicy": {"inherit": "none", "ignoreDefaultExcludes": false, "exclude": [],
            "set": {"API_KEY": "sk-SET-VALUE-LEAK"}, "includeOnly": []}});
    client.call("process/start", start).await;
    client.notification("process/exited").await;
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("http://alice:pw-LEAK@127.0.0.1:{port}/p?token=QUERY-LEAK#frag");
    let _ = client
        .request(
            "http/request",
            json!({"method": "GET", "url": url, "requestId": "r1"}),
        )
        .await;
    let bad = json!({"processId": "q", "argv": ["/bin/true"], "cwd": "/", "tty": false,
        "env": {"PIN": 98765432}});
    client.call_err("process/start", bad).await;
    let long = format!("/tmp/{}", "A".repeat(300_000));
    client
        .call_err("fs/createDirectory", json!({"path": long}))
        .await;
    client.close().await;
    let events = audit
        .wait_for("session.closed", |e| e["kind"] == "session.closed")
        .await;
    let text = audit.text();
    for secret in ["sk-SET-VALUE-LEAK", "pw-LEAK", "QUERY-LEAK", "98765432"] {
        assert!(!text.contains(secret), "{secret} reached the trail");
    }
    let mine = of_session(&events, &session);
    let started = mine
        .iter()
        .find(|e| shape(e) == "request process/start completed")
        .unwrap();
    assert_eq!(
        started["details"]["envPolicy"]["setNames"],
        json!(["API_KEY"])
    );
    let http = mine
        .iter()
        .find(|e| shape(e) == "request http/request completed")
        .unwrap();
    assert_eq!(http["details"]["url"], format!("http://127.0.0.1:{port}/p"));
    let created = mine
        .iter()
        .find(|e| shape(e) == "request fs/createDirectory completed")
        .unwrap();
    assert_eq!(created["details"]["path"]["truncatedBytes"], long.len());
    assert!(created.to_string().len() < 16 * 1024);
}

/// A streamed write is its `fs/open`, its blocks and the `fs/close` that puts it in place,
/// joined by the handle; the close records the size of the new version.
#[tokio::test]
async fn a_streamed_write_is_recorded_with_its_path_and_size() {
    let audit = AuditFile::new();
    let config = config_file(&audit.config("batch", "levels = { request = \"request\" }"));
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    let session = client.handshake().await;
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("streamed");
    let open = json!({"handleId": "h1", "path": target, "mode": "replace"});
    client.call("fs/open", open).await;
    for (offset, part) in [(0, "0123456789"), (10, "abcdef")] {
        let block = json!({"handleId": "h1", "offset": offset, "chunk": b64(part)});
        client.call("fs/writeBlock", block).await;
    }
    client.call("fs/close", json!({"handleId": "h1"})).await;
    client.close().await;
    let events = audit
        .wait_for("session.closed", |e| e["kind"] == "session.closed")
        .await;
    let mine = of_session(&events, &session);
    let shapes: Vec<String> = mine.iter().map(|e| shape(e)).collect();
    assert_eq!(
        shapes,
        [
            "session.opened",
            "request fs/open completed",
            "request fs/writeBlock completed",
            "request fs/writeBlock completed",
            "request fs/close completed",
            "session.closed"
        ]
    );
    assert_eq!(mine[1]["details"]["path"], json!(target));
    assert_eq!(mine[1]["details"]["mode"], "replace");
    assert_eq!(mine[2]["details"]["bytes"], 10);
    assert_eq!(mine[4]["details"]["handleId"], "h1");
    assert_eq!(mine[4]["details"]["bytes"], 16);
}

//! The WebSocket listener's HTTP surface, framing and liveness (PROTOCOL §1.3, §1.5).

use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

use crate::util::{config_file, http_body, http_get, WsServer, STEP_TIMEOUT};

const UPGRADE_HEADERS: &str = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

#[tokio::test]
async fn http_surface_follows_the_table() {
    let server = WsServer::start(&[]).await;
    let base = server.http_base();
    assert_eq!(http_get(&base, "/readyz", "").await.0, 200);
    assert_eq!(http_get(&base, "/livez", "").await.0, 200);
    assert_eq!(http_get(&base, "/elsewhere", "").await.0, 404);
    // Origin is refused on everything, health endpoints and upgrades included.
    let origin = "Origin: http://evil.example\r\n";
    assert_eq!(http_get(&base, "/readyz", origin).await.0, 403);
    assert_eq!(http_get(&base, "/livez", origin).await.0, 403);
    assert_eq!(
        http_get(&base, "/", &format!("{origin}{UPGRADE_HEADERS}"))
            .await
            .0,
        403
    );
    // GET / that is not an upgrade is a 4xx.
    let (status, _) = http_get(&base, "/", "").await;
    assert!((400..500).contains(&status), "{status}");
    // A valid upgrade switches protocols.
    let (status, _) = http_get(&base, "/", UPGRADE_HEADERS).await;
    assert_eq!(status, 101);
}

#[tokio::test]
async fn bearer_token_guards_the_upgrade_only() {
    let config = config_file("[websocket]\nbearer_token = \"s3cret-token\"\n");
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let base = server.http_base();
    let (status, text) = http_get(&base, "/", UPGRADE_HEADERS).await;
    assert_eq!(status, 401);
    assert!(
        text.to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{text}"
    );
    let wrong = format!("{UPGRADE_HEADERS}Authorization: Bearer nope\r\n");
    assert_eq!(http_get(&base, "/", &wrong).await.0, 401);
    let right = format!("{UPGRADE_HEADERS}Authorization: bEaReR s3cret-token\r\n");
    assert_eq!(http_get(&base, "/", &right).await.0, 101);
    // Health probes need no secret.
    assert_eq!(http_get(&base, "/readyz", "").await.0, 200);

    let mut request = server.url.as_str().into_client_request().unwrap();
    request
        .headers_mut()
        .insert("Authorization", "Bearer s3cret-token".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    ws.send(Message::Text(
        json!({"id": 1, "method": "initialize", "params": {"clientName": "t"}})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let reply = ws.next().await.unwrap().unwrap();
    assert!(reply.to_text().unwrap().contains("sessionId"));
}

#[tokio::test]
async fn the_connection_token_may_come_from_the_environment() {
    let mut cmd = crate::util::server_command(&["--listen", "ws://127.0.0.1:0"]);
    cmd.env("CODEX_EXEC_SERVER_CONNECTION_TOKEN", "from-env");
    let server = WsServer::start_with(cmd).await;
    let base = server.http_base();
    assert_eq!(http_get(&base, "/", UPGRADE_HEADERS).await.0, 401);
    let right = format!("{UPGRADE_HEADERS}Authorization: Bearer from-env\r\n");
    assert_eq!(http_get(&base, "/", &right).await.0, 101);
}

#[tokio::test]
async fn binary_messages_are_accepted_and_answers_are_text() {
    let server = WsServer::start(&[]).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(&server.url).await.unwrap();
    let init = json!({"id": 1, "method": "initialize", "params": {"clientName": "t"}});
    ws.send(Message::Binary(init.to_string().into_bytes().into()))
        .await
        .unwrap();
    match ws.next().await.unwrap().unwrap() {
        Message::Text(text) => assert!(text.contains("sessionId")),
        other => panic!("expected a text answer, got {other:?}"),
    }
    // Malformed input names the peer address.
    ws.send(Message::Text("nope".into())).await.unwrap();
    let reply: serde_json::Value =
        serde_json::from_str(ws.next().await.unwrap().unwrap().to_text().unwrap()).unwrap();
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "failed to parse websocket JSON-RPC message from exec-server websocket 127.0.0.1:"
        ),
        "{message}"
    );
}

#[tokio::test]
async fn oversized_messages_close_with_1009() {
    let config = config_file("[limits]\nmax_message_bytes = 1024\n");
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let mut client = server.connect_initialized().await;
    let session = client.session_id.clone().unwrap();
    let (mut ws, _) = tokio_tungstenite::connect_async(&server.url).await.unwrap();
    ws.send(Message::Text("x".repeat(4096).into()))
        .await
        .unwrap();
    let close = tokio::time::timeout(STEP_TIMEOUT, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(frame))) => break frame,
                Some(Ok(_)) => continue,
                other => panic!("expected a close frame, got {other:?}"),
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(close.unwrap().code, CloseCode::Size);
    // Other connections are unaffected.
    assert_eq!(
        client.call("environment/status", json!({})).await,
        json!({"status": "ready"})
    );
    assert!(session.len() == 36);
}

#[tokio::test]
async fn server_pings_on_its_interval() {
    let config = config_file("[websocket]\nping_interval_ms = 100\n");
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(&server.url).await.unwrap();
    let got_ping = tokio::time::timeout(STEP_TIMEOUT, async {
        loop {
            if let Some(Ok(Message::Ping(_))) = ws.next().await {
                break true;
            }
        }
    })
    .await
    .unwrap();
    assert!(got_ping);
}

#[tokio::test]
async fn sigterm_shuts_down_with_status_zero() {
    let mut server = WsServer::start(&[]).await;
    let mut client = server.connect_initialized().await;
    let pid = server.child.id().unwrap() as i32;
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(STEP_TIMEOUT, server.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(client.read_wire().await.is_none());
}

#[tokio::test]
async fn several_listeners_share_one_session_registry() {
    let mut cmd = crate::util::server_command(&[
        "--listen",
        "ws://127.0.0.1:0",
        "--listen",
        "ws://127.0.0.1:0",
    ]);
    let mut child = cmd.spawn().unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut urls = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut stdout, &mut line)
            .await
            .unwrap();
        urls.push(line.trim().to_owned());
    }
    assert_ne!(urls[0], urls[1]);
    let mut a = crate::util::Client::websocket(&urls[0]).await;
    let session = a.handshake().await;
    a.close().await;
    drop(a);
    let mut b = crate::util::Client::websocket(&urls[1]).await;
    crate::handshake::retry_resume(&mut b, &session).await;
    assert_eq!(
        b.call("environment/status", json!({})).await,
        json!({"status": "ready"})
    );
}

/// Checks every line of a text exposition and returns the value of `series`, if present.
pub(crate) fn prometheus_value(text: &str, series: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(comment) = line.strip_prefix("# ") {
            assert!(
                comment.starts_with("HELP ") || comment.starts_with("TYPE "),
                "{line}"
            );
            continue;
        }
        let (name_and_labels, value) = line.rsplit_once(' ').expect("`series value`");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line}"));
        let name_end = name_and_labels.find('{').unwrap_or(name_and_labels.len());
        let name = &name_and_labels[..name_end];
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad metric name in {line}"
        );
        if name_end < name_and_labels.len() {
            assert!(name_and_labels.ends_with('}'), "{line}");
        }
        if name_and_labels == series {
            found = Some(value);
        }
    }
    found
}

#[tokio::test]
async fn metrics_count_requests_and_connections() {
    let server = WsServer::start(&[]).await;
    let base = server.http_base();
    let mut client = server.connect_initialized().await;
    for _ in 0..3 {
        client.call("environment/status", json!({})).await;
    }
    client.call_err("environment/nope", json!({})).await;
    let (status, body) = http_body(&base, "/metrics", "").await;
    assert_eq!(status, 200);
    let ok = r#"exec_server_requests_total{method="environment/status",result="ok"}"#;
    assert_eq!(prometheus_value(&body, ok), Some(3.0), "{body}");
    let unknown = r#"exec_server_requests_total{method="(unknown)",result="error"}"#;
    assert_eq!(prometheus_value(&body, unknown), Some(1.0), "{body}");
    let active = r#"exec_server_connections_active{transport="websocket"}"#;
    assert_eq!(prometheus_value(&body, active), Some(1.0), "{body}");
    let count = r#"exec_server_request_duration_seconds_count{method="environment/status"}"#;
    assert_eq!(prometheus_value(&body, count), Some(3.0), "{body}");
    // Labels never carry ids or addresses.
    assert!(!body.contains("127.0.0.1"), "{body}");
    assert!(
        !body.contains(client.session_id.as_deref().unwrap()),
        "{body}"
    );
}

#[tokio::test]
async fn metrics_require_the_bearer_token_when_configured() {
    let config = config_file("[websocket]\nbearer_token = \"m3trics\"\n");
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let base = server.http_base();
    let (status, head) = http_get(&base, "/metrics", "").await;
    assert_eq!(status, 401);
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{head}"
    );
    let (status, body) = http_body(&base, "/metrics", "Authorization: Bearer m3trics\r\n").await;
    assert_eq!(status, 200);
    assert!(prometheus_value(&body, "nothing").is_none());
    assert_eq!(
        http_get(&base, "/metrics", "Origin: http://x\r\n").await.0,
        403
    );
}

#[tokio::test]
async fn metrics_count_processes() {
    let server = WsServer::start(&[]).await;
    let base = server.http_base();
    let mut client = server.connect_initialized().await;
    let params =
        json!({"processId": "m", "argv": ["sleep", "60"], "cwd": "/", "env": {}, "tty": false});
    client.call("process/start", params).await;
    let (_, body) = http_body(&base, "/metrics", "").await;
    assert_eq!(
        prometheus_value(&body, "exec_server_processes_started_total"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        prometheus_value(&body, "exec_server_processes_running"),
        Some(1.0),
        "{body}"
    );
    client
        .call("process/terminate", json!({"processId": "m"}))
        .await;
    client.notification("process/closed").await;
    let (_, body) = http_body(&base, "/metrics", "").await;
    assert_eq!(
        prometheus_value(&body, "exec_server_processes_running"),
        Some(0.0),
        "{body}"
    );
    assert_eq!(
        prometheus_value(&body, "exec_server_processes_finished_total"),
        Some(1.0),
        "{body}"
    );
    // Commands and ids never become labels.
    assert!(!body.contains("sleep"), "{body}");
}

/// An answer larger than tungstenite's default 16 MiB frame limit (a 20 MiB file is 28 MB of
/// base64) reaches a client with that default, as codex's is: the server sends long
/// messages in frames, and the client joins them into one text message.
#[tokio::test]
async fn a_large_answer_reaches_a_client_with_the_default_frame_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large");
    let data: Vec<u8> = (0..20u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let server = WsServer::start(&[]).await;
    let mut client = server.connect_initialized().await;
    let uri = format!("file://{}", path.display());
    let read = client.call("fs/readFile", json!({"path": uri})).await;
    assert!(crate::util::b64decode(&read["dataBase64"]) == data);
    // The connection goes on serving.
    assert_eq!(
        client.call("environment/status", json!({})).await,
        json!({"status": "ready"})
    );
}

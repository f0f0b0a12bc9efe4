//! The backends: a webhook collector, alive and dead, in both modes; the file rotated
//! under load without losing or doubling an event.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::{AuditFile, STEP_TIMEOUT};
use crate::util::*;
use crate::ws_auth::secret_file;

/// A port nothing listens on.
async fn dead_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

fn webhook_config(url: &str, mode: &str, extra: &str) -> String {
    format!(
        "[audit]\nenabled = true\n[[audit.backends]]\ntype = \"webhook\"\nurl = \"{url}\"\nmode = \"{mode}\"\nretries = 0\nretry_backoff_ms = 10\nwrite_timeout_ms = 2000\nflush_interval_ms = 20\n{extra}"
    )
}

/// A `blocking` webhook that cannot be reached: requests that change the machine are
/// refused with a clear error and change nothing; reads are still served.
#[tokio::test]
async fn a_dead_blocking_webhook_refuses_changes_and_serves_reads() {
    let url = format!(
        "http://127.0.0.1:{}/audit?token=query-secret",
        dead_port().await
    );
    let config = config_file(&webhook_config(&url, "blocking", ""));
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let mut client = server.connect_initialized().await;
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("never-written");
    let error = client
        .call_err(
            "fs/writeFile",
            json!({"path": target, "dataBase64": b64("x")}),
        )
        .await;
    assert_eq!(error["code"], -32603, "{error}");
    assert_eq!(
        error["message"],
        "`fs/writeFile` refused: the audit trail cannot record it (audit backend `webhook` is not writing); requests that change the machine are refused until it recovers"
    );
    assert!(!target.exists());
    let error = client
        .call_err(
            "process/start",
            json!({"processId": "p", "argv": ["/bin/true"],
            "cwd": "/", "env": {}, "tty": false}),
        )
        .await;
    assert!(
        error["message"].as_str().unwrap().contains("audit trail"),
        "{error}"
    );
    std::fs::write(dir.path().join("present"), "read me").unwrap();
    let read = client
        .call("fs/readFile", json!({"path": dir.path().join("present")}))
        .await;
    assert_eq!(b64decode(&read["dataBase64"]), b"read me");
    let (_, metrics) = http_body(&server.http_base(), "/metrics", "").await;
    assert!(!metrics.contains("query-secret"));
}

/// A `batch` webhook that cannot be reached loses events, and says so: counted in
/// `/metrics`, while every request is served.
#[tokio::test]
async fn a_dead_batch_webhook_counts_what_it_drops() {
    let url = format!("http://127.0.0.1:{}/audit", dead_port().await);
    let config = config_file(&webhook_config(&url, "batch", ""));
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let mut client = server.connect_initialized().await;
    let dir = tempfile::tempdir().unwrap();
    for n in 0..5 {
        let path = dir.path().join(format!("f{n}"));
        client
            .call(
                "fs/writeFile",
                json!({"path": path, "dataBase64": b64("x")}),
            )
            .await;
        assert!(path.exists());
    }
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        let (_, metrics) = http_body(&server.http_base(), "/metrics", "").await;
        let dropped = metric(
            &metrics,
            "exec_server_audit_events_dropped_total{backend=\"webhook\"}",
        );
        if dropped >= 7 {
            // config.loaded, session.opened, five completed writes.
            assert!(
                metric(
                    &metrics,
                    "exec_server_audit_write_failures_total{backend=\"webhook\"}"
                ) >= 1
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

/// What a collector received: each post's `Authorization` header and body.
type Posts = Arc<Mutex<Vec<(Option<String>, Value)>>>;

/// A collector answering 200 to every post, over plain HTTP/1.1 with keep-alive.
async fn collector() -> (String, Posts) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/audit", listener.local_addr().unwrap());
    let posts: Posts = Arc::default();
    let kept = Arc::clone(&posts);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let posts = Arc::clone(&kept);
            tokio::spawn(async move {
                let mut reader = BufReader::new(socket);
                loop {
                    let (mut length, mut authorization) = (0usize, None);
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let line = line.trim_end();
                        if line.is_empty() {
                            break;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(value) = lower.strip_prefix("content-length:") {
                            length = value.trim().parse().unwrap();
                        }
                        if lower.starts_with("authorization:") {
                            authorization = Some(line["authorization:".len()..].trim().to_owned());
                        }
                    }
                    let mut body = vec![0u8; length];
                    reader.read_exact(&mut body).await.unwrap();
                    posts
                        .lock()
                        .unwrap()
                        .push((authorization, serde_json::from_slice(&body).unwrap()));
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                    reader.get_mut().write_all(answer).await.unwrap();
                }
            });
        }
    });
    (url, posts)
}

/// A live collector gets every event, in batches of the documented shape, with the bearer
/// token of `token_file`, in both modes.
#[tokio::test]
async fn a_webhook_collector_gets_every_event_with_its_token() {
    for mode in ["batch", "blocking"] {
        let (url, posts) = collector().await;
        let dir = tempfile::tempdir().unwrap();
        let token_file = secret_file(&dir, "collector-token", "collector-token-5d2a\n");
        let extra = format!("token_file = {token_file:?}\n");
        let config = config_file(&webhook_config(&url, mode, &extra));
        let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
        let mut client = server.connect_initialized().await;
        let path = dir.path().join("posted");
        client
            .call(
                "fs/writeFile",
                json!({"path": path, "dataBase64": b64("x")}),
            )
            .await;
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        let events = loop {
            let events: Vec<Value> = {
                let posts = posts.lock().unwrap();
                for (authorization, body) in posts.iter() {
                    assert_eq!(
                        authorization.as_deref(),
                        Some("Bearer collector-token-5d2a")
                    );
                    assert_eq!(body["schema"], "exec-server.audit/v1");
                }
                posts
                    .iter()
                    .flat_map(|(_, body)| body["events"].as_array().unwrap().clone())
                    .collect()
            };
            if events.iter().any(|e| e["stage"] == "completed") {
                break events;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{mode}: {events:#?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds[..2], ["config.loaded", "session.opened"], "{mode}");
        let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "{mode}");
    }
}

/// Rotation under load: the file is rotated many times while requests run, and every
/// event is in exactly one file, numbered without a gap; every file is owner-only.
#[tokio::test]
async fn rotation_under_load_loses_no_event() {
    let audit = AuditFile::new();
    let extra = "max_file_bytes = 16384\nmax_files = 1000\nfsync = \"never\"\n";
    let config = config_file(&(audit.config("batch", "") + extra));
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(server.connect_initialized().await);
    }
    let writes = 150;
    let work = clients.iter_mut().enumerate().map(|(c, client)| {
        let dir = dir.path().to_path_buf();
        async move {
            for n in 0..writes {
                let path = dir.join(format!("c{c}-{n}"));
                client
                    .call(
                        "fs/writeFile",
                        json!({"path": path, "dataBase64": b64("x")}),
                    )
                    .await;
            }
        }
    });
    futures_util::future::join_all(work).await;
    let expected_completed = 4 * writes;
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    while audit_completed(&audit) < expected_completed {
        assert!(tokio::time::Instant::now() < deadline, "events are missing");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let events = audit.events();
    assert_eq!(
        audit_completed(&audit),
        expected_completed,
        "an event was doubled"
    );
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    let rotated = std::fs::read_dir(audit.dir.path()).unwrap().count();
    assert!(rotated > 5, "only {rotated} files");
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(audit.dir.path()).unwrap().flatten() {
        let mode = entry.metadata().unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{:?}", entry.path());
    }
}

fn audit_completed(audit: &AuditFile) -> usize {
    audit
        .events()
        .iter()
        .filter(|e| e["stage"] == "completed" && e["method"] == "fs/writeFile")
        .count()
}

/// A trail that cannot be written, or a configuration that cannot make one, stops the
/// server before it serves anything, with the reason.
#[tokio::test]
async fn a_server_whose_trail_cannot_be_written_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir/audit.jsonl");
    let cases = [
        (
            format!("[audit]\nenabled = true\n[[audit.backends]]\ntype = \"file\"\npath = {:?}\n", missing.to_str().unwrap()),
            "audit.backends[0]: the audit backend cannot start: cannot open",
        ),
        (
            "[audit]\nenabled = true\n".to_owned(),
            "invalid config: audit.enabled needs at least one [[audit.backends]] entry",
        ),
        (
            "[audit]\nenabled = true\n[[audit.backends]]\ntype = \"syslog\"\n".to_owned(),
            "invalid config: audit.backends[0].type `syslog` is not a backend of this binary (known: file, webhook)",
        ),
        (
            "[audit]\nenabled = true\n[[audit.backends]]\ntype = \"file\"\n".to_owned(),
            "invalid config: audit.backends[0].path is required for a `file` backend",
        ),
    ];
    for (toml, expected) in cases {
        let config = config_file(&toml);
        let output = server_command(&["--config", config.to_str().unwrap(), "--listen", "stdio"])
            .stderr(std::process::Stdio::piped())
            .output()
            .await
            .unwrap();
        assert!(!output.status.success(), "{toml}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{toml}: {stderr}");
    }
}

/// An audit file moved away or removed by someone else: the next events go to a new file
/// at the configured path, and the rotated files are left as they were.
#[tokio::test]
async fn a_removed_audit_file_is_created_again_and_history_is_kept() {
    let audit = AuditFile::new();
    let extra = "max_file_bytes = 4096\nmax_files = 3\nfsync = \"never\"\n";
    let config = config_file(&(audit.config("batch", "") + extra));
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let mut client = server.connect_initialized().await;
    let dir = tempfile::tempdir().unwrap();
    let write = |n: usize| json!({"path": dir.path().join(format!("f{n}")), "dataBase64": ""});
    for n in 0..40 {
        client.call("fs/writeFile", write(n)).await;
    }
    let rotated = |k: u32| {
        let mut name = audit.path.clone().into_os_string();
        name.push(format!(".{k}"));
        std::path::PathBuf::from(name)
    };
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    while !rotated(3).exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the file never rotated three times"
        );
        client.call("fs/writeFile", write(0)).await;
    }
    let kept: Vec<String> = (1..=3)
        .map(|k| std::fs::read_to_string(rotated(k)).unwrap())
        .collect();
    std::fs::remove_file(&audit.path).unwrap();
    client.call("fs/writeFile", write(99)).await;
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    while !std::fs::read_to_string(&audit.path).is_ok_and(|t| t.contains("f99")) {
        assert!(tokio::time::Instant::now() < deadline, "no new audit file");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for k in 1..=3 {
        let now = std::fs::read_to_string(rotated(k)).unwrap();
        assert_eq!(now, kept[k as usize - 1], "rotated file {k} changed");
    }
}

/// Refused upgrades are an unauthenticated peer's to cause: a flood of them is recorded
/// at a bounded rate, and the rest are counted, not written.
#[tokio::test]
async fn a_flood_of_refused_upgrades_is_recorded_at_a_bounded_rate() {
    let audit = AuditFile::new();
    let dir = tempfile::tempdir().unwrap();
    let token_file = secret_file(&dir, "token", "flood-test-token");
    let config = config_file(&audit.config("batch", ""));
    let server = super::server_with_token(&config, &token_file).await;
    for _ in 0..200 {
        let (status, _) = http_body(
            &server.http_base(),
            "/metrics",
            "Authorization: Bearer nope\r\n",
        )
        .await;
        assert_eq!(status, 401);
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let recorded = audit
        .events()
        .iter()
        .filter(|e| e["kind"] == "auth.refused")
        .count();
    assert!((1..=40).contains(&recorded), "{recorded} refusals recorded");
    let (_, metrics) = http_body(
        &server.http_base(),
        "/metrics",
        "Authorization: Bearer flood-test-token\r\n",
    )
    .await;
    let suppressed = metric(
        &metrics,
        "exec_server_audit_events_suppressed_total{kind=\"auth.refused\"}",
    );
    assert_eq!(suppressed as usize + recorded, 200, "{metrics}");
}

/// The trail is denied to every sandbox: it holds every session's commands and paths,
/// and the rotated files and the webhook's token file with it.
#[tokio::test]
async fn sandboxes_cannot_read_the_trail_or_its_token() {
    if !crate::sandbox::landlock_available() {
        return;
    }
    let audit = AuditFile::new();
    let token_file = secret_file(&audit.dir, "collector-token", "collector-token-secret");
    let extra = format!(
        "[[audit.backends]]\ntype = \"webhook\"\nurl = \"http://127.0.0.1:9/x\"\ntoken_file = {token_file:?}\nretries = 0\n"
    );
    let config = config_file(&(audit.config("batch", "") + &extra));
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    client.handshake().await;
    let mut rotated = audit.path.clone().into_os_string();
    rotated.push(".1");
    std::fs::write(&rotated, "an older event\n").unwrap();
    let policy = crate::sandbox::managed(vec![crate::sandbox::root_read()]);
    for path in [audit.path.clone(), rotated.into(), token_file.into()] {
        let error = client
            .call_err("fs/readFile", json!({"path": path, "sandbox": policy}))
            .await;
        assert_eq!(error["data"]["sandboxDenied"], true, "{path:?}: {error}");
    }
}

/// `exec-server config` prints the backends, a webhook URL without its credentials: the
/// form `config.loaded` hashes.
#[tokio::test]
async fn the_printed_configuration_names_backends_without_credentials() {
    let toml = "[audit]\nenabled = true\n[[audit.backends]]\ntype = \"webhook\"\nurl = \"https://u:pw-LEAK@h.example/x?token=QUERY-LEAK\"\n";
    let config = config_file(toml);
    let output = server_command(&["config", "--config", config.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8(output.stdout).unwrap();
    assert!(
        printed.contains("url = \"https://h.example/x\""),
        "{printed}"
    );
    assert!(!printed.contains("LEAK"), "{printed}");
}

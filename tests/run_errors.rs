//! `exec-server run` when something is in the way: usage mistakes name every way to reach a
//! server, a refused upgrade says why and what to set, a busy server is waited for, and a
//! command that ignores Ctrl-C is killed by the second one.

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::client::{run_command, run_output};
use crate::util::{server_command, WsServer, STEP_TIMEOUT};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn usage_mistakes_name_every_way_to_reach_a_server() {
    let none = run_output(&mut run_command(&["--", "true"])).await;
    assert_eq!(none.status.code(), Some(2));
    let stderr = text(&none.stderr);
    for way in ["--url", "--stdio", "--remote"] {
        assert!(stderr.contains(way), "{stderr}");
    }
    let http = run_output(&mut run_command(&[
        "--url",
        "http://127.0.0.1:1",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(http.status.code(), Some(2));
    let stderr = text(&http.stderr);
    assert!(stderr.contains("expected `ws://IP:PORT`"), "{stderr}");
    assert!(
        stderr.contains("--stdio") && stderr.contains("--remote"),
        "{stderr}"
    );
}

fn token_file(dir: &tempfile::TempDir, token: &str) -> String {
    let path = dir.path().join("token");
    std::fs::write(&path, token).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.display().to_string()
}

#[tokio::test]
async fn a_refused_upgrade_says_why_and_what_to_set() {
    let mut command = server_command(&["--listen", "ws://127.0.0.1:0"]);
    command.env("CODEX_EXEC_SERVER_CONNECTION_TOKEN", "run-errors-token");
    let server = WsServer::start_with(command).await;

    let refused = run_output(&mut run_command(&["--url", &server.url, "--", "true"])).await;
    assert_eq!(refused.status.code(), Some(125));
    let stderr = text(&refused.stderr);
    assert!(stderr.contains("HTTP 401"), "{stderr}");
    assert!(stderr.contains("--token-file FILE"), "{stderr}");
    assert!(
        stderr.contains("CODEX_EXEC_SERVER_CONNECTION_TOKEN"),
        "{stderr}"
    );

    let dir = tempfile::tempdir().unwrap();
    let wrong = token_file(&dir, "not-the-token");
    let out = run_output(&mut run_command(&[
        "--url",
        &server.url,
        "--token-file",
        &wrong,
        "--",
        "true",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(125));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "did not accept the bearer token from --token-file {wrong}"
        )),
        "{stderr}"
    );
    assert!(
        !stderr.contains("not-the-token"),
        "the token never reaches an error: {stderr}"
    );

    let right = token_file(&dir, "run-errors-token\n");
    let out = run_output(&mut run_command(&[
        "--url",
        &server.url,
        "--token-file",
        &right,
        "--",
        "echo",
        "in",
    ]))
    .await;
    assert_eq!(text(&out.stdout), "in\n", "{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
}

/// A front that answers the first `busy_answers` connections with `answer` and forwards
/// the rest to `target`; counts the connections it took.
async fn busy_front(
    target: String,
    answer: &'static str,
    busy_answers: usize,
) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let n = counter.fetch_add(1, Ordering::SeqCst);
            let target = target.clone();
            tokio::spawn(async move {
                if n < busy_answers {
                    let mut head = BufReader::new(&mut socket);
                    let mut line = String::new();
                    while head.read_line(&mut line).await.unwrap_or(0) > 0 && line != "\r\n" {
                        line.clear();
                    }
                    let _ = socket.write_all(answer.as_bytes()).await;
                    return;
                }
                let mut upstream = TcpStream::connect(target.trim_start_matches("ws://"))
                    .await
                    .unwrap();
                let _ = tokio::io::copy_bidirectional(&mut socket, &mut upstream).await;
            });
        }
    });
    (url, seen)
}

const BUSY: &str = "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy";
const BUSY_FOR_LONG: &str = "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3600\r\nContent-Length: 9\r\nConnection: close\r\n\r\nslow down";

#[tokio::test]
async fn a_busy_server_is_waited_for_as_it_asks() {
    let server = WsServer::start(&[]).await;
    let (front, seen) = busy_front(server.url.clone(), BUSY, 2).await;
    let out = run_output(&mut run_command(&[
        "--url", &front, "--", "echo", "through",
    ]))
    .await;
    assert_eq!(text(&out.stdout), "through\n", "{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    assert!(
        seen.load(Ordering::SeqCst) >= 3,
        "two refusals, then the upgrade"
    );

    // A wait longer than the client allows is not waited for: the refusal is reported.
    let (front, seen) = busy_front(server.url.clone(), BUSY_FOR_LONG, usize::MAX).await;
    let out = run_output(&mut run_command(&["--url", &front, "--", "true"])).await;
    assert_eq!(out.status.code(), Some(125));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("HTTP 429 (slow down)"), "{stderr}");
    assert!(stderr.contains("busy"), "{stderr}");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_second_interrupt_kills_a_command_that_ignores_the_first() {
    let server = WsServer::start(&[]).await;
    let mut command = run_command(&[
        "--url",
        &server.url,
        "--",
        "sh",
        "-c",
        "trap '' INT; echo ready; sleep 60",
    ]);
    command.stdin(Stdio::null());
    let mut child = command.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(line, "ready\n");
    let pid = child.id().unwrap() as libc::pid_t;
    // SAFETY: kill has no memory-safety preconditions; `pid` is our unreaped child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    line.clear();
    tokio::time::timeout(STEP_TIMEOUT, stderr.read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    assert!(line.contains("press Ctrl-C again"), "{line}");
    // The command ignored it and still runs.
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(300), child.wait())
            .await
            .is_err()
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let status = tokio::time::timeout(STEP_TIMEOUT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(137), "killed (128 + SIGKILL)");
}

const ECHOING: &str = "HTTP/1.1 401 Unauthorized\r\nContent-Length: 52\r\nConnection: close\r\n\r\nrefused: Authorization: Bearer run-errors-echo-token";

#[tokio::test]
async fn a_token_the_server_echoes_back_is_not_printed() {
    let server = WsServer::start(&[]).await;
    let (front, _) = busy_front(server.url.clone(), ECHOING, usize::MAX).await;
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(&dir, "run-errors-echo-token");
    let out = run_output(&mut run_command(&[
        "--url",
        &front,
        "--token-file",
        &token,
        "--",
        "true",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(125));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("Bearer <redacted>"), "{stderr}");
    assert!(!stderr.contains("run-errors-echo-token"), "{stderr}");
}

#[tokio::test]
/// Only loopback exists here, so the warning's other side is a unit test
/// (`server_args::tests::a_token_is_in_clear_over_ws_to_another_host`).
async fn a_token_sent_to_this_machine_is_not_warned_about() {
    let mut command = server_command(&["--listen", "ws://127.0.0.1:0"]);
    command.env("CODEX_EXEC_SERVER_CONNECTION_TOKEN", "clear-token");
    let server = WsServer::start_with(command).await;
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(&dir, "clear-token");
    let local = run_output(&mut run_command(&[
        "--url",
        &server.url,
        "--token-file",
        &token,
        "--",
        "true",
    ]))
    .await;
    assert_eq!(local.status.code(), Some(0), "{}", text(&local.stderr));
    assert!(
        !text(&local.stderr).contains("in clear"),
        "loopback is this machine"
    );
}

//! A `ws://` listener with no credential runs commands for anyone who reaches it: off
//! loopback it is refused at start unless the operator allows it in so many words
//! (`--dangerously-listen-without-auth`), and then it warns. `ws://localhost:PORT` is
//! loopback and accepted.

use std::process::{Output, Stdio};

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::util::{config_file, server_bin, server_command, WsServer, STEP_TIMEOUT};

/// Runs the binary with `args` and expects it to exit by itself: a server that starts
/// serving instead is killed and fails the test (it does not hang it).
fn run(args: &[&str]) -> Output {
    let mut child = std::process::Command::new(server_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + STEP_TIMEOUT;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            let _ = child.wait();
            panic!("exec-server {args:?} kept running instead of refusing to start");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn an_unauthenticated_listener_off_loopback_is_refused_with_the_fixes() {
    for url in ["ws://0.0.0.0:0", "ws://[::]:0", "ws://[::ffff:10.0.0.1]:0"] {
        let out = run(&["--listen", url]);
        assert_eq!(out.status.code(), Some(2), "{url}");
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(text.contains("without authentication"), "{url}: {text}");
        for fix in [
            "127.0.0.1",
            "--ws-auth capability-token",
            "--dangerously-listen-without-auth",
        ] {
            assert!(text.contains(fix), "{url}: {text}");
        }
        assert!(out.stdout.is_empty(), "nothing was announced for {url}");
    }
}

#[tokio::test]
async fn an_authenticated_listener_off_loopback_starts() {
    let config = config_file("[websocket]\nbearer_token = \"exposure-test-token\"\n");
    let server = WsServer::start_with(server_command(&[
        "--listen",
        "ws://0.0.0.0:0",
        "--config",
        config.to_str().unwrap(),
    ]))
    .await;
    assert!(server.url.starts_with("ws://0.0.0.0:"), "{}", server.url);
}

#[tokio::test]
async fn the_dangerous_switch_serves_without_auth_and_warns() {
    for (args, env) in [
        (vec!["--dangerously-listen-without-auth"], None),
        (
            vec![],
            Some((
                "EXEC_SERVER_WEBSOCKET__DANGEROUSLY_LISTEN_WITHOUT_AUTH",
                "true",
            )),
        ),
    ] {
        let mut cmd = server_command(&[&["--listen", "ws://0.0.0.0:0"], &args[..]].concat());
        cmd.stderr(Stdio::piped()).env("RUST_LOG", "warn");
        if let Some((key, value)) = env {
            cmd.env(key, value);
        }
        let mut server = WsServer::start_with(cmd).await;
        let mut stderr = BufReader::new(server.child.stderr.take().unwrap());
        let mut line = String::new();
        tokio::time::timeout(STEP_TIMEOUT, stderr.read_line(&mut line))
            .await
            .expect("a warning on stderr")
            .unwrap();
        assert!(line.contains("WARN"), "{line}");
        assert!(
            line.contains("without authentication off loopback"),
            "{line}"
        );
        assert!(line.contains("dangerously_listen_without_auth"), "{line}");
    }
}

#[tokio::test]
async fn localhost_is_loopback_and_needs_no_switch() {
    let server = WsServer::start_with(server_command(&["--listen", "ws://localhost:0"])).await;
    assert!(server.url.starts_with("ws://127.0.0.1:"), "{}", server.url);
    let mut client = server.connect().await;
    client.handshake().await;
}

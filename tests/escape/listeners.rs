//! Unauthenticated peers cannot exhaust the listeners: slow headers, stalled handshakes, floods.
//!
//! The attacker opens TCP connections, sends part of a request head and then nothing. Each
//! such connection used to cost the server a descriptor for ever; with enough of them the
//! server could accept nobody. Every test here runs the real binary with a small
//! `RLIMIT_NOFILE` (`sh -c 'ulimit -n N; exec …'`) where the attack needs it.

use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::time::Instant;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};
use tokio::process::Command;
use tokio::sync::mpsc;

use crate::util::{http_body, http_get, server_bin, Client, WsServer, STEP_TIMEOUT};
use crate::websocket::prometheus_value;

const TOKEN: &str = "listener-escape-token";

/// What a slowloris peer sends before it stalls: half a request head.
const HALF_HEAD: &[u8] = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websock";

/// The start of a valid, authenticated upgrade request, and its end.
const UPGRADE_START: &str = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n";
const UPGRADE_END: &str = "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer listener-escape-token\r\n\r\n";

/// Raises this test process's soft descriptor limit, so it can hold the attack's sockets.
pub(crate) fn raise_own_descriptor_limit(needed: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    assert!(
        limit.rlim_max >= needed,
        "this test needs {needed} descriptors; the hard limit is {}",
        limit.rlim_max
    );
    if limit.rlim_cur < needed {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: `limit` is a valid rlimit; only the soft limit is raised.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    }
}

/// `exec-server <args>` started with `RLIMIT_NOFILE` = `nofile` (soft and hard), the bearer
/// token in its environment, and its stderr handed to the caller.
pub(crate) fn server_with_descriptor_limit(nofile: u64, args: &[&str]) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
        .arg(server_bin())
        .args(args)
        .env("CODEX_EXEC_SERVER_CONNECTION_TOKEN", TOKEN)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    cmd
}

/// A connection from `source` (any loopback address) that sent `head` and then stalls.
pub(crate) async fn stalled_from(server: SocketAddr, source: IpAddr, head: &[u8]) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(source, 0)).unwrap();
    let mut stream = socket.connect(server).await.expect("tcp connect");
    stream.write_all(head).await.unwrap();
    stream
}

async fn stalled(server: SocketAddr) -> TcpStream {
    stalled_from(server, "127.0.0.1".parse().unwrap(), HALF_HEAD).await
}

/// Resolves when the server has closed `stream` (end of file or reset).
pub(crate) async fn closed_by_server(stream: &mut TcpStream) {
    let mut buf = [0u8; 1024];
    let outcome = tokio::time::timeout(STEP_TIMEOUT, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(outcome.is_ok(), "the server left the connection open");
}

fn socket_addr(url: &str) -> SocketAddr {
    url.trim_start_matches("ws://")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

/// Connects from `source` with the bearer token and completes the handshake.
async fn authenticated_client_from(url: &str, source: IpAddr) -> Client {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(source, 0)).unwrap();
    let stream = socket.connect(socket_addr(url)).await.expect("tcp connect");
    let mut client = Client::websocket_over(stream, url, Some(TOKEN))
        .await
        .expect("upgrade");
    client.handshake().await;
    client
}

async fn metrics(base: &str) -> String {
    let (status, body) = http_body(
        base,
        "/metrics",
        &format!("Authorization: Bearer {TOKEN}\r\n"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

fn series(body: &str, name: &str, labels: &str) -> f64 {
    prometheus_value(body, &format!("{name}{{{labels}}}"))
        .unwrap_or_else(|| panic!("{name}{{{labels}}} is missing from /metrics:\n{body}"))
}

/// Stalled connections the slowloris test opens: more than the server's descriptor limit,
/// since a server with 1,024 descriptors and a dozen of its own could still accept a few
/// clients past exactly 1,000.
const STALLED: usize = 1_100;

#[tokio::test]
async fn an_authenticated_client_gets_in_past_a_thousand_stalled_connections() {
    raise_own_descriptor_limit(STALLED as u64 + 256);
    let server = WsServer::start_with(server_with_descriptor_limit(
        1024,
        &["--listen", "ws://127.0.0.1:0"],
    ))
    .await;
    let addr = socket_addr(&server.url);
    let mut attack = Vec::with_capacity(STALLED);
    for _ in 0..STALLED {
        attack.push(stalled(addr).await);
    }

    let started = Instant::now();
    let connect = async {
        let mut client = Client::websocket_with_bearer(&server.url, TOKEN).await;
        client.handshake().await;
        client.call("environment/status", json!({})).await
    };
    let status = tokio::time::timeout(STEP_TIMEOUT, connect)
        .await
        .expect("the authenticated client did not get in while the stalled connections were open");
    eprintln!(
        "authenticated client connected and initialized in {:?} with {STALLED} stalled connections open (RLIMIT_NOFILE 1024)",
        started.elapsed()
    );
    assert_eq!(status, json!({"status": "ready"}));
    let body = metrics(&server.http_base()).await;
    assert!(
        series(
            &body,
            "exec_server_listener_connections_evicted_total",
            r#"listener="websocket",cap="per_peer""#
        ) >= (STALLED - 64) as f64,
        "{body}"
    );
    drop(attack);
}

#[tokio::test]
async fn a_stalled_request_head_is_closed_after_the_header_timeout() {
    let mut cmd = server_with_descriptor_limit(1024, &["--listen", "ws://127.0.0.1:0"]);
    cmd.env("EXEC_SERVER_LISTENER__HEADER_READ_TIMEOUT_MS", "300");
    let server = WsServer::start_with(cmd).await;
    let mut stall = stalled(socket_addr(&server.url)).await;
    closed_by_server(&mut stall).await;
    let body = metrics(&server.http_base()).await;
    assert_eq!(
        series(
            &body,
            "exec_server_listener_header_timeouts_total",
            r#"listener="websocket""#
        ),
        1.0,
        "{body}"
    );
}

#[tokio::test]
async fn a_connection_that_does_not_upgrade_is_closed_after_its_one_answer() {
    let mut cmd = server_with_descriptor_limit(1024, &["--listen", "ws://127.0.0.1:0"]);
    cmd.env("EXEC_SERVER_LISTENER__UPGRADE_TIMEOUT_MS", "60000");
    let server = WsServer::start_with(cmd).await;
    // A keep-alive client asks for more: the server answers one request and closes, so no
    // connection idles on a descriptor without having upgraded (the upgrade timeout, set
    // long here, is not what ends it).
    let mut stream = TcpStream::connect(socket_addr(&server.url)).await.unwrap();
    stream
        .write_all(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(STEP_TIMEOUT, stream.read_to_end(&mut answer))
        .await
        .expect("the server closes the connection after answering")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
}

#[tokio::test]
async fn a_peer_at_its_pending_cap_loses_its_oldest_connection_not_the_new_one() {
    let mut cmd = server_with_descriptor_limit(1024, &["--listen", "ws://127.0.0.1:0"]);
    cmd.env("EXEC_SERVER_LISTENER__MAX_PENDING_PER_PEER", "3")
        .env("EXEC_SERVER_LISTENER__HEADER_READ_TIMEOUT_MS", "120000");
    let server = WsServer::start_with(cmd).await;
    let addr = socket_addr(&server.url);
    let attacker: IpAddr = "127.0.0.2".parse().unwrap();
    let other: IpAddr = "127.0.0.3".parse().unwrap();

    // A slow but legitimate client elsewhere, then the attacker at its cap.
    let mut slow = stalled_from(addr, other, UPGRADE_START.as_bytes()).await;
    let mut oldest = stalled_from(addr, attacker, HALF_HEAD).await;
    let _second = stalled_from(addr, attacker, HALF_HEAD).await;
    let _third = stalled_from(addr, attacker, HALF_HEAD).await;

    // A client sharing the attacker's address gets in; the attacker's oldest goes.
    let mut client = tokio::time::timeout(
        STEP_TIMEOUT,
        authenticated_client_from(&server.url, attacker),
    )
    .await
    .expect("the new client from the capped address got in");
    assert_eq!(
        client.call("environment/status", json!({})).await,
        json!({"status": "ready"})
    );
    closed_by_server(&mut oldest).await;

    // The other peer was not touched: its request completes.
    slow.write_all(UPGRADE_END.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 12];
    tokio::time::timeout(STEP_TIMEOUT, slow.read_exact(&mut head))
        .await
        .expect("the other peer's upgrade is answered")
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 101");

    let body = metrics(&server.http_base()).await;
    let evicted = |cap| {
        series(
            &body,
            "exec_server_listener_connections_evicted_total",
            &format!(r#"listener="websocket",cap="{cap}""#),
        )
    };
    assert_eq!(evicted("per_peer"), 1.0, "{body}");
    assert_eq!(evicted("total"), 0.0, "{body}");
}

#[tokio::test]
async fn at_the_total_pending_cap_the_oldest_connection_of_anyone_goes() {
    let mut cmd = server_with_descriptor_limit(1024, &["--listen", "ws://127.0.0.1:0"]);
    cmd.env("EXEC_SERVER_LISTENER__MAX_PENDING_CONNECTIONS", "3")
        .env("EXEC_SERVER_LISTENER__MAX_PENDING_PER_PEER", "3")
        .env("EXEC_SERVER_LISTENER__HEADER_READ_TIMEOUT_MS", "120000");
    let server = WsServer::start_with(cmd).await;
    let addr = socket_addr(&server.url);
    let source = |last: u8| IpAddr::from([127, 0, 0, last]);

    let mut oldest = stalled_from(addr, source(2), HALF_HEAD).await;
    let mut slow = stalled_from(addr, source(3), UPGRADE_START.as_bytes()).await;
    let _third = stalled_from(addr, source(4), HALF_HEAD).await;

    let mut client = tokio::time::timeout(
        STEP_TIMEOUT,
        authenticated_client_from(&server.url, source(5)),
    )
    .await
    .expect("a new client got in at the total cap");
    assert_eq!(
        client.call("environment/status", json!({})).await,
        json!({"status": "ready"})
    );
    closed_by_server(&mut oldest).await;

    slow.write_all(UPGRADE_END.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 12];
    tokio::time::timeout(STEP_TIMEOUT, slow.read_exact(&mut head))
        .await
        .expect("the second oldest connection was left alone")
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 101");

    let body = metrics(&server.http_base()).await;
    assert_eq!(
        series(
            &body,
            "exec_server_listener_connections_evicted_total",
            r#"listener="websocket",cap="total""#
        ),
        1.0,
        "{body}"
    );
}

#[tokio::test]
async fn the_rendezvous_listener_survives_stalled_connections_too() {
    const RENDEZVOUS_STALLED: usize = 300;
    raise_own_descriptor_limit(RENDEZVOUS_STALLED as u64 + 256);
    let mut cmd = server_with_descriptor_limit(
        256,
        &[
            "rendezvous",
            "--listen",
            "http://127.0.0.1:0",
            "--insecure-no-auth",
        ],
    );
    cmd.env(
        "EXEC_SERVER_RENDEZVOUS_SIGNING_KEY",
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
    );
    let mut child = cmd.spawn().expect("spawn rendezvous");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut url = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut url))
        .await
        .expect("rendezvous prints its URL")
        .unwrap();
    let base = url.trim().to_owned();
    let addr = socket_addr(&base);
    let mut attack = Vec::with_capacity(RENDEZVOUS_STALLED);
    for _ in 0..RENDEZVOUS_STALLED {
        attack.push(stalled(addr).await);
    }
    let started = Instant::now();
    let (status, _) = http_get(&base, "/livez", "").await;
    eprintln!(
        "rendezvous answered /livez in {:?} with {RENDEZVOUS_STALLED} stalled connections open (RLIMIT_NOFILE 256)",
        started.elapsed()
    );
    assert_eq!(status, 200);
    drop(attack);
}

/// Lines of the server's stderr, as they come.
fn stderr_lines(child: &mut tokio::process::Child) -> mpsc::UnboundedReceiver<String> {
    let stderr = child.stderr.take().expect("stderr is piped");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("server: {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a stderr line containing `needle`; returns every line seen until then.
async fn line_containing(rx: &mut mpsc::UnboundedReceiver<String>, needle: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let line = rx
            .recv()
            .await
            .unwrap_or_else(|| panic!("the server ended before logging {needle:?}"));
        let found = line.contains(needle);
        seen.push(line);
        if found {
            return seen;
        }
    }
}

async fn authenticated(url: String) -> Client {
    let mut client = Client::websocket_with_bearer(&url, TOKEN).await;
    client.handshake().await;
    client
}

const BACKOFF_STARTED: &str = "cannot accept connections";
const BACKOFF_ENDED: &str = "accepting connections again";

#[tokio::test]
async fn running_out_of_descriptors_backs_off_keeps_serving_and_recovers() {
    // No reserve and no descriptor budget, so idle authenticated connections can use
    // every descriptor and the kernel's limit is what stops them.
    let mut cmd = server_with_descriptor_limit(64, &["--listen", "ws://127.0.0.1:0"]);
    cmd.env("EXEC_SERVER_LISTENER__FD_RESERVE", "0")
        .env("EXEC_SERVER_DESCRIPTORS__RESERVE", "0")
        .env("EXEC_SERVER_DESCRIPTORS__SESSION_GUARANTEE", "0")
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped());
    let mut server = WsServer::start_with(cmd).await;
    let mut log = stderr_lines(&mut server.child);
    let url = server.url.clone();

    // Open idle authenticated connections until the server reports that accept fails.
    // Linux allocates the descriptor before it looks at the queue, so the report can come
    // as soon as the table is full, while the last connection is still being served.
    let mut open = Vec::new();
    let mut logged = Vec::new();
    let last = loop {
        assert!(
            open.len() < 64,
            "64 connections in, and accept never failed"
        );
        let mut attempt = tokio::spawn(authenticated(url.clone()));
        tokio::select! {
            client = &mut attempt => open.push(client.expect("connect task")),
            lines = line_containing(&mut log, BACKOFF_STARTED) => {
                logged.extend(lines);
                break attempt;
            }
            () = tokio::time::sleep(STEP_TIMEOUT) => {
                panic!("connection {} neither got in nor made the server report a failed accept", open.len() + 1)
            }
        }
    };
    // The table is full and nothing is closing: this one waits in the kernel's queue.
    let waiting = tokio::spawn(authenticated(url.clone()));

    // Connections already in are still served.
    for client in open.iter_mut().take(3) {
        let error = client.call_err("nothing/here", json!({})).await;
        assert_eq!(error["code"], -32601, "{error}");
    }

    // Free a few descriptors: the waiting clients get in, and the episode ends.
    for mut client in open.drain(..5) {
        client.close().await;
    }
    for attempt in [last, waiting] {
        let mut client = tokio::time::timeout(STEP_TIMEOUT, attempt)
            .await
            .expect("a waiting client got in once descriptors were free")
            .expect("connect task");
        assert_eq!(
            client.call("environment/status", json!({})).await,
            json!({"status": "ready"})
        );
        open.push(client);
    }
    let ended = tokio::time::timeout(STEP_TIMEOUT, line_containing(&mut log, BACKOFF_ENDED))
        .await
        .expect("the server logs the end of the episode");
    logged.extend(ended);
    let warnings = logged
        .iter()
        .filter(|l| l.contains(BACKOFF_STARTED))
        .count();
    assert_eq!(warnings, 1, "one warning per episode: {logged:#?}");

    let body = metrics(&server.http_base()).await;
    assert!(
        series(
            &body,
            "exec_server_listener_accept_errors_total",
            r#"listener="websocket",error="emfile""#
        ) >= 1.0,
        "{body}"
    );
}

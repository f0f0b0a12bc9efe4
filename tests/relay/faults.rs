//! Remote-mode faults in both stream modes — our reliable streams (acks, retransmission,
//! Resume) and codex's (numbered from 0, nothing resent, a stream ends with its socket):
//! the executor's connection cut in the middle of a WebSocket frame by a TCP proxy, the
//! executor restarted, the rendezvous restarted. Reliable streams come through with every
//! byte once; codex streams end, and the session is resumed on a new stream the way codex
//! clients do (`initialize` with `resumeSessionId`, then `process/read` from the last
//! `seq` seen), again with every byte once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use exec_server_relay_core::harness::{RelayConnectArgs, RelayError};
use exec_server_relay_core::noise::NoiseIdentity;
use exec_server_relay_core::proto::StreamFeatures;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::util::{b64decode, STEP_TIMEOUT};

use super::fixtures::*;

/// The two stream modes a harness can get from our executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Our extension, announced in the handshake: acks, retransmission, Resume.
    Reliable,
    /// What a codex harness gets: it announces nothing.
    Codex,
}

fn args_for(mode: Mode, registry: &str, environment: &str) -> RelayConnectArgs {
    let mut args = harness_args(registry, environment);
    if mode == Mode::Codex {
        args.stream_features = StreamFeatures::NONE;
    }
    args
}

/// Executor settings that bring it back quickly after a fault.
const QUICK_RECONNECT: &str =
    "[relay]\nreconnect_initial_backoff_ms = 50\nreconnect_max_backoff_ms = 200\n";

// ---- a TCP proxy that cuts the executor's connection mid-frame --------------------------

/// A TCP proxy in front of the rendezvous's WebSocket listener (its `public_url`, so
/// every rendezvous socket passes it). Once armed, it cuts the executor's connection after
/// that many more bytes from the executor — wherever in a WebSocket frame that falls.
struct TcpCutter {
    url: String,
    /// Bytes from the executor still let through before the cut; 0: not armed.
    armed: Arc<AtomicUsize>,
    cuts: Arc<AtomicUsize>,
    executor_connections: Arc<AtomicUsize>,
}

impl TcpCutter {
    fn cut_after(&self, bytes: usize) {
        self.armed.store(bytes, Ordering::SeqCst);
    }

    async fn wait_for_executor_connections(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        while self.executor_connections.load(Ordering::SeqCst) < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the executor did not reconnect"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The cutter, and a rendezvous whose public URL is the cutter.
async fn cut_rendezvous() -> (TcpCutter, Rendezvous) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cutter = TcpCutter {
        url: format!("http://{}", listener.local_addr().unwrap()),
        armed: Arc::default(),
        cuts: Arc::default(),
        executor_connections: Arc::default(),
    };
    let rdv = start_rendezvous_with(Some(&cutter.url), "").await;
    let upstream = rdv.direct.trim_start_matches("http://").to_owned();
    let (armed, cuts, executors) = (
        Arc::clone(&cutter.armed),
        Arc::clone(&cutter.cuts),
        Arc::clone(&cutter.executor_connections),
    );
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(cutter_connection(
                client,
                upstream.clone(),
                Arc::clone(&armed),
                Arc::clone(&cuts),
                Arc::clone(&executors),
            ));
        }
    });
    (cutter, rdv)
}

async fn cutter_connection(
    mut client: TcpStream,
    upstream: String,
    armed: Arc<AtomicUsize>,
    cuts: Arc<AtomicUsize>,
    executors: Arc<AtomicUsize>,
) {
    let Ok(mut server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let mut from_client = vec![0u8; 16 * 1024];
    let mut from_server = vec![0u8; 16 * 1024];
    // The request line says whose socket this is.
    let Ok(n) = client.read(&mut from_client).await else {
        return;
    };
    let executor = String::from_utf8_lossy(&from_client[..n]).contains("role=environment");
    if executor {
        executors.fetch_add(1, Ordering::SeqCst);
    }
    if n == 0 || server.write_all(&from_client[..n]).await.is_err() {
        return;
    }
    loop {
        tokio::select! {
            read = client.read(&mut from_client) => {
                let Ok(n) = read else { return };
                if n == 0 {
                    return;
                }
                let left = if executor { armed.load(Ordering::SeqCst) } else { 0 };
                if left > 0 && n >= left {
                    // The cut: the first `left` bytes go through, then both sides end.
                    armed.store(0, Ordering::SeqCst);
                    let _ = server.write_all(&from_client[..left]).await;
                    cuts.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                if left > 0 {
                    armed.store(left - n, Ordering::SeqCst);
                }
                if server.write_all(&from_client[..n]).await.is_err() {
                    return;
                }
            }
            read = server.read(&mut from_server) => {
                let Ok(n) = read else { return };
                if n == 0 || client.write_all(&from_server[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

// ---- a process whose output is followed across faults -----------------------------------

/// Lines the process prints: about 230 KB (310 KB encoded), several records on the way,
/// less than the output a process retains for `process/read` (1 MiB).
const LINES: usize = 40_000;

fn expected_output() -> Vec<u8> {
    (1..=LINES)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect()
}

/// Output followed by `seq`: every notification and read chunk must continue exactly
/// where the last one ended.
#[derive(Default)]
struct Followed {
    stdout: Vec<u8>,
    last_seq: u64,
    exit_code: Option<i64>,
    closed: bool,
}

impl Followed {
    /// Applies one `process/output|exited|closed` notification.
    fn notification(&mut self, message: &Value) {
        let params = &message["params"];
        let seq = params["seq"].as_u64().expect("a seq");
        assert_eq!(seq, self.last_seq + 1, "no gap, no repeat: {message}");
        self.last_seq = seq;
        match message["method"].as_str().unwrap() {
            "process/output" => self.stdout.extend(b64decode(&params["chunk"])),
            "process/exited" => self.exit_code = params["exitCode"].as_i64(),
            "process/closed" => self.closed = true,
            other => panic!("unexpected notification {other}"),
        }
    }

    /// Applies one `process/read` answer.
    fn read(&mut self, result: &Value) {
        for chunk in result["chunks"].as_array().unwrap() {
            let seq = chunk["seq"].as_u64().unwrap();
            assert_eq!(seq, self.last_seq + 1, "no gap, no repeat: {chunk}");
            self.last_seq = seq;
            self.stdout.extend(b64decode(&chunk["chunk"]));
        }
        self.exit_code = result["exitCode"].as_i64().or(self.exit_code);
        self.closed = result["closed"] == true;
        self.last_seq = self
            .last_seq
            .max(result["nextSeq"].as_u64().unwrap().saturating_sub(1));
    }
}

/// Sends the counter's `process/start` without waiting for its answer: the output may
/// overtake the answer on a loaded machine, and a codex stream cut 60 KB into the output can
/// end before the answer arrives. [`follow`] checks the answer when it comes.
async fn start_counting(client: &mut RelayClient) {
    let start = json!({"id": "start-counter", "method": "process/start", "params": {
        "processId": "counter",
        "argv": ["seq", "1", LINES.to_string()],
        "cwd": "file:///tmp",
        "env": {"PATH": "/usr/bin:/bin"},
        "tty": false,
        "pipeStdin": false,
    }});
    client.conn.send(start.to_string()).await.unwrap();
}

/// The next message of the stream, or `None` once it ended.
async fn next_or_end(client: &mut RelayClient) -> Option<Value> {
    if !client.pending.is_empty() {
        return Some(client.pending.remove(0));
    }
    let bytes = tokio::time::timeout(STEP_TIMEOUT, client.conn.recv())
        .await
        .expect("the stream neither delivered nor ended")?;
    Some(serde_json::from_slice(&bytes).unwrap())
}

/// Follows the counter's notifications until it closes or the stream ends; the answer to
/// its start must be a success.
async fn follow(client: &mut RelayClient, followed: &mut Followed) {
    while !followed.closed {
        let Some(message) = next_or_end(client).await else {
            return;
        };
        if message.get("id").is_some() {
            assert!(message["result"].is_object(), "process/start: {message}");
            continue;
        }
        followed.notification(&message);
    }
}

/// Reads the rest of the counter's output with `process/read` from the last `seq` seen.
async fn read_rest(client: &mut RelayClient, followed: &mut Followed) {
    while !followed.closed {
        let result = client
            .call(
                "process/read",
                json!({"processId": "counter", "afterSeq": followed.last_seq, "waitMs": 1000}),
            )
            .await;
        followed.read(&result);
    }
}

// ---- a cut WebSocket ----------------------------------------------------------------

async fn cut_in_the_middle_of_a_frame(mode: Mode) {
    let (cutter, rdv) = cut_rendezvous().await;
    let environment = "env-cut";
    let _executor = start_executor_with(&rdv.direct, environment, QUICK_RECONNECT);
    let args = args_for(mode, &rdv.direct, environment);
    let (mut client, init) =
        RelayClient::open_with(args.clone(), json!({"clientName": "relay-tests-client"})).await;
    let session = init["sessionId"].as_str().unwrap().to_owned();
    let stream = client.conn.stream_id().to_owned();
    cutter.wait_for_executor_connections(1).await;

    // 60 KB into the executor's answer and the output, in the middle of whatever frame
    // carries that byte.
    cutter.cut_after(60_000);
    start_counting(&mut client).await;
    let mut followed = Followed::default();
    follow(&mut client, &mut followed).await;
    assert_eq!(cutter.cuts.load(Ordering::SeqCst), 1, "the cut happened");

    match mode {
        Mode::Reliable => {
            // The stream lived through it: same stream, nothing lost, nothing twice.
            assert!(
                followed.closed,
                "the stream ended: {:?}",
                client.conn.error()
            );
            cutter.wait_for_executor_connections(2).await;
            assert_eq!(
                client.call("environment/status", json!({})).await["status"],
                "ready"
            );
        }
        Mode::Codex => {
            // Nothing is resent on a codex stream: it ended with its socket ...
            assert!(!followed.closed, "a codex stream cannot outlive its socket");
            let ended = client.conn.error();
            assert!(
                matches!(ended, Some(RelayError::Reset(_) | RelayError::Lost)),
                "{ended:?}"
            );
            // ... and the session goes on on a new stream, read from the last seq seen.
            let mut resumed = resume_session(&args, &session).await;
            assert_ne!(resumed.conn.stream_id(), stream);
            read_rest(&mut resumed, &mut followed).await;
        }
    }
    assert_eq!(followed.exit_code, Some(0));
    assert!(
        followed.stdout == expected_output(),
        "{} of {} bytes, first difference at {:?}",
        followed.stdout.len(),
        expected_output().len(),
        followed
            .stdout
            .iter()
            .zip(expected_output())
            .position(|(a, b)| *a != b)
    );
}

#[tokio::test]
async fn a_reliable_stream_resumes_with_every_byte_after_its_executor_socket_is_cut_mid_frame() {
    cut_in_the_middle_of_a_frame(Mode::Reliable).await;
}

#[tokio::test]
async fn a_codex_stream_ends_when_its_executor_socket_is_cut_and_the_session_resumes_whole() {
    cut_in_the_middle_of_a_frame(Mode::Codex).await;
}

// ---- an executor restarted -------------------------------------------------------------

/// The rendezvous keeps a detached executor's environment for an hour, so only the
/// takeover of a restarted executor (same environment, new key) can serve it in time.
async fn executor_restarted(mode: Mode) {
    let rdv = start_rendezvous_with(None, "grace_secs = 3600").await;
    let environment = "env-restarted";
    let mut first = start_executor_with(&rdv.url, environment, QUICK_RECONNECT);
    let mut client = RelayClient::open(args_for(mode, &rdv.url, environment)).await;
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
    let harness = registry_as(&rdv.url, HARNESS_TOKEN);
    let probe = NoiseIdentity::generate().public();
    let old_key = harness
        .connect(environment, &probe)
        .await
        .unwrap()
        .executor_public_key;
    // SIGKILL: the socket ends without a close code, as after a crash.
    first.child.kill().await.unwrap();
    let _second = start_executor_with(&rdv.url, environment, QUICK_RECONNECT);
    // The registry hands out the new executor's key as soon as it registered.
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        let bundle = harness.connect(environment, &probe).await;
        if bundle.is_ok_and(|b| b.executor_public_key != old_key) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the restarted executor never took over"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A new stream reaches the new executor.
    let mut again = RelayClient::open(args_for(mode, &rdv.url, environment)).await;
    assert_eq!(
        again.call("environment/status", json!({})).await["status"],
        "ready"
    );
    // The old stream does not hang: the takeover ended its route with a Reset and closed
    // its socket. A codex stream ends with its socket, so it may report either first.
    let ended = client.ended().await;
    let reset = Some(RelayError::Reset("executor_unavailable".into()));
    match mode {
        Mode::Reliable => assert_eq!(ended, reset),
        Mode::Codex => assert!(
            ended == reset || ended == Some(RelayError::Lost),
            "{ended:?}"
        ),
    }
}

#[tokio::test]
async fn a_restarted_executor_serves_reliable_streams_and_the_old_stream_is_reset() {
    executor_restarted(Mode::Reliable).await;
}

#[tokio::test]
async fn a_restarted_executor_serves_codex_streams_and_the_old_stream_is_reset() {
    executor_restarted(Mode::Codex).await;
}

// ---- the rendezvous restarted ----------------------------------------------------------

/// Every socket and all registry state are lost; while the service comes back its
/// registry answers 503 for a while. The executor retries, registers again and serves.
async fn rendezvous_restarted(mode: Mode) {
    let mut rdv = start_rendezvous(None).await;
    let gate = start_gate(&rdv.url).await;
    let environment = "env-rdv-restart";
    let mut executor = start_executor_with(&gate.url, environment, QUICK_RECONNECT);
    let args = args_for(mode, &rdv.url, environment);
    let (mut client, init) =
        RelayClient::open_with(args.clone(), json!({"clientName": "relay-tests-client"})).await;
    let session = init["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
    let registered = gate.registers.load(Ordering::SeqCst);

    gate.refuse_register.store(503, Ordering::SeqCst);
    rdv.restart().await;
    // Transient registry errors: the executor keeps trying and does not exit.
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    while gate.registers.load(Ordering::SeqCst) < registered + 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the executor stopped registering"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        executor.child.try_wait().unwrap().is_none(),
        "the executor exited"
    );
    gate.refuse_register.store(0, Ordering::SeqCst);

    // Harnesses reach it again.
    let mut fresh = RelayClient::open(args_for(mode, &rdv.url, environment)).await;
    assert_eq!(
        fresh.call("environment/status", json!({})).await["status"],
        "ready"
    );
    match mode {
        Mode::Reliable => {
            // The same stream resumed through the new service (a lost one would fail
            // this call).
            assert_eq!(
                client.call("environment/status", json!({})).await["status"],
                "ready"
            );
        }
        Mode::Codex => {
            // The stream ended with its socket; the session resumes on a new one.
            let ended = client.ended().await;
            assert!(
                matches!(ended, Some(RelayError::Reset(_) | RelayError::Lost)),
                "{ended:?}"
            );
            let mut resumed = resume_session(&args, &session).await;
            assert_eq!(
                resumed.call("environment/status", json!({})).await["status"],
                "ready"
            );
        }
    }
}

#[tokio::test]
async fn reliable_streams_and_the_executor_come_through_a_rendezvous_restart() {
    rendezvous_restarted(Mode::Reliable).await;
}

#[tokio::test]
async fn codex_sessions_and_the_executor_come_through_a_rendezvous_restart() {
    rendezvous_restarted(Mode::Codex).await;
}

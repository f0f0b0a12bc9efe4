//! Fixtures shared by the relay tests: the real `exec-server rendezvous` and executor
//! processes, a JSON-RPC client over one relay stream, a WebSocket proxy that captures,
//! drops, duplicates, reorders, injects and cuts frames, raw rendezvous sockets and
//! registry calls, and a registry gate that holds or refuses `/validate` and `/register`.
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exec_server_relay_core::harness::{
    connect_relay, RelayBundleProvider, RelayConnectArgs, RelayConnection, RelayError,
};
use exec_server_relay_core::noise::{NoiseIdentity, NoisePublicKey};
use exec_server_relay_core::proto::{self, Body};
use exec_server_relay_core::registry::{BaseUrl, ConnectBundle, RegistryClient, SecretString};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio_tungstenite::tungstenite::Message;

use crate::util::{config_file, server_command, STEP_TIMEOUT};

pub(crate) const EXECUTOR_TOKEN: &str = "executor-token-for-tests";
pub(crate) const HARNESS_TOKEN: &str = "harness-token-for-tests";

pub(crate) fn sha256_hex(text: &str) -> String {
    use std::fmt::Write;
    let digest = ring_digest(text.as_bytes());
    digest.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

pub(crate) fn ring_digest(bytes: &[u8]) -> Vec<u8> {
    // The rendezvous crate exposes SHA-256 through its token digest helper.
    exec_server_rendezvous::signing::token_digest(std::str::from_utf8(bytes).unwrap()).to_vec()
}

/// A running `exec-server rendezvous`.
pub(crate) struct Rendezvous {
    pub(crate) child: Child,
    /// The first stdout line (the public URL).
    pub(crate) url: String,
    /// The address it listens on.
    pub(crate) direct: String,
    pub(crate) _config: tempfile::TempPath,
    /// Its stderr, when started with [`start_rendezvous_logged`].
    pub(crate) log: Arc<Mutex<String>>,
    /// Its command line and whether its stderr is kept, for [`Rendezvous::restart`].
    args: Vec<String>,
    capture_log: bool,
}

impl Rendezvous {
    /// Kills the service (SIGKILL: every socket and all its state are lost) and starts it
    /// again on the same address with the same configuration and signing key.
    pub(crate) async fn restart(&mut self) {
        self.restart_with_signing_key(TEST_SIGNING_KEY).await;
    }

    /// [`Rendezvous::restart`] with another signing key: every URL and authorization it
    /// signed before is refused afterwards.
    pub(crate) async fn restart_with_signing_key(&mut self, key: &str) {
        self.child.kill().await.unwrap();
        let (child, url, log) = spawn_rendezvous_keyed(&self.args, self.capture_log, key).await;
        assert_eq!(url, self.url);
        self.child = child;
        if self.capture_log {
            self.log = log;
        }
    }
}

/// A rendezvous whose stderr (at `warn`) is kept in [`Rendezvous::log`].
pub(crate) async fn start_rendezvous_logged() -> Rendezvous {
    start_rendezvous_inner(None, "", true, false, None).await
}

/// [`start_rendezvous_logged`] whose `[rendezvous]` table also holds `settings`.
pub(crate) async fn start_rendezvous_logged_with(settings: &str) -> Rendezvous {
    start_rendezvous_inner(None, settings, true, false, None).await
}

/// A logged rendezvous serving TLS itself with these PEM files (`--listen https://…`).
pub(crate) async fn start_tls_rendezvous(cert: &Path, key: &Path) -> Rendezvous {
    start_rendezvous_inner(None, "", true, false, Some((cert, key))).await
}

/// One node of a deployment of several: `settings` name the shared store, `public_url`
/// is the deployment's URL, and the node's own URL (`--node-url`) is its listen address.
pub(crate) async fn start_rendezvous_node(public_url: Option<&str>, settings: &str) -> Rendezvous {
    start_rendezvous_inner(public_url, settings, false, true, None).await
}

pub(crate) async fn start_rendezvous(public_url: Option<&str>) -> Rendezvous {
    start_rendezvous_with(public_url, "").await
}

/// A rendezvous whose `[rendezvous]` table also holds `settings` (small limits, short grace).
pub(crate) async fn start_rendezvous_with(public_url: Option<&str>, settings: &str) -> Rendezvous {
    start_rendezvous_inner(public_url, settings, false, false, None).await
}

async fn start_rendezvous_inner(
    public_url: Option<&str>,
    settings: &str,
    capture_log: bool,
    node_url: bool,
    tls: Option<(&Path, &Path)>,
) -> Rendezvous {
    // A free port, so the direct URL is known even when a public URL is printed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let listen = format!("{scheme}://127.0.0.1:{port}");
    let config = config_file(&format!(
        r#"
[rendezvous]
{settings}

[[rendezvous.tokens]]
name = "executors"
sha256 = "{}"
role = "executor"
environments = ["env-*"]

[[rendezvous.tokens]]
name = "harnesses"
sha256 = "{}"
role = "harness"
"#,
        sha256_hex(EXECUTOR_TOKEN),
        sha256_hex(HARNESS_TOKEN)
    ));
    let path = config.to_str().unwrap().to_owned();
    let mut args = vec!["rendezvous", "--config", &path, "--listen", &listen];
    if let Some(url) = public_url {
        args.extend(["--public-url", url]);
    }
    if node_url {
        args.extend(["--node-url", &listen]);
    }
    let tls_files = tls.map(|(cert, key)| (cert.display().to_string(), key.display().to_string()));
    if let Some((cert, key)) = &tls_files {
        args.extend(["--tls-cert-file", cert, "--tls-key-file", key]);
    }
    let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
    let (child, url, log) = spawn_rendezvous(&args, capture_log).await;
    assert!(url.starts_with(&format!("{scheme}://127.0.0.1:")), "{url}");
    Rendezvous {
        child,
        url,
        direct: listen,
        _config: config,
        log,
        args,
        capture_log,
    }
}

/// The signing key (base64) of the tests' rendezvous services.
const TEST_SIGNING_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

/// Starts `exec-server <args>` with the tests' signing key: the child, its first stdout
/// line (the URL) and its stderr when `capture_log`.
async fn spawn_rendezvous(
    args: &[String],
    capture_log: bool,
) -> (Child, String, Arc<Mutex<String>>) {
    spawn_rendezvous_keyed(args, capture_log, TEST_SIGNING_KEY).await
}

async fn spawn_rendezvous_keyed(
    args: &[String],
    capture_log: bool,
    signing_key: &str,
) -> (Child, String, Arc<Mutex<String>>) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = server_command(&args);
    cmd.env("EXEC_SERVER_RENDEZVOUS_SIGNING_KEY", signing_key);
    let mut log = Arc::new(Mutex::new(String::new()));
    if capture_log {
        cmd.env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stderr(std::process::Stdio::piped());
    }
    let mut child = cmd.spawn().expect("spawn rendezvous");
    if capture_log {
        log = capture_stderr(&mut child);
    }
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut line))
        .await
        .expect("rendezvous prints its URL")
        .unwrap();
    tokio::spawn(async move {
        let mut rest = String::new();
        while stdout.read_line(&mut rest).await.unwrap_or(0) > 0 {}
    });
    (child, line.trim().to_owned(), log)
}

/// Runs `cmd` to its end, which must be a refusal at start (status 2, nothing on
/// stdout); returns its stderr.
pub(crate) async fn refused_at_start(mut cmd: tokio::process::Command) -> String {
    cmd.stderr(std::process::Stdio::piped());
    let output = tokio::time::timeout(STEP_TIMEOUT, cmd.output())
        .await
        .expect("it exits")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(output.stdout.is_empty(), "{stderr}");
    stderr
}

/// Collects a child's piped stderr, line by line, as it comes.
pub(crate) fn capture_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let log = Arc::new(Mutex::new(String::new()));
    let stderr = child.stderr.take().expect("stderr is piped");
    let sink = Arc::clone(&log);
    let mut lines = BufReader::new(stderr).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let mut text = sink.lock().unwrap();
            text.push_str(&line);
            text.push('\n');
        }
    });
    log
}

/// Waits until `log` contains `needle` `times` times (bounded by the step timeout).
pub(crate) async fn wait_for_log(log: &Mutex<String>, needle: &str, times: usize) {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    while log.lock().unwrap().matches(needle).count() < times {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{needle:?} was not logged {times} times; the log:\n{}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn start_executor(registry: &str, environment: &str) -> Child {
    let mut cmd = server_command(&["--remote", registry, "--environment-id", environment]);
    cmd.env("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN);
    cmd.spawn().expect("spawn executor")
}

/// An executor started with `--config` holding `toml` (a `[relay]` table and others).
pub(crate) struct Executor {
    pub(crate) child: Child,
    pub(crate) _config: tempfile::TempPath,
}

pub(crate) fn start_executor_with(registry: &str, environment: &str, toml: &str) -> Executor {
    let config = config_file(toml);
    let path = config.to_str().unwrap().to_owned();
    let mut cmd = server_command(&[
        "--config",
        &path,
        "--remote",
        registry,
        "--environment-id",
        environment,
    ]);
    cmd.env("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN);
    Executor {
        child: cmd.spawn().expect("spawn executor"),
        _config: config,
    }
}

/// Harness arguments for the tests, which wait for executors with their own loops
/// ([`connect`]) and assert on first answers: busy registry answers are not waited out
/// (`run_errors`-style tests of that wait turn it back on).
pub(crate) fn harness_args(registry: &str, environment: &str) -> RelayConnectArgs {
    let mut args = RelayConnectArgs::new(registry, environment, SecretString::new(HARNESS_TOKEN));
    args.retry_busy_registry = false;
    args
}

/// Connects, retrying while the executor is still starting (404/503).
pub(crate) async fn connect(args: RelayConnectArgs) -> RelayConnection {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        match connect_relay(args.clone()).await {
            Ok(c) => return c,
            Err(RelayError::Registry(e)) if matches!(e.status(), Some(404 | 503)) => {}
            Err(e) => panic!("relay connect failed: {e}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "executor never became reachable"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A new stream that takes the session over, retrying while the executor has not yet
/// seen the old stream end (-32010), as codex clients do.
pub(crate) async fn resume_session(args: &RelayConnectArgs, session: &str) -> RelayClient {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    let executor_away = Some(RelayError::Reset("executor_unavailable".into()));
    loop {
        let mut client = RelayClient {
            conn: connect(args.clone()).await,
            next_id: 1,
            pending: Vec::new(),
        };
        let initialize = json!({"id": 0, "method": "initialize", "params":
            {"clientName": "relay-tests-client", "resumeSessionId": session}});
        let sent = client.conn.send(initialize.to_string()).await;
        let answer = match sent {
            Ok(()) => tokio::time::timeout(STEP_TIMEOUT, client.conn.recv())
                .await
                .expect("timed out waiting for the initialize answer"),
            Err(_) => None,
        };
        match answer.map(|bytes| into_result(serde_json::from_slice(&bytes).unwrap())) {
            Some(Ok(result)) => {
                assert_eq!(result["sessionId"], session);
                client
                    .conn
                    .send(json!({"method": "initialized", "params": {}}).to_string())
                    .await
                    .unwrap();
                return client;
            }
            // The old stream still holds the session.
            Some(Err(error)) if error["code"] == -32010 => {}
            Some(Err(error)) => panic!("resume failed: {error}"),
            // The executor's new socket was not attached yet when the stream arrived (a
            // harness tries again, as codex's does).
            None if client.conn.error() == executor_away => {}
            None => panic!("the resumed stream ended: {:?}", client.conn.error()),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session could not be resumed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A JSON-RPC client over one relay stream.
pub(crate) struct RelayClient {
    pub(crate) conn: RelayConnection,
    pub(crate) next_id: i64,
    pub(crate) pending: Vec<Value>,
}

impl RelayClient {
    pub(crate) async fn open(args: RelayConnectArgs) -> Self {
        Self::open_with(args, json!({"clientName": "relay-tests-client"}))
            .await
            .0
    }

    /// Opens a stream and initializes it with `params`; returns the `initialize` result.
    pub(crate) async fn open_with(args: RelayConnectArgs, params: Value) -> (Self, Value) {
        let mut client = Self {
            conn: connect(args).await,
            next_id: 1,
            pending: Vec::new(),
        };
        let result = client.call("initialize", params).await;
        client
            .conn
            .send(json!({"method": "initialized", "params": {}}).to_string())
            .await
            .unwrap();
        (client, result)
    }

    /// Waits for the stream to end and returns why.
    pub(crate) async fn ended(&mut self) -> Option<RelayError> {
        stream_end(&mut self.conn).await
    }

    pub(crate) async fn next(&mut self) -> Value {
        let bytes = tokio::time::timeout(STEP_TIMEOUT, self.conn.recv())
            .await
            .expect("timed out waiting for a relay message")
            .unwrap_or_else(|| panic!("relay stream ended: {:?}", self.conn.error()));
        serde_json::from_slice(&bytes).unwrap()
    }

    pub(crate) async fn request(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.conn
            .send(json!({"id": id, "method": method, "params": params}).to_string())
            .await
            .unwrap();
        if let Some(pos) = self.pending.iter().position(|m| m["id"] == id) {
            return into_result(self.pending.remove(pos));
        }
        loop {
            let message = self.next().await;
            if message["id"] == id {
                return into_result(message);
            }
            self.pending.push(message);
        }
    }

    pub(crate) async fn call(&mut self, method: &str, params: Value) -> Value {
        self.request(method, params)
            .await
            .unwrap_or_else(|e| panic!("{method} failed: {e}"))
    }
}

pub(crate) fn into_result(mut message: Value) -> Result<Value, Value> {
    match message.get_mut("error") {
        Some(e) => Err(e.take()),
        None => Ok(message["result"].take()),
    }
}

/// Which endpoint a proxied socket belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Executor,
    Harness,
}

/// One binary message seen by the proxy.
#[derive(Debug, Clone)]
pub(crate) struct Captured {
    pub(crate) side: Side,
    /// Sent by the endpoint towards the rendezvous.
    pub(crate) up: bool,
    /// Index of the proxied socket (in accept order).
    pub(crate) socket: usize,
    pub(crate) bytes: Vec<u8>,
}

/// Faults the proxy applies, and what it observed.
#[derive(Default)]
pub(crate) struct Faults {
    pub(crate) lossy: AtomicBool,
    /// Cuts every executor socket.
    pub(crate) cut: tokio::sync::Notify,
    /// Cuts every harness socket.
    pub(crate) cut_harness: tokio::sync::Notify,
    /// Executor upgrades are refused with 503 while set.
    pub(crate) refuse_executor: AtomicBool,
    pub(crate) refused_executor: AtomicUsize,
    /// Messages to write to the current executor socket, as a router that does not
    /// validate would (RELAY §2.5).
    pub(crate) inject: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Message>>>,
    /// The same towards the most recent harness socket.
    pub(crate) inject_harness: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Message>>>,
    /// Sides of the sockets proxied so far, in accept order.
    pub(crate) sockets: Mutex<Vec<Side>>,
    /// 1 + the index of a socket whose endpoint side is no longer read (so its Pings go
    /// unanswered); 0 for none.
    pub(crate) freeze: AtomicUsize,
    /// Close codes sent by endpoints.
    pub(crate) closes: Mutex<Vec<(Side, Option<u16>)>>,
    /// Close codes sent by the rendezvous, by the side of the socket.
    pub(crate) router_closes: Mutex<Vec<(Side, Option<u16>)>>,
}

/// A WebSocket proxy in front of the rendezvous: records every frame and optionally
/// drops, duplicates, reorders, injects and cuts.
pub(crate) struct Proxy {
    pub(crate) url: String,
    pub(crate) frames: Arc<Mutex<Vec<Captured>>>,
    pub(crate) faults: Arc<Faults>,
}

impl Proxy {
    pub(crate) fn executor_sockets(&self) -> usize {
        let sockets = self.faults.sockets.lock().unwrap();
        sockets.iter().filter(|s| **s == Side::Executor).count()
    }

    pub(crate) fn closes(&self, side: Side) -> Vec<Option<u16>> {
        let closes = self.faults.closes.lock().unwrap();
        closes
            .iter()
            .filter(|(s, _)| *s == side)
            .map(|(_, c)| *c)
            .collect()
    }

    /// Waits until `condition` holds (bounded by the step timeout).
    pub(crate) async fn wait_for(&self, what: &str, condition: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        while !condition(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Writes `message` to the current executor socket.
    pub(crate) async fn inject(&self, message: Message) {
        self.wait_for("an executor socket", |p| {
            p.faults.inject.lock().unwrap().is_some()
        })
        .await;
        let sender = self.faults.inject.lock().unwrap().clone().unwrap();
        sender.send(message).unwrap();
    }
}

/// A proxy, and a rendezvous whose public URL is the proxy (so every executor and harness
/// socket passes through it, while registry calls may go to the rendezvous directly).
pub(crate) async fn proxied_rendezvous(settings: &str) -> (Proxy, Rendezvous) {
    let upstream = Arc::new(Mutex::new(String::new()));
    let proxy = start_proxy(Arc::clone(&upstream)).await;
    let rdv = start_rendezvous_with(Some(&proxy.url), settings).await;
    *upstream.lock().unwrap() = rdv.direct.clone();
    (proxy, rdv)
}

pub(crate) async fn start_proxy(upstream_port_file: Arc<Mutex<String>>) -> Proxy {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let frames = Arc::new(Mutex::new(Vec::new()));
    let faults = Arc::new(Faults::default());
    let (f2, faults2) = (Arc::clone(&frames), Arc::clone(&faults));
    tokio::spawn(async move {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let (frames, faults, upstream) = (
                Arc::clone(&f2),
                Arc::clone(&faults2),
                Arc::clone(&upstream_port_file),
            );
            tokio::spawn(proxy_socket(tcp, frames, faults, upstream, seed));
        }
    });
    Proxy {
        url,
        frames,
        faults,
    }
}

// The upgrade callback's error type is tungstenite's `ErrorResponse`.
#[allow(clippy::result_large_err)]
pub(crate) async fn proxy_socket(
    tcp: tokio::net::TcpStream,
    frames: Arc<Mutex<Vec<Captured>>>,
    faults: Arc<Faults>,
    upstream: Arc<Mutex<String>>,
    seed: u64,
) {
    let path = Arc::new(Mutex::new(String::new()));
    let p2 = Arc::clone(&path);
    let f2 = Arc::clone(&faults);
    let Ok(client) = tokio_tungstenite::accept_hdr_async(
        tcp,
        move |req: &tokio_tungstenite::tungstenite::handshake::server::Request, resp| {
            let uri = req.uri().to_string();
            if uri.contains("role=environment") && f2.refuse_executor.load(Ordering::SeqCst) {
                f2.refused_executor.fetch_add(1, Ordering::SeqCst);
                let mut refusal = tokio_tungstenite::tungstenite::http::Response::new(None);
                *refusal.status_mut() =
                    tokio_tungstenite::tungstenite::http::StatusCode::SERVICE_UNAVAILABLE;
                return Err(refusal);
            }
            *p2.lock().unwrap() = uri;
            Ok(resp)
        },
    )
    .await
    else {
        return;
    };
    let path = path.lock().unwrap().clone();
    let side = if path.contains("role=environment") {
        Side::Executor
    } else {
        Side::Harness
    };
    let executor_side = side == Side::Executor;
    let base = upstream.lock().unwrap().replacen("http://", "ws://", 1);
    let Ok((server, _)) = tokio_tungstenite::connect_async(format!("{base}{path}")).await else {
        return;
    };
    let socket = {
        let mut sockets = faults.sockets.lock().unwrap();
        sockets.push(side);
        sockets.len() - 1
    };
    let (inject_tx, mut inject_rx) = tokio::sync::mpsc::unbounded_channel();
    if executor_side {
        *faults.inject.lock().unwrap() = Some(inject_tx);
    } else {
        *faults.inject_harness.lock().unwrap() = Some(inject_tx);
    }
    let capture = |up: bool, m: &Message| {
        if let Message::Binary(b) = m {
            frames.lock().unwrap().push(Captured {
                side,
                up,
                socket,
                bytes: b.to_vec(),
            });
        }
    };
    let (mut c_tx, mut c_rx) = client.split();
    let (mut s_tx, mut s_rx) = server.split();
    let mut rng = seed | 1;
    let mut rand = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % 100
    };
    let mut held_up: Vec<Message> = Vec::new();
    let mut held_down: Vec<Message> = Vec::new();
    loop {
        tokio::select! {
            biased;
            Some(m) = inject_rx.recv() => {
                if c_tx.send(m).await.is_err() { return; }
            }
            _ = faults.cut.notified(), if executor_side => return,
            _ = faults.cut_harness.notified(), if !executor_side => return,
            m = c_rx.next(), if faults.freeze.load(Ordering::SeqCst) != socket + 1 => {
                let Some(Ok(m)) = m else { return };
                if let Message::Close(frame) = &m {
                    let code = frame.as_ref().map(|f| u16::from(f.code));
                    faults.closes.lock().unwrap().push((side, code));
                }
                capture(true, &m);
                if executor_side && faults.lossy.load(Ordering::SeqCst) && is_faultable(&m) {
                    let r = rand();
                    if r < 10 { continue; }
                    if r < 20 { let _ = s_tx.send(m.clone()).await; }
                    if r < 30 { held_up.push(m); continue; }
                }
                if s_tx.send(m).await.is_err() { return; }
                if held_up.len() > 3 || rand() < 20 { for h in held_up.drain(..) { let _ = s_tx.send(h).await; } }
            }
            m = s_rx.next() => {
                let Some(Ok(m)) = m else { return };
                if let Message::Close(frame) = &m {
                    let code = frame.as_ref().map(|f| u16::from(f.code));
                    faults.router_closes.lock().unwrap().push((side, code));
                }
                capture(false, &m);
                if executor_side && faults.lossy.load(Ordering::SeqCst) && is_faultable(&m) {
                    let r = rand();
                    if r < 10 { continue; }
                    if r < 20 { let _ = c_tx.send(m.clone()).await; }
                    if r < 30 { held_down.push(m); continue; }
                }
                if c_tx.send(m).await.is_err() { return; }
                if held_down.len() > 3 || rand() < 20 { for h in held_down.drain(..) { let _ = c_tx.send(h).await; } }
            }
        }
    }
}

pub(crate) fn is_faultable(m: &Message) -> bool {
    let Message::Binary(b) = m else { return false };
    matches!(
        proto::decode(b).ok().and_then(|f| f.body),
        Some(Body::Data(_) | Body::AckFrame(_) | Body::Resume(_) | Body::Handshake(_))
    )
}

pub(crate) type RawWs =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub(crate) fn registry_as(url: &str, token: &str) -> RegistryClient {
    RegistryClient::new(
        BaseUrl::parse(url, false).unwrap(),
        SecretString::new(token),
        Duration::from_secs(10),
        false,
    )
}

/// Waits for the stream to end and returns why (`None` for an orderly end).
pub(crate) async fn stream_end(conn: &mut RelayConnection) -> Option<RelayError> {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    while tokio::time::timeout_at(deadline, conn.recv())
        .await
        .expect("the relay stream did not end")
        .is_some()
    {}
    // The reason is recorded as the stream task finishes.
    while conn.error().is_none() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    conn.error()
}

/// A connect bundle for a fresh harness key, retrying while the executor is starting.
pub(crate) async fn harness_bundle(url: &str, environment: &str) -> ConnectBundle {
    let registry = registry_as(url, HARNESS_TOKEN);
    let key = NoiseIdentity::generate().public();
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        match registry.connect(environment, &key).await {
            Ok(bundle) => return bundle,
            Err(e) if matches!(e.status(), Some(404 | 503)) => {}
            Err(e) => panic!("connect failed: {e}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "connect never succeeded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens a rendezvous socket; `Err(status)` when the upgrade is refused.
pub(crate) async fn upgrade(url: &str) -> Result<RawWs, u16> {
    use tokio_tungstenite::tungstenite::Error;
    match tokio::time::timeout(STEP_TIMEOUT, tokio_tungstenite::connect_async(url))
        .await
        .expect("upgrade timed out")
    {
        Ok((ws, _)) => Ok(ws),
        Err(Error::Http(response)) => Err(response.status().as_u16()),
        Err(e) => panic!("upgrade failed: {e}"),
    }
}

pub(crate) async fn open_raw(url: &str) -> RawWs {
    upgrade(url)
        .await
        .unwrap_or_else(|status| panic!("upgrade refused with {status}"))
}

pub(crate) enum Raw {
    Frame(proto::RelayMessageFrame),
    Closed(Option<u16>),
}

pub(crate) async fn raw_next(ws: &mut RawWs) -> Raw {
    loop {
        let message = tokio::time::timeout(STEP_TIMEOUT, ws.next())
            .await
            .expect("timed out on a raw relay socket");
        match message {
            Some(Ok(Message::Binary(b))) => return Raw::Frame(proto::decode(&b).unwrap()),
            Some(Ok(Message::Close(f))) => return Raw::Closed(f.map(|f| u16::from(f.code))),
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return Raw::Closed(None),
        }
    }
}

/// The close code the peer ends the socket with (frames before it are skipped).
pub(crate) async fn raw_close_code(ws: &mut RawWs) -> Option<u16> {
    loop {
        if let Raw::Closed(code) = raw_next(ws).await {
            return code;
        }
    }
}

/// The next Reset on the socket: (stream id, reason).
pub(crate) async fn raw_reset(ws: &mut RawWs) -> (String, String) {
    loop {
        match raw_next(ws).await {
            Raw::Frame(f) => {
                if let Some(Body::Reset(r)) = f.body {
                    return (f.stream_id, r.reason);
                }
            }
            Raw::Closed(code) => panic!("socket closed ({code:?}) before a Reset"),
        }
    }
}

/// A Ping is answered: the peer still reads this socket.
pub(crate) async fn assert_alive(ws: &mut RawWs) {
    ws.send(Message::Ping(b"alive".to_vec().into()))
        .await
        .unwrap();
    loop {
        let message = tokio::time::timeout(STEP_TIMEOUT, ws.next())
            .await
            .expect("no Pong");
        match message {
            Some(Ok(Message::Pong(p))) if p.as_ref() == b"alive" => return,
            Some(Ok(Message::Close(f))) => panic!("socket closed: {f:?}"),
            Some(Ok(_)) => {}
            other => panic!("socket ended: {other:?}"),
        }
    }
}

pub(crate) async fn send_frame(ws: &mut RawWs, frame: &proto::RelayMessageFrame) {
    ws.send(Message::Binary(proto::encode(frame)))
        .await
        .unwrap();
}

pub(crate) fn new_stream_id() -> String {
    NoiseIdentity::generate().public().to_base64()[..20]
        .replace(['+', '/'], "-")
        .to_lowercase()
}

/// A frame with a wrong version for `stream_id` (§2.5 row 4).
pub(crate) fn version_two(stream_id: &str) -> proto::RelayMessageFrame {
    let mut frame = proto::frame(stream_id, 0, 0, proto::ack_body());
    frame.version = 2;
    frame
}

/// A registry in front of the rendezvous that can hold or refuse `/validate` calls and
/// counts `/register` calls (plain HTTP/1.1, one request per connection).
#[derive(Default)]
pub(crate) struct RegistryGate {
    pub(crate) url: String,
    pub(crate) hold_validate: AtomicBool,
    pub(crate) held: AtomicUsize,
    pub(crate) release: tokio::sync::Notify,
    pub(crate) registers: AtomicUsize,
    pub(crate) validates: AtomicUsize,
    /// When non-zero, `/validate` and `/register` are answered with this status.
    pub(crate) refuse_validate: AtomicUsize,
    pub(crate) refuse_register: AtomicUsize,
    /// `/connect` calls seen, and how many more to answer `503` with `Retry-After: 1`.
    pub(crate) connects: AtomicUsize,
    pub(crate) busy_connects: AtomicUsize,
}

pub(crate) async fn start_gate(upstream: &str) -> Arc<RegistryGate> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gate = Arc::new(RegistryGate {
        url: format!("http://{}", listener.local_addr().unwrap()),
        ..RegistryGate::default()
    });
    let upstream = upstream.trim_start_matches("http://").to_owned();
    let g = Arc::clone(&gate);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(gate_request(tcp, Arc::clone(&g), upstream.clone()));
        }
    });
    gate
}

pub(crate) async fn gate_request(
    mut tcp: tokio::net::TcpStream,
    gate: Arc<RegistryGate>,
    upstream: String,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        let Ok(n) = tcp.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let target = head.split_whitespace().nth(1).unwrap_or("").to_owned();
    if target.ends_with("/register") {
        gate.registers.fetch_add(1, Ordering::SeqCst);
    }
    if target.ends_with("/validate") {
        gate.validates.fetch_add(1, Ordering::SeqCst);
    }
    if target.ends_with("/connect") {
        gate.connects.fetch_add(1, Ordering::SeqCst);
        let busy = gate
            .busy_connects
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if busy.is_ok() {
            let body = r#"{"error":{"code":"store_unavailable","message":"busy (test gate)"}}"#;
            let answer = format!(
                "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tcp.write_all(answer.as_bytes()).await;
            let _ = tcp.shutdown().await;
            return;
        }
    }
    let refusal = if target.ends_with("/register") {
        gate.refuse_register.load(Ordering::SeqCst)
    } else if target.ends_with("/validate") {
        gate.refuse_validate.load(Ordering::SeqCst)
    } else {
        0
    };
    if refusal != 0 {
        let body = r#"{"error":{"code":"forbidden","message":"refused by the test gate"}}"#;
        let answer = format!(
            "HTTP/1.1 {refusal} Refused\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = tcp.write_all(answer.as_bytes()).await;
        let _ = tcp.shutdown().await;
        return;
    }
    if target.ends_with("/validate") && gate.hold_validate.load(Ordering::SeqCst) {
        gate.held.fetch_add(1, Ordering::SeqCst);
        gate.release.notified().await;
        gate.held.fetch_sub(1, Ordering::SeqCst);
    }
    // Forward with `Connection: close`, so the answer ends with the upstream connection.
    let mut request = String::new();
    for line in head[..head_end - 4].split("\r\n") {
        if !line.to_ascii_lowercase().starts_with("connection:") {
            request.push_str(line);
            request.push_str("\r\n");
        }
    }
    request.push_str("Connection: close\r\n\r\n");
    let Ok(mut up) = tokio::net::TcpStream::connect(&upstream).await else {
        return;
    };
    if up.write_all(request.as_bytes()).await.is_err()
        || up.write_all(&buf[head_end..]).await.is_err()
    {
        return;
    }
    let mut answer = Vec::new();
    let _ = up.read_to_end(&mut answer).await;
    let _ = tcp.write_all(&answer).await;
    let _ = tcp.shutdown().await;
}

/// `url` with query parameter `name` replaced by `value` (`None` removes it).
pub(crate) fn with_query(url: &str, name: &str, value: Option<&str>) -> String {
    let (base, query) = url.split_once('?').unwrap();
    let pairs: Vec<String> = query
        .split('&')
        .filter_map(|pair| {
            let key = pair.split('=').next().unwrap();
            if key != name {
                Some(pair.to_owned())
            } else {
                value.map(|v| format!("{name}={v}"))
            }
        })
        .collect();
    format!("{base}?{}", pairs.join("&"))
}

pub(crate) fn query_value(url: &str, name: &str) -> String {
    let query = url.split_once('?').unwrap().1;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix(&format!("{name}=")))
        .unwrap()
        .to_owned()
}

pub(crate) fn status_of<T: std::fmt::Debug>(
    result: Result<T, exec_server_relay_core::registry::RegistryError>,
) -> u16 {
    result
        .expect_err("the registry must refuse")
        .status()
        .unwrap()
}

/// Polls `call` until it answers `want` (a status, or 200 for success).
pub(crate) async fn until_status<T, F, Fut>(what: &str, want: u16, mut call: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, exec_server_relay_core::registry::RegistryError>>,
{
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        match call().await {
            Ok(value) if want == 200 => return Some(value),
            Err(e) if e.status() == Some(want) => return None,
            _ => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} never answered {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Hands the harness connector one fixed bundle (no registry involved).
pub(crate) struct StaticBundle(pub(crate) ConnectBundle);

#[exec_server_core::async_trait]
impl RelayBundleProvider for StaticBundle {
    async fn connect_bundle(
        &self,
        _environment_id: &str,
        _key: &NoisePublicKey,
    ) -> Result<ConnectBundle, RelayError> {
        Ok(self.0.clone())
    }
}

/// `exec-server run --remote <registry> --environment-id <environment> <extra> -- <command>`
/// with the harness token: (exit code, stdout, stderr).
pub(crate) async fn run_remote(
    registry: &str,
    environment: &str,
    extra: &[&str],
    command: &[&str],
) -> (Option<i32>, String, String) {
    let mut args = vec!["run", "--remote", registry, "--environment-id", environment];
    args.extend(extra);
    args.push("--no-stdin");
    args.push("--");
    args.extend(command);
    let mut run = server_command(&args);
    run.env("EXEC_SERVER_RELAY_TOKEN", HARNESS_TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let output = tokio::time::timeout(STEP_TIMEOUT, run.output())
        .await
        .expect("exec-server run finished")
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

//! Remote mode end to end: the real `exec-server rendezvous` and `exec-server --remote`
//! processes on loopback, a harness speaking JSON-RPC through the relay with the library's
//! connector, and a WebSocket proxy in between that captures, drops, duplicates, reorders
//! and cuts frames.

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

const EXECUTOR_TOKEN: &str = "executor-token-for-tests";
const HARNESS_TOKEN: &str = "harness-token-for-tests";

fn sha256_hex(text: &str) -> String {
    use std::fmt::Write;
    let digest = ring_digest(text.as_bytes());
    digest.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn ring_digest(bytes: &[u8]) -> Vec<u8> {
    // The relay crate exposes SHA-256 through its token digest helper.
    exec_server_rendezvous::signing::token_digest(std::str::from_utf8(bytes).unwrap()).to_vec()
}

/// A running `exec-server rendezvous`.
struct Rendezvous {
    child: Child,
    /// The first stdout line (the public URL).
    url: String,
    /// The address it listens on.
    direct: String,
    _config: tempfile::TempPath,
}

async fn start_rendezvous(public_url: Option<&str>) -> Rendezvous {
    start_rendezvous_with(public_url, "").await
}

/// A rendezvous whose `[rendezvous]` table also holds `settings` (small limits, short grace).
async fn start_rendezvous_with(public_url: Option<&str>, settings: &str) -> Rendezvous {
    // A free port, so the direct URL is known even when a public URL is printed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("http://127.0.0.1:{port}");
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
    let mut cmd = server_command(&args);
    cmd.env(
        "EXEC_SERVER_RENDEZVOUS_SIGNING_KEY",
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
    );
    let mut child = cmd.spawn().expect("spawn rendezvous");
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
    let url = line.trim().to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    Rendezvous {
        child,
        url,
        direct: listen,
        _config: config,
    }
}

fn start_executor(registry: &str, environment: &str) -> Child {
    let mut cmd = server_command(&["--remote", registry, "--environment-id", environment]);
    cmd.env("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN);
    cmd.spawn().expect("spawn executor")
}

/// An executor started with `--config` holding `toml` (a `[relay]` table and others).
struct Executor {
    child: Child,
    _config: tempfile::TempPath,
}

fn start_executor_with(registry: &str, environment: &str, toml: &str) -> Executor {
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

fn harness_args(registry: &str, environment: &str) -> RelayConnectArgs {
    RelayConnectArgs::new(registry, environment, SecretString::new(HARNESS_TOKEN))
}

/// Connects, retrying while the executor is still starting (404/503).
async fn connect(args: RelayConnectArgs) -> RelayConnection {
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

/// A JSON-RPC client over one relay stream.
struct RelayClient {
    conn: RelayConnection,
    next_id: i64,
    pending: Vec<Value>,
}

impl RelayClient {
    async fn open(args: RelayConnectArgs) -> Self {
        Self::open_with(args, json!({"clientName": "relay-tests-client"}))
            .await
            .0
    }

    /// Opens a stream and initializes it with `params`; returns the `initialize` result.
    async fn open_with(args: RelayConnectArgs, params: Value) -> (Self, Value) {
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
    async fn ended(&mut self) -> Option<RelayError> {
        stream_end(&mut self.conn).await
    }

    async fn next(&mut self) -> Value {
        let bytes = tokio::time::timeout(STEP_TIMEOUT, self.conn.recv())
            .await
            .expect("timed out waiting for a relay message")
            .unwrap_or_else(|| panic!("relay stream ended: {:?}", self.conn.error()));
        serde_json::from_slice(&bytes).unwrap()
    }

    async fn request(&mut self, method: &str, params: Value) -> Result<Value, Value> {
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

    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.request(method, params)
            .await
            .unwrap_or_else(|e| panic!("{method} failed: {e}"))
    }
}

fn into_result(mut message: Value) -> Result<Value, Value> {
    match message.get_mut("error") {
        Some(e) => Err(e.take()),
        None => Ok(message["result"].take()),
    }
}

/// Which endpoint a proxied socket belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Executor,
    Harness,
}

/// One binary message seen by the proxy.
#[derive(Debug, Clone)]
struct Captured {
    side: Side,
    /// Sent by the endpoint towards the rendezvous.
    up: bool,
    /// Index of the proxied socket (in accept order).
    socket: usize,
    bytes: Vec<u8>,
}

/// Faults the proxy applies, and what it observed.
#[derive(Default)]
struct Faults {
    lossy: AtomicBool,
    /// Cuts every executor socket.
    cut: tokio::sync::Notify,
    /// Cuts every harness socket.
    cut_harness: tokio::sync::Notify,
    /// Executor upgrades are refused with 503 while set.
    refuse_executor: AtomicBool,
    refused_executor: AtomicUsize,
    /// Messages to write to the current executor socket, as a router that does not
    /// validate would (RELAY §2.5).
    inject: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Message>>>,
    /// The same towards the most recent harness socket.
    inject_harness: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Message>>>,
    /// Sides of the sockets proxied so far, in accept order.
    sockets: Mutex<Vec<Side>>,
    /// 1 + the index of a socket whose endpoint side is no longer read (so its Pings go
    /// unanswered); 0 for none.
    freeze: AtomicUsize,
    /// Close codes sent by endpoints.
    closes: Mutex<Vec<(Side, Option<u16>)>>,
    /// Close codes sent by the rendezvous, by the side of the socket.
    router_closes: Mutex<Vec<(Side, Option<u16>)>>,
}

/// A WebSocket proxy in front of the rendezvous: records every frame and optionally
/// drops, duplicates, reorders, injects and cuts.
struct Proxy {
    url: String,
    frames: Arc<Mutex<Vec<Captured>>>,
    faults: Arc<Faults>,
}

impl Proxy {
    fn executor_sockets(&self) -> usize {
        let sockets = self.faults.sockets.lock().unwrap();
        sockets.iter().filter(|s| **s == Side::Executor).count()
    }

    fn closes(&self, side: Side) -> Vec<Option<u16>> {
        let closes = self.faults.closes.lock().unwrap();
        closes
            .iter()
            .filter(|(s, _)| *s == side)
            .map(|(_, c)| *c)
            .collect()
    }

    /// Waits until `condition` holds (bounded by the step timeout).
    async fn wait_for(&self, what: &str, condition: impl Fn(&Self) -> bool) {
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
    async fn inject(&self, message: Message) {
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
async fn proxied_rendezvous(settings: &str) -> (Proxy, Rendezvous) {
    let upstream = Arc::new(Mutex::new(String::new()));
    let proxy = start_proxy(Arc::clone(&upstream)).await;
    let rdv = start_rendezvous_with(Some(&proxy.url), settings).await;
    *upstream.lock().unwrap() = rdv.direct.clone();
    (proxy, rdv)
}

async fn start_proxy(upstream_port_file: Arc<Mutex<String>>) -> Proxy {
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
async fn proxy_socket(
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

fn is_faultable(m: &Message) -> bool {
    let Message::Binary(b) = m else { return false };
    matches!(
        proto::decode(b).ok().and_then(|f| f.body),
        Some(Body::Data(_) | Body::AckFrame(_) | Body::Resume(_) | Body::Handshake(_))
    )
}

#[tokio::test]
async fn two_streams_share_one_executor_socket_without_cross_talk() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-two");
    let mut a = RelayClient::open(harness_args(&rdv.url, "env-two")).await;
    let mut b = RelayClient::open(harness_args(&rdv.url, "env-two")).await;
    assert_ne!(a.conn.stream_id(), b.conn.stream_id());
    for _ in 0..5 {
        let (ra, rb) = tokio::join!(
            a.call("environment/status", json!({})),
            b.call("environment/status", json!({}))
        );
        assert_eq!(ra["status"], "ready");
        assert_eq!(rb["status"], "ready");
    }
    assert!(
        a.pending.is_empty() && b.pending.is_empty(),
        "no stray messages"
    );
    // Closing one stream leaves the other working.
    a.conn.abort();
    assert_eq!(
        b.call("environment/status", json!({})).await["status"],
        "ready"
    );
}

#[tokio::test]
async fn large_file_through_a_lossy_proxy_without_plaintext_on_the_wire() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    assert_eq!(rdv.url, proxy.url);
    let _executor = start_executor(&rdv.direct, "env-lossy");
    let mut client = RelayClient::open(harness_args(&rdv.direct, "env-lossy")).await;
    proxy.faults.lossy.store(true, Ordering::SeqCst);

    let dir = tempfile::tempdir().unwrap();
    let marker = "MARKER-7d1f0c";
    let mut content = Vec::new();
    while content.len() < 3 * 1024 * 1024 / 2 {
        content.extend_from_slice(format!("{marker} line {}\n", content.len()).as_bytes());
    }
    let path = dir.path().join("big.txt");
    std::fs::write(&path, &content).unwrap();
    let uri = format!("file://{}", path.display());
    match client.request("fs/readFile", json!({"path": uri})).await {
        Ok(result) => {
            let data = result["dataBase64"]
                .as_str()
                .map(|s| crate::util::b64decode(&json!(s)))
                .expect("dataBase64");
            assert_eq!(data, content, "byte for byte through the lossy relay");
        }
        Err(e) => panic!("fs/readFile failed: {e}"),
    }
    for _ in 0..20 {
        assert_eq!(
            client.call("environment/status", json!({})).await["status"],
            "ready"
        );
    }
    // The executor's socket is cut mid-session; the stream resumes.
    proxy.faults.cut.notify_waiters();
    for _ in 0..5 {
        assert_eq!(
            client.call("environment/status", json!({})).await["status"],
            "ready"
        );
    }
    let frames: Vec<Vec<u8>> = proxy
        .frames
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.bytes.clone())
        .collect();
    assert!(
        frames
            .iter()
            .filter(|f| matches!(
                proto::decode(f).ok().and_then(|f| f.body),
                Some(Body::Data(_))
            ))
            .count()
            >= 4
    );
    for needle in [
        "initialize",
        "fs/readFile",
        "environment/status",
        "relay-tests-client",
        marker,
    ] {
        assert!(
            !frames
                .iter()
                .any(|f| f.windows(needle.len()).any(|w| w == needle.as_bytes())),
            "plaintext `{needle}` seen on the wire"
        );
    }
}

struct FixedBundles {
    registry: RegistryClient,
    tamper_key: bool,
    tamper_authz: bool,
}

#[exec_server_core::async_trait]
impl RelayBundleProvider for FixedBundles {
    async fn connect_bundle(
        &self,
        environment_id: &str,
        key: &NoisePublicKey,
    ) -> Result<ConnectBundle, RelayError> {
        let mut bundle = self.registry.connect(environment_id, key).await?;
        if self.tamper_key {
            bundle.executor_public_key = NoiseIdentity::generate().public();
        }
        if self.tamper_authz {
            let text = bundle.harness_key_authorization.expose().to_owned();
            bundle.harness_key_authorization =
                SecretString::new(format!("{}x", &text[..text.len() - 1]));
        }
        Ok(bundle)
    }
}

#[tokio::test]
async fn wrong_executor_key_and_invalid_authorization_are_rejected() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-reject");
    // Make sure the executor is up.
    let _ok = RelayClient::open(harness_args(&rdv.url, "env-reject")).await;
    let registry = RegistryClient::new(
        BaseUrl::parse(&rdv.url, false).unwrap(),
        SecretString::new(HARNESS_TOKEN),
        Duration::from_secs(10),
        false,
    );
    for (tamper_key, tamper_authz, reason) in [
        (true, false, "handshake_failed"),
        (false, true, "unauthorized"),
    ] {
        let mut args = harness_args(&rdv.url, "env-reject");
        args.bundle_provider = Some(Arc::new(FixedBundles {
            registry: registry.clone(),
            tamper_key,
            tamper_authz,
        }));
        let error = connect_relay(args).await.expect_err("must be rejected");
        assert_eq!(error, RelayError::Reset(reason.into()));
    }
}

// ---- raw sockets and registry calls ---------------------------------------------------

type RawWs =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn registry_as(url: &str, token: &str) -> RegistryClient {
    RegistryClient::new(
        BaseUrl::parse(url, false).unwrap(),
        SecretString::new(token),
        Duration::from_secs(10),
        false,
    )
}

/// Waits for the stream to end and returns why (`None` for an orderly end).
async fn stream_end(conn: &mut RelayConnection) -> Option<RelayError> {
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
async fn harness_bundle(url: &str, environment: &str) -> ConnectBundle {
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
async fn upgrade(url: &str) -> Result<RawWs, u16> {
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

async fn open_raw(url: &str) -> RawWs {
    upgrade(url)
        .await
        .unwrap_or_else(|status| panic!("upgrade refused with {status}"))
}

enum Raw {
    Frame(proto::RelayMessageFrame),
    Closed(Option<u16>),
}

async fn raw_next(ws: &mut RawWs) -> Raw {
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
async fn raw_close_code(ws: &mut RawWs) -> Option<u16> {
    loop {
        if let Raw::Closed(code) = raw_next(ws).await {
            return code;
        }
    }
}

/// The next Reset on the socket: (stream id, reason).
async fn raw_reset(ws: &mut RawWs) -> (String, String) {
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
async fn assert_alive(ws: &mut RawWs) {
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

async fn send_frame(ws: &mut RawWs, frame: &proto::RelayMessageFrame) {
    ws.send(Message::Binary(proto::encode(frame)))
        .await
        .unwrap();
}

fn new_stream_id() -> String {
    NoiseIdentity::generate().public().to_base64()[..20]
        .replace(['+', '/'], "-")
        .to_lowercase()
}

/// A frame with a wrong version for `stream_id` (§2.5 row 4).
fn version_two(stream_id: &str) -> proto::RelayMessageFrame {
    let mut frame = proto::frame(stream_id, 0, 0, proto::ack_body());
    frame.version = 2;
    frame
}

/// A registry in front of the rendezvous that can hold or refuse `/validate` calls and
/// counts `/register` calls (plain HTTP/1.1, one request per connection).
#[derive(Default)]
struct RegistryGate {
    url: String,
    hold_validate: AtomicBool,
    held: AtomicUsize,
    release: tokio::sync::Notify,
    registers: AtomicUsize,
    validates: AtomicUsize,
    /// When non-zero, `/validate` and `/register` are answered with this status.
    refuse_validate: AtomicUsize,
    refuse_register: AtomicUsize,
}

async fn start_gate(upstream: &str) -> Arc<RegistryGate> {
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

async fn gate_request(mut tcp: tokio::net::TcpStream, gate: Arc<RegistryGate>, upstream: String) {
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

// ---- interoperability -----------------------------------------------------------------

/// The harness written in Python against the `noiseprotocol` package (RELAY §3 with an
/// independent Noise implementation) talks to a real rendezvous and executor.
/// Fails (never skips) when the interop tests cannot run: CI installs the package.
async fn require_python_noise() {
    const INSTALL: &str = "python3 -m pip install --quiet noiseprotocol==0.3.1";
    let probe = tokio::process::Command::new("python3")
        .args(["-c", "import noise.connection, cryptography"])
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!("python3 is needed for the Noise interop tests ({e}); then: {INSTALL}")
        });
    assert!(
        probe.status.success(),
        "the Python package noiseprotocol is missing; install it with: {INSTALL}\n{}",
        String::from_utf8_lossy(&probe.stderr)
    );
}

fn interop_script(name: &str) -> String {
    format!("{}/tests/relay_interop/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn python_noiseprotocol_harness_interoperates_with_the_executor() {
    require_python_noise().await;

    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-python");
    let dir = tempfile::tempdir().unwrap();
    let script = interop_script("noise_harness.py");
    let run = tokio::process::Command::new("python3")
        .args([
            &script,
            "--registry",
            &rdv.url,
            "--environment",
            "env-python",
            "--workdir",
            dir.path().to_str().unwrap(),
        ])
        .env("EXEC_SERVER_RELAY_TOKEN", HARNESS_TOKEN)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(STEP_TIMEOUT * 3, run)
        .await
        .expect("the Python harness did not finish")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the Python harness failed ({}): {stderr}",
        output.status
    );
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("bad report ({e}): {stderr}"));
    // The prologue of §3.3 as the script builds it.
    assert_eq!(
        report["prologue_vector_sha256"],
        "61104073ea47510b85d9020fe87609c449d3b09aaa44c264d8834e112f6e69f1"
    );
    // IK message sizes of §3.4: msg1 = 96 + P, msg2 = 48.
    assert_eq!(
        report["msg1_len"].as_u64().unwrap(),
        96 + report["authorization_len"].as_u64().unwrap()
    );
    assert_eq!(report["msg2_len"], 48);
    // JSON-RPC answers decrypted by Python.
    assert!(report["session_id"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(report["status"], json!({"status": "ready"}));
    assert_eq!(
        report["shared_record"],
        json!([{"status": "ready"}, {"status": "ready"}])
    );
    assert_eq!(report["split_prefix"], json!({"status": "ready"}));
    // A 120,000-byte file through fs/writeFile and fs/readFile: multi-record messages in
    // both directions, full-size records from the executor.
    assert_eq!(report["file_written_by_executor"], true);
    assert_eq!(report["file_read_back"], true);
    assert!(report["records_for_read"].as_u64().unwrap() >= 3);
    assert_eq!(report["largest_record"], 61_440);
    assert_eq!(report["executor_ack"], report["records_sent"]);
    // A record with one flipped bit.
    assert_eq!(report["tampered_reset"], "decrypt_failed");
}

// ---- process/* through the relay ------------------------------------------------------

#[tokio::test]
async fn process_start_through_the_relay_streams_output_exit_and_close() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-process");
    let mut client = RelayClient::open(harness_args(&rdv.url, "env-process")).await;
    let started = client
        .call(
            "process/start",
            json!({
                "processId": "relay-proc",
                "argv": ["/bin/sh", "-c", "IFS= read -r line; printf 'out:%s\\n' \"$line\"; printf 'err-line\\n' >&2; exit 3"],
                "cwd": "file:///tmp",
                "env": {"PATH": "/usr/bin:/bin"},
                "tty": false,
                "pipeStdin": true,
            }),
        )
        .await;
    assert_eq!(started["processId"], "relay-proc");
    let written = client
        .call(
            "process/write",
            json!({"processId": "relay-proc", "chunk": crate::util::b64("through-the-relay\n"), "writeId": "w1"}),
        )
        .await;
    assert_eq!(written["accepted"], true, "{written}");
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut last_seq = 0;
    let mut exit_code = None;
    loop {
        let event = if client.pending.is_empty() {
            client.next().await
        } else {
            client.pending.remove(0)
        };
        assert_eq!(event["params"]["processId"], "relay-proc", "{event}");
        let seq = event["params"]["seq"].as_u64().unwrap();
        assert!(seq > last_seq, "notification seq goes up: {event}");
        last_seq = seq;
        match event["method"].as_str().unwrap() {
            "process/output" => {
                let chunk = crate::util::b64decode(&event["params"]["chunk"]);
                match event["params"]["stream"].as_str().unwrap() {
                    "stdout" => stdout.extend(chunk),
                    "stderr" => stderr.extend(chunk),
                    other => panic!("unexpected stream {other}"),
                }
            }
            "process/exited" => {
                assert!(exit_code.is_none(), "exited twice");
                exit_code = event["params"]["exitCode"].as_i64();
            }
            "process/closed" => break,
            other => panic!("unexpected notification {other}"),
        }
    }
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        "out:through-the-relay\n"
    );
    assert_eq!(String::from_utf8(stderr).unwrap(), "err-line\n");
    assert_eq!(exit_code, Some(3), "process/exited precedes process/closed");
}

// ---- frame rules and budgets (RELAY §2.5, §6.2, §8.6) ------------------------------------

#[tokio::test]
async fn rendezvous_closes_harness_sockets_for_text_oversize_and_invalid_frames() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-frames");
    let bundle = harness_bundle(&rdv.url, "env-frames").await;

    let mut ws = open_raw(&bundle.url).await;
    ws.send(Message::text("{}")).await.unwrap();
    assert_eq!(raw_close_code(&mut ws).await, Some(1003), "text message");

    let mut ws = open_raw(&bundle.url).await;
    let _ = ws.send(Message::binary(vec![0u8; 262_145])).await;
    assert_eq!(raw_close_code(&mut ws).await, Some(1009), "262,145 bytes");

    // Rows 3–9 of §2.5: seven invalid frames are dropped and the socket stays open.
    let sid = new_stream_id();
    let mut segmented = proto::frame(&sid, 0, 0, proto::data_body(1, vec![0u8; 32].into()));
    if let Some(Body::Data(d)) = &mut segmented.body {
        d.segment_count = 2;
    }
    let mut no_body = proto::frame(&sid, 0, 0, proto::ack_body());
    no_body.body = None;
    let invalid: Vec<Vec<u8>> = vec![
        vec![0xff, 0xff, 0xff],
        proto::encode(&version_two(&sid)).to_vec(),
        proto::encode(&segmented).to_vec(),
        proto::encode(&proto::frame(
            &sid,
            0,
            0,
            proto::data_body(1, vec![0u8; 61_457].into()),
        ))
        .to_vec(),
        proto::encode(&proto::frame(
            &sid,
            0,
            0,
            proto::data_body(0, vec![0u8; 32].into()),
        ))
        .to_vec(),
        proto::encode(&proto::frame(&sid, 0, 0, proto::handshake_body(Vec::new()))).to_vec(),
        proto::encode(&no_body).to_vec(),
        proto::encode(&proto::frame(
            &sid,
            0,
            0,
            proto::handshake_body(vec![1u8; 65_536]),
        ))
        .to_vec(),
    ];
    assert_eq!(invalid.len(), 8);
    let mut ws = open_raw(&bundle.url).await;
    for bytes in &invalid[..7] {
        ws.send(Message::binary(bytes.clone())).await.unwrap();
    }
    assert_alive(&mut ws).await;
    ws.send(Message::binary(invalid[7].clone())).await.unwrap();
    assert_eq!(
        raw_close_code(&mut ws).await,
        Some(1002),
        "the 8th invalid frame"
    );
}

#[tokio::test]
async fn executor_behind_a_non_validating_router_counts_invalid_frames() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor_with(
        &rdv.direct,
        "env-invalid",
        "[relay]\nreconnect_initial_backoff_ms = 50\nreconnect_max_backoff_ms = 200\n",
    );
    let mut a = RelayClient::open(harness_args(&rdv.direct, "env-invalid")).await;
    let mut b = RelayClient::open(harness_args(&rdv.direct, "env-invalid")).await;
    let mut c = RelayClient::open(harness_args(&rdv.direct, "env-invalid")).await;
    assert_eq!(proxy.executor_sockets(), 1);

    // An invalid frame naming an active stream resets that stream only.
    proxy
        .inject(Message::Binary(proto::encode(&version_two(
            b.conn.stream_id(),
        ))))
        .await;
    assert_eq!(
        b.ended().await,
        Some(RelayError::Reset("invalid_frame".into()))
    );
    // A data payload above 61,456 bytes is a record error, before any decryption.
    let oversized = proto::frame(
        c.conn.stream_id(),
        0,
        0,
        proto::data_body(1, vec![0u8; 61_457].into()),
    );
    proxy
        .inject(Message::Binary(proto::encode(&oversized)))
        .await;
    assert_eq!(
        c.ended().await,
        Some(RelayError::Reset("record_error".into()))
    );
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );

    // Five undecodable frames make seven invalid frames: the connection stays.
    for _ in 0..5 {
        proxy.inject(Message::binary(vec![0xffu8; 9])).await;
    }
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );
    assert_eq!(proxy.executor_sockets(), 1);
    assert!(proxy.closes(Side::Executor).is_empty());

    // The 8th closes it with 1002; the executor reconnects and the stream resumes.
    proxy.inject(Message::binary(vec![0xffu8; 9])).await;
    proxy
        .wait_for("close 1002", |p| p.closes(Side::Executor) == [Some(1002)])
        .await;
    proxy
        .wait_for("a reconnect", |p| p.executor_sockets() == 2)
        .await;
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );

    // A text message: 1003, reconnect, resume.
    proxy.inject(Message::text("not a frame")).await;
    proxy
        .wait_for("close 1003", |p| {
            p.closes(Side::Executor).contains(&Some(1003))
        })
        .await;
    proxy
        .wait_for("a reconnect", |p| p.executor_sockets() == 3)
        .await;
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );

    // A message above 256 KiB: 1009, reconnect, resume.
    proxy.inject(Message::binary(vec![0u8; 262_145])).await;
    proxy
        .wait_for("close 1009", |p| {
            p.closes(Side::Executor).contains(&Some(1009))
        })
        .await;
    proxy
        .wait_for("a reconnect", |p| p.executor_sockets() == 4)
        .await;
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );
}

#[tokio::test]
async fn failed_handshakes_close_the_executor_socket_with_1008_and_streams_resume() {
    use exec_server_relay_core::noise::{prologue, IkSuite, NoiseSuite};
    let (proxy, rdv) = proxied_rendezvous("").await;
    let gate = start_gate(&rdv.direct).await;
    let _executor = start_executor_with(
        &gate.url,
        "env-budget",
        "[relay]\nmax_failed_handshakes = 3\nreconnect_initial_backoff_ms = 50\n",
    );
    let mut a = RelayClient::open(harness_args(&rdv.direct, "env-budget")).await;
    let validations = gate.validates.load(Ordering::SeqCst);
    let identity = NoiseIdentity::generate();
    let bundle = registry_as(&rdv.direct, HARNESS_TOKEN)
        .connect("env-budget", &identity.public())
        .await
        .unwrap();
    // A real msg1 whose authorisation is not UTF-8 (§3.5 row 9).
    let not_utf8 = |sid: &str| {
        let p = prologue("env-budget", &bundle.executor_registration_id, sid);
        let mut initiator = IkSuite
            .initiator(&identity, &bundle.executor_public_key, &p)
            .unwrap();
        let mut buf = vec![0u8; 65_535];
        let n = initiator
            .write_message(&[0xff, 0xfe, 0x80], &mut buf)
            .unwrap();
        buf.truncate(n);
        buf
    };
    for attempt in 1..=3 {
        let mut ws = open_raw(&bundle.url).await;
        let sid = new_stream_id();
        let msg1 = match attempt {
            // Row 7: shorter than 97 bytes, no DH work.
            1 => vec![0x42u8; 96],
            // Row 8: not a Noise message for this executor.
            2 => vec![0x42u8; 100],
            _ => not_utf8(&sid),
        };
        send_frame(
            &mut ws,
            &proto::frame(&sid, 0, 0, proto::handshake_body(msg1)),
        )
        .await;
        assert_eq!(
            raw_reset(&mut ws).await,
            (sid, "handshake_failed".to_owned()),
            "attempt {attempt}"
        );
        if attempt < 3 {
            assert!(proxy.closes(Side::Executor).is_empty(), "attempt {attempt}");
        }
    }
    assert_eq!(
        gate.validates.load(Ordering::SeqCst),
        validations,
        "no /validate call for a failed handshake"
    );
    proxy
        .wait_for("close 1008", |p| p.closes(Side::Executor) == [Some(1008)])
        .await;
    proxy
        .wait_for("a reconnect", |p| p.executor_sockets() == 2)
        .await;
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );
}

#[tokio::test]
async fn stream_limit_refuses_extra_streams_without_counting_a_failure() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor_with(
        &rdv.direct,
        "env-streams",
        "[relay]\nmax_streams = 2\nmax_failed_handshakes = 1\n",
    );
    let mut a = RelayClient::open(harness_args(&rdv.direct, "env-streams")).await;
    let b = RelayClient::open(harness_args(&rdv.direct, "env-streams")).await;
    for _ in 0..3 {
        let error = connect_relay(harness_args(&rdv.direct, "env-streams"))
            .await
            .expect_err("a third stream is refused");
        assert_eq!(error, RelayError::Reset("stream_limit".into()));
    }
    // With a budget of one failure, a counted refusal would have closed the socket.
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );
    assert!(proxy.closes(Side::Executor).is_empty());
    assert_eq!(proxy.executor_sockets(), 1);
    // Once a stream ends there is room again.
    b.conn.abort();
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        match connect_relay(harness_args(&rdv.direct, "env-streams")).await {
            Ok(_) => break,
            Err(RelayError::Reset(r)) if r == "stream_limit" => {}
            Err(e) => panic!("{e}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no room after a close"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn pending_validations_are_bounded_and_time_out_without_msg2() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let gate = start_gate(&rdv.direct).await;
    let _executor = start_executor_with(
        &gate.url,
        "env-pending",
        "[relay]\nmax_pending_validations = 2\nmax_failed_handshakes = 1\nvalidate_timeout_ms = 1500\n",
    );
    // The executor is up once a stream works.
    let mut a = RelayClient::open(harness_args(&rdv.direct, "env-pending")).await;
    gate.hold_validate.store(true, Ordering::SeqCst);
    let first = tokio::spawn(connect_relay(harness_args(&rdv.direct, "env-pending")));
    let second = tokio::spawn(connect_relay(harness_args(&rdv.direct, "env-pending")));
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    while gate.held.load(Ordering::SeqCst) < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "validations never held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A third handshake while two are pending.
    let third = connect_relay(harness_args(&rdv.direct, "env-pending"))
        .await
        .expect_err("refused");
    assert_eq!(third, RelayError::Reset("validation_limit".into()));
    // Both pending handshakes end with validation_unavailable when the bound passes.
    for pending in [first, second] {
        let error = pending
            .await
            .unwrap()
            .expect_err("no msg2 without a validation");
        assert_eq!(error, RelayError::Reset("validation_unavailable".into()));
    }
    gate.release.notify_waiters();
    // No msg2 left the executor for those streams: the only handshake frames the
    // executor sent are msg2 of stream `a`.
    let msg2_count = proxy
        .frames
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.side == Side::Executor && c.up)
        .filter(|c| {
            matches!(
                proto::decode(&c.bytes).ok().and_then(|f| f.body),
                Some(Body::Handshake(_))
            )
        })
        .count();
    assert_eq!(msg2_count, 1);
    // None of it counted as a failed handshake (budget 1): same socket, stream alive.
    assert!(proxy.closes(Side::Executor).is_empty());
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );
    gate.hold_validate.store(false, Ordering::SeqCst);
    RelayClient::open(harness_args(&rdv.direct, "env-pending")).await;
}

#[tokio::test]
async fn json_rpc_message_limit_is_enforced_on_both_directions() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor_with(
        &rdv.url,
        "env-msgsize",
        "[limits]\nmax_message_bytes = 65536\n",
    );
    // A response above the executor's limit becomes a -32603 error; the stream goes on.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.bin");
    std::fs::write(&path, vec![b'x'; 60_000]).unwrap();
    let mut client = RelayClient::open(harness_args(&rdv.url, "env-msgsize")).await;
    let error = client
        .request(
            "fs/readFile",
            json!({"path": format!("file://{}", path.display())}),
        )
        .await
        .expect_err("too large");
    assert_eq!(error["code"], -32603, "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("exceeds the maximum message size of 65536 bytes"),
        "{error}"
    );
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
    // A request whose length prefix is above the executor's limit: Reset{record_error}.
    let big =
        json!({"id": 99, "method": "environment/status", "params": {"pad": "y".repeat(70_000)}});
    client.conn.send(big.to_string()).await.unwrap();
    assert_eq!(
        client.ended().await,
        Some(RelayError::Reset("record_error".into()))
    );
}

// ---- rendezvous service (RELAY §8) ------------------------------------------------------

/// `url` with query parameter `name` replaced by `value` (`None` removes it).
fn with_query(url: &str, name: &str, value: Option<&str>) -> String {
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

fn query_value(url: &str, name: &str) -> String {
    let query = url.split_once('?').unwrap().1;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix(&format!("{name}=")))
        .unwrap()
        .to_owned()
}

fn status_of<T: std::fmt::Debug>(
    result: Result<T, exec_server_relay_core::registry::RegistryError>,
) -> u16 {
    result
        .expect_err("the registry must refuse")
        .status()
        .unwrap()
}

#[tokio::test]
async fn registry_bearer_tokens_and_connect_answers() {
    let rdv = start_rendezvous(None).await;
    let key = NoiseIdentity::generate().public();
    let unknown = registry_as(&rdv.url, "not-a-configured-token");
    let executor = registry_as(&rdv.url, EXECUTOR_TOKEN);
    let harness = registry_as(&rdv.url, HARNESS_TOKEN);
    // Unknown token: 401 on every call.
    assert_eq!(
        status_of(unknown.register("env-tokens", &key, None).await),
        401
    );
    assert_eq!(status_of(unknown.connect("env-tokens", &key).await), 401);
    assert_eq!(
        status_of(
            unknown
                .validate("env-tokens", "reg-x", &key, "v1.x.y")
                .await
        ),
        401
    );
    // Wrong role: 403.
    assert_eq!(
        status_of(harness.register("env-tokens", &key, None).await),
        403
    );
    assert_eq!(
        status_of(
            harness
                .validate("env-tokens", "reg-x", &key, "v1.x.y")
                .await
        ),
        403
    );
    assert_eq!(status_of(executor.connect("env-tokens", &key).await), 403);
    // The executor token only covers `env-*`.
    assert_eq!(
        status_of(executor.register("other-1", &key, None).await),
        403
    );
    // connect: never registered → 404; registered, never attached → 503 + Retry-After: 1.
    let error = harness.connect("env-tokens", &key).await.unwrap_err();
    assert_eq!(error.status(), Some(404));
    assert!(
        error.to_string().contains("environment_not_found"),
        "{error}"
    );
    executor.register("env-tokens", &key, None).await.unwrap();
    let error = harness.connect("env-tokens", &key).await.unwrap_err();
    assert_eq!(error.status(), Some(503));
    assert!(
        error.to_string().contains("executor_unavailable"),
        "{error}"
    );
    assert_eq!(error.retry_after(), Some(Duration::from_secs(1)));
}

/// Polls `call` until it answers `want` (a status, or 200 for success).
async fn until_status<T, F, Fut>(what: &str, want: u16, mut call: F) -> Option<T>
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

#[tokio::test]
async fn rendezvous_upgrade_answers_standby_and_registration_expiry() {
    let rdv = start_rendezvous_with(None, "grace_secs = 1\nregistration_ttl_secs = 2").await;
    let executor = registry_as(&rdv.url, EXECUTOR_TOKEN);
    let harness = registry_as(&rdv.url, HARNESS_TOKEN);
    let (key_a, key_b) = (
        NoiseIdentity::generate().public(),
        NoiseIdentity::generate().public(),
    );
    let reg_a = executor
        .register("env-upgrade", &key_a, None)
        .await
        .unwrap();
    // Same key: the same registration again.
    let again = executor
        .register("env-upgrade", &key_a, None)
        .await
        .unwrap();
    assert_eq!(
        again.executor_registration_id,
        reg_a.executor_registration_id
    );

    // §8.4 upgrade checks, in order.
    assert_eq!(
        upgrade(&with_query(&reg_a.url, "exp", None)).await.err(),
        Some(400)
    );
    assert_eq!(
        upgrade(&with_query(&reg_a.url, "role", Some("auditor")))
            .await
            .err(),
        Some(400)
    );
    let sig = query_value(&reg_a.url, "sig");
    let tampered = format!(
        "{}{}",
        if sig.starts_with('A') { "B" } else { "A" },
        &sig[1..]
    );
    assert_eq!(
        upgrade(&with_query(&reg_a.url, "sig", Some(&tampered)))
            .await
            .err(),
        Some(401)
    );
    assert_eq!(
        upgrade(&with_query(&reg_a.url, "sig", None)).await.err(),
        Some(401)
    );
    let exp: u64 = query_value(&reg_a.url, "exp").parse().unwrap();
    let later = (exp + 1).to_string();
    assert_eq!(
        upgrade(&with_query(&reg_a.url, "exp", Some(&later)))
            .await
            .err(),
        Some(401)
    );

    let mut socket_a = open_raw(&reg_a.url).await;
    // A harness URL used as an executor URL: the signature covers the role.
    let bundle = harness_bundle(&rdv.url, "env-upgrade").await;
    let as_executor = with_query(
        &with_query(&bundle.url, "role", Some("environment")),
        "kh",
        None,
    );
    assert_eq!(upgrade(&as_executor).await.err(), Some(401));
    // Standby: another key gets 409 while the first executor is attached.
    assert_eq!(
        status_of(executor.register("env-upgrade", &key_b, None).await),
        409
    );
    socket_a.close(None).await.unwrap();
    // After the grace the second executor takes over.
    let reg_b = until_status("register B", 200, || {
        executor.register("env-upgrade", &key_b, None)
    })
    .await
    .unwrap();
    assert_ne!(
        reg_b.executor_registration_id,
        reg_a.executor_registration_id
    );
    let mut socket_b = open_raw(&reg_b.url).await;
    let _ = harness_bundle(&rdv.url, "env-upgrade").await;
    // The first executor returns: 410 on its upgrade, 409 on its register.
    assert_eq!(upgrade(&reg_a.url).await.err(), Some(410));
    assert_eq!(
        status_of(executor.register("env-upgrade", &key_a, None).await),
        409
    );
    assert_alive(&mut socket_b).await;

    // A harness upgrade while no executor is attached and none in its grace: 503.
    let bundle = harness_bundle(&rdv.url, "env-upgrade").await;
    socket_b.close(None).await.unwrap();
    let probe_key = NoiseIdentity::generate().public();
    until_status("connect", 503, || {
        harness.connect("env-upgrade", &probe_key)
    })
    .await;
    assert_eq!(upgrade(&bundle.url).await.err(), Some(503));
    // The detached registration is deleted after registration_ttl_secs: 404.
    until_status("connect", 404, || {
        harness.connect("env-upgrade", &probe_key)
    })
    .await;
    assert_eq!(upgrade(&reg_b.url).await.err(), Some(404));
}

#[tokio::test]
async fn rendezvous_capacity_limits_and_parked_routes() {
    let rdv = start_rendezvous_with(
        None,
        "grace_secs = 1\nmax_environments = 2\nmax_harness_sockets_per_environment = 1\nmax_parked_streams_per_environment = 2",
    )
    .await;
    let executor = registry_as(&rdv.url, EXECUTOR_TOKEN);
    let key = NoiseIdentity::generate().public();
    let reg = executor.register("env-cap-1", &key, None).await.unwrap();
    executor.register("env-cap-2", &key, None).await.unwrap();
    let error = executor
        .register("env-cap-3", &key, None)
        .await
        .unwrap_err();
    assert_eq!(error.status(), Some(503));
    assert!(error.to_string().contains("overloaded"), "{error}");

    let mut exec_ws = open_raw(&reg.url).await;
    let bundle = harness_bundle(&rdv.url, "env-cap-1").await;
    let mut harness_ws = open_raw(&bundle.url).await;
    assert_eq!(
        upgrade(&bundle.url).await.err(),
        Some(503),
        "second harness socket"
    );

    // Frames from the executor for streams no harness has bound yet park their routes,
    // up to two; the third gets Reset{unknown_stream}.
    let (s1, s2, s3) = (new_stream_id(), new_stream_id(), new_stream_id());
    let held = proto::frame(&s1, 4, 0, proto::resume_body(7));
    send_frame(&mut exec_ws, &held).await;
    send_frame(
        &mut exec_ws,
        &proto::frame(&s2, 0, 0, proto::resume_body(3)),
    )
    .await;
    send_frame(
        &mut exec_ws,
        &proto::frame(&s3, 0, 0, proto::resume_body(3)),
    )
    .await;
    assert_eq!(
        raw_reset(&mut exec_ws).await,
        (s3, "unknown_stream".to_owned())
    );
    // A harness binding to s1 receives the held resume, byte for byte.
    send_frame(
        &mut harness_ws,
        &proto::frame(&s1, 0, 0, proto::resume_body(0)),
    )
    .await;
    match raw_next(&mut harness_ws).await {
        Raw::Frame(f) => assert_eq!(f, held),
        Raw::Closed(code) => panic!("closed {code:?}"),
    }
    // s2 stays parked past the grace: the executor learns harness_unavailable.
    let (sid, reason) = loop {
        let (sid, reason) = raw_reset(&mut exec_ws).await;
        if sid != s1 {
            break (sid, reason);
        }
    };
    assert_eq!((sid, reason.as_str()), (s2, "harness_unavailable"));
    assert_alive(&mut harness_ws).await;
    // A text message on the executor socket: 1003.
    exec_ws.send(Message::text("{}")).await.unwrap();
    assert_eq!(raw_close_code(&mut exec_ws).await, Some(1003));
}

// ---- resume and grace (RELAY §5.8, §8.7) ------------------------------------------------

#[tokio::test]
async fn harness_socket_cut_resumes_the_same_stream_with_a_new_bundle() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor(&rdv.direct, "env-hcut");
    let (mut client, init) = RelayClient::open_with(
        harness_args(&rdv.direct, "env-hcut"),
        json!({"clientName": "relay-tests-client"}),
    )
    .await;
    let sid = client.conn.stream_id().to_owned();
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
    proxy.faults.cut_harness.notify_waiters();
    for _ in 0..3 {
        assert_eq!(
            client.call("environment/status", json!({})).await["status"],
            "ready"
        );
    }
    // The second harness socket began with resume for the same stream: no new handshake,
    // no second initialize.
    let frames = proxy.frames.lock().unwrap().clone();
    let sockets: Vec<usize> = {
        let mut s: Vec<usize> = frames
            .iter()
            .filter(|c| c.side == Side::Harness)
            .map(|c| c.socket)
            .collect();
        s.dedup();
        s
    };
    assert!(sockets.len() >= 2, "the harness reconnected: {sockets:?}");
    let first_on_second = frames
        .iter()
        .find(|c| c.side == Side::Harness && c.up && c.socket == sockets[1])
        .map(|c| proto::decode(&c.bytes).unwrap())
        .unwrap();
    assert_eq!(first_on_second.stream_id, sid);
    assert!(
        matches!(first_on_second.body, Some(Body::Resume(r)) if r.next_seq >= 1),
        "{first_on_second:?}"
    );
    assert!(init["sessionId"].is_string());
}

#[tokio::test]
async fn harness_receives_executor_unavailable_after_the_rendezvous_grace() {
    let rdv = start_rendezvous_with(None, "grace_secs = 1").await;
    let mut executor = start_executor(&rdv.url, "env-gone");
    let mut client = RelayClient::open(harness_args(&rdv.url, "env-gone")).await;
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
    executor.kill().await.unwrap();
    assert_eq!(
        client.ended().await,
        Some(RelayError::Reset("executor_unavailable".into()))
    );
}

#[tokio::test]
async fn harness_stream_is_lost_when_the_rendezvous_stays_away_past_its_grace() {
    let mut rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-lost");
    let mut args = harness_args(&rdv.url, "env-lost");
    args.resume_grace = Duration::from_millis(500);
    let mut client = RelayClient::open(args).await;
    rdv.child.kill().await.unwrap();
    assert_eq!(client.ended().await, Some(RelayError::Lost));
}

#[tokio::test]
async fn executor_drops_streams_after_its_grace_and_the_session_can_be_taken_over() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor_with(
        &rdv.direct,
        "env-xgrace",
        "[relay]\nresume_grace_ms = 300\nreconnect_initial_backoff_ms = 50\nreconnect_max_backoff_ms = 200\n",
    );
    let (mut client, init) = RelayClient::open_with(
        harness_args(&rdv.direct, "env-xgrace"),
        json!({"clientName": "relay-tests-client"}),
    )
    .await;
    let session = init["sessionId"].as_str().unwrap().to_owned();
    // Keep the executor away: its reconnect attempts are refused. Between five refused
    // attempts it sleeps 50, 100, 200 and 200 ms, more than its 300 ms grace.
    proxy.faults.refuse_executor.store(true, Ordering::SeqCst);
    proxy.faults.cut.notify_waiters();
    proxy
        .wait_for("refused reconnects", |p| {
            p.faults.refused_executor.load(Ordering::SeqCst) >= 5
        })
        .await;
    proxy.faults.refuse_executor.store(false, Ordering::SeqCst);
    proxy
        .wait_for("a reconnect", |p| p.executor_sockets() == 2)
        .await;
    // The executor dropped the stream: the harness's next record gets unknown_stream.
    client
        .conn
        .send(json!({"id": 50, "method": "environment/status", "params": {}}).to_string())
        .await
        .unwrap();
    assert_eq!(
        client.ended().await,
        Some(RelayError::Reset("unknown_stream".into()))
    );
    // The stream's session was detached, not killed: a new stream takes it over.
    let (_taken, resumed) = RelayClient::open_with(
        harness_args(&rdv.direct, "env-xgrace"),
        json!({"clientName": "relay-tests-client", "resumeSessionId": session}),
    )
    .await;
    assert_eq!(resumed["sessionId"], session.as_str());
}

#[tokio::test]
async fn validate_refused_with_401_registers_again_once_then_exits_on_a_refused_register() {
    let rdv = start_rendezvous(None).await;
    let gate = start_gate(&rdv.direct).await;
    let mut executor = start_executor_with(
        &gate.url,
        "env-revoked",
        "[relay]\nreconnect_initial_backoff_ms = 50\nmax_failed_handshakes = 1\n",
    );
    let mut a = RelayClient::open(harness_args(&rdv.url, "env-revoked")).await;
    assert_eq!(gate.registers.load(Ordering::SeqCst), 1);
    gate.refuse_validate.store(401, Ordering::SeqCst);
    let error = connect_relay(harness_args(&rdv.url, "env-revoked"))
        .await
        .expect_err("validation refused");
    assert_eq!(error, RelayError::Reset("validation_unavailable".into()));
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    while gate.registers.load(Ordering::SeqCst) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no second register");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The established stream carries on; the refusal was not a failed handshake.
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );
    assert_eq!(
        gate.registers.load(Ordering::SeqCst),
        2,
        "exactly one new register"
    );
    // Now the register is refused too: the executor exits with status 1.
    gate.refuse_register.store(403, Ordering::SeqCst);
    let refused = tokio::spawn(connect_relay(harness_args(&rdv.url, "env-revoked")));
    let status = tokio::time::timeout(STEP_TIMEOUT, executor.child.wait())
        .await
        .expect("the executor exits")
        .unwrap();
    assert_eq!(status.code(), Some(1));
    assert_eq!(gate.registers.load(Ordering::SeqCst), 3);
    // The Reset went out before the executor closed its socket.
    let error = refused.await.unwrap().expect_err("validation refused");
    assert_eq!(error, RelayError::Reset("validation_unavailable".into()));
    a.conn.abort();
}

#[tokio::test]
async fn executor_stopping_flushes_then_resets_streams_with_shutdown_and_exits_0() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let mut executor = start_executor_with(&rdv.direct, "env-stop", "");
    let mut client = RelayClient::open(harness_args(&rdv.direct, "env-stop")).await;
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
    let pid = executor.child.id().unwrap() as libc::pid_t;
    // SAFETY: sending SIGTERM to a child process this test started and still owns.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    assert_eq!(
        client.ended().await,
        Some(RelayError::Reset("shutdown".into()))
    );
    let status = tokio::time::timeout(STEP_TIMEOUT, executor.child.wait())
        .await
        .expect("the executor exits")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(proxy.closes(Side::Executor), [Some(1000)]);
}

#[tokio::test]
async fn retransmitted_msg1_gets_the_cached_msg2_and_another_msg1_is_a_duplicate() {
    use exec_server_relay_core::noise::{prologue, IkSuite, NoiseSuite};
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor_with(
        &rdv.direct,
        "env-dup",
        "[relay]\nmax_failed_handshakes = 1\nreconnect_initial_backoff_ms = 50\n",
    );
    // Wait for the executor with a throw-away key, then connect with the test's own key.
    harness_bundle(&rdv.direct, "env-dup").await;
    let identity = NoiseIdentity::generate();
    let bundle = registry_as(&rdv.direct, HARNESS_TOKEN)
        .connect("env-dup", &identity.public())
        .await
        .unwrap();
    let sid = new_stream_id();
    let p = prologue("env-dup", &bundle.executor_registration_id, &sid);
    let authorization = bundle
        .harness_key_authorization
        .expose()
        .as_bytes()
        .to_vec();
    let msg1 = || {
        let mut initiator = IkSuite
            .initiator(&identity, &bundle.executor_public_key, &p)
            .unwrap();
        let mut buf = vec![0u8; 65_535];
        let n = initiator.write_message(&authorization, &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    let first = msg1();
    let mut ws = open_raw(&bundle.url).await;
    let handshake =
        |payload: &[u8]| proto::frame(&sid, 0, 0, proto::handshake_body(payload.to_vec()));
    let next_msg2 = |frame: Raw| match frame {
        Raw::Frame(f) => match f.body {
            Some(Body::Handshake(h)) => h.payload,
            other => panic!("expected msg2, got {other:?}"),
        },
        Raw::Closed(code) => panic!("closed {code:?}"),
    };
    send_frame(&mut ws, &handshake(&first)).await;
    let msg2 = next_msg2(raw_next(&mut ws).await);
    assert_eq!(msg2.len(), 48);
    // The identical msg1 again, before any data: the cached msg2, byte for byte; nothing
    // is counted (the budget is one failure).
    send_frame(&mut ws, &handshake(&first)).await;
    assert_eq!(next_msg2(raw_next(&mut ws).await), msg2);
    assert!(proxy.closes(Side::Executor).is_empty());
    // Another msg1 (a new ephemeral key) for the same id: Reset{duplicate_stream}, counted.
    let second = msg1();
    assert_ne!(second, first);
    send_frame(&mut ws, &handshake(&second)).await;
    assert_eq!(
        raw_reset(&mut ws).await,
        (sid.clone(), "duplicate_stream".to_owned())
    );
    proxy
        .wait_for("close 1008", |p| p.closes(Side::Executor) == [Some(1008)])
        .await;
}

#[tokio::test]
async fn executor_declares_a_socket_dead_without_pongs_and_resumes_on_a_new_one() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor_with(
        &rdv.direct,
        "env-pong",
        "[relay]\nping_interval_ms = 100\npong_timeout_ms = 300\nreconnect_initial_backoff_ms = 50\n",
    );
    let mut client = RelayClient::open(harness_args(&rdv.direct, "env-pong")).await;
    let first = proxy
        .faults
        .sockets
        .lock()
        .unwrap()
        .iter()
        .position(|s| *s == Side::Executor)
        .unwrap();
    // Nothing the executor sends on its socket is read any more, so no Pong answers it,
    // while frames towards it still flow.
    proxy.faults.freeze.store(first + 1, Ordering::SeqCst);
    proxy
        .wait_for("a new executor socket", |p| p.executor_sockets() == 2)
        .await;
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
}

#[tokio::test]
async fn harness_sockets_are_bound_to_one_stream_and_one_key() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-bind");
    let mine = harness_bundle(&rdv.url, "env-bind").await;
    let other = harness_bundle(&rdv.url, "env-bind").await;
    let sid = new_stream_id();
    let claim = proto::frame(&sid, 0, 0, proto::resume_body(0));
    let mut ws = open_raw(&mine.url).await;
    send_frame(&mut ws, &claim).await;
    assert_alive(&mut ws).await;
    // Another harness key naming the same stream: 1008.
    let mut intruder = open_raw(&other.url).await;
    send_frame(&mut intruder, &claim).await;
    assert_eq!(raw_close_code(&mut intruder).await, Some(1008));
    // The same key on a new socket takes the stream over; the old socket gets 4002.
    let mut takeover = open_raw(&mine.url).await;
    send_frame(&mut takeover, &claim).await;
    assert_eq!(raw_close_code(&mut ws).await, Some(4002));
    // A second stream id on a bound socket: 1008.
    send_frame(
        &mut takeover,
        &proto::frame(&new_stream_id(), 0, 0, proto::resume_body(0)),
    )
    .await;
    assert_eq!(raw_close_code(&mut takeover).await, Some(1008));
}

/// Hands the harness connector one fixed bundle (no registry involved).
struct StaticBundle(ConnectBundle);

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

/// The library's harness connector (snow initiator) against a responder written in Python
/// with `noiseprotocol`: msg1, msg2 and records in both directions.
#[tokio::test]
async fn harness_connector_interoperates_with_a_python_noiseprotocol_responder() {
    require_python_noise().await;
    let authorization = "v1.python-interop-authorization";
    let mut child = tokio::process::Command::new("python3")
        .args([
            &interop_script("noise_executor.py"),
            "--environment",
            "env-py-exec",
            "--registration",
            "reg-python",
            "--authorization",
            authorization,
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut line))
        .await
        .expect("the Python responder announces itself")
        .unwrap();
    let hello: Value = serde_json::from_str(&line).expect("a JSON first line");
    let executor_key = NoisePublicKey::from_json(&json!({
        "suite": exec_server_relay_core::noise::SUITE_V1,
        "x25519_public_key": hello["public_key"],
    }))
    .unwrap();
    let identity = Arc::new(NoiseIdentity::generate());
    let bundle = ConnectBundle {
        environment_id: "env-py-exec".into(),
        url: format!(
            "ws://127.0.0.1:{}/ws/environment/env-py-exec?role=harness",
            hello["port"]
        ),
        security_profile: "noise_ik_v1".into(),
        executor_registration_id: "reg-python".into(),
        executor_public_key: executor_key,
        harness_key_authorization: SecretString::new(authorization),
    };
    let mut args = RelayConnectArgs::new(
        "http://127.0.0.1:9",
        "env-py-exec",
        SecretString::new("unused"),
    );
    args.identity = Some(Arc::clone(&identity));
    args.bundle_provider = Some(Arc::new(StaticBundle(bundle)));
    let (mut client, init) =
        RelayClient::open_with(args, json!({"clientName": "rust-harness-interop"})).await;
    assert_eq!(init, json!({"sessionId": "python-session"}));
    assert_eq!(
        client.call("environment/status", json!({})).await,
        json!({"status": "python-ready"})
    );
    // An orderly close: the stream flushes, then Reset{stream_closed}.
    drop(client);
    let mut report = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut report))
        .await
        .expect("the Python responder reports")
        .unwrap();
    let report: Value = serde_json::from_str(&report).expect("a JSON report");
    assert_eq!(report["authorization_matches"], true, "{report}");
    assert_eq!(
        report["harness_public_key"],
        identity.public().to_base64(),
        "the responder learned the pinned harness key"
    );
    assert_eq!(report["msg1_len"], 96 + authorization.len());
    assert_eq!(report["client_name"], "rust-harness-interop");
    assert_eq!(
        report["methods"],
        json!(["initialize", "initialized", "environment/status"])
    );
    assert_eq!(report["reset"], "stream_closed");
    assert!(child.wait().await.unwrap().success());
}

#[tokio::test]
async fn harness_resets_and_closes_on_an_undecodable_frame_or_a_text_message() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor(&rdv.direct, "env-hframes");
    for (message, code) in [
        (Message::binary(vec![0xffu8; 9]), 1002),
        (Message::text("not a frame"), 1003),
    ] {
        let mut client = RelayClient::open(harness_args(&rdv.direct, "env-hframes")).await;
        let sid = client.conn.stream_id().to_owned();
        let sender = proxy.faults.inject_harness.lock().unwrap().clone().unwrap();
        sender.send(message).unwrap();
        assert_eq!(
            client.ended().await,
            Some(RelayError::Reset("invalid_frame".into()))
        );
        proxy
            .wait_for("the harness close", |p| {
                p.closes(Side::Harness).contains(&Some(code))
            })
            .await;
        // The Reset for the stream went out before the close.
        let frames = proxy.frames.lock().unwrap().clone();
        assert!(frames.iter().any(|c| {
            c.side == Side::Harness
                && c.up
                && matches!(
                    proto::decode(&c.bytes),
                    Ok(f) if f.stream_id == sid
                        && matches!(&f.body, Some(Body::Reset(r)) if r.reason == "invalid_frame")
                )
        }));
    }
}

#[tokio::test]
async fn stopping_rendezvous_closes_every_socket_with_1001() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor(&rdv.direct, "env-1001");
    let _client = RelayClient::open(harness_args(&rdv.direct, "env-1001")).await;
    let pid = rdv.child.id().unwrap() as libc::pid_t;
    // SAFETY: sending SIGTERM to a child process this test started and still owns.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    proxy
        .wait_for("1001 on both sockets", |p| {
            let closes = p.faults.router_closes.lock().unwrap();
            closes.contains(&(Side::Executor, Some(1001)))
                && closes.contains(&(Side::Harness, Some(1001)))
        })
        .await;
}

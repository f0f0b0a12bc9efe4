//! Remote mode end to end: the real `exec-server rendezvous` and `exec-server --remote`
//! processes on loopback, a harness speaking JSON-RPC through the relay with the library's
//! connector, and a WebSocket proxy in between that captures, drops, duplicates, reorders
//! and cuts frames.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exec_server_relay::harness::{
    connect_relay, RelayBundleProvider, RelayConnectArgs, RelayConnection, RelayError,
};
use exec_server_relay::noise::{NoiseIdentity, NoisePublicKey};
use exec_server_relay::proto::{self, Body};
use exec_server_relay::registry::{BaseUrl, ConnectBundle, RegistryClient, SecretString};
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
    exec_server_relay::rendezvous::signing::token_digest(std::str::from_utf8(bytes).unwrap())
        .to_vec()
}

/// A running `exec-server rendezvous`.
struct Rendezvous {
    _child: Child,
    /// The first stdout line (the public URL).
    url: String,
    /// The address it listens on.
    direct: String,
    _config: tempfile::TempPath,
}

async fn start_rendezvous(public_url: Option<&str>) -> Rendezvous {
    // A free port, so the direct URL is known even when a public URL is printed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("http://127.0.0.1:{port}");
    let config = config_file(&format!(
        r#"
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
        _child: child,
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
        let mut client = Self {
            conn: connect(args).await,
            next_id: 1,
            pending: Vec::new(),
        };
        client
            .call("initialize", json!({"clientName": "relay-tests-client"}))
            .await;
        client
            .conn
            .send(json!({"method": "initialized", "params": {}}).to_string())
            .await
            .unwrap();
        client
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

/// Faults the proxy applies to executor-socket frames.
#[derive(Default)]
struct Faults {
    lossy: AtomicBool,
    cut: tokio::sync::Notify,
}

/// A WebSocket proxy in front of the rendezvous: records every frame and optionally
/// drops, duplicates and reorders frames on executor sockets.
struct Proxy {
    url: String,
    frames: Arc<Mutex<Vec<Vec<u8>>>>,
    faults: Arc<Faults>,
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

// The handshake callback's error type is tungstenite's, not ours to shrink.
#[allow(clippy::result_large_err)]
async fn proxy_socket(
    tcp: tokio::net::TcpStream,
    frames: Arc<Mutex<Vec<Vec<u8>>>>,
    faults: Arc<Faults>,
    upstream: Arc<Mutex<String>>,
    seed: u64,
) {
    let path = Arc::new(Mutex::new(String::new()));
    let p2 = Arc::clone(&path);
    let Ok(client) = tokio_tungstenite::accept_hdr_async(
        tcp,
        move |req: &tokio_tungstenite::tungstenite::handshake::server::Request, resp| {
            *p2.lock().unwrap() = req.uri().to_string();
            Ok(resp)
        },
    )
    .await
    else {
        return;
    };
    let path = path.lock().unwrap().clone();
    let executor_side = path.contains("role=environment");
    let base = upstream.lock().unwrap().replacen("http://", "ws://", 1);
    let Ok((server, _)) = tokio_tungstenite::connect_async(format!("{base}{path}")).await else {
        return;
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
            _ = faults.cut.notified(), if executor_side => return,
            m = c_rx.next() => {
                let Some(Ok(m)) = m else { return };
                if let Message::Binary(b) = &m { frames.lock().unwrap().push(b.to_vec()); }
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
                if let Message::Binary(b) = &m { frames.lock().unwrap().push(b.to_vec()); }
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
    let upstream = Arc::new(Mutex::new(String::new()));
    let proxy = start_proxy(Arc::clone(&upstream)).await;
    let rdv = start_rendezvous(Some(&proxy.url)).await;
    assert_eq!(rdv.url, proxy.url);
    *upstream.lock().unwrap() = rdv.direct.clone();
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
    let frames = proxy.frames.lock().unwrap().clone();
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

/// Relay round-trip time and throughput against the local WebSocket, same run.
/// `cargo test --release --test tests relay::measure -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_relay_against_local_websocket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob.bin");
    std::fs::write(&path, vec![b'x'; 8 * 1024 * 1024]).unwrap();
    let uri = format!("file://{}", path.display());
    let rounds = 500;

    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-measure");
    let mut relay = RelayClient::open(harness_args(&rdv.url, "env-measure")).await;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        relay.call("environment/status", json!({})).await;
    }
    let relay_rtt = start.elapsed() / rounds;
    let start = std::time::Instant::now();
    relay.call("fs/readFile", json!({"path": uri})).await;
    let relay_secs = start.elapsed().as_secs_f64();

    let ws = crate::util::WsServer::start(&[]).await;
    let mut local = ws.connect_initialized().await;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        local.call("environment/status", json!({})).await;
    }
    let ws_rtt = start.elapsed() / rounds;
    let start = std::time::Instant::now();
    local.call("fs/readFile", json!({"path": uri})).await;
    let ws_secs = start.elapsed().as_secs_f64();

    // The answer is base64: 8 MiB of file is ~10.7 MiB on the wire.
    let mib = 8.0;
    println!(
        "round trip: relay {relay_rtt:?}, websocket {ws_rtt:?}, added {:?}",
        relay_rtt.saturating_sub(ws_rtt)
    );
    println!(
        "fs/readFile 8 MiB: relay {:.1} MiB/s, websocket {:.1} MiB/s",
        mib / relay_secs,
        mib / ws_secs
    );
}

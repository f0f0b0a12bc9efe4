//! `http/request`: a body fetched by the executor for its client, against the same body read
//! straight from the same origin by the bench itself (one loopback HTTP/1.1 GET, no JSON,
//! no base64).
//!
//! * `http_request` — a buffered 32 MiB body in one answer. 32 MiB and not 64: codex's
//!   WebSocket message limit (64 MiB) ends buffered answers near 48 MiB of body, and ours
//!   holds at most `http.max_buffered_body_bytes` (32 MiB) unstreamed.
//! * `http_stream` — a 64 MiB body as `http/request/bodyDelta` notifications, each decoded.

use std::time::Instant;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::report::{Row, Unit};
use crate::target::WsProcess;
use crate::wire::{self, Rpc};

/// A loopback origin that answers every GET with `bytes` bytes (content-length framed).
pub(super) struct Origin {
    pub(super) addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    pub(super) async fn start(bytes: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the origin");
        let addr = listener.local_addr().expect("origin address");
        let body = std::sync::Arc::new(vec![b'x'; bytes]);
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let body = std::sync::Arc::clone(&body);
                tokio::spawn(async move {
                    while read_head(&mut stream).await {
                        let head =
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                        if stream.write_all(head.as_bytes()).await.is_err()
                            || stream.write_all(&body).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        Self { addr, task }
    }

    pub(super) fn url(&self) -> String {
        format!("http://{}/body", self.addr)
    }
}

/// Reads one request head; `false` when the connection ended.
async fn read_head(stream: &mut TcpStream) -> bool {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return false,
        }
    }
    true
}

/// Bytes/s of one GET of the origin's body read straight off the socket.
async fn direct_rate(origin: &Origin, bytes: usize) -> f64 {
    let mut stream = TcpStream::connect(origin.addr)
        .await
        .expect("connect to the origin");
    let started = Instant::now();
    stream
        .write_all(b"GET /body HTTP/1.1\r\nhost: origin\r\n\r\n")
        .await
        .expect("send the request");
    let mut buf = vec![0u8; 1 << 20];
    let mut head = Vec::new();
    let mut body = 0usize;
    while body < bytes {
        let n = stream.read(&mut buf).await.expect("read the answer");
        assert!(n > 0, "the origin closed early");
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            body += n;
        } else {
            head.extend_from_slice(&buf[..n]);
            if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                body += head.len() - at - 4;
            }
        }
    }
    bytes as f64 / started.elapsed().as_secs_f64()
}

pub async fn http_request() -> Row {
    let what = "http/request of a 32 MiB body, buffered, decoded";
    row("http_request", what, 32 << 20, Mode::Buffered).await
}

pub async fn http_stream() -> Row {
    let what = "http/request of a 64 MiB body, streamed as bodyDelta, decoded";
    row("http_stream", what, 64 << 20, Mode::Streamed).await
}

/// How a row asks for its body.
#[derive(Clone, Copy)]
enum Mode {
    Buffered,
    Streamed,
}

impl Mode {
    async fn rate(self, server: &str, url: &str, bytes: usize) -> f64 {
        match self {
            Mode::Buffered => buffered(server, url, bytes).await,
            Mode::Streamed => streamed(server, url, bytes).await,
        }
    }
}

/// One row: `bytes` from a local origin through our server and codex's, against the
/// origin read directly.
async fn row(key: &'static str, what: &'static str, bytes: usize, mode: Mode) -> Row {
    let origin = Origin::start(bytes).await;
    let floor = direct_rate(&origin, bytes).await;
    let url = origin.url();
    let server = WsProcess::exec_server(&[]).await;
    let rate = mode.rate(&server.url, &url, bytes).await;
    drop(server);
    let peer = crate::peer::measure(key, move |codex| async move {
        mode.rate(&codex.url, &url, bytes).await
    })
    .await;
    Row {
        key,
        what,
        unit: Unit::BytesPerSecond,
        median: rate,
        p99: None,
        floor: Some(floor),
        target: "≥ 0.3× floor",
        met: rate >= 0.3 * floor,
        peer,
    }
}

/// Bytes/s of one buffered `http/request` of `url`, answered and decoded.
async fn buffered(server: &str, url: &str, bytes: usize) -> f64 {
    let mut ws = wire::ws_connect(server).await;
    wire::handshake(&mut ws).await;
    let params = json!({"method": "GET", "url": url, "requestId": "b"});
    let started = Instant::now();
    let result = wire::call(&mut ws, 1, "http/request", params).await;
    let mut buf = Vec::new();
    let got = wire::decode_into(result["bodyBase64"].as_str().expect("bodyBase64"), &mut buf);
    let rate = got as f64 / started.elapsed().as_secs_f64();
    assert_eq!(got, bytes);
    rate
}

/// Bytes/s of one streamed `http/request` of `url`, every delta decoded.
async fn streamed(server: &str, url: &str, bytes: usize) -> f64 {
    let mut ws = wire::ws_connect(server).await;
    wire::handshake(&mut ws).await;
    let params = json!({"method": "GET", "url": url, "requestId": "s", "streamResponse": true});
    let started = Instant::now();
    let request = json!({"id": 1, "method": "http/request", "params": params}).to_string();
    ws.send_text(request).await;
    let mut buf = Vec::new();
    let mut got = 0usize;
    loop {
        let text = ws.recv_text().await;
        let message: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        if let Some(error) = message.get("error") {
            panic!("http/request failed: {error}");
        }
        if message["method"] != "http/request/bodyDelta" {
            continue;
        }
        let delta = &message["params"];
        got += wire::decode_into(delta["deltaBase64"].as_str().expect("delta"), &mut buf);
        if delta["done"] == true {
            assert!(delta["error"].is_null(), "the stream failed: {delta}");
            break;
        }
    }
    let rate = got as f64 / started.elapsed().as_secs_f64();
    assert_eq!(got, bytes);
    rate
}

//! Shared fixtures: upstream servers, a started proxy with its event stream, raw clients.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use exec_server_netproxy::{
    NetworkProxyLaunchConfig, PolicyDecider, PolicyEvent, Proxy, ProxyOptions, Resolver,
    StaticResolver,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Guards against a hang only; no test depends on how fast anything is.
pub const HANG_GUARD: Duration = Duration::from_secs(30);

/// Aborts the server task when the test ends.
pub struct Server {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An HTTP/1.1 server that answers every request with `200`, the body
/// `seen:<request head>\n<request body>`, and closes.
pub async fn upstream_http() -> std::io::Result<Server> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(answer_one(stream));
        }
    });
    Ok(Server { addr, task })
}

async fn answer_one(mut stream: TcpStream) {
    let Ok((head, mut body)) = read_head(&mut stream).await else {
        return;
    };
    let length = header(&head, "content-length")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let chunked =
        header(&head, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    while body.len() < length || (chunked && !body.ends_with(b"0\r\n\r\n")) {
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let content = format!("seen:{head}\n{}", String::from_utf8_lossy(&body));
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\nkeep-alive: timeout=5\r\nx-upstream: yes\r\n\r\n{content}",
        content.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
}

/// A TCP server that echoes every byte back.
pub async fn echo_server() -> std::io::Result<Server> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut reader, mut writer) = stream.split();
                let _ = tokio::io::copy(&mut reader, &mut writer).await;
            });
        }
    });
    Ok(Server { addr, task })
}

/// A `networkProxy` value: the given mode and domains, local binding as given.
pub fn config(mode: &str, domains: Value, allow_local_binding: bool) -> Value {
    json!({
        "proxy": {
            "enabled": true, "enableSocks5": true, "enableSocks5Udp": false,
            "allowUpstreamProxy": false, "dangerouslyAllowAllUnixSockets": false,
            "mode": mode, "domains": domains, "allowLocalBinding": allow_local_binding
        }
    })
}

pub struct Started {
    pub proxy: Proxy,
    pub events: mpsc::UnboundedReceiver<PolicyEvent>,
}

impl Started {
    /// The next event, as the JSON the notification would carry.
    pub async fn next_event(&mut self) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        let event = tokio::time::timeout(HANG_GUARD, self.events.recv())
            .await?
            .ok_or("event stream closed")?;
        Ok(serde_json::to_value(event)?)
    }

    pub fn no_more_events(&mut self) -> bool {
        self.events.try_recv().is_err()
    }
}

/// Names the tests use, all pointing at loopback.
pub fn test_resolver() -> StaticResolver {
    let loopback: IpAddr = "127.0.0.1".parse().unwrap_or(IpAddr::from([127, 0, 0, 1]));
    StaticResolver::new()
        .with("up.test", &[loopback])
        .with("decided.test", &[loopback])
        .with("localhost", &[loopback])
}

pub struct StartOptions {
    pub resolver: Arc<dyn Resolver>,
    pub decider: Option<Arc<dyn PolicyDecider>>,
    pub tweak: fn(&mut ProxyOptions),
}

impl Default for StartOptions {
    fn default() -> Self {
        Self {
            resolver: Arc::new(test_resolver()),
            decider: None,
            tweak: |_| {},
        }
    }
}

pub async fn start(config: Value) -> Result<Started, Box<dyn std::error::Error + Send + Sync>> {
    start_with(config, StartOptions::default()).await
}

pub async fn start_with(
    config: Value,
    start: StartOptions,
) -> Result<Started, Box<dyn std::error::Error + Send + Sync>> {
    let config = NetworkProxyLaunchConfig::from_value(config)?;
    let (tx, events) = mpsc::unbounded_channel();
    let mut options = ProxyOptions::new(Arc::new(move |event| {
        let _ = tx.send(event);
    }));
    options.resolver = start.resolver;
    options.decider = start.decider;
    (start.tweak)(&mut options);
    let proxy = Proxy::start(&config, options).await?;
    Ok(Started { proxy, events })
}

/// Reads a response (or request) head; returns it and any bytes read past it.
pub async fn read_head(stream: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    let mut buffer = Vec::new();
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_string();
            return Ok((head, buffer[end + 4..].to_vec()));
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                String::from_utf8_lossy(&buffer).to_string(),
            ));
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// A header's value from a head (case-insensitive name).
pub fn header(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().to_string())
    })
}

/// A response: its head and its body (by content-length, else to EOF).
pub struct Reply {
    pub head: String,
    pub body: String,
}

impl Reply {
    pub fn status(&self) -> &str {
        self.head.split(' ').nth(1).unwrap_or("")
    }

    pub fn header(&self, name: &str) -> Option<String> {
        header(&self.head, name)
    }
}

/// Sends `request` as is on a new connection and reads one response.
pub async fn send_raw(
    proxy: SocketAddr,
    request: &[u8],
) -> Result<Reply, Box<dyn std::error::Error + Send + Sync>> {
    let mut stream = TcpStream::connect(proxy).await?;
    stream.write_all(request).await?;
    tokio::time::timeout(HANG_GUARD, read_reply(&mut stream)).await?
}

pub async fn read_reply(
    stream: &mut TcpStream,
) -> Result<Reply, Box<dyn std::error::Error + Send + Sync>> {
    let (head, mut body) = read_head(stream).await?;
    match header(&head, "content-length").and_then(|v| v.parse::<usize>().ok()) {
        Some(length) => {
            while body.len() < length {
                let mut chunk = [0u8; 4096];
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        }
        None => {
            stream.read_to_end(&mut body).await?;
        }
    }
    Ok(Reply {
        head,
        body: String::from_utf8_lossy(&body).to_string(),
    })
}

/// `GET http://<host>/<path>` through the proxy, closing after the response.
pub async fn get(
    proxy: SocketAddr,
    authority: &str,
    method: &str,
) -> Result<Reply, Box<dyn std::error::Error + Send + Sync>> {
    let request = format!(
        "{method} http://{authority}/path?q=1 HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    );
    send_raw(proxy, request.as_bytes()).await
}

/// Reads until EOF or an error: the peer closed.
pub async fn wait_closed(stream: &mut TcpStream) -> TestResult {
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(HANG_GUARD, stream.read_to_end(&mut sink)).await?;
    Ok(())
}

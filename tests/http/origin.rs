//! A loopback HTTP/1.1 origin for `http/request` tests, written by hand so that every byte
//! it receives and sends is the test's: it records each request head as it came (header
//! lines in wire order) and answers by path.
//!
//! Routes: `/echo` (200, the request as JSON), `/status/<n>`, `/headers` (repeated and
//! non-UTF-8 values), `/redirect/<code>?to=<url>`, `/loop/<n>` (to `/loop/<n+1>`), `/gzip`,
//! `/zstd`, `/badgzip`, `/sse?chunks=<n>&delay=<ms>` (chunked, one event per chunk),
//! `/big?bytes=<n>`, `/truncated` (a body cut short), `/hang` (never answers). A request in
//! absolute form (`GET http://host/path`, as sent to a proxy) is answered by its path, so
//! the origin also stands in for a proxy.

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::util::b64;

/// One request as the origin saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub request_line: String,
    /// Header lines as sent, names as the client spelled them.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    /// The values of header `name` (any case), in order.
    pub fn header(&self, name: &str) -> Vec<String> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .collect()
    }
}

pub struct Origin {
    pub base: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&log)));
            }
        });
        Self { base, seen, task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn last(&self) -> Seen {
        self.seen().pop().expect("the origin saw a request")
    }
}

async fn serve(mut stream: TcpStream, log: Arc<Mutex<Vec<Seen>>>) {
    while let Some(seen) = read_request(&mut stream).await {
        log.lock().unwrap().push(seen.clone());
        if answer(&mut stream, &seen).await.is_err() {
            return;
        }
    }
}

async fn read_request(stream: &mut TcpStream) -> Option<Seen> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n").filter(|l| !l.is_empty());
    let request_line = lines.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_owned(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.ok()?;
    Some(Seen {
        request_line,
        headers,
        body,
    })
}

fn target(seen: &Seen) -> (String, Vec<(String, String)>) {
    let target = seen.request_line.split(' ').nth(1).unwrap_or("/");
    // Absolute form (a request sent to a proxy) is answered as if it came to this origin.
    let target = match target.strip_prefix("http://") {
        Some(rest) => rest.find('/').map_or("/", |slash| &rest[slash..]),
        None => target,
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.replace("%3A", ":").replace("%2F", "/")))
        .collect();
    (path.to_owned(), query)
}

fn param(query: &[(String, String)], name: &str) -> Option<String> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

async fn answer(stream: &mut TcpStream, seen: &Seen) -> std::io::Result<()> {
    let (path, query) = target(seen);
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["echo"] => {
            let body = json!({
                "requestLine": seen.request_line,
                "headers": seen.headers,
                "bodyBase64": b64(&seen.body),
            });
            respond(
                stream,
                200,
                &[("content-type", "application/json")],
                body.to_string().as_bytes(),
            )
            .await
        }
        ["status", code] => respond(stream, code.parse().unwrap_or(500), &[], b"status").await,
        ["headers"] => {
            let head = b"HTTP/1.1 200 OK\r\nx-multi: a\r\nx-bin: \xff\xfe\r\nx-multi: b\r\nx-ok: yes\r\ncontent-length: 2\r\n\r\nok";
            stream.write_all(head).await
        }
        ["redirect", code] => {
            let to = param(&query, "to").unwrap_or_else(|| "/echo".to_owned());
            respond(
                stream,
                code.parse().unwrap_or(302),
                &[("location", &to)],
                b"",
            )
            .await
        }
        ["loop", n] => {
            let next = format!("/loop/{}", n.parse::<u32>().unwrap_or(0) + 1);
            respond(stream, 302, &[("location", &next)], b"").await
        }
        ["gzip"] => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(b"gzip body").unwrap();
            let body = encoder.finish().unwrap();
            respond(stream, 200, &[("content-encoding", "gzip")], &body).await
        }
        ["zstd"] => {
            let body = zstd::encode_all(&b"zstd body"[..], 3).unwrap();
            respond(stream, 200, &[("content-encoding", "zstd")], &body).await
        }
        ["badgzip"] => {
            respond(
                stream,
                200,
                &[("content-encoding", "gzip")],
                b"not gzip at all",
            )
            .await
        }
        ["sse"] => {
            let chunks: usize = param(&query, "chunks")
                .and_then(|c| c.parse().ok())
                .unwrap_or(3);
            let delay: u64 = param(&query, "delay")
                .and_then(|d| d.parse().ok())
                .unwrap_or(100);
            sse(stream, chunks, Duration::from_millis(delay)).await
        }
        ["big"] => {
            let bytes: usize = param(&query, "bytes")
                .and_then(|b| b.parse().ok())
                .unwrap_or(0);
            let body: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
            respond(stream, 200, &[], &body).await
        }
        ["truncated"] => {
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten!!")
                .await?;
            Err(std::io::ErrorKind::ConnectionAborted.into())
        }
        ["hang"] => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        }
        _ => respond(stream, 404, &[], b"no such route").await,
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await
}

/// `chunks` events of `data: <i> xx\n\n`, each its own chunk, `delay` apart.
async fn sse(stream: &mut TcpStream, chunks: usize, delay: Duration) -> std::io::Result<()> {
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    stream.write_all(head.as_bytes()).await?;
    for i in 0..chunks {
        let event = format!("data: {i} xx\n\n");
        stream
            .write_all(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes())
            .await?;
        stream.flush().await?;
        tokio::time::sleep(delay).await;
    }
    stream.write_all(b"0\r\n\r\n").await
}

/// The body of a `/echo` answer, decoded.
pub fn echoed(result: &Value) -> Value {
    let body = crate::util::b64decode(&result["bodyBase64"]);
    serde_json::from_slice(&body).expect("an /echo body")
}

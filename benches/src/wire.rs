//! A minimal JSON-RPC client for measurements: raw text out, raw text in, no framework,
//! the same code over a WebSocket or a relay stream.

use exec_server_relay_core::harness::{
    connect_relay, RelayConnectArgs, RelayConnection, RelayError,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use crate::target::StdioProcess;

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One JSON-RPC connection: whole messages in and out. A message comes in as the
/// transport's own buffer, never copied into a new string. The measurements use the
/// panicking `send_text`/`recv_text`; the soak test, which must report a lost connection
/// as a failure of its own, uses the fallible `try_*` forms they are built on.
pub(crate) trait Rpc {
    /// Sends one message; `Err` says why the connection cannot take it.
    async fn try_send_text(&mut self, text: String) -> Result<(), String>;

    /// The next message; `Err` once the connection has ended, saying why.
    async fn try_recv_text(&mut self) -> Result<Utf8Bytes, String>;

    async fn send_text(&mut self, text: String) {
        if let Err(e) = self.try_send_text(text).await {
            panic!("send: {e}");
        }
    }

    async fn recv_text(&mut self) -> Utf8Bytes {
        self.try_recv_text()
            .await
            .unwrap_or_else(|e| panic!("receive: {e}"))
    }
}

impl Rpc for Ws {
    async fn try_send_text(&mut self, text: String) -> Result<(), String> {
        self.send(Message::Text(text.into()))
            .await
            .map_err(|e| format!("websocket send failed: {e}"))
    }

    async fn try_recv_text(&mut self) -> Result<Utf8Bytes, String> {
        loop {
            match self.next().await {
                None => return Err("the websocket was closed".into()),
                Some(Err(e)) => return Err(format!("websocket read failed: {e}")),
                Some(Ok(Message::Text(text))) => return Ok(text),
                Some(Ok(Message::Binary(bytes))) => {
                    return bytes
                        .try_into()
                        .map_err(|_| "a binary message that is not UTF-8".into())
                }
                Some(Ok(Message::Close(frame))) => {
                    return Err(format!("the server closed the websocket: {frame:?}"))
                }
                Some(Ok(_)) => continue,
            }
        }
    }
}

impl Rpc for RelayConnection {
    async fn try_send_text(&mut self, text: String) -> Result<(), String> {
        self.send(text)
            .await
            .map_err(|e| format!("relay send failed: {e}"))
    }

    async fn try_recv_text(&mut self) -> Result<Utf8Bytes, String> {
        let Some(bytes) = self.recv().await else {
            // The reason is recorded just after the stream's end reaches the receiver.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            return Err(format!("the relay stream ended: {:?}", self.error()));
        };
        bytes
            .try_into()
            .map_err(|_| "a relay message that is not UTF-8".into())
    }
}

/// A relay stream through `args`, retrying for up to 20 s while the executor is still
/// registering (the registry answers 404 or 503 until it is).
pub(crate) async fn relay_connect(args: RelayConnectArgs) -> Result<RelayConnection, String> {
    for _ in 0..400 {
        match connect_relay(args.clone()).await {
            Ok(connection) => return Ok(connection),
            Err(RelayError::Registry(e)) if matches!(e.status(), Some(404 | 503)) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("relay connect failed: {e}")),
        }
    }
    Err("relay connect failed: the executor never became reachable".into())
}

/// Connects with limits large enough for a 64 MiB file in one answer.
pub async fn ws_connect(url: &str) -> Ws {
    let config = WebSocketConfig::default()
        .max_message_size(Some(1 << 30))
        .max_frame_size(Some(1 << 30));
    let (ws, _) = tokio_tungstenite::connect_async_with_config(url, Some(config), true)
        .await
        .expect("websocket connect");
    ws
}

/// Sends `text` and waits for the message whose `id` matches.
pub(crate) async fn round_trip(conn: &mut impl Rpc, text: &str, id: i64) -> Value {
    conn.send_text(text.to_owned()).await;
    loop {
        let reply: Value = serde_json::from_str(&conn.recv_text().await).expect("JSON");
        if reply["id"] == id {
            return reply;
        }
    }
}

/// `initialize` + `initialized`.
pub(crate) async fn handshake(conn: &mut impl Rpc) {
    round_trip(
        conn,
        r#"{"id":0,"method":"initialize","params":{"clientName":"bench"}}"#,
        0,
    )
    .await;
    conn.send_text(r#"{"method":"initialized"}"#.to_owned())
        .await;
}

/// Calls `method` and returns its result, panicking on an error answer.
pub(crate) async fn call(conn: &mut impl Rpc, id: i64, method: &str, params: Value) -> Value {
    let request = json!({"id": id, "method": method, "params": params}).to_string();
    let mut reply = round_trip(conn, &request, id).await;
    if let Some(error) = reply.get("error") {
        panic!("{method} failed: {error}");
    }
    reply["result"].take()
}

/// Decodes base64 into `buf` (reused across calls, never zero-filled first) and returns
/// the decoded length. The decoder uses the CPU's vector instructions, as a client that
/// cares about throughput would: the portable one was half of this client's time.
pub fn decode_into(text: &str, buf: &mut Vec<u8>) -> usize {
    buf.clear();
    base64_simd::STANDARD
        .decode_append(text, buf)
        .expect("base64");
    buf.len()
}

/// The members of a server message the measurements look at, borrowed from the text so a
/// large chunk is never copied by the client (the client's cost is not what is measured).
#[derive(serde::Deserialize)]
struct ServerMessage<'a> {
    #[serde(default)]
    id: Option<i64>,
    #[serde(default, borrow)]
    method: Option<&'a str>,
    #[serde(default, borrow)]
    params: Option<Params<'a>>,
    #[serde(default, borrow)]
    result: Option<ResultData<'a>>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Params<'a> {
    #[serde(borrow)]
    process_id: &'a str,
    #[serde(default, borrow)]
    chunk: Option<&'a str>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResultData<'a> {
    #[serde(default, borrow)]
    data_base64: Option<&'a str>,
    /// `fs/readBlock`.
    #[serde(default, borrow)]
    chunk: Option<&'a str>,
    #[serde(default)]
    eof: bool,
}

/// `fs/readFile` of `uri`: returns the decoded file length.
pub(crate) async fn read_file_len(conn: &mut impl Rpc, id: i64, uri: &str) -> usize {
    let request = json!({"id": id, "method": "fs/readFile", "params": {"path": uri}}).to_string();
    conn.send_text(request).await;
    let mut buf = Vec::new();
    loop {
        let text = conn.recv_text().await;
        let message: ServerMessage<'_> = serde_json::from_str(&text).expect("JSON");
        if message.id != Some(id) {
            continue;
        }
        if let Some(error) = message.error {
            panic!("fs/readFile failed: {error}");
        }
        let data = message
            .result
            .and_then(|r| r.data_base64)
            .expect("dataBase64");
        return decode_into(data, &mut buf);
    }
}

/// Streams `uri` with `fs/open` and `fs/readBlock` of `block` bytes, keeping `depth` reads
/// in flight (answers may come in any order), then `fs/close`; returns the decoded length.
pub(crate) async fn read_blocks_len(
    conn: &mut impl Rpc,
    uri: &str,
    block: usize,
    depth: usize,
) -> usize {
    call(conn, 1, "fs/open", json!({"handleId": "b", "path": uri})).await;
    let read = |id: usize| {
        let offset = (id - 1) * block;
        json!({"id": id, "method": "fs/readBlock",
               "params": {"handleId": "b", "offset": offset, "len": block}})
        .to_string()
    };
    // Request ids from 1 up stand for blocks 0 up.
    let mut next = 1;
    while next <= depth {
        conn.send_text(read(next)).await;
        next += 1;
    }
    let (mut in_flight, mut total, mut eof) = (depth, 0, false);
    let mut buf = Vec::new();
    while in_flight > 0 {
        let text = conn.recv_text().await;
        let message: ServerMessage<'_> = serde_json::from_str(&text).expect("JSON");
        if message.id.is_none() {
            continue;
        }
        if let Some(error) = message.error {
            panic!("fs/readBlock failed: {error}");
        }
        let result = message.result.expect("result");
        total += decode_into(result.chunk.expect("chunk"), &mut buf);
        eof |= result.eof;
        in_flight -= 1;
        if !eof {
            conn.send_text(read(next)).await;
            next += 1;
            in_flight += 1;
        }
    }
    call(conn, 0, "fs/close", json!({"handleId": "b"})).await;
    total
}

/// Starts `argv` as process `process_id` and returns the decoded output byte count once
/// the process closed.
pub(crate) async fn run_process(
    conn: &mut impl Rpc,
    process_id: &str,
    argv: &[&str],
    tty: bool,
) -> u64 {
    let params =
        json!({"processId": process_id, "argv": argv, "cwd": "file:///", "env": {}, "tty": tty});
    run_started(conn, process_id, params).await
}

/// Like [`run_process`] for pipe mode, under `sandbox` (a `process/start` `sandbox` value).
pub(crate) async fn run_sandboxed_process(
    conn: &mut impl Rpc,
    process_id: &str,
    argv: &[&str],
    sandbox: &Value,
) -> u64 {
    let params = json!({"processId": process_id, "argv": argv, "cwd": "file:///", "env": {},
                        "tty": false, "sandbox": sandbox});
    run_started(conn, process_id, params).await
}

/// A `sandbox` value (`process/start`, `fs/*`) that lets the whole file system be read,
/// only `dir` be written, and no network be reached: what the sandboxed rows and the soak
/// confine their requests to.
pub(crate) fn confined_sandbox(dir: &std::path::Path) -> Value {
    json!({"permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
        {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
        {"path": {"type": "path", "path": format!("file://{}", dir.display())}, "access": "write"}
    ]}, "network": "restricted"}})
}

/// Sends `process/start` with `params` and counts the output until `process/closed`.
async fn run_started(conn: &mut impl Rpc, process_id: &str, params: Value) -> u64 {
    let start = json!({"id": -2, "method": "process/start", "params": params}).to_string();
    conn.send_text(start).await;
    let mut bytes = 0u64;
    let mut buf = Vec::new();
    loop {
        let text = conn.recv_text().await;
        let message: ServerMessage<'_> = serde_json::from_str(&text).expect("JSON");
        if let Some(error) = message.error {
            panic!("process/start failed: {error}");
        }
        let Some(params) = message.params.filter(|p| p.process_id == process_id) else {
            continue;
        };
        match message.method {
            Some("process/output") => {
                bytes += decode_into(params.chunk.expect("chunk"), &mut buf) as u64;
            }
            Some("process/closed") => return bytes,
            _ => {}
        }
    }
}

pub async fn line_send(p: &mut StdioProcess, text: &str) {
    p.stdin.write_all(text.as_bytes()).await.expect("write");
    p.stdin.write_all(b"\n").await.expect("write");
    p.stdin.flush().await.expect("flush");
}

pub async fn line_recv(p: &mut StdioProcess) -> String {
    let mut line = String::new();
    p.stdout.read_line(&mut line).await.expect("read");
    line
}

/// `initialize` + `initialized` over stdio.
pub async fn line_handshake(p: &mut StdioProcess) {
    line_send(
        p,
        r#"{"id":0,"method":"initialize","params":{"clientName":"bench"}}"#,
    )
    .await;
    line_recv(p).await;
    line_send(p, r#"{"method":"initialized"}"#).await;
}

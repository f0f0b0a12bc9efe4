//! Shared fixtures: start the real `exec-server` binary and talk to it over real stdio pipes
//! or a real WebSocket, as a client would.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio_tungstenite::tungstenite::Message;

/// How long any single expected message may take before a test fails.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// The server binary under test: this build's, or the one `EXEC_SERVER_TEST_BIN` names
/// (to run tests against another build, e.g. to show a new test fails on the old code).
pub fn server_bin() -> PathBuf {
    std::env::var_os("EXEC_SERVER_TEST_BIN")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_exec-server")))
}

/// A command for the server binary with logs kept quiet unless `RUST_LOG` is set.
pub fn server_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(server_bin());
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "warn");
    }
    cmd
}

/// A TOML config file that lives as long as the returned handle.
pub fn config_file(toml: &str) -> tempfile::TempPath {
    let file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(file.path(), toml).unwrap();
    file.into_temp_path()
}

/// A server listening on `ws://127.0.0.1:0`.
pub struct WsServer {
    pub child: Child,
    pub url: String,
    /// The rest of stdout, kept open so the server never sees EPIPE.
    pub stdout: BufReader<ChildStdout>,
}

impl WsServer {
    /// Starts `exec-server --listen ws://127.0.0.1:0 <args>` and reads its `ws://` line.
    pub async fn start(args: &[&str]) -> Self {
        Self::start_with(server_command(
            &[&["--listen", "ws://127.0.0.1:0"], args].concat(),
        ))
        .await
    }

    /// Starts a prepared command (which must listen on one WebSocket) and reads its line.
    pub async fn start_with(mut cmd: Command) -> Self {
        let mut child = cmd.spawn().expect("spawn exec-server");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut line))
            .await
            .expect("server announces its address")
            .unwrap();
        let url = line.trim().to_owned();
        assert!(
            url.starts_with("ws://"),
            "unexpected first stdout line {url:?}"
        );
        Self { child, url, stdout }
    }

    /// `http://IP:PORT` of the listener.
    pub fn http_base(&self) -> String {
        self.url.replacen("ws://", "http://", 1)
    }

    /// Opens a WebSocket client connection.
    pub async fn connect(&self) -> Client {
        Client::websocket(&self.url).await
    }

    /// Opens a client connection and completes the handshake.
    pub async fn connect_initialized(&self) -> Client {
        let mut client = self.connect().await;
        client.handshake().await;
        client
    }
}

// One per test client: the size of the larger variant (a socket that may carry TLS) costs
// nothing worth an indirection.
#[allow(clippy::large_enum_variant)]
enum Conn {
    Stdio {
        /// `None` once closed: dropping the pipe is what delivers EOF.
        stdin: Option<ChildStdin>,
        stdout: BufReader<ChildStdout>,
        child: Child,
    },
    Ws(
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
    ),
}

/// A JSON-RPC client speaking the raw protocol; it keeps messages it was not waiting for.
pub struct Client {
    conn: Conn,
    next_id: i64,
    /// Messages received while waiting for something else.
    pending: VecDeque<Value>,
    pub session_id: Option<String>,
    /// Sent as `initialize.params.extensions` by [`Client::handshake`] and
    /// [`Client::resume`] when not empty.
    pub extensions: Vec<String>,
}

impl Client {
    /// Starts `exec-server --listen stdio <args>` and connects to its stdin/stdout.
    pub async fn stdio(args: &[&str]) -> Self {
        Self::stdio_with(server_command(&[&["--listen", "stdio"], args].concat()))
    }

    /// Connects to a prepared stdio server command.
    pub fn stdio_with(mut cmd: Command) -> Self {
        let mut child = cmd.spawn().expect("spawn exec-server");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self::new(Conn::Stdio {
            stdin: Some(stdin),
            stdout,
            child,
        })
    }

    /// Connects to a stdio server that is started by a test-binary wrapper: the lines the
    /// test harness prints before the wrapper execs the server are skipped.
    pub async fn stdio_after_harness_preamble(mut cmd: Command) -> Self {
        let mut child = cmd.spawn().expect("spawn the wrapper");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut line))
                .await
                .expect("the wrapper starts")
                .unwrap();
            assert!(n > 0, "the wrapper ended before the server started");
            if line.starts_with("running ") {
                break;
            }
        }
        Self::new(Conn::Stdio {
            stdin: Some(stdin),
            stdout,
            child,
        })
    }

    pub async fn websocket(url: &str) -> Self {
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("websocket connect");
        Self::new(Conn::Ws(ws))
    }

    /// Upgrades an already connected socket (e.g. one bound to a chosen source address),
    /// sending `Authorization: Bearer <token>` when a token is given.
    pub async fn websocket_over(
        stream: tokio::net::TcpStream,
        url: &str,
        token: Option<&str>,
    ) -> Result<Self, tokio_tungstenite::tungstenite::Error> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = url.into_client_request()?;
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().expect("a header value");
            request.headers_mut().insert("Authorization", value);
        }
        let stream = tokio_tungstenite::MaybeTlsStream::Plain(stream);
        let (ws, _) = tokio_tungstenite::client_async(request, stream).await?;
        Ok(Self::new(Conn::Ws(ws)))
    }

    /// Connects to `url` with `Authorization: Bearer <token>`.
    pub async fn websocket_with_bearer(url: &str, token: &str) -> Self {
        let addr = url.trim_start_matches("ws://").trim_end_matches('/');
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("tcp connect");
        Self::websocket_over(stream, url, Some(token))
            .await
            .expect("websocket connect")
    }

    fn new(conn: Conn) -> Self {
        Self {
            conn,
            next_id: 1,
            pending: VecDeque::new(),
            session_id: None,
            extensions: Vec::new(),
        }
    }

    /// The server process of a stdio client.
    pub fn child(&mut self) -> &mut Child {
        match &mut self.conn {
            Conn::Stdio { child, .. } => child,
            Conn::Ws(_) => panic!("websocket clients have no child"),
        }
    }

    /// Sends raw text as one message (stdio: one line).
    pub async fn send_raw(&mut self, text: &str) {
        match &mut self.conn {
            Conn::Stdio { stdin, .. } => {
                let stdin = stdin.as_mut().expect("stdin is open");
                stdin.write_all(text.as_bytes()).await.unwrap();
                stdin.write_all(b"\n").await.unwrap();
                stdin.flush().await.unwrap();
            }
            Conn::Ws(ws) => ws
                .send(Message::Text(text.to_owned().into()))
                .await
                .unwrap(),
        }
    }

    pub async fn send(&mut self, message: Value) {
        self.send_raw(&message.to_string()).await;
    }

    /// Closes the client's side: stdin EOF on stdio, a Close frame on WebSocket.
    pub async fn close(&mut self) {
        match &mut self.conn {
            Conn::Stdio { stdin, .. } => drop(stdin.take()),
            Conn::Ws(ws) => {
                let _ = ws.close(None).await;
            }
        }
    }

    /// The next message from the wire (or from the pending queue), failing after
    /// [`STEP_TIMEOUT`].
    pub async fn next_message(&mut self) -> Value {
        if let Some(message) = self.pending.pop_front() {
            return message;
        }
        self.read_wire()
            .await
            .expect("connection closed while a message was expected")
    }

    /// Reads one message from the wire; `None` when the server closed the connection.
    pub async fn read_wire(&mut self) -> Option<Value> {
        let read = async {
            match &mut self.conn {
                Conn::Stdio { stdout, .. } => {
                    let mut line = String::new();
                    let n = stdout.read_line(&mut line).await.unwrap();
                    (n > 0).then(|| serde_json::from_str(&line).expect("server sent valid JSON"))
                }
                Conn::Ws(ws) => loop {
                    match ws.next().await {
                        Some(Ok(Message::Text(text))) => {
                            break Some(
                                serde_json::from_str(&text).expect("server sent valid JSON"),
                            )
                        }
                        Some(Ok(Message::Binary(_))) => panic!("server sent a binary message"),
                        Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break None,
                        Some(Ok(_)) => continue,
                    }
                },
            }
        };
        tokio::time::timeout(STEP_TIMEOUT, read)
            .await
            .expect("timed out waiting for a message")
    }

    /// Sends a request with a fresh integer id and returns its id.
    pub async fn send_request(&mut self, method: &str, params: Value) -> i64 {
        self.send_request_with(method, params, json!({})).await
    }

    /// Like [`Client::send_request`], with `extra` top-level members (a `trace`).
    pub async fn send_request_with(&mut self, method: &str, params: Value, extra: Value) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let (Some(message), Some(extra)) = (message.as_object_mut(), extra.as_object()) {
            message.extend(extra.clone());
        }
        self.send(message).await;
        id
    }

    /// Waits for the response with `id`, keeping everything else for later.
    pub async fn response(&mut self, id: impl Into<Value>) -> Result<Value, Value> {
        let id = id.into();
        if let Some(pos) = self.pending.iter().position(|m| m.get("id") == Some(&id)) {
            return into_result(self.pending.remove(pos).unwrap());
        }
        loop {
            let message = self
                .read_wire()
                .await
                .expect("connection closed before the response");
            if message.get("id") == Some(&id) {
                return into_result(message);
            }
            self.pending.push_back(message);
        }
    }

    /// Sends a request and waits for its result (`Ok`) or error object (`Err`).
    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.send_request(method, params).await;
        self.response(id).await
    }

    /// Like [`Client::request`], panicking on an error response.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        match self.request(method, params).await {
            Ok(result) => result,
            Err(error) => panic!("{method} failed: {error}"),
        }
    }

    /// Like [`Client::request`], panicking on success; returns the error object.
    pub async fn call_err(&mut self, method: &str, params: Value) -> Value {
        match self.request(method, params).await {
            Ok(result) => panic!("{method} unexpectedly succeeded: {result}"),
            Err(error) => error,
        }
    }

    /// Opts in to server extensions at the next handshake or resume.
    pub fn opt_in(&mut self, extensions: &[&str]) {
        self.extensions = extensions.iter().map(|e| e.to_string()).collect();
    }

    /// The `initialize` params this client sends (its extensions, a session to resume).
    pub fn initialize_params(&self, resume: Option<&str>) -> Value {
        let mut params = json!({"clientName": "tests"});
        if let Some(session_id) = resume {
            params["resumeSessionId"] = json!(session_id);
        }
        if !self.extensions.is_empty() {
            params["extensions"] = json!(self.extensions);
        }
        params
    }

    /// `initialize` + `initialized`; returns the session id.
    pub async fn handshake(&mut self) -> String {
        let params = self.initialize_params(None);
        let result = self.call("initialize", params).await;
        self.send(json!({"method": "initialized", "params": {}}))
            .await;
        let id = result["sessionId"].as_str().unwrap().to_owned();
        self.session_id = Some(id.clone());
        id
    }

    /// `initialize{resumeSessionId}` + `initialized`.
    pub async fn resume(&mut self, session_id: &str) -> Result<Value, Value> {
        let params = self.initialize_params(Some(session_id));
        let result = self.request("initialize", params).await;
        if result.is_ok() {
            self.send(json!({"method": "initialized", "params": {}}))
                .await;
            self.session_id = Some(session_id.to_owned());
        }
        result
    }

    /// The next notification with `method`, keeping everything else for later.
    pub async fn notification(&mut self, method: &str) -> Value {
        if let Some(pos) = self
            .pending
            .iter()
            .position(|m| m.get("method").and_then(Value::as_str) == Some(method))
        {
            return self.pending.remove(pos).unwrap()["params"].take();
        }
        loop {
            let mut message = self
                .read_wire()
                .await
                .expect("connection closed before the notification");
            if message.get("method").and_then(Value::as_str) == Some(method) {
                return message["params"].take();
            }
            self.pending.push_back(message);
        }
    }

    /// Messages received but not yet consumed.
    pub fn pending(&self) -> &VecDeque<Value> {
        &self.pending
    }
}

fn into_result(mut message: Value) -> Result<Value, Value> {
    if let Some(error) = message.get_mut("error") {
        Err(error.take())
    } else {
        Ok(message["result"].take())
    }
}

/// Asserts an error object's code and exact message.
#[track_caller]
pub fn assert_error(error: &Value, code: i64, message: &str) {
    assert_eq!(error["code"], code, "error code in {error}");
    assert_eq!(error["message"], message, "error message in {error}");
}

/// Decodes a base64 string from the wire.
pub fn b64decode(text: &Value) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text.as_str().expect("base64 string"))
        .expect("valid base64")
}

/// Encodes bytes as base64 for the wire.
pub fn b64(bytes: impl AsRef<[u8]>) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A plain HTTP/1.1 request on a fresh TCP connection; returns the status and the response
/// head (status line and headers).
pub async fn http_request(base: &str, raw_request: &str) -> (u16, String) {
    use tokio::io::AsyncReadExt;
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(raw_request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let read_head = async {
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                break;
            }
            head.push(byte[0]);
        }
    };
    tokio::time::timeout(STEP_TIMEOUT, read_head)
        .await
        .expect("response head");
    let text = String::from_utf8_lossy(&head).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// `GET <path>` with extra header lines on a fresh `Connection: close` request; returns the
/// status and the body.
pub async fn http_body(base: &str, path: &str, headers: &str) -> (u16, String) {
    use tokio::io::AsyncReadExt;
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stream.read_to_string(&mut response))
        .await
        .unwrap()
        .unwrap();
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// `GET <path>` with extra header lines (each ending in `\r\n`).
pub async fn http_get(base: &str, path: &str, extra_headers: &str) -> (u16, String) {
    let host = base.trim_start_matches("http://");
    http_request(
        base,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra_headers}\r\n"),
    )
    .await
}

/// Runs the same async test body over stdio and over WebSocket.
#[macro_export]
macro_rules! both_transports {
    ($name:ident, $body:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test]
            async fn over_stdio() {
                let client = $crate::util::Client::stdio(&[]).await;
                ($body)(client).await;
            }

            #[tokio::test]
            async fn over_websocket() {
                let server = $crate::util::WsServer::start(&[]).await;
                let client = server.connect().await;
                ($body)(client).await;
                drop(server);
            }
        }
    };
}

/// Runs the server on `input` piped to its stdin (closed at the end, as `printf … |` does)
/// and returns its exit code and every line it wrote.
pub async fn piped_stdio_session(input: &str, env: &[(&str, &str)]) -> (Option<i32>, Vec<Value>) {
    use tokio::io::AsyncWriteExt;
    let mut cmd = server_command(&["--listen", "stdio"]);
    cmd.envs(env.iter().copied());
    let mut child = cmd.spawn().expect("spawn the server");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(STEP_TIMEOUT, child.wait_with_output())
        .await
        .expect("the server exits after end of input")
        .unwrap();
    let lines = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON message per line"))
        .collect();
    (output.status.code(), lines)
}

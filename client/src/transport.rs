//! Transports: ways to open one connection that carries whole JSON-RPC messages.
//!
//! The client never looks below a message. A [`Transport`] opens a [`Connection`] — a pair
//! of channels, one message per item — and says whether a lost connection may be replaced
//! by a new one that resumes the session (WebSocket, relay, in-process) or not (stdio,
//! where the server ends with its stdin).

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "in-process")]
use exec_server_core::{InProcessConnection, ServerContext};
use exec_server_relay_core::harness::{connect_relay, RelayConnectArgs};
use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::Connector;

use exec_server_relay_core::busy::{parse_retry_after, BusyRetries};

use crate::ExecServerError;

/// How many inbound messages a connection buffers before the transport stops reading.
const INBOUND_QUEUE: usize = 64;

/// Opens connections to one server.
pub trait Transport: Send + Sync + 'static {
    /// Opens a fresh connection (no handshake yet).
    fn connect(&self) -> BoxFuture<'_, Result<Connection, ExecServerError>>;

    /// True when a session survives the end of a connection, so the client may reconnect
    /// and resume it (PROTOCOL §3.4).
    fn resumable(&self) -> bool;

    /// A short description for error messages, without secrets.
    fn describe(&self) -> String;

    /// Called once when the client shuts down for good.
    fn shutdown(&self) {}
}

/// One open connection: whole JSON-RPC messages in both directions.
///
/// The connection ends when `incoming` yields `None`. Dropping the `Connection` closes it;
/// `guard` holds whatever keeps the transport alive (tasks, child processes).
pub struct Connection {
    /// Messages to the server, in order. Unbounded so that the client can queue requests
    /// while holding its state lock, which is what keeps resent writes ahead of new ones.
    pub outgoing: mpsc::UnboundedSender<String>,
    /// Messages from the server; `None` once the connection is gone.
    pub incoming: mpsc::Receiver<String>,
    guard: Option<Box<dyn Any + Send>>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

impl Connection {
    /// A connection from its two channels.
    pub fn new(outgoing: mpsc::UnboundedSender<String>, incoming: mpsc::Receiver<String>) -> Self {
        Self {
            outgoing,
            incoming,
            guard: None,
        }
    }

    /// Keeps `guard` alive exactly as long as the connection.
    pub fn with_guard(mut self, guard: impl Any + Send) -> Self {
        self.guard = Some(Box::new(guard));
        self
    }
}

/// Aborts its tasks when dropped, so dropping a [`Connection`] closes its socket or pipes.
struct TaskGuard(Vec<JoinHandle<()>>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

// ---- stdio ----------------------------------------------------------------------------

/// Spawns `exec-server --listen stdio` (or any command speaking the protocol on its stdin
/// and stdout). Each connect spawns a new server; sessions cannot be resumed.
pub(crate) struct StdioTransport {
    command: std::sync::Mutex<Option<Command>>,
    program: String,
}

impl StdioTransport {
    pub(crate) fn new(mut command: Command) -> Self {
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(false);
        // The whole command line, for errors: `sh` alone would not say which server.
        let std = command.as_std();
        let program = std::iter::once(std.get_program())
            .chain(std.get_args())
            .map(|part| part.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        Self {
            command: std::sync::Mutex::new(Some(command)),
            program,
        }
    }
}

impl Transport for StdioTransport {
    fn connect(&self) -> BoxFuture<'_, Result<Connection, ExecServerError>> {
        Box::pin(async move {
            // A stdio server lives and dies with its one connection: it is spawned once.
            let mut command = self.command.lock().unwrap().take().ok_or_else(|| {
                ExecServerError::Connect(format!("the stdio server `{}` has ended", self.program))
            })?;
            let mut child = command.spawn().map_err(|e| {
                ExecServerError::Connect(format!("failed to spawn `{}`: {e}", self.program))
            })?;
            let lifetime = ChildLifetime::new(&child);
            let mut stdin = child.stdin.take().expect("stdin is piped");
            let stdout = child.stdout.take().expect("stdout is piped");
            let (outgoing, mut to_server) = mpsc::unbounded_channel::<String>();
            let (from_server, incoming) = mpsc::channel(INBOUND_QUEUE);
            let reaped = Arc::clone(&lifetime.reaped);
            let writer = tokio::spawn(async move {
                while let Some(mut message) = to_server.recv().await {
                    message.push('\n');
                    if stdin.write_all(message.as_bytes()).await.is_err()
                        || stdin.flush().await.is_err()
                    {
                        break;
                    }
                }
                // Dropping stdin is end-of-file: the server shuts down (PROTOCOL §1.2).
            });
            let reader = tokio::spawn(async move {
                let mut lines = BufReader::new(stdout);
                let mut line = String::new();
                loop {
                    line.clear();
                    match lines.read_line(&mut line).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let message = line.trim_end_matches(['\n', '\r']);
                            if message.trim().is_empty() {
                                continue;
                            }
                            if from_server.send(message.to_owned()).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                // The server is gone or going; reap it so it does not linger as a zombie.
                let _ = child.wait().await;
                reaped.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            let guard = (TaskGuard(vec![writer, reader]), lifetime);
            Ok(Connection::new(outgoing, incoming).with_guard(guard))
        })
    }

    fn resumable(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        format!("stdio server `{}`", self.program)
    }
}

/// Ends a stdio server that outlives its connection. End of stdin stops a server that
/// speaks the protocol; one that does not (a server listening elsewhere, a wrong command)
/// would run on, so when the connection is dropped before the child was reaped it gets
/// SIGTERM — its whole process group when it leads one (a command run through `sh -c` in
/// its own group), so the shell's children go too.
struct ChildLifetime {
    pid: Option<u32>,
    reaped: Arc<std::sync::atomic::AtomicBool>,
}

impl ChildLifetime {
    fn new(child: &tokio::process::Child) -> Self {
        Self {
            pid: child.id(),
            reaped: Arc::default(),
        }
    }
}

impl Drop for ChildLifetime {
    fn drop(&mut self) {
        let Some(pid) = self.pid.and_then(|pid| libc::pid_t::try_from(pid).ok()) else {
            return;
        };
        if self.reaped.load(std::sync::atomic::Ordering::SeqCst) {
            // Reaped: the pid may belong to someone else by now.
            return;
        }
        // SAFETY: getpgid and kill take plain integers. The child is not reaped (the flag is
        // set only after `wait` returns), so `pid` still names it, alive or a zombie.
        unsafe {
            let target = if libc::getpgid(pid) == pid { -pid } else { pid };
            libc::kill(target, libc::SIGTERM);
        }
    }
}

// ---- WebSocket ------------------------------------------------------------------------

/// A WebSocket listener at `ws://IP:PORT` (or `wss://` behind a TLS proxy), optionally
/// with a bearer token (PROTOCOL §1.3).
pub(crate) struct WebSocketTransport {
    url: String,
    bearer_token: Option<String>,
    max_message_bytes: usize,
    keepalive: Duration,
}

impl WebSocketTransport {
    pub(crate) fn new(
        url: &str,
        bearer_token: Option<String>,
        max_message_bytes: usize,
        keepalive: Duration,
    ) -> Self {
        Self {
            url: url.to_owned(),
            bearer_token: bearer_token.filter(|t| !t.is_empty()),
            max_message_bytes,
            keepalive,
        }
    }
}

/// How much of a refusal's body is kept for the error: enough for the reason.
const REFUSAL_BODY_CHARS: usize = 200;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

impl WebSocketTransport {
    /// The upgraded socket, after any busy retries ([`BusyRetries`]); an HTTP refusal is
    /// [`ExecServerError::Refused`] with the server's status and reason.
    async fn upgrade_when_not_busy(&self) -> Result<Socket, ExecServerError> {
        let mut busy = BusyRetries::default();
        loop {
            let error = match self.upgrade().await? {
                Ok(socket) => return Ok(socket),
                Err(error) => error,
            };
            let tokio_tungstenite::tungstenite::Error::Http(response) = &error else {
                return Err(ExecServerError::Connect(format!("{}: {error}", self.url)));
            };
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|value| value.to_str().ok())
                .and_then(parse_retry_after);
            let Some(wait) = busy.next_wait(status, retry_after) else {
                let body = response.body().as_deref().unwrap_or_default();
                let mut body = String::from_utf8_lossy(body).into_owned();
                // A server that echoes the request back would print our credential.
                if let Some(token) = &self.bearer_token {
                    body = body.replace(token.as_str(), "<redacted>");
                }
                return Err(ExecServerError::Refused {
                    url: self.url.clone(),
                    status,
                    body: exec_server_proto::log_text::printable_start(&body, REFUSAL_BODY_CHARS),
                });
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// One upgrade attempt: the outer error is a request that cannot be built, the inner
    /// one what the server or the network answered.
    async fn upgrade(
        &self,
    ) -> Result<Result<Socket, tokio_tungstenite::tungstenite::Error>, ExecServerError> {
        let mut request = self
            .url
            .as_str()
            .into_client_request()
            .map_err(|e| ExecServerError::Connect(format!("invalid URL {}: {e}", self.url)))?;
        if let Some(token) = &self.bearer_token {
            let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                ExecServerError::Connect("the bearer token is not a valid header value".into())
            })?;
            request.headers_mut().insert("Authorization", value);
        }
        let config = WebSocketConfig::default()
            .max_message_size(Some(self.max_message_bytes))
            .max_frame_size(Some(self.max_message_bytes));
        // `wss` with the relay's TLS configuration (the system's roots), so every TLS
        // connection of the client trusts the same certificates.
        let tls = (request.uri().scheme_str() == Some("wss"))
            .then(|| Connector::Rustls(exec_server_relay_core::tls::client_config()));
        Ok(
            tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, tls)
                .await
                .map(|(socket, _)| socket),
        )
    }
}

impl Transport for WebSocketTransport {
    fn connect(&self) -> BoxFuture<'_, Result<Connection, ExecServerError>> {
        Box::pin(async move {
            let socket = self.upgrade_when_not_busy().await?;
            let (mut sink, mut stream) = socket.split();
            let (outgoing, mut to_server) = mpsc::unbounded_channel::<String>();
            let (from_server, incoming) = mpsc::channel(INBOUND_QUEUE);
            let keepalive = self.keepalive;
            let task = tokio::spawn(async move {
                // Liveness: a ping every `keepalive`; a connection that has shown no sign of
                // life for three intervals is treated as dead, so recovery can start even
                // when the network drops silently.
                let mut ticker = tokio::time::interval(keepalive);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                ticker.tick().await;
                let mut last_heard = tokio::time::Instant::now();
                loop {
                    tokio::select! {
                        message = to_server.recv() => match message {
                            Some(text) => {
                                if sink.send(Message::Text(text.into())).await.is_err() {
                                    break;
                                }
                            }
                            None => {
                                let _ = sink.send(Message::Close(None)).await;
                                break;
                            }
                        },
                        frame = stream.next() => {
                            last_heard = tokio::time::Instant::now();
                            let text = match frame {
                                Some(Ok(Message::Text(text))) => text.as_str().to_owned(),
                                Some(Ok(Message::Binary(bytes))) => match String::from_utf8(bytes.to_vec()) {
                                    Ok(text) => text,
                                    Err(_) => continue,
                                },
                                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                                Some(Ok(_)) => continue,
                            };
                            if from_server.send(text).await.is_err() {
                                break;
                            }
                        }
                        _ = ticker.tick() => {
                            if last_heard.elapsed() > keepalive * 3 {
                                tracing::debug!("websocket silent for too long; dropping it");
                                break;
                            }
                            if sink.send(Message::Ping(Default::default())).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            });
            Ok(Connection::new(outgoing, incoming).with_guard(TaskGuard(vec![task])))
        })
    }

    fn resumable(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!("websocket {}", self.url)
    }
}

// ---- in-process -----------------------------------------------------------------------

/// A server in this process: no socket, the same connection processor as every transport.
#[cfg(feature = "in-process")]
pub(crate) struct InProcessTransport {
    server: Arc<ServerContext>,
    /// The client built this server, so it shuts it down when it is done with it.
    owned: bool,
}

#[cfg(feature = "in-process")]
impl InProcessTransport {
    pub(crate) fn new(server: Arc<ServerContext>, owned: bool) -> Self {
        Self { server, owned }
    }
}

#[cfg(feature = "in-process")]
impl Transport for InProcessTransport {
    fn connect(&self) -> BoxFuture<'_, Result<Connection, ExecServerError>> {
        Box::pin(async move {
            if !self.server.is_ready() {
                return Err(ExecServerError::Connect(
                    "the in-process server is shutting down".into(),
                ));
            }
            let mut connection = InProcessConnection::open(&self.server);
            let (outgoing, mut to_server) = mpsc::unbounded_channel::<String>();
            let (from_server, incoming) = mpsc::channel(INBOUND_QUEUE);
            let task = tokio::spawn(async move {
                loop {
                    tokio::select! {
                        message = to_server.recv() => match message {
                            Some(text) => connection.send_raw(text).await,
                            None => break,
                        },
                        message = connection.recv() => match message {
                            Some(value) => {
                                if from_server.send(value.to_string()).await.is_err() {
                                    break;
                                }
                            }
                            None => break,
                        },
                    }
                }
            });
            Ok(Connection::new(outgoing, incoming).with_guard(TaskGuard(vec![task])))
        })
    }

    fn resumable(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        "in-process server".into()
    }

    fn shutdown(&self) {
        if self.owned {
            self.server.begin_shutdown();
        }
    }
}

// ---- relay ----------------------------------------------------------------------------

/// An executor behind the encrypted relay (RELAY.md): each connection is a new relay
/// stream. The relay resumes a stream across short network drops by itself; when a stream
/// is lost for good, the client opens a new one and resumes the session on it.
pub(crate) struct RelayTransport {
    args: RelayConnectArgs,
}

impl RelayTransport {
    pub(crate) fn new(args: RelayConnectArgs) -> Self {
        Self { args }
    }
}

impl Transport for RelayTransport {
    fn connect(&self) -> BoxFuture<'_, Result<Connection, ExecServerError>> {
        Box::pin(async move {
            let stream = connect_relay(self.args.clone())
                .await
                .map_err(|e| ExecServerError::Connect(format!("{}: {e}", self.describe())))?;
            let (to_relay, mut from_relay) = stream.split();
            let (outgoing, mut to_server) = mpsc::unbounded_channel::<String>();
            let (from_server, incoming) = mpsc::channel(INBOUND_QUEUE);
            let task = tokio::spawn(async move {
                loop {
                    tokio::select! {
                        message = to_server.recv() => match message {
                            Some(text) => {
                                if to_relay.send(text).await.is_err() {
                                    break;
                                }
                            }
                            None => break,
                        },
                        message = from_relay.recv() => match message {
                            Some(bytes) => {
                                let Ok(text) = String::from_utf8(bytes.to_vec()) else {
                                    continue;
                                };
                                if from_server.send(text).await.is_err() {
                                    break;
                                }
                            }
                            None => break,
                        },
                    }
                }
            });
            Ok(Connection::new(outgoing, incoming).with_guard(TaskGuard(vec![task])))
        })
    }

    fn resumable(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!("relay environment {}", self.args.environment_id)
    }
}

//! [`ExecServerClient`]: connecting, and one typed method per protocol method.

use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "in-process")]
use exec_server_config::{ConfigSource, CoreConfig};
#[cfg(feature = "in-process")]
use exec_server_core::ServerContext;
use exec_server_proto::bytes::{decode_base64, encode_base64, Empty};
use exec_server_proto::environment::{EnvironmentInfo, EnvironmentStatus};
use exec_server_proto::error::code;
use exec_server_proto::fs::{
    CanonicalizeParams, CloseParams, CopyParams, CreateDirectoryParams, DirectoryEntry,
    GetMetadataParams, HandleResult, Metadata, OpenParams, PathResult, ReadBlockParams,
    ReadBlockResult, ReadDirectoryParams, ReadDirectoryResult, ReadFileParams, ReadFileResult,
    RemoveParams, WalkParams, WalkResult, WriteFileParams,
};
use exec_server_proto::process::{
    CloseStdinParams, CloseStdinResult, ReadParams, ReadResult, ResizeParams, SandboxType, Signal,
    SignalParams, StartParams, TerminateParams, TerminateResult, WriteParams, WriteResult,
    WriteStatus,
};
use exec_server_proto::{fs, process};
use exec_server_relay_core::harness::RelayConnectArgs;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::process::{ProcessControl, ProcessEvents, ProcessHandle};
use crate::session::{handshake, supervise, HandshakeError, Retry, Shared};
#[cfg(feature = "in-process")]
use crate::transport::InProcessTransport;
use crate::transport::{RelayTransport, StdioTransport, Transport, WebSocketTransport};
use crate::ExecServerError;

/// Settings of a client. `Default` gives the values reference clients use.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// `initialize.clientName`, for the server's logs.
    pub client_name: String,
    /// `initialize.extensions`: the server extensions whose notifications this client
    /// handles. This client handles only reference notifications, so none by default.
    pub extensions: Vec<String>,
    /// Bound on opening one connection (spawn, TCP + WebSocket upgrade).
    pub connect_timeout: Duration,
    /// Bound on one `initialize` exchange.
    pub initialize_timeout: Duration,
    /// How long after losing the connection the client keeps trying to resume the
    /// session before it gives up (25 s: inside the server's default 30 s detach window).
    pub resume_deadline: Duration,
    /// Pause between resume attempts that got -32010 (PROTOCOL §3.4).
    pub resume_retry_interval: Duration,
    /// Largest message accepted from a WebSocket server.
    pub max_message_bytes: usize,
    /// WebSocket ping interval; a socket silent for three intervals counts as lost.
    pub keepalive_interval: Duration,
    /// Events buffered per process handle before the connection waits for the handle.
    pub event_queue: usize,
    /// Out-of-order events buffered per process before a catch-up read fills the gap.
    pub reorder_window: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            client_name: "exec-server-client".into(),
            extensions: Vec::new(),
            connect_timeout: Duration::from_secs(10),
            initialize_timeout: Duration::from_secs(10),
            resume_deadline: Duration::from_secs(25),
            resume_retry_interval: Duration::from_millis(100),
            max_message_bytes: 64 * 1024 * 1024,
            keepalive_interval: Duration::from_secs(10),
            event_queue: 256,
            reorder_window: 1024,
        }
    }
}

/// A connection to an exec-server session that survives the loss of its transport.
///
/// Cheap to clone; every clone uses the same session. The session ends (and a stdio or
/// in-process server shuts down) when the last clone, process handle and event stream is
/// dropped.
#[derive(Clone)]
pub struct ExecServerClient {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    shared: Arc<Shared>,
    /// Cancelled when the last clone goes away: stops the supervisor.
    closed: CancellationToken,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

impl std::fmt::Debug for ExecServerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecServerClient")
            .field("session_id", &self.session_id())
            .finish_non_exhaustive()
    }
}

impl ExecServerClient {
    /// Spawns `command` (for example `exec-server --listen stdio`) and speaks to it over
    /// its stdin and stdout. Its stderr is left as `command` configures it. A stdio
    /// session cannot be resumed: the server ends with its stdin.
    pub async fn connect_stdio(
        command: Command,
        options: ClientOptions,
    ) -> Result<Self, ExecServerError> {
        Self::connect_with(Arc::new(StdioTransport::new(command)), options).await
    }

    /// Connects to a WebSocket listener (`ws://IP:PORT`), sending `Authorization: Bearer`
    /// when a token is given.
    pub async fn connect_websocket(
        url: &str,
        bearer_token: Option<String>,
        options: ClientOptions,
    ) -> Result<Self, ExecServerError> {
        let transport = WebSocketTransport::new(
            url,
            bearer_token,
            options.max_message_bytes,
            options.keepalive_interval,
        );
        Self::connect_with(Arc::new(transport), options).await
    }

    /// Builds a server in this process from `source` (with every plugin linked into the
    /// binary) and connects to it without a socket. The server shuts down with the client.
    /// Needs the `in-process` feature.
    #[cfg(feature = "in-process")]
    pub async fn connect_in_process(
        source: &ConfigSource,
        options: ClientOptions,
    ) -> Result<Self, ExecServerError> {
        let core = CoreConfig::from_source(source, None)
            .map_err(|e| ExecServerError::Connect(e.to_string()))?;
        let server = ServerContext::new(source, core).map_err(|e| ExecServerError::Connect(e.0))?;
        Self::connect_with(Arc::new(InProcessTransport::new(server, true)), options).await
    }

    /// Connects to an existing in-process server; it keeps running after the client.
    /// Needs the `in-process` feature.
    #[cfg(feature = "in-process")]
    pub async fn connect_in_process_server(
        server: Arc<ServerContext>,
        options: ClientOptions,
    ) -> Result<Self, ExecServerError> {
        Self::connect_with(Arc::new(InProcessTransport::new(server, false)), options).await
    }

    /// Connects to an executor through the encrypted relay (RELAY.md §9.4): fetches a
    /// connect bundle from the registry, opens the rendezvous socket and performs the Noise
    /// handshake, then `initialize`. The relay resumes its stream across short drops; when
    /// a stream is lost for good the client resumes the session on a new one.
    pub async fn connect_relay(
        args: RelayConnectArgs,
        options: ClientOptions,
    ) -> Result<Self, ExecServerError> {
        Self::connect_with(Arc::new(RelayTransport::new(args)), options).await
    }

    /// Connects through any [`Transport`] and performs the handshake.
    pub async fn connect_with(
        transport: Arc<dyn Transport>,
        options: ClientOptions,
    ) -> Result<Self, ExecServerError> {
        let opened = tokio::time::timeout(options.connect_timeout, transport.connect()).await;
        let mut connection = match opened {
            Ok(Ok(connection)) => connection,
            Ok(Err(error)) => {
                transport.shutdown();
                return Err(error);
            }
            Err(_) => {
                transport.shutdown();
                return Err(ExecServerError::Timeout {
                    what: "connecting",
                    after: options.connect_timeout,
                });
            }
        };
        let next_id = AtomicI64::new(1);
        let session_id = match handshake(
            &mut connection,
            &next_id,
            &options.client_name,
            &options.extensions,
            None,
            options.initialize_timeout,
        )
        .await
        {
            Ok(session_id) => session_id,
            Err(error) => {
                transport.shutdown();
                return Err(match error {
                    HandshakeError::Rpc(error) => ExecServerError::Rpc(error),
                    HandshakeError::Lost => ExecServerError::Connect(format!(
                        "the {} closed the connection during initialize",
                        transport.describe()
                    )),
                    HandshakeError::Timeout => ExecServerError::Timeout {
                        what: "initialize",
                        after: options.initialize_timeout,
                    },
                    HandshakeError::NotJsonRpc(line) => ExecServerError::Connect(format!(
                        "the {} does not speak JSON-RPC on this connection; it wrote `{line}` (a server started for --stdio needs `--listen stdio`)",
                        transport.describe()
                    )),
                });
            }
        };
        let shared = Shared::new(options, transport, &connection, session_id, next_id);
        let closed = CancellationToken::new();
        tokio::spawn(supervise(Arc::clone(&shared), connection, closed.clone()));
        Ok(Self {
            inner: Arc::new(ClientInner { shared, closed }),
        })
    }

    /// The session id the server assigned (PROTOCOL §3.1); unchanged by resumes.
    pub fn session_id(&self) -> String {
        self.inner.shared.session_id()
    }

    /// A fresh `processId` for [`StartParams`].
    pub fn new_process_id() -> String {
        format!("proc-{}", uuid::Uuid::new_v4())
    }

    async fn request<P, R>(
        &self,
        method: &str,
        params: &P,
        retry: Retry,
    ) -> Result<R, ExecServerError>
    where
        P: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        let answer = self.inner.shared.call(method, params, retry).await;
        let raw = answer.result?;
        serde_json::from_str(raw.get())
            .map_err(|e| ExecServerError::Protocol(format!("{method} result: {e}")))
    }

    /// Calls any method (for example a third-party plugin's) with raw JSON. It is not
    /// repeated after a reconnect.
    pub async fn request_raw(&self, method: &str, params: Value) -> Result<Value, ExecServerError> {
        self.request(method, &params, Retry::Once).await
    }

    /// [ext] `session/close`: tells the server this client is done, so it ends the session
    /// at once (its processes are killed) instead of keeping it detached for a resume; the
    /// server then closes the connection. Not repeated after a reconnect.
    pub async fn close_session(&self) -> Result<(), ExecServerError> {
        let _: Value = self
            .request("session/close", &serde_json::json!({}), Retry::Once)
            .await?;
        Ok(())
    }

    // ---- process/* (PROTOCOL §4) ----------------------------------------------------

    /// `process/start`: starts a process and follows its events.
    ///
    /// If the connection is lost before the answer, the start is repeated on the resumed
    /// connection; an `already exists` answer then means the first attempt succeeded,
    /// and the handle catches up on everything the process did meanwhile.
    pub async fn start_process(
        &self,
        params: StartParams,
    ) -> Result<ProcessHandle, ExecServerError> {
        let shared = &self.inner.shared;
        let id = params.process_id.clone();
        let rx = shared.follow(&id)?;
        let answer = shared.call(process::START, &params, Retry::Resend).await;
        let sandbox_type = match answer.result {
            Ok(raw) => {
                shared.started(&id, false);
                serde_json::from_str::<Value>(raw.get()).ok().and_then(|v| {
                    serde_json::from_value::<SandboxType>(v["sandboxType"].clone()).ok()
                })
            }
            Err(ExecServerError::Rpc(error))
                if answer.resent
                    && error.code == code::INVALID_REQUEST
                    && error.message == format!("process {id} already exists") =>
            {
                shared.started(&id, true);
                params.sandbox.is_none().then_some(SandboxType::None)
            }
            Err(error) => {
                shared.unfollow(&id);
                return Err(error);
            }
        };
        Ok(ProcessHandle {
            control: ProcessControl::new(self.clone(), &id),
            events: ProcessEvents {
                rx,
                finished: false,
                _client: self.clone(),
            },
            sandbox_type,
        })
    }

    /// `process/read` (PROTOCOL §4.5). Repeated after a reconnect.
    pub async fn process_read(&self, params: ReadParams) -> Result<ReadResult, ExecServerError> {
        self.request(process::READ, &params, Retry::Resend).await
    }

    /// `process/write` (PROTOCOL §4.7). Repeated after a reconnect only when it carries a
    /// `writeId`, which makes the repeat harmless. [`ProcessControl::write`] numbers
    /// writes automatically.
    pub async fn process_write(&self, params: WriteParams) -> Result<WriteResult, ExecServerError> {
        let retry = if params.write_id.is_some() {
            Retry::Resend
        } else {
            Retry::Once
        };
        self.request(process::WRITE, &params, retry).await
    }

    pub(crate) async fn write_with_id(
        &self,
        process_id: &str,
        bytes: &[u8],
        write_id: Option<String>,
    ) -> Result<WriteStatus, ExecServerError> {
        let params = WriteParams {
            process_id: process_id.to_owned(),
            chunk: encode_base64(bytes),
            write_id,
        };
        Ok(self.process_write(params).await?.status)
    }

    /// `process/signal` (PROTOCOL §4.8). Not repeated after a reconnect (a signal must not
    /// be delivered twice).
    pub async fn process_signal(
        &self,
        process_id: &str,
        signal: Signal,
    ) -> Result<(), ExecServerError> {
        let params = SignalParams {
            process_id: process_id.to_owned(),
            signal,
        };
        let _: Empty = self.request(process::SIGNAL, &params, Retry::Once).await?;
        Ok(())
    }

    /// `process/resize` (PROTOCOL §4.9).
    pub async fn process_resize(
        &self,
        process_id: &str,
        rows: u16,
        cols: u16,
    ) -> Result<(), ExecServerError> {
        let params = ResizeParams {
            process_id: process_id.to_owned(),
            rows,
            cols,
        };
        let _: Empty = self
            .request(process::RESIZE, &params, Retry::Resend)
            .await?;
        Ok(())
    }

    /// `process/terminate` (PROTOCOL §4.10): `true` if the process was running.
    pub async fn process_terminate(&self, process_id: &str) -> Result<bool, ExecServerError> {
        let params = TerminateParams {
            process_id: process_id.to_owned(),
        };
        let result: TerminateResult = self
            .request(process::TERMINATE, &params, Retry::Resend)
            .await?;
        Ok(result.running)
    }

    /// [ext] `process/closeStdin`: the process reads end of input once every earlier write
    /// is in. Repeated after a reconnect (closing twice answers `stdinClosed`).
    pub async fn process_close_stdin(
        &self,
        process_id: &str,
    ) -> Result<WriteStatus, ExecServerError> {
        let params = CloseStdinParams {
            process_id: process_id.to_owned(),
        };
        let result: CloseStdinResult = self
            .request(process::CLOSE_STDIN, &params, Retry::Resend)
            .await?;
        Ok(result.status)
    }

    // ---- fs/* (PROTOCOL §5) ---------------------------------------------------------

    /// `fs/readFile`: the file's bytes.
    pub async fn fs_read_file(&self, params: ReadFileParams) -> Result<Vec<u8>, ExecServerError> {
        let result: ReadFileResult = self.request(fs::READ_FILE, &params, Retry::Resend).await?;
        decode_base64(&result.data_base64)
            .map_err(|e| ExecServerError::Protocol(format!("fs/readFile dataBase64: {e}")))
    }

    /// `fs/readFile` of `path` (a `file:` URI or an absolute path) with defaults.
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, ExecServerError> {
        self.fs_read_file(ReadFileParams {
            path: path.to_owned(),
            follow_symlinks: None,
            sandbox: None,
            sandbox_policy: None,
        })
        .await
    }

    /// `fs/writeFile`.
    pub async fn fs_write_file(&self, params: WriteFileParams) -> Result<(), ExecServerError> {
        let _: Empty = self.request(fs::WRITE_FILE, &params, Retry::Resend).await?;
        Ok(())
    }

    /// `fs/writeFile` of `data` to `path` with defaults.
    pub async fn write_file(&self, path: &str, data: &[u8]) -> Result<(), ExecServerError> {
        self.fs_write_file(WriteFileParams {
            path: path.to_owned(),
            data_base64: encode_base64(data),
            follow_symlinks: None,
            sandbox: None,
            sandbox_policy: None,
        })
        .await
    }

    /// `fs/createDirectory`. A non-recursive create is not repeated after a reconnect
    /// (the repeat would fail with `File exists`).
    pub async fn fs_create_directory(
        &self,
        params: CreateDirectoryParams,
    ) -> Result<(), ExecServerError> {
        let retry = if params.recursive == Some(false) {
            Retry::Once
        } else {
            Retry::Resend
        };
        let _: Empty = self.request(fs::CREATE_DIRECTORY, &params, retry).await?;
        Ok(())
    }

    /// `fs/getMetadata`.
    pub async fn fs_get_metadata(
        &self,
        params: GetMetadataParams,
    ) -> Result<Metadata, ExecServerError> {
        self.request(fs::GET_METADATA, &params, Retry::Resend).await
    }

    /// `fs/canonicalize`: the canonical `file:` URI.
    pub async fn fs_canonicalize(
        &self,
        params: CanonicalizeParams,
    ) -> Result<String, ExecServerError> {
        let result: PathResult = self
            .request(fs::CANONICALIZE, &params, Retry::Resend)
            .await?;
        Ok(result.path)
    }

    /// `fs/readDirectory`.
    pub async fn fs_read_directory(
        &self,
        params: ReadDirectoryParams,
    ) -> Result<Vec<DirectoryEntry>, ExecServerError> {
        let result: ReadDirectoryResult = self
            .request(fs::READ_DIRECTORY, &params, Retry::Resend)
            .await?;
        Ok(result.entries)
    }

    /// `fs/walk`.
    pub async fn fs_walk(&self, params: WalkParams) -> Result<WalkResult, ExecServerError> {
        self.request(fs::WALK, &params, Retry::Resend).await
    }

    /// `fs/remove`. Repeated after a reconnect only with `force` (the default), for which
    /// a repeat is harmless.
    pub async fn fs_remove(&self, params: RemoveParams) -> Result<(), ExecServerError> {
        let retry = if params.force == Some(false) {
            Retry::Once
        } else {
            Retry::Resend
        };
        let _: Empty = self.request(fs::REMOVE, &params, retry).await?;
        Ok(())
    }

    /// `fs/copy`.
    pub async fn fs_copy(&self, params: CopyParams) -> Result<(), ExecServerError> {
        let _: Empty = self.request(fs::COPY, &params, Retry::Once).await?;
        Ok(())
    }

    /// `fs/open`: the handle id. Handles belong to the connection (PROTOCOL §3.5): after
    /// a reconnect they are gone and `fs/readBlock` answers -32004.
    pub async fn fs_open(&self, params: OpenParams) -> Result<String, ExecServerError> {
        let result: HandleResult = self.request(fs::OPEN, &params, Retry::Once).await?;
        Ok(result.handle_id)
    }

    /// `fs/readBlock`, with the chunk decoded.
    pub async fn fs_read_block(
        &self,
        params: ReadBlockParams,
    ) -> Result<ReadBlockResult<Vec<u8>>, ExecServerError> {
        let result: ReadBlockResult = self.request(fs::READ_BLOCK, &params, Retry::Once).await?;
        let chunk = decode_base64(&result.chunk)
            .map_err(|e| ExecServerError::Protocol(format!("fs/readBlock chunk: {e}")))?;
        Ok(ReadBlockResult {
            chunk,
            eof: result.eof,
        })
    }

    /// `fs/writeBlock`: `data` at `offset` of a handle opened with mode `replace`. Not
    /// repeated after a reconnect (the handle belonged to the lost connection).
    pub async fn fs_write_block(
        &self,
        handle_id: &str,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ExecServerError> {
        let params = serde_json::json!({
            "handleId": handle_id,
            "offset": offset,
            "chunk": encode_base64(data),
        });
        let _: Empty = self.request(fs::WRITE_BLOCK, &params, Retry::Once).await?;
        Ok(())
    }

    /// `fs/close`.
    pub async fn fs_close(&self, handle_id: &str) -> Result<(), ExecServerError> {
        let params = CloseParams {
            handle_id: handle_id.to_owned(),
        };
        let _: Empty = self.request(fs::CLOSE, &params, Retry::Once).await?;
        Ok(())
    }

    // ---- environment/* (PROTOCOL §6) ------------------------------------------------

    /// `environment/info`. Capabilities the server does not report count as `false`.
    pub async fn environment_info(&self) -> Result<EnvironmentInfo, ExecServerError> {
        let mut info: Value = self
            .request("environment/info", &Value::Null, Retry::Resend)
            .await?;
        if let Some(capabilities) = info.get_mut("capabilities").and_then(Value::as_object_mut) {
            for name in [
                "networkProxyLaunch",
                "capabilityDiscoverySandbox",
                "environmentConfigRead",
                "httpHeaderEnvVars",
                "sandboxedFileStreaming",
                "shellSnapshotV2",
            ] {
                capabilities.entry(name).or_insert(Value::Bool(false));
            }
        }
        serde_json::from_value(info)
            .map_err(|e| ExecServerError::Protocol(format!("environment/info result: {e}")))
    }

    /// `environment/status`.
    pub async fn environment_status(&self) -> Result<EnvironmentStatus, ExecServerError> {
        self.request("environment/status", &Value::Null, Retry::Resend)
            .await
    }
}

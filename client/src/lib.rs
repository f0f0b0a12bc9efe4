//! The Rust client library of exec-server: its one job is to speak the codex exec-server
//! protocol (`PROTOCOL.md`) to a server, for any program — typed calls for every method,
//! process events strictly in `seq` order, and sessions that survive the loss of their
//! connection. The `exec-server run` command is one such program (in the binary crate).
//!
//! It carries no server: its transports are stdio, WebSocket and the encrypted relay
//! (through `exec-server-relay-core`); with the `in-process` feature it also connects to a
//! server built in the same process (which brings in `exec-server-core`).
//!
//! * [`client`] — [`ExecServerClient`]: the connect functions (stdio, WebSocket, relay,
//!   in-process, any [`Transport`]) and one typed method per protocol method.
//! * [`process`] — [`ProcessHandle`], its ordered [`ProcessEvents`] and the cloneable
//!   [`ProcessControl`] (write with automatic `writeId`s, resize, signal, terminate).
//! * [`transport`] — the [`Transport`] trait and the built-in transports.
//! * [`error`] — [`ExecServerError`].
//! * `session` — requests in flight, followed processes, and the supervisor that resumes
//!   the session after a lost connection.
//! * `reorder` — the per-process reorder buffer.
//!
//! # Recovery
//!
//! When a WebSocket, relay or in-process connection is lost, the client reconnects and resumes
//! its session with `initialize { resumeSessionId }` within
//! [`ClientOptions::resume_deadline`] (25 s), retrying while the server answers -32010.
//! It then catches every process up with `process/read` from the last `seq` it delivered,
//! so each handle sees every event exactly once, and repeats the reads, writes (with the
//! same `writeId`) and other repeatable requests that were in flight. If the session cannot
//! be resumed, every call and every process handle ends with
//! [`ExecServerError::SessionLost`]. A stdio server ends with its stdin, so a stdio
//! session is never resumed.
//!
//! # Example
//!
//! ```no_run
//! use std::collections::BTreeMap;
//!
//! use exec_server_client::proto::process::StartParams;
//! use exec_server_client::{ClientOptions, ExecServerClient, ProcessEvent};
//!
//! # async fn example() -> Result<(), exec_server_client::ExecServerError> {
//! let client =
//!     ExecServerClient::connect_websocket("ws://127.0.0.1:9000", None, ClientOptions::default())
//!         .await?;
//! let mut process = client
//!     .start_process(StartParams {
//!         process_id: ExecServerClient::new_process_id(),
//!         argv: vec!["sh".into(), "-c".into(), "echo hello; exit 3".into()],
//!         cwd: "/tmp".into(),
//!         env: BTreeMap::new(),
//!         tty: false,
//!         pipe_stdin: None,
//!         arg0: None,
//!         env_policy: None,
//!         sandbox: None,
//!         size: None,
//!         network_proxy: None,
//!         enforce_managed_network: None,
//!         managed_network: None,
//!     })
//!     .await?;
//! while let Some(event) = process.next_event().await {
//!     match event? {
//!         ProcessEvent::Output { bytes, .. } => print!("{}", String::from_utf8_lossy(&bytes)),
//!         ProcessEvent::Exited { exit_code, .. } => println!("exit code {exit_code}"),
//!         _ => {}
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Files, over a stdio server this time:
//!
//! ```no_run
//! use exec_server_client::{ClientOptions, ExecServerClient};
//!
//! # async fn example() -> Result<(), exec_server_client::ExecServerError> {
//! let mut server = tokio::process::Command::new("exec-server");
//! server.args(["--listen", "stdio"]);
//! let client = ExecServerClient::connect_stdio(server, ClientOptions::default()).await?;
//! client.write_file("file:///tmp/greeting.txt", b"hello world\n").await?;
//! assert_eq!(client.read_file("/tmp/greeting.txt").await?, b"hello world\n");
//! # Ok(())
//! # }
//! ```
//!
//! A server in this process, for tests and embedding (with the `in-process` feature; the
//! plugin crates must be linked into the binary for their methods to exist):
//!
//! ```no_run
//! # #[cfg(feature = "in-process")]
//! # async fn example() -> Result<(), exec_server_client::ExecServerError> {
//! use exec_server_client::{ClientOptions, ExecServerClient};
//! use exec_server_config::ConfigSource;
//!
//! let source = ConfigSource::from_toml_str("[session]\ndetached_ttl_ms = 5000\n");
//! let client = ExecServerClient::connect_in_process(&source, ClientOptions::default()).await?;
//! println!("{}", client.environment_status().await?.status);
//! # Ok(())
//! # }
//! ```

pub mod client;
pub mod error;
pub mod process;
mod reorder;
mod session;
pub mod transport;

pub use client::{ClientOptions, ExecServerClient};
pub use error::ExecServerError;
pub use exec_server_proto as proto;
/// The relay core, for [`relay::harness::RelayConnectArgs`].
pub use exec_server_relay_core as relay;
pub use process::{
    EventResult, ProcessControl, ProcessEvent, ProcessEvents, ProcessHandle, ProcessOutput,
};
pub use transport::{Connection, Transport};

//! exec-server remote mode (RELAY.md): an executor with no inbound port serves harness
//! sessions through a rendezvous, each session a Noise-encrypted, reliable virtual stream
//! carried in protobuf frames that the rendezvous routes but cannot read.
//!
//! * [`config`] — the `[relay]`, `[remote]` and `[rendezvous]` tables.
//! * [`proto`] — the frame schema, frame constructors, stateless validation, reset reasons.
//! * [`noise`] — the Noise suite, static keys and key JSON, the prologue.
//! * [`reliable`] — one stream's records, sequence numbers, acks, retransmission and resume.
//! * [`driver`] — the task that runs one stream between its inbox, the JSON-RPC side and
//!   the current physical connection.
//! * [`link`] — one physical WebSocket of an endpoint: limits, writer queues, Ping/Pong.
//! * [`registry`] — the registry HTTP client (`register`, `connect`, `validate`).
//! * [`executor`] — the executor: registration loop, handshake admission, one JSON-RPC
//!   connection per stream.
//! * [`harness`] — the harness connector (`connect_relay`).
//! * [`rendezvous`] — `exec-server rendezvous`, the self-hosted registry and router.

pub mod config;
pub mod driver;
pub mod executor;
pub mod harness;
pub mod link;
pub mod noise;
pub mod proto;
pub mod registry;
pub mod reliable;
pub mod rendezvous;

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

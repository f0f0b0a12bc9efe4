//! The relay core (RELAY.md): everything both ends of a relay stream share, and nothing that
//! serves — an encrypted, reliable virtual stream carried in protobuf frames that a
//! rendezvous routes but cannot read, the harness's connector, and the registry client.
//! The executor (`exec-server-relay`) and the rendezvous service (`exec-server-rendezvous`)
//! are built on it; a harness needs nothing else.
//!
//! * [`proto`] — the relay.v1 frame schema (prost), frame constructors, stateless
//!   validation, reset reasons.
//! * [`noise`] — the Noise suites behind the [`noise::NoiseSuite`] seam (codex's hybrid
//!   X25519 + ML-KEM-768 suite, the default, and the classic X25519 one), static keys and
//!   their JSON, the prologue.
//! * [`reliable`] — one stream's records and sequence numbers as a sans-IO state machine,
//!   under either rule set negotiated at the handshake: acks, retransmission and resume
//!   (RELAY §5), or codex 0.169.0's (seq from 0, nothing acknowledged or resent).
//! * [`driver`] — the task that runs one stream between its inbox, the JSON-RPC side and
//!   the current physical connection (stream multiplexing over one socket).
//! * [`link`] — one physical WebSocket to the rendezvous: limits, writer queues, Ping/Pong.
//! * [`endpoint`] — registry and rendezvous URLs, environment ids and their encoding.
//! * [`registry`] — the registry HTTP client (`register`, `connect`, `validate`).
//! * [`busy`] — waiting for a server that answers `503`/`429` (`Retry-After`).
//! * [`tls`] — the TLS configuration of `https` registries and `wss` rendezvous sockets.
//! * [`harness`] — the harness connector ([`harness::connect_relay`]).

pub mod busy;
pub mod driver;
pub mod endpoint;
pub mod harness;
pub mod link;
pub mod noise;
pub mod proto;
pub mod registry;
pub mod reliable;
pub mod tls;

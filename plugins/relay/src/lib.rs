//! The relay transport plugin (RELAY.md §6, §7.6, §9.1): an executor with no inbound port
//! registers with a relay registry, keeps one rendezvous socket, and serves each harness
//! stream on it with its own connection processor, through the relay core
//! (`exec-server-relay-core`).
//!
//! * [`config`] — the `[relay]` table and its older `[remote]` alias.
//! * [`executor`] — the executor: registration loop, handshake admission, one JSON-RPC
//!   connection per stream, and its registration as a configured transport.
//! * [`forward`] — forward mode: each stream copied to its own WebSocket to a destination
//!   exec-server instead of being served locally.

pub mod config;
pub mod executor;
pub mod forward;

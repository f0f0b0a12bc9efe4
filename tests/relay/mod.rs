//! Remote mode end to end: the real `exec-server rendezvous` and `exec-server --remote`
//! processes on loopback, a harness speaking JSON-RPC through the relay with the library's
//! connector, and a WebSocket proxy in between that captures, drops, duplicates, reorders
//! and cuts frames.
//!
//! One module per topic; the fixtures they share are in `fixtures`.

mod codex_executor;
mod codex_harness;
mod executor;
mod faults;
pub(crate) mod fixtures;
mod forward;
mod harness;
mod interop;
mod limits;
mod redis_nodes;
mod registry;
mod rendezvous;
mod semantics;
pub(crate) mod tls;

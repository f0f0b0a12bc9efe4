//! The built-in listener transports, registered as [`crate::ListenerKind`]s.
//!
//! * [`stdio`] — newline-delimited JSON on stdin/stdout (PROTOCOL §1.2).
//! * [`websocket`] — `ws://IP:PORT` on axum, with health endpoints (PROTOCOL §1.3).

pub mod stdio;
pub mod websocket;

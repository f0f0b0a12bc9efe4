//! The built-in listener transports, registered as [`crate::ListenerKind`]s.
//!
//! * [`stdio`] — newline-delimited JSON on stdin/stdout (PROTOCOL §1.2).
//! * [`websocket`] — `ws://IP:PORT` on axum, with health endpoints (PROTOCOL §1.3).
//! * [`ws_auth`] — the credential check of an upgrade: capability token or HS256 JWT.
//! * [`exposure`] — refusing an unauthenticated listener off loopback.
//! * [`http_server`] — the hardened accept-and-serve loop of every network listener.
//! * `pending` — connections whose request head has not arrived, and which one to evict at a cap.
//! * `accept_backoff` — sleeping, not spinning, when `accept` runs out of descriptors.

mod accept_backoff;
pub mod exposure;
pub mod http_server;
mod pending;
pub mod stdio;
pub mod websocket;
pub mod ws_auth;
mod ws_upgrade;

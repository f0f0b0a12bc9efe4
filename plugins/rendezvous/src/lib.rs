//! The self-hosted relay registry and rendezvous service (RELAY §8), `exec-server
//! rendezvous`: one axum service that is both the registry (`register`, `connect`,
//! `validate`) and the WebSocket router that moves frames between an environment's
//! executor socket and its harness sockets by `stream_id`, without ever decrypting them.
//!
//! * [`config`] — the `[rendezvous]` table.
//! * [`service`] — start-up, the registry endpoints and the upgrade checks.
//! * [`signing`] — signed URLs, authorisations, registration ids.
//! * [`store`] — the registry's state behind the [`store::RendezvousStore`] seam:
//!   tenants and token digests, registrations, attach state, capacity.
//! * [`memory`] — the in-memory store, the default.
//! * [`redis_store`] — the store shared by several nodes, in Redis.
//! * `tokens` — the configured bearer tokens, which every node checks itself.
//! * `store_url` — `rendezvous.store`: memory or Redis, and its URL without a password.
//! * `capacity` — the memory store's count of the environments and harness sockets the
//!   service and each tenant hold.
//! * [`router`] — the live sockets and routes of this process (§8.6–§8.7).
//! * `hub` — where store and router meet, and the executor and harness socket loops.
//! * `rate_limit` — request rates of the registry endpoints, per tenant and per peer.
//! * [`refusal`] — every limit as a refusal: status, error code, and a message naming the
//!   configuration key to raise.
//! * `fuzzing` — entry points of the fuzz target (hidden; not an API).
//! * `tls` — in-process TLS from the PEM files of `rendezvous.tls_cert_file` and
//!   `rendezvous.tls_key_file`.

mod audit;
mod capacity;
pub mod config;
#[doc(hidden)]
pub mod fuzzing;
mod hub;
pub mod memory;
mod rate_limit;
pub mod redis_store;
pub mod refusal;
pub mod router;
pub mod service;
pub mod signing;
pub mod store;
pub mod store_url;
pub mod tls;
mod tokens;

pub use router::RouterTiming;
pub use service::{
    grace, run, start, RendezvousArgs, RunningRendezvous, StartError, SIGNING_KEY_ENV,
};

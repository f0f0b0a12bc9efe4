//! The self-hosted relay registry and rendezvous service (RELAY §8), `exec-server
//! rendezvous`: one axum service that is both the registry (`register`, `connect`,
//! `validate`) and the WebSocket router that moves frames between an environment's
//! executor socket and its harness sockets by `stream_id`, without ever decrypting them.
//!
//! * [`config`] — the `[rendezvous]` table.
//! * [`service`] — start-up, the registry endpoints and the upgrade checks.
//! * [`signing`] — signed URLs, authorisations, registration ids.
//! * `state` — registrations, routes and the routing rules of §8.6–§8.7.
//! * `capacity` — the environments and harness sockets the service and each tenant hold.
//! * `rate_limit` — request rates of the registry endpoints, per tenant and per peer.
//! * `refusal` — every limit as a refusal: status, error code, and a message naming the
//!   configuration key to raise.

mod capacity;
pub mod config;
mod rate_limit;
mod refusal;
pub mod service;
pub mod signing;
mod state;

pub use service::{grace, run, start, RendezvousArgs, RunningRendezvous, SIGNING_KEY_ENV};
pub use state::RouterTiming;

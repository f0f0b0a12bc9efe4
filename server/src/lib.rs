//! exec-server core: the plugin framework every method family and transport plugs into.
//!
//! * [`plugin`] — [`Plugin`] records collected through `inventory`, typed method adapters.
//! * [`config_section`] — [`ConfigSection`] records: tables that belong to no plugin.
//! * [`router`] — the method registry with the operator's switches (PROTOCOL §2.10).
//! * [`call`] — [`Call`], what a handler may touch: session, connection state, back-pressure.
//! * [`session`] — sessions that outlive connections: detach, resume, expiry (§3.4).
//! * [`extensions`] — typed per-plugin state and the session-end hook.
//! * [`connection`] — the transport-agnostic connection processor (§2.9, §3).
//! * [`outbound`] — the one outbound path: encoding, size limit, opt-in filter, bounded queue.
//! * [`server`] — the shared [`ServerContext`], listener registry, start-up and shutdown.
//! * [`transport`] — the stdio and WebSocket listeners.
//! * [`in_process`] — a connection without a transport, for tests and embedding.
//! * [`audit`] — the audit trail: events, who caused them, the `[audit]` policy and its
//!   backends; `audit_config`, the `[audit]` table's checks and registration.
//! * [`metrics`] — process-wide counters, gauges and histograms for `/metrics`.
//! * [`quota`] — per-session quotas: how much of a resource one session may hold.
//! * [`descriptors`] — the one budget of file descriptors held for clients, shared out by
//!   session; [`descriptor_config`] — its `[descriptors]` table.
//! * [`fair_slots`] — bounded slots for expensive work (blocking file operations, helper
//!   processes), shared round-robin by session.
//! * [`worker_threads`] — threads for blocking work that never outnumber its slots.
//! * `memory_trim`, `worker_caches` — memory given back to the system once connections
//!   are gone.
//! * [`helpers`] — hidden helper entry points dispatched from `main` by argv\[1\].
//! * [`hygiene`] — process hardening run first thing: non-dumpable, secrets out of the
//!   environment, descriptor limit raised.

pub mod audit;
mod audit_config;
pub mod call;
pub mod client_requests;
pub mod config_section;
pub mod connection;
pub mod descriptor_config;
pub mod descriptors;
pub mod exit_hooks;
pub mod extensions;
pub mod fair_budget;
pub mod fair_slots;
pub mod helpers;
pub mod hygiene;
pub mod in_process;
mod memory_trim;
pub mod metrics;
pub mod outbound;
pub mod plugin;
pub mod quota;
pub mod router;
pub mod server;
pub mod session;
mod sparse_map;
pub mod transport;
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod worker_caches;
pub mod worker_threads;

pub use async_trait::async_trait;
pub use call::{AnswerRoom, Call, ConnectionClosed, Parked, ResponseQueued};
pub use client_requests::{ClientAnswer, NoAnswer};
pub use config_section::ConfigSection;
pub use descriptors::DescriptorLease;
pub use exec_server_config as config;
pub use exec_server_proto as proto;
pub use extensions::SessionState;
pub use fair_slots::{DeadlineReport, FairSlots, SlotPermit};
pub use in_process::InProcessConnection;
pub use inventory;
pub use plugin::{
    checked_section, typed_section, CheckedSection, Install, InstallError, Method, MethodDecl,
    NoParams, Plugin,
};
pub use quota::{Quota, QuotaLease};
pub use router::StartupError;
pub use server::{
    ConfiguredTransport, Listener, ListenerFailed, ListenerKind, RunError, ServerContext,
};
pub use session::Session;
pub use worker_threads::{SlottedThreads, WorkerThreads};

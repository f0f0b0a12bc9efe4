//! The audit trail: one structured event for each thing done on the machine and each
//! refusal, with who asked for it, written to backends an operator can keep and ship
//! (docs/AUDIT.md has the schema, docs/OPERATIONS.md how to run it).
//!
//! * [`config`] — the `[audit]` table.
//! * [`event`] — what an event says and its JSON line; [`Who`], the identity.
//! * [`policy`] — levels by event kind and method; [`MethodAudit`], a method's declaration.
//! * [`auditor`] — [`Auditor`]: the policy and the backends, numbering and queueing events.
//! * [`queue`] — a backend's queue and writer thread: batches, retries, the two modes.
//! * [`backend`] — the backend registry ([`AuditBackend`]); [`file`] is built in.
//!
//! The core records sessions, requests (with the outcome the client was given) and
//! refused upgrades; plugins add what only they know through [`crate::Call::audit_note`]
//! and [`AuditScope`] (a process's exit, say).

pub mod auditor;
pub mod backend;
mod bound;
pub mod config;
pub mod describe;
pub mod event;
mod file;
pub mod policy;
mod queue;
pub(crate) mod request;
pub mod sampler;

use std::sync::Arc;

use exec_server_proto::RequestId;
use serde_json::{Map, Value};

pub use auditor::{Auditor, Unwritten};
pub use backend::{AuditBackend, AuditWriter};
pub use config::{AuditConfig, BackendConfig};
pub use event::{path_value, AuthIdentity, Event, Level, Outcome, RelayIdentity, Who};
pub use policy::{Describe, Described, MethodAudit};

/// What an event emitted later on behalf of a request carries: the trail, who asked, the
/// session, the request. Cheap to clone; a plugin keeps one with work that outlives the
/// request (a process, a watch).
#[derive(Clone, Debug)]
pub struct AuditScope {
    pub(crate) auditor: Arc<Auditor>,
    pub(crate) who: Arc<Who>,
    pub(crate) session: Option<String>,
    pub(crate) traceparent: Option<String>,
    pub(crate) method: Option<String>,
    pub(crate) request_id: Option<RequestId>,
}

impl AuditScope {
    /// A scope for events of the server itself.
    pub fn server(auditor: &Arc<Auditor>) -> Self {
        Self {
            auditor: Arc::clone(auditor),
            who: Arc::new(Who::server()),
            session: None,
            traceparent: None,
            method: None,
            request_id: None,
        }
    }

    /// A scope for events of a connection with no request (yet).
    pub fn connection(auditor: &Arc<Auditor>, who: Arc<Who>, session: Option<String>) -> Self {
        Self {
            auditor: Arc::clone(auditor),
            who,
            session,
            traceparent: None,
            method: None,
            request_id: None,
        }
    }

    /// The level events of `kind` are recorded at (`None`: not recorded).
    pub fn level(&self, kind: &str) -> Level {
        self.auditor.level(kind)
    }

    /// Records an event of `kind` if its level is not `none`, with the members `details`
    /// makes for that level. Never waits.
    pub fn emit(&self, kind: &'static str, details: impl FnOnce(Level) -> Map<String, Value>) {
        let level = self.level(kind);
        if level == Level::None {
            return;
        }
        self.auditor
            .record_now(self.event(kind, level, details(level)));
    }

    /// Like [`AuditScope::emit`], for an event with an outcome (a refusal that is no
    /// request's: an upgrade, a rendezvous call).
    pub fn emit_outcome(
        &self,
        kind: &'static str,
        outcome: Outcome,
        details: impl FnOnce(Level) -> Map<String, Value>,
    ) {
        let level = self.level(kind);
        if level == Level::None {
            return;
        }
        let mut event = self.event(kind, level, details(level));
        event.outcome = Some(outcome);
        self.auditor.record_now(event);
    }

    /// Like [`AuditScope::emit`], waiting until `blocking` backends have written it.
    pub async fn emit_and_wait(
        &self,
        kind: &'static str,
        details: impl FnOnce(Level) -> Map<String, Value>,
    ) -> Result<(), Unwritten> {
        let level = self.level(kind);
        if level == Level::None {
            return Ok(());
        }
        self.auditor
            .record(self.event(kind, level, details(level)))
            .await
    }

    pub(crate) fn event(
        &self,
        kind: &'static str,
        level: Level,
        details: Map<String, Value>,
    ) -> Event {
        Event {
            kind,
            level,
            session: self.session.clone(),
            who: Arc::clone(&self.who),
            traceparent: self.traceparent.clone(),
            method: self.method.clone(),
            request_id: self.request_id.clone(),
            stage: None,
            outcome: None,
            details,
        }
    }
}

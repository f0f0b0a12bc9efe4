//! The events of one request: `received` (changing methods, when a backend blocks) and
//! `completed` with the outcome the client was given.

use std::sync::{Arc, Mutex};

use exec_server_proto::RequestId;
use serde_json::{Map, Value};

use super::{AuditScope, Auditor, Described, Level, MethodAudit, Outcome, Unwritten, Who};

/// The audit of one request that is recorded.
pub(crate) struct RequestAudit {
    scope: AuditScope,
    level: Level,
    changes: bool,
    details: Map<String, Value>,
    notes: Arc<Mutex<Map<String, Value>>>,
}

/// Who made a request, and which.
pub(crate) struct RequestOrigin<'a> {
    pub(crate) who: &'a Arc<Who>,
    /// `None` for a request refused before the connection has a session.
    pub(crate) session: Option<&'a str>,
    pub(crate) method: &'a str,
    pub(crate) id: &'a RequestId,
    pub(crate) traceparent: Option<&'a str>,
}

impl RequestAudit {
    /// `None` when the request is not recorded: its level is `none`, or it only reads
    /// inside the workspace.
    pub(crate) fn begin(
        auditor: &Arc<Auditor>,
        origin: RequestOrigin<'_>,
        audit: &MethodAudit,
        params: &Value,
    ) -> Option<Self> {
        let level = auditor.request_level(origin.method, audit.changes);
        if level == Level::None {
            return None;
        }
        let described = match audit.describe {
            Some(describe) => describe(params, level),
            None => member_names(params, level),
        };
        if !audit.changes && auditor.inside_workspace(&described.read_paths) {
            return None;
        }
        let scope = AuditScope {
            auditor: Arc::clone(auditor),
            who: Arc::clone(origin.who),
            session: origin.session.map(str::to_owned),
            traceparent: origin.traceparent.map(str::to_owned),
            method: Some(origin.method.to_owned()),
            request_id: Some(origin.id.clone()),
        };
        Some(Self {
            scope,
            level,
            changes: audit.changes,
            details: described.details,
            notes: Arc::default(),
        })
    }

    /// Where the handler's [`crate::Call::audit_note`]s go.
    pub(crate) fn notes(&self) -> Arc<Mutex<Map<String, Value>>> {
        Arc::clone(&self.notes)
    }

    /// True when the request must wait for its `received` event before it runs.
    pub(crate) fn waits_before_running(&self) -> bool {
        self.changes && self.scope.auditor.has_blocking_backend()
    }

    /// Writes the `received` event; `Err`: a blocking backend did not, and the request
    /// must be refused.
    pub(crate) async fn received(&self) -> Result<(), Unwritten> {
        let mut event = self
            .scope
            .event("request", self.level, self.details.clone());
        event.stage = Some("received");
        self.scope.auditor.record(event).await
    }

    /// Records the `completed` event of a request refused before it ran, without waiting.
    pub(crate) fn refused(&self, outcome: Outcome) {
        let mut event = self
            .scope
            .event("request", self.level, self.details.clone());
        event.stage = Some("completed");
        event.outcome = Some(outcome);
        self.scope.auditor.record_now(event);
    }

    /// Writes the `completed` event with the outcome and the handler's notes.
    pub(crate) async fn completed(self, outcome: Outcome) {
        let mut details = self.details;
        let notes = std::mem::take(&mut *self.notes.lock().unwrap_or_else(|p| p.into_inner()));
        details.extend(notes);
        let mut event = self.scope.event("request", self.level, details);
        event.stage = Some("completed");
        event.outcome = Some(outcome);
        // The answer follows its event in `blocking` mode; the work is done, so a backend
        // that failed only loses the event (counted there).
        let _ = self.scope.auditor.record(event).await;
    }
}

/// A method that declared no description: at `request` level, the names of its params'
/// members (never their values, which may hold anything).
fn member_names(params: &Value, level: Level) -> Described {
    let mut described = Described::default();
    if level == Level::Request {
        if let Some(object) = params.as_object() {
            let names: Vec<Value> = object.keys().map(|k| Value::String(k.clone())).collect();
            described
                .details
                .insert("params".into(), Value::Array(names));
        }
    }
    described
}

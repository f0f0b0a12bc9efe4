//! The rendezvous's audit events (docs/AUDIT.md): each refused registry call, socket
//! upgrade and `/metrics` request as `rendezvous.refused`, with the status and reason the
//! caller was given and the tenant when its token was known. The trail is the process's
//! own, opened by `exec-server rendezvous` from the `[audit]` table; a rendezvous started
//! in-process (tests, embedding) has none.

use std::sync::{Arc, OnceLock};

use exec_server_core::audit::sampler::Sampler;
use exec_server_core::audit::{AuditConfig, AuditScope, Auditor, AuthIdentity, Outcome, Who};
use exec_server_core::config::ConfigSource;

static TRAIL: OnceLock<Arc<Auditor>> = OnceLock::new();

/// Opens the trail of `[audit]`; a backend that cannot start is the error.
pub(crate) fn open(source: &ConfigSource) -> Result<(), String> {
    let config: AuditConfig =
        exec_server_core::plugin::load_checked(source, "audit").map_err(|e| e.0)?;
    let auditor = Auditor::open(&config, source)?;
    if auditor.is_enabled() {
        let _ = TRAIL.set(auditor);
    }
    Ok(())
}

/// Writes back what is queued, at shutdown.
pub(crate) async fn flush() {
    if let Some(auditor) = TRAIL.get() {
        auditor.flush(std::time::Duration::from_secs(5)).await;
    }
}

/// What a refusal says.
pub(crate) struct Refused<'a> {
    pub(crate) status: u16,
    pub(crate) reason: &'a str,
    pub(crate) message: &'a str,
    pub(crate) environment: &'a str,
    pub(crate) tenant: Option<&'a str>,
}

/// Records `rendezvous.refused`, at most `RECORDED_PER_SECOND` a second (the rest are
/// counted, and the count goes with the next one recorded).
pub(crate) fn refused(refused: Refused<'_>) {
    static SAMPLER: Sampler = Sampler::new("rendezvous.refused");
    let Some(auditor) = TRAIL.get() else { return };
    let Some(suppressed) = SAMPLER.admit() else {
        return;
    };
    let who = Arc::new(Who {
        transport: "rendezvous",
        auth: refused.tenant.map(|tenant| AuthIdentity {
            mode: "rendezvous-token",
            subject: Some(tenant.to_owned()),
            issuer: None,
        }),
        ..Who::default()
    });
    let scope = AuditScope::connection(auditor, who, None);
    // The environment id is the caller's text: bounded like every peer text we record.
    let environment: String = refused.environment.chars().take(256).collect();
    scope.emit_outcome(
        "rendezvous.refused",
        Outcome::refused(refused.message),
        |_| {
            let mut details = serde_json::Map::new();
            details.insert("status".into(), refused.status.into());
            details.insert("reason".into(), refused.reason.into());
            details.insert("environment".into(), environment.into());
            if suppressed > 0 {
                details.insert("suppressed".into(), suppressed.into());
            }
            details
        },
    );
}

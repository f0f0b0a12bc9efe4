//! The report of each decision: the members of `network/policyDecision` (§3.4, without
//! `processId`, which the caller adds), handed to the caller's sink and logged.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;

use crate::decision::{Decision, Protocol, Reason, Scope, Source, Verdict};
use crate::policy::Target;
use exec_server_proto::clock::rfc3339_millis;

/// One decision about one connection, serialized in the notification's member order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyEvent {
    pub timestamp: String,
    pub scope: Scope,
    pub decision: Verdict,
    pub source: Source,
    pub reason: Reason,
    pub protocol: Protocol,
    pub host: String,
    pub port: u16,
    /// The HTTP method or `CONNECT`; absent for `socks5_tcp`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The child's end of the proxy connection.
    pub client: String,
    pub policy_override: bool,
}

/// Where events go. It is called on the connection's task, so it must not block: send
/// to a channel.
pub type EventSink = Arc<dyn Fn(PolicyEvent) + Send + Sync>;

impl PolicyEvent {
    pub fn new(target: &Target, client: SocketAddr, decision: &Decision) -> Self {
        Self {
            timestamp: rfc3339_millis(SystemTime::now()),
            scope: decision.scope,
            decision: decision.verdict,
            source: decision.source,
            reason: decision.reason.clone(),
            protocol: target.protocol,
            host: target.host.clone(),
            port: target.port,
            method: target.method.clone(),
            client: client.to_string(),
            policy_override: decision.policy_override,
        }
    }
}

/// `json` with the Unicode line and paragraph separators escaped (`\u2028`, still JSON):
/// serde leaves them as they are, and a log reader that splits lines on them would see a
/// line the peer wrote (a host name is the child's text).
fn one_line(json: String) -> String {
    json.replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// Logs the event (info for allow, warn otherwise) and hands it to the sink.
pub(crate) fn report(sink: &EventSink, event: PolicyEvent) {
    let json = one_line(serde_json::to_string(&event).unwrap_or_default());
    if event.decision == Verdict::Allow {
        tracing::info!(target: "codex.network_proxy.policy_decision", "{json}");
    } else {
        tracing::warn!(target: "codex.network_proxy.policy_decision", "CODEX_NETWORK_POLICY_VIOLATION {json}");
    }
    sink(event);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_host_cannot_start_a_log_line_of_its_own() {
        let host = "evil.test\u{2028}2026-01-01T00:00:00Z  INFO forged\u{2029}";
        let json = serde_json::to_string(&serde_json::json!({ "host": host })).unwrap();
        let line = super::one_line(json);
        assert!(
            !line.contains('\u{2028}') && !line.contains('\u{2029}'),
            "{line}"
        );
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["host"], host);
    }
}

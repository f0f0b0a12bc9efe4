//! The client's reviewer for allowlist misses (§3.4): the trait the caller implements
//! with a `network/policyRequest`, the parsing of its answer, and the gate that bounds
//! it (timeout + 5 s, at most 256 pending, anything but allow → deny).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::decision::{Decision, Protocol, Reason, Scope, Source, Verdict};

/// At most this many decisions wait for the client at once; beyond → deny.
pub const MAX_PENDING_DECISIONS: usize = 256;

/// Added to `policyDecisionTimeoutMs`, as codex does (1000 ms → denied after 6 s).
pub const DECISION_GRACE: Duration = Duration::from_secs(5);

/// `params.request` of `network/policyRequest`: only these three members are sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyRequest {
    pub protocol: Protocol,
    pub host: String,
    pub port: u16,
}

/// A well-formed answer: `{"decision": {"type": "allow"|"deny"|"ask", "reason"?}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeciderAnswer {
    Allow,
    Deny { reason: Option<String> },
    Ask { reason: Option<String> },
}

impl DeciderAnswer {
    /// Reads a JSON-RPC `result`. `None` for anything malformed (a string decision, a
    /// capitalised type, a missing `decision`…), which the proxy treats as a deny.
    pub fn from_result(result: &Value) -> Option<Self> {
        let decision = result.get("decision")?.as_object()?;
        let reason = decision
            .get("reason")
            .and_then(Value::as_str)
            .filter(|text| !text.is_empty())
            .map(str::to_string);
        match decision.get("type")?.as_str()? {
            "allow" => Some(Self::Allow),
            "deny" => Some(Self::Deny { reason }),
            "ask" => Some(Self::Ask { reason }),
            _ => None,
        }
    }
}

/// Implemented by the caller: send `network/policyRequest` and wait for the answer.
/// `None` means a JSON-RPC error, a malformed result or a lost connection.
#[async_trait]
pub trait PolicyDecider: Send + Sync {
    async fn decide(&self, request: PolicyRequest) -> Option<DeciderAnswer>;
}

/// The decider of one proxy with its bounds.
#[derive(Clone)]
pub(crate) struct DeciderGate {
    decider: Arc<dyn PolicyDecider>,
    /// `policyDecisionTimeoutMs` + [`DECISION_GRACE`].
    wait: Duration,
    /// Counts pending decisions so that a flood of misses cannot queue without bound.
    pending: Arc<Semaphore>,
}

impl DeciderGate {
    pub(crate) fn new(decider: Arc<dyn PolicyDecider>, timeout_ms: u64) -> Self {
        Self {
            decider,
            wait: Duration::from_millis(timeout_ms).saturating_add(DECISION_GRACE),
            pending: Arc::new(Semaphore::new(MAX_PENDING_DECISIONS)),
        }
    }

    /// The domain decision for an allowlist miss.
    pub(crate) async fn ask(&self, request: PolicyRequest) -> Decision {
        let Ok(_slot) = self.pending.clone().try_acquire_owned() else {
            return decider_deny(Reason::NotAllowed);
        };
        let answer = tokio::time::timeout(self.wait, self.decider.decide(request)).await;
        match answer.ok().flatten() {
            Some(DeciderAnswer::Allow) => Decision::allow(Source::Decider),
            Some(DeciderAnswer::Deny { reason }) => decider_deny(policy_reason(reason)),
            Some(DeciderAnswer::Ask { reason }) => Decision {
                verdict: Verdict::Ask,
                ..decider_deny(policy_reason(reason))
            },
            None => decider_deny(Reason::NotAllowed),
        }
    }
}

fn policy_reason(reason: Option<String>) -> Reason {
    reason.map_or(Reason::NotAllowed, Reason::Policy)
}

fn decider_deny(reason: Reason) -> Decision {
    Decision::deny(Scope::Domain, Source::Decider, reason)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn answers_are_parsed_as_the_spec_says() {
        let cases = [
            (
                json!({"decision": {"type": "allow"}}),
                Some(DeciderAnswer::Allow),
            ),
            (
                json!({"decision": {"type": "deny", "reason": "my_reason"}, "x": 1}),
                Some(DeciderAnswer::Deny {
                    reason: Some("my_reason".into()),
                }),
            ),
            (
                json!({"decision": {"type": "deny"}}),
                Some(DeciderAnswer::Deny { reason: None }),
            ),
            (
                json!({"decision": {"type": "ask", "reason": "r", "source": "x"}}),
                Some(DeciderAnswer::Ask {
                    reason: Some("r".into()),
                }),
            ),
            (json!({"decision": "allow"}), None),
            (json!("allow"), None),
            (json!({"type": "allow"}), None),
            (json!({}), None),
            (json!({"decision": {"type": "Allow"}}), None),
        ];
        for (result, expected) in cases {
            assert_eq!(DeciderAnswer::from_result(&result), expected, "{result}");
        }
    }
}

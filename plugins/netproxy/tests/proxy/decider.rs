//! The decider through the proxy: allow, deny with a reason, ask, and failure.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use exec_server_netproxy::{DeciderAnswer, PolicyDecider, PolicyRequest, Protocol};
use serde_json::json;

use crate::util::*;

struct Scripted {
    answer: Option<DeciderAnswer>,
    requests: Mutex<Vec<PolicyRequest>>,
}

#[async_trait]
impl PolicyDecider for Scripted {
    async fn decide(&self, request: PolicyRequest) -> Option<DeciderAnswer> {
        if let Ok(mut requests) = self.requests.lock() {
            requests.push(request);
        }
        self.answer.clone()
    }
}

async fn start_decided(
    answer: Option<DeciderAnswer>,
) -> Result<(Started, Arc<Scripted>), Box<dyn std::error::Error + Send + Sync>> {
    let decider = Arc::new(Scripted {
        answer,
        requests: Mutex::new(Vec::new()),
    });
    let mut value = config("full", json!({}), true);
    value["policyDecisionTimeoutMs"] = json!(1000);
    let options = StartOptions {
        decider: Some(decider.clone()),
        ..StartOptions::default()
    };
    Ok((start_with(value, options).await?, decider))
}

#[tokio::test]
async fn decider_allow_lets_the_request_through() -> TestResult {
    let upstream = upstream_http().await?;
    let (mut started, decider) = start_decided(Some(DeciderAnswer::Allow)).await?;
    let authority = format!("decided.test:{}", upstream.addr.port());
    let reply = get(started.proxy.http_addr(), &authority, "GET").await?;
    assert_eq!(reply.status(), "200", "{}", reply.head);
    let asked = decider
        .requests
        .lock()
        .map(|r| r.clone())
        .unwrap_or_default();
    assert_eq!(
        asked,
        vec![PolicyRequest {
            protocol: Protocol::Http,
            host: "decided.test".into(),
            port: upstream.addr.port()
        }]
    );
    assert_eq!(
        serde_json::to_value(&asked[0])?,
        json!({"protocol": "http", "host": "decided.test", "port": upstream.addr.port()})
    );
    let event = started.next_event().await?;
    assert_eq!(
        (
            &event["source"],
            &event["decision"],
            &event["policyOverride"]
        ),
        (&json!("decider"), &json!("allow"), &json!(true))
    );
    Ok(())
}

#[tokio::test]
async fn decider_refusals_are_blocked_as_the_spec_says() -> TestResult {
    let cases = [
        (
            Some(DeciderAnswer::Deny {
                reason: Some("my_reason".into()),
            }),
            "deny",
            "my_reason",
            "blocked-by-policy",
            "Request blocked by network policy.",
        ),
        (
            Some(DeciderAnswer::Deny { reason: None }),
            "deny",
            "not_allowed",
            "blocked-by-allowlist",
            "Domain not in allowlist.",
        ),
        (
            Some(DeciderAnswer::Ask {
                reason: Some("r".into()),
            }),
            "ask",
            "r",
            "blocked-by-policy",
            "Request blocked by network policy.",
        ),
        (
            None,
            "deny",
            "not_allowed",
            "blocked-by-allowlist",
            "Domain not in allowlist.",
        ),
    ];
    for (answer, decision, reason, proxy_error, message) in cases {
        let (mut started, _) = start_decided(answer).await?;
        let reply = get(started.proxy.http_addr(), "decided.test", "GET").await?;
        assert_eq!(reply.status(), "403");
        assert_eq!(reply.header("x-proxy-error").as_deref(), Some(proxy_error));
        let expected = format!(
            r#"{{"status":"blocked","host":"decided.test","reason":"{reason}","decision":"{decision}","source":"decider","protocol":"http","port":80,"message":"{message}"}}"#
        );
        assert_eq!(reply.body, expected);
        let event = started.next_event().await?;
        assert_eq!(
            (&event["decision"], &event["reason"], &event["source"]),
            (&json!(decision), &json!(reason), &json!("decider"))
        );
    }
    Ok(())
}

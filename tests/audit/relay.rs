//! A relay stream's events: who the harness is (its Noise key, the environment, the
//! rendezvous), the stream's opening and end, and its session's requests between.

use serde_json::json;

use super::{find, shape, AuditFile};
use crate::relay::fixtures::*;

#[tokio::test]
async fn a_relay_stream_is_recorded_with_its_route_and_harness_key() {
    let audit = AuditFile::new();
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor_with(&rdv.url, "env-audit", &audit.config("batch", ""));
    let mut client = RelayClient::open(harness_args(&rdv.url, "env-audit")).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("through-the-relay");
    client
        .call("fs/writeFile", json!({"path": path, "dataBase64": "eA=="}))
        .await;
    client.conn.abort();
    let events = audit
        .wait_for("relay.stream.closed", |e| {
            e["kind"] == "relay.stream.closed"
        })
        .await;
    let shapes: Vec<String> = events
        .iter()
        .filter(|e| e["who"]["transport"] == "relay")
        .map(shape)
        .collect();
    assert_eq!(
        shapes,
        [
            "relay.stream.opened",
            "session.opened",
            "request fs/writeFile completed",
            "session.detached",
            "relay.stream.closed"
        ]
    );
    let opened = find(&events, "relay.stream.opened");
    let who = &opened["who"];
    assert_eq!(who["relay"]["environment"], "env-audit");
    assert_eq!(who["relay"]["rendezvous"], rdv.url.as_str());
    assert_eq!(who["auth"]["mode"], "noise");
    assert!(who["auth"]["subject"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    let write = find(&events, "request fs/writeFile completed");
    assert_eq!(write["who"], *who);
    assert_eq!(write["details"]["path"], json!(path));
}

/// The rendezvous records every refusal with the status and reason the caller was given,
/// and the tenant when its token was known; never the token.
#[tokio::test]
async fn rendezvous_refusals_are_recorded_without_their_tokens() {
    let audit = AuditFile::new();
    let rdv = start_rendezvous_with(None, &format!("\n{}", audit.config("batch", ""))).await;
    let base = rdv.direct.clone();
    let wrong = "Authorization: Bearer a-wrong-rendezvous-token\r\n";
    let (status, _) = crate::util::http_body(&base, "/metrics", wrong).await;
    assert_eq!(status, 401);
    // A known harness token asking for an environment nobody registered: 404.
    let refused =
        exec_server_relay_core::harness::connect_relay(harness_args(&rdv.url, "env-nobody")).await;
    assert!(refused.is_err());
    let events = audit
        .wait_for("the 404", |e| {
            e["details"]["reason"] == "environment_not_found"
        })
        .await;
    let refusals: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["kind"] == "rendezvous.refused")
        .collect();
    assert_eq!(refusals[0]["details"]["status"], 401, "{refusals:#?}");
    assert_eq!(refusals[0]["who"]["transport"], "rendezvous");
    let missing = refusals
        .iter()
        .find(|e| e["details"]["reason"] == "environment_not_found")
        .unwrap();
    assert_eq!(missing["details"]["status"], 404);
    assert_eq!(missing["details"]["environment"], "env-nobody");
    assert!(missing["outcome"]["message"].as_str().is_some());
    let text = audit.text();
    assert!(!text.contains("a-wrong-rendezvous-token") && !text.contains(HARNESS_TOKEN));
}

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

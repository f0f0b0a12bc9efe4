//! Executor limits: active streams, pending validations and the JSON-RPC message size.

use std::sync::atomic::Ordering;
use std::time::Duration;

use exec_server_relay_core::harness::{connect_relay, RelayError};
use exec_server_relay_core::proto::{self, Body};
use serde_json::json;

use super::fixtures::*;
use crate::util::STEP_TIMEOUT;

#[tokio::test]
async fn stream_limit_refuses_extra_streams_without_counting_a_failure() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor_with(&rdv.direct, "env-streams", "[relay]\nmax_streams = 2\n");
    let mut a = RelayClient::open(harness_args(&rdv.direct, "env-streams")).await;
    let b = RelayClient::open(harness_args(&rdv.direct, "env-streams")).await;
    for _ in 0..3 {
        let error = connect_relay(harness_args(&rdv.direct, "env-streams"))
            .await
            .expect_err("a third stream is refused");
        assert_eq!(error, RelayError::Reset("stream_limit".into()));
    }
    // Refusals are the refused streams' alone: the executor's socket stays.
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );
    assert!(proxy.closes(Side::Executor).is_empty());
    assert_eq!(proxy.executor_sockets(), 1);
    // Once a stream ends there is room again.
    b.conn.abort();
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        match connect_relay(harness_args(&rdv.direct, "env-streams")).await {
            Ok(_) => break,
            Err(RelayError::Reset(r)) if r == "stream_limit" => {}
            Err(e) => panic!("{e}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no room after a close"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn pending_validations_are_bounded_and_time_out_without_msg2() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let gate = start_gate(&rdv.direct).await;
    let _executor = start_executor_with(
        &gate.url,
        "env-pending",
        "[relay]\nmax_pending_validations = 2\nvalidate_timeout_ms = 1500\n",
    );
    // The executor is up once a stream works.
    let mut a = RelayClient::open(harness_args(&rdv.direct, "env-pending")).await;
    gate.hold_validate.store(true, Ordering::SeqCst);
    let first = tokio::spawn(connect_relay(harness_args(&rdv.direct, "env-pending")));
    let second = tokio::spawn(connect_relay(harness_args(&rdv.direct, "env-pending")));
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    while gate.held.load(Ordering::SeqCst) < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "validations never held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A third handshake while two are pending.
    let third = connect_relay(harness_args(&rdv.direct, "env-pending"))
        .await
        .expect_err("refused");
    assert_eq!(third, RelayError::Reset("validation_limit".into()));
    // Both pending handshakes end with validation_unavailable when the bound passes.
    for pending in [first, second] {
        let error = pending
            .await
            .unwrap()
            .expect_err("no msg2 without a validation");
        assert_eq!(error, RelayError::Reset("validation_unavailable".into()));
    }
    gate.release.notify_waiters();
    // No msg2 left the executor for those streams: the only handshake frames the
    // executor sent are msg2 of stream `a`.
    let msg2_count = proxy
        .frames
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.side == Side::Executor && c.up)
        .filter(|c| {
            matches!(
                proto::decode(&c.bytes).ok().and_then(|f| f.body),
                Some(Body::Handshake(_))
            )
        })
        .count();
    assert_eq!(msg2_count, 1);
    // None of it cost the executor its socket: same socket, stream alive.
    assert!(proxy.closes(Side::Executor).is_empty());
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );
    gate.hold_validate.store(false, Ordering::SeqCst);
    RelayClient::open(harness_args(&rdv.direct, "env-pending")).await;
}

#[tokio::test]
async fn json_rpc_message_limit_is_enforced_on_both_directions() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor_with(
        &rdv.url,
        "env-msgsize",
        "[limits]\nmax_message_bytes = 65536\n",
    );
    // A response above the executor's limit becomes a -32603 error; the stream goes on.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.bin");
    std::fs::write(&path, vec![b'x'; 60_000]).unwrap();
    let mut client = RelayClient::open(harness_args(&rdv.url, "env-msgsize")).await;
    let error = client
        .request(
            "fs/readFile",
            json!({"path": format!("file://{}", path.display())}),
        )
        .await
        .expect_err("too large");
    assert_eq!(error["code"], -32603, "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("exceeds the maximum message size of 65536 bytes"),
        "{error}"
    );
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
    // A request whose length prefix is above the executor's limit: Reset{record_error}.
    let big =
        json!({"id": 99, "method": "environment/status", "params": {"pad": "y".repeat(70_000)}});
    client.conn.send(big.to_string()).await.unwrap();
    assert_eq!(
        client.ended().await,
        Some(RelayError::Reset("record_error".into()))
    );
}

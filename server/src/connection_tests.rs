//! The connection processor driven through channels, with a plugin that exists only in this
//! test binary: concurrency, back-pressure, ordering and panics.

use std::sync::Arc;
use std::time::Duration;

use exec_server_config::{ConfigSource, CoreConfig};
use exec_server_proto::RpcError;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::Notify;

use crate::plugin::{Install, InstallError, MethodDecl, Plugin};
use crate::server::ServerContext;
use crate::{Call, InProcessConnection};

/// Per-session gate: `testing/block` and `testing/park` wait until `testing/release`
/// (`notify_one` keeps a permit, so a release that wins the race is not lost).
#[derive(Default)]
struct Gate(Notify);

impl crate::SessionState for Gate {}

fn gate(cx: &Call) -> Arc<Gate> {
    cx.session().state(Gate::default)
}

inventory::submit! {
    Plugin {
        name: "testing",
        summary: "test-only methods",
        methods: &[
            MethodDecl { name: "testing/block", family: "testing" },
            MethodDecl { name: "testing/park", family: "testing" },
            MethodDecl { name: "testing/release", family: "testing" },
            MethodDecl { name: "testing/notify", family: "testing" },
            MethodDecl { name: "testing/panic", family: "testing" },
        ],
        config: None,
        install,
    }
}

#[derive(Deserialize)]
struct NotifyParams {
    count: usize,
}

fn install(install: &mut Install<'_>) -> Result<(), InstallError> {
    install.method("testing/block", |cx: Call, _: Value| async move {
        gate(&cx).0.notified().await;
        Ok::<_, RpcError>(json!("unblocked"))
    });
    install.method("testing/park", |mut cx: Call, _: Value| async move {
        let parked = cx.park();
        if parked.is_none() {
            return Ok::<_, RpcError>(json!("not parked"));
        }
        gate(&cx).0.notified().await;
        Ok(json!("parked"))
    });
    install.method("testing/release", |cx: Call, _: Value| async move {
        gate(&cx).0.notify_one();
        Ok::<_, RpcError>(json!(null))
    });
    install.method("testing/notify", |cx: Call, p: NotifyParams| async move {
        let session = Arc::clone(cx.session());
        let queued = cx.response_queued();
        tokio::spawn(async move {
            queued.wait().await;
            for i in 0..p.count {
                session.notify("testing/event", &json!({ "i": i })).await;
            }
        });
        Ok::<_, RpcError>(json!("started"))
    });
    install.method("testing/panic", |_: Call, _: Value| async {
        if true {
            panic!("handler bug");
        }
        Ok::<_, RpcError>(json!(null))
    });
    Ok(())
}

struct Harness {
    connection: InProcessConnection,
}

impl Harness {
    fn start(toml: &str) -> Self {
        let source = ConfigSource::from_toml_str(toml);
        let core = CoreConfig::from_source(&source, None).unwrap();
        let server = ServerContext::new(&source, core).unwrap();
        Self {
            connection: InProcessConnection::open(&server),
        }
    }

    async fn send(&self, message: Value) {
        self.connection.send(&message).await;
    }

    async fn recv(&mut self) -> Value {
        tokio::time::timeout(Duration::from_secs(10), self.connection.recv())
            .await
            .expect("a message in time")
            .expect("connection open")
    }

    /// Waits briefly and reports whether anything arrived.
    async fn nothing_arrives(&mut self) -> bool {
        tokio::time::timeout(Duration::from_millis(300), self.connection.recv())
            .await
            .is_err()
    }

    async fn handshake(&mut self) {
        self.send(json!({"id": 0, "method": "initialize", "params": {"clientName": "t"}}))
            .await;
        assert!(self.recv().await["result"]["sessionId"].is_string());
        self.send(json!({"method": "initialized"})).await;
    }
}

#[tokio::test]
async fn a_blocked_request_does_not_hold_up_others() {
    let mut h = Harness::start("");
    h.handshake().await;
    h.send(json!({"id": 1, "method": "testing/block"})).await;
    h.send(json!({"id": 2, "method": "testing/release"})).await;
    // The release answers although the blocked request was sent first.
    let first = h.recv().await;
    let second = h.recv().await;
    let ids = [first["id"].clone(), second["id"].clone()];
    assert!(
        ids.contains(&json!(1)) && ids.contains(&json!(2)),
        "{ids:?}"
    );
    assert_eq!(
        [first, second].iter().find(|m| m["id"] == 1).unwrap()["result"],
        "unblocked"
    );
}

#[tokio::test]
async fn max_in_flight_pauses_the_reader() {
    let mut h = Harness::start("[dispatch]\nmax_in_flight = 1\n");
    h.handshake().await;
    h.send(json!({"id": 1, "method": "testing/block"})).await;
    // With one slot taken, this release cannot start until the block finishes: nothing
    // arrives.
    h.send(json!({"id": 2, "method": "testing/release"})).await;
    assert!(
        h.nothing_arrives().await,
        "a second request ran beyond max_in_flight"
    );
}

#[tokio::test]
async fn parked_requests_do_not_count_against_max_in_flight() {
    let mut h = Harness::start("[dispatch]\nmax_in_flight = 1\nmax_waiting_reads = 1\n");
    h.handshake().await;
    h.send(json!({"id": 1, "method": "testing/park"})).await;
    // The waiting budget is spent: this one answers at once.
    h.send(json!({"id": 2, "method": "testing/park"})).await;
    assert_eq!(h.recv().await, json!({"id": 2, "result": "not parked"}));
    h.send(json!({"id": 3, "method": "testing/release"})).await;
    let mut got = [h.recv().await, h.recv().await];
    got.sort_by_key(|m| m["id"].as_i64());
    assert_eq!(got[0], json!({"id": 1, "result": "parked"}));
    assert_eq!(got[1], json!({"id": 3, "result": null}));
}

#[tokio::test]
async fn notifications_follow_their_response() {
    let mut h = Harness::start("");
    h.handshake().await;
    h.send(json!({"id": 1, "method": "testing/notify", "params": {"count": 3}}))
        .await;
    assert_eq!(h.recv().await, json!({"id": 1, "result": "started"}));
    for i in 0..3 {
        assert_eq!(
            h.recv().await,
            json!({"method": "testing/event", "params": {"i": i}})
        );
    }
}

#[tokio::test]
async fn a_full_outbound_queue_slows_producers_without_losing_messages() {
    let mut h = Harness::start("[connection]\noutbound_queue_messages = 1\n");
    h.handshake().await;
    h.send(json!({"id": 1, "method": "testing/notify", "params": {"count": 200}}))
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.recv().await["id"], 1);
    for i in 0..200 {
        assert_eq!(h.recv().await["params"]["i"], i);
    }
}

#[tokio::test]
async fn a_panicking_handler_answers_internal_error() {
    let mut h = Harness::start("");
    h.handshake().await;
    h.send(json!({"id": 1, "method": "testing/panic"})).await;
    let reply = h.recv().await;
    assert_eq!(reply["error"]["code"], -32603);
    assert_eq!(
        reply["error"]["message"],
        "internal error while handling `testing/panic`"
    );
    h.send(json!({"id": 2, "method": "testing/release"})).await;
    assert_eq!(h.recv().await["id"], 2);
}

#[test]
fn only_well_formed_traceparents_are_kept() {
    use super::valid_traceparent;
    let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    assert_eq!(
        valid_traceparent(&json!({"traceparent": good})).as_deref(),
        Some(good)
    );
    for bad in [
        json!({}),
        json!({"traceparent": ""}),
        json!({"traceparent": 7}),
        json!({"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}),
        json!({"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}),
        json!({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"}),
    ] {
        assert_eq!(valid_traceparent(&bad), None, "{bad}");
    }
}

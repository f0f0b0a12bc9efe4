//! Failure isolation on the relay: a failure caused by one stream is paid for by that
//! stream, never by the executor's rendezvous connection that every harness of the
//! environment shares.
//!
//! Each test runs the real `exec-server rendezvous` and `exec-server --remote` behind the
//! recording proxy of the relay suite, so "the executor never reconnected" is observable
//! as: no close code from the executor, still one executor socket, one `register` call.

use std::sync::atomic::Ordering;

use exec_server_relay_core::harness::connect_relay;
use exec_server_relay_core::noise::{NoiseIdentity, DEFAULT_SUITE};
use exec_server_relay_core::proto;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::relay::fixtures::*;

/// Waves of bad handshakes, and streams per wave: the reported attack.
const WAVES: usize = 8;
const PER_WAVE: usize = 8;

/// A stream opened without any retry, initialized, asked for `environment/status`: what a
/// harness sees while another one attacks. A 503 `executor_unavailable` from the registry
/// or a Reset fails it.
async fn probe(registry: &str, environment: &str) {
    let conn = connect_relay(harness_args(registry, environment))
        .await
        .unwrap_or_else(|e| panic!("a good harness could not open a stream: {e}"));
    let mut client = RelayClient {
        conn,
        next_id: 1,
        pending: Vec::new(),
    };
    client
        .call("initialize", json!({"clientName": "good-harness"}))
        .await;
    client
        .conn
        .send(json!({"method": "initialized", "params": {}}).to_string())
        .await
        .unwrap();
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
}

/// One bad msg1 on its own stream (and its own harness socket, as every stream has);
/// waits for the Reset that ends that stream.
async fn bad_handshake(url: String, msg1: Vec<u8>) {
    let mut ws = open_raw(&url).await;
    let sid = new_stream_id();
    send_frame(
        &mut ws,
        &proto::frame(&sid, 0, 0, proto::handshake_body(msg1)),
    )
    .await;
    assert_eq!(
        raw_reset(&mut ws).await,
        (sid, "handshake_failed".to_owned())
    );
}

/// The reported attack: one harness sends 64 bad msg1 frames in waves of 8 streams while
/// another harness keeps opening streams. Before the fix the 8th failure closed the
/// executor's only rendezvous connection (1008) and every other harness got 503
/// `executor_unavailable` until it came back.
#[tokio::test]
async fn one_harness_s_bad_handshakes_never_cost_the_others_the_executor_connection() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let gate = start_gate(&rdv.direct).await;
    let _executor = start_executor_with(&gate.url, "env-isolation", "");
    // An established stream of the good harness, from before the attack.
    let mut established = RelayClient::open(harness_args(&rdv.direct, "env-isolation")).await;
    let attacker = NoiseIdentity::generate();
    let bundle = registry_as(&rdv.direct, HARNESS_TOKEN)
        .connect("env-isolation", &attacker.public())
        .await
        .unwrap();
    let (min, _) = DEFAULT_SUITE.msg1_bounds();
    for wave in 0..WAVES {
        // 10 bytes fail the size check (§3.5 row 7); a msg1 of the smallest size that is
        // not a Noise message for this executor fails `read_message` after DH work (row 8).
        let msg1 = if wave % 2 == 0 {
            vec![0x42u8; 10]
        } else {
            vec![0x42u8; min]
        };
        let attack =
            (0..PER_WAVE).map(|_| tokio::spawn(bad_handshake(bundle.url.clone(), msg1.clone())));
        let attack: Vec<_> = attack.collect();
        // A good stream opened while the wave is under way, and one after it.
        probe(&rdv.direct, "env-isolation").await;
        for task in attack {
            task.await.unwrap();
        }
        probe(&rdv.direct, "env-isolation").await;
    }
    assert_eq!(
        established.call("environment/status", json!({})).await["status"],
        "ready"
    );
    assert_link_kept(&proxy);
    assert_eq!(
        gate.registers.load(Ordering::SeqCst),
        1,
        "the executor registered again"
    );
}

/// Behind a router that does not validate (RELAY §2.5), invalid frames that name a stream
/// are that stream's failure: the named active stream is reset, the others are dropped,
/// and none of them is charged to the connection. Before the fix the 8th within 60 s
/// closed it (1002) for every stream.
#[tokio::test]
async fn invalid_frames_naming_streams_never_cost_the_executor_connection() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor_with(
        &rdv.direct,
        "env-isolation-invalid",
        "[relay]\nreconnect_initial_backoff_ms = 50\n",
    );
    let mut good = RelayClient::open(harness_args(&rdv.direct, "env-isolation-invalid")).await;
    let mut victim = RelayClient::open(harness_args(&rdv.direct, "env-isolation-invalid")).await;
    assert_eq!(proxy.executor_sockets(), 1);
    // Twice the old limit, each naming a stream the executor does not know.
    for _ in 0..16 {
        let frame = version_two(&new_stream_id());
        proxy.inject(Message::Binary(proto::encode(&frame))).await;
    }
    // The last one names an active stream; its Reset proves every earlier one was read.
    let frame = version_two(victim.conn.stream_id());
    proxy.inject(Message::Binary(proto::encode(&frame))).await;
    assert_eq!(
        victim.ended().await,
        Some(exec_server_relay_core::harness::RelayError::Reset(
            "invalid_frame".into()
        ))
    );
    assert_eq!(
        good.call("environment/status", json!({})).await["status"],
        "ready"
    );
    assert_link_kept(&proxy);
}

/// The executor's one rendezvous connection was neither closed nor replaced.
#[track_caller]
fn assert_link_kept(proxy: &Proxy) {
    assert_eq!(
        proxy.closes(Side::Executor),
        Vec::<Option<u16>>::new(),
        "the executor closed its rendezvous connection"
    );
    assert_eq!(proxy.executor_sockets(), 1, "the executor reconnected");
}

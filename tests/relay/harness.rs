//! Harness side: the connector end to end through a lossy proxy, pinned keys and
//! authorisations, resume across harness socket cuts, and the ways a stream ends.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use exec_server_relay_core::harness::{connect_relay, RelayBundleProvider, RelayError};
use exec_server_relay_core::noise::{NoiseIdentity, NoisePublicKey};
use exec_server_relay_core::proto::{self, Body};
use exec_server_relay_core::registry::{BaseUrl, ConnectBundle, RegistryClient, SecretString};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use super::fixtures::*;

#[tokio::test]
async fn large_file_through_a_lossy_proxy_without_plaintext_on_the_wire() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    assert_eq!(rdv.url, proxy.url);
    let _executor = start_executor(&rdv.direct, "env-lossy");
    let mut client = RelayClient::open(harness_args(&rdv.direct, "env-lossy")).await;
    proxy.faults.lossy.store(true, Ordering::SeqCst);

    let dir = tempfile::tempdir().unwrap();
    let marker = "MARKER-7d1f0c";
    let mut content = Vec::new();
    while content.len() < 3 * 1024 * 1024 / 2 {
        content.extend_from_slice(format!("{marker} line {}\n", content.len()).as_bytes());
    }
    let path = dir.path().join("big.txt");
    std::fs::write(&path, &content).unwrap();
    let uri = format!("file://{}", path.display());
    match client.request("fs/readFile", json!({"path": uri})).await {
        Ok(result) => {
            let data = result["dataBase64"]
                .as_str()
                .map(|s| crate::util::b64decode(&json!(s)))
                .expect("dataBase64");
            assert_eq!(data, content, "byte for byte through the lossy relay");
        }
        Err(e) => panic!("fs/readFile failed: {e}"),
    }
    for _ in 0..20 {
        assert_eq!(
            client.call("environment/status", json!({})).await["status"],
            "ready"
        );
    }
    // The executor's socket is cut mid-session; the stream resumes.
    proxy.faults.cut.notify_waiters();
    for _ in 0..5 {
        assert_eq!(
            client.call("environment/status", json!({})).await["status"],
            "ready"
        );
    }
    let frames: Vec<Vec<u8>> = proxy
        .frames
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.bytes.clone())
        .collect();
    assert!(
        frames
            .iter()
            .filter(|f| matches!(
                proto::decode(f).ok().and_then(|f| f.body),
                Some(Body::Data(_))
            ))
            .count()
            >= 4
    );
    for needle in [
        "initialize",
        "fs/readFile",
        "environment/status",
        "relay-tests-client",
        marker,
    ] {
        assert!(
            !frames
                .iter()
                .any(|f| f.windows(needle.len()).any(|w| w == needle.as_bytes())),
            "plaintext `{needle}` seen on the wire"
        );
    }
}

struct FixedBundles {
    registry: RegistryClient,
    tamper_key: bool,
    tamper_authz: bool,
}

#[exec_server_core::async_trait]
impl RelayBundleProvider for FixedBundles {
    async fn connect_bundle(
        &self,
        environment_id: &str,
        key: &NoisePublicKey,
    ) -> Result<ConnectBundle, RelayError> {
        let mut bundle = self.registry.connect(environment_id, key).await?;
        if self.tamper_key {
            let suite = bundle.executor_public_key.suite();
            bundle.executor_public_key = NoiseIdentity::generate_for(suite).public();
        }
        if self.tamper_authz {
            let text = bundle.harness_key_authorization.expose().to_owned();
            bundle.harness_key_authorization =
                SecretString::new(format!("{}x", &text[..text.len() - 1]));
        }
        Ok(bundle)
    }
}

#[tokio::test]
async fn wrong_executor_key_and_invalid_authorization_are_rejected() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-reject");
    // Make sure the executor is up.
    let _ok = RelayClient::open(harness_args(&rdv.url, "env-reject")).await;
    let registry = RegistryClient::new(
        BaseUrl::parse(&rdv.url, false).unwrap(),
        SecretString::new(HARNESS_TOKEN),
        Duration::from_secs(10),
        false,
    );
    for (tamper_key, tamper_authz, reason) in [
        (true, false, "handshake_failed"),
        (false, true, "unauthorized"),
    ] {
        let mut args = harness_args(&rdv.url, "env-reject");
        args.bundle_provider = Some(Arc::new(FixedBundles {
            registry: registry.clone(),
            tamper_key,
            tamper_authz,
        }));
        let error = connect_relay(args).await.expect_err("must be rejected");
        assert_eq!(error, RelayError::Reset(reason.into()));
    }
}

#[tokio::test]
async fn harness_socket_cut_resumes_the_same_stream_with_a_new_bundle() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor(&rdv.direct, "env-hcut");
    let (mut client, init) = RelayClient::open_with(
        harness_args(&rdv.direct, "env-hcut"),
        json!({"clientName": "relay-tests-client"}),
    )
    .await;
    let sid = client.conn.stream_id().to_owned();
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
    proxy.faults.cut_harness.notify_waiters();
    for _ in 0..3 {
        assert_eq!(
            client.call("environment/status", json!({})).await["status"],
            "ready"
        );
    }
    // The second harness socket began with resume for the same stream: no new handshake,
    // no second initialize.
    let frames = proxy.frames.lock().unwrap().clone();
    let sockets: Vec<usize> = {
        let mut s: Vec<usize> = frames
            .iter()
            .filter(|c| c.side == Side::Harness)
            .map(|c| c.socket)
            .collect();
        s.dedup();
        s
    };
    assert!(sockets.len() >= 2, "the harness reconnected: {sockets:?}");
    let first_on_second = frames
        .iter()
        .find(|c| c.side == Side::Harness && c.up && c.socket == sockets[1])
        .map(|c| proto::decode(&c.bytes).unwrap())
        .unwrap();
    assert_eq!(first_on_second.stream_id, sid);
    assert!(
        matches!(first_on_second.body, Some(Body::Resume(r)) if r.next_seq >= 1),
        "{first_on_second:?}"
    );
    assert!(init["sessionId"].is_string());
}

#[tokio::test]
async fn harness_receives_executor_unavailable_after_the_rendezvous_grace() {
    let rdv = start_rendezvous_with(None, "grace_secs = 1").await;
    let mut executor = start_executor(&rdv.url, "env-gone");
    let mut client = RelayClient::open(harness_args(&rdv.url, "env-gone")).await;
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
    executor.kill().await.unwrap();
    assert_eq!(
        client.ended().await,
        Some(RelayError::Reset("executor_unavailable".into()))
    );
}

#[tokio::test]
async fn harness_stream_is_lost_when_the_rendezvous_stays_away_past_its_grace() {
    let mut rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-lost");
    let mut args = harness_args(&rdv.url, "env-lost");
    args.resume_grace = Duration::from_millis(500);
    let mut client = RelayClient::open(args).await;
    rdv.child.kill().await.unwrap();
    assert_eq!(client.ended().await, Some(RelayError::Lost));
}

#[tokio::test]
async fn harness_resets_and_closes_on_an_undecodable_frame_or_a_text_message() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor(&rdv.direct, "env-hframes");
    for (message, code) in [
        (Message::binary(vec![0xffu8; 9]), 1002),
        (Message::text("not a frame"), 1003),
    ] {
        let mut client = RelayClient::open(harness_args(&rdv.direct, "env-hframes")).await;
        let sid = client.conn.stream_id().to_owned();
        let sender = proxy.faults.inject_harness.lock().unwrap().clone().unwrap();
        sender.send(message).unwrap();
        assert_eq!(
            client.ended().await,
            Some(RelayError::Reset("invalid_frame".into()))
        );
        proxy
            .wait_for("the harness close", |p| {
                p.closes(Side::Harness).contains(&Some(code))
            })
            .await;
        // The Reset for the stream went out before the close.
        let frames = proxy.frames.lock().unwrap().clone();
        assert!(frames.iter().any(|c| {
            c.side == Side::Harness
                && c.up
                && matches!(
                    proto::decode(&c.bytes),
                    Ok(f) if f.stream_id == sid
                        && matches!(&f.body, Some(Body::Reset(r)) if r.reason == "invalid_frame")
                )
        }));
    }
}

/// `RelayConnection::abort` sends the stream's Reset before its socket closes, so the
/// executor lets the session go at once and a new stream takes it over. (The socket used to
/// close as the Reset was being queued: the rendezvous then parked the route for its 30 s
/// grace, and the session stayed attached, answering -32010, all that time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_stream_releases_its_session_at_once() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-abort");
    let args = harness_args(&rdv.url, "env-abort");
    for round in 0..20 {
        let (client, result) =
            RelayClient::open_with(args.clone(), json!({"clientName": "abort-test"})).await;
        let session = result["sessionId"].as_str().unwrap().to_owned();
        client.conn.abort();
        drop(client);
        let resumed = tokio::time::timeout(Duration::from_secs(5), resume_session(&args, &session))
            .await
            .unwrap_or_else(|_| panic!("round {round}: the aborted stream kept its session"));
        resumed.conn.abort();
    }
}

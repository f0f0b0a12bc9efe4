//! TLS is a setting: an `https` registry and a `wss` rendezvous are reached over TLS with
//! the system's root certificates, and the schemes the relay refuses still say why.

use std::sync::Arc;

use exec_server_relay_core::harness::{connect_relay, RelayConnectArgs, RelayError};
use exec_server_relay_core::noise::NoiseIdentity;
use exec_server_relay_core::registry::{ConnectBundle, SecretString};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use crate::util::{server_command, STEP_TIMEOUT};

use super::fixtures::*;

/// The first six bytes of the first connection to `listener`: a TLS ClientHello starts
/// with a handshake record (0x16, then the 0x03 of a TLS version) whose first message is
/// of type 1.
async fn first_record(listener: &TcpListener) -> [u8; 6] {
    let (mut tcp, _) = tokio::time::timeout(STEP_TIMEOUT, listener.accept())
        .await
        .expect("nobody connected")
        .unwrap();
    let mut head = [0u8; 6];
    tokio::time::timeout(STEP_TIMEOUT, tcp.read_exact(&mut head))
        .await
        .expect("nothing was sent")
        .unwrap();
    head
}

fn is_client_hello(head: &[u8; 6]) -> bool {
    head[0] == 0x16 && head[1] == 0x03 && head[5] == 0x01
}

#[tokio::test]
async fn an_executor_reaches_an_https_registry_over_tls() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let registry = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    let _executor = start_executor(&registry, "env-https");
    let head = first_record(&listener).await;
    assert!(is_client_hello(&head), "not a TLS ClientHello: {head:02x?}");
}

#[tokio::test]
async fn the_harness_opens_a_wss_rendezvous_socket_over_tls() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let bundle = ConnectBundle {
        environment_id: "env-wss".into(),
        url: format!("wss://127.0.0.1:{port}/ws/environment/env-wss?role=harness"),
        security_profile: "noise_ik_v1".into(),
        executor_registration_id: "reg-wss".into(),
        executor_public_key: NoiseIdentity::generate().public(),
        harness_key_authorization: SecretString::new("v1.authorization"),
    };
    let mut args = RelayConnectArgs::new(
        "https://127.0.0.1:9",
        "env-wss",
        SecretString::new("unused"),
    );
    args.bundle_provider = Some(Arc::new(StaticBundle(bundle)));
    let connecting = tokio::spawn(connect_relay(args));
    let head = first_record(&listener).await;
    assert!(is_client_hello(&head), "not a TLS ClientHello: {head:02x?}");
    // The listener speaks no TLS: the handshake fails and the connector says so.
    drop(listener);
    let error = tokio::time::timeout(STEP_TIMEOUT, connecting)
        .await
        .expect("the connector gave up")
        .unwrap()
        .expect_err("no TLS server");
    assert!(matches!(error, RelayError::Open(_)), "{error:?}");
}

#[tokio::test]
async fn refused_registry_urls_are_start_up_errors_that_say_why() {
    for (url, why) in [
        ("ws://127.0.0.1:9", "must be an http:// or https:// URL"),
        ("ftp://127.0.0.1:9", "unsupported URL scheme `ftp`"),
        (
            "http://registry.example.com",
            "must use https unless the host is a loopback address",
        ),
        ("https://127.0.0.1:9/?token=x", "must not contain a query"),
    ] {
        let mut executor = server_command(&["--remote", url, "--environment-id", "env-refused"]);
        executor
            .env("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN)
            .stderr(std::process::Stdio::piped());
        let output = tokio::time::timeout(STEP_TIMEOUT, executor.output())
            .await
            .expect("the executor exits")
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{url}: {stderr}");
        assert!(
            stderr.contains("invalid config: relay.url") && stderr.contains(why),
            "{url}: {stderr}"
        );
    }
}

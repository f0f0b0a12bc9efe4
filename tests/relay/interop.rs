//! Interoperability with an independent Noise implementation: Python's `noiseprotocol`
//! package as harness against our executor, and as executor against our harness connector.
//! Fails (never skips) when the package is missing: CI installs it.

use std::sync::Arc;

use exec_server_relay_core::harness::RelayConnectArgs;
use exec_server_relay_core::noise::{NoiseIdentity, NoisePublicKey};
use exec_server_relay_core::registry::{ConnectBundle, SecretString};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::fixtures::*;
use crate::util::STEP_TIMEOUT;

/// The harness written in Python against the `noiseprotocol` package (RELAY §3 with an
/// independent Noise implementation) talks to a real rendezvous and executor.
/// Fails (never skips) when the interop tests cannot run: CI installs the package.
async fn require_python_noise() {
    const INSTALL: &str = "python3 -m pip install --quiet noiseprotocol==0.3.1";
    let probe = tokio::process::Command::new("python3")
        .args(["-c", "import noise.connection, cryptography"])
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!("python3 is needed for the Noise interop tests ({e}); then: {INSTALL}")
        });
    assert!(
        probe.status.success(),
        "the Python package noiseprotocol is missing; install it with: {INSTALL}\n{}",
        String::from_utf8_lossy(&probe.stderr)
    );
}

fn interop_script(name: &str) -> String {
    format!("{}/tests/relay_interop/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn python_noiseprotocol_harness_interoperates_with_the_executor() {
    require_python_noise().await;

    let rdv = start_rendezvous(None).await;
    // `noiseprotocol` has no hybrid patterns: this executor registers the classic suite.
    let _executor = start_executor_with(
        &rdv.url,
        "env-python",
        "[relay]\nsecurity_profile = \"noise_ik_v1\"\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let script = interop_script("noise_harness.py");
    let run = tokio::process::Command::new("python3")
        .args([
            &script,
            "--registry",
            &rdv.url,
            "--environment",
            "env-python",
            "--workdir",
            dir.path().to_str().unwrap(),
        ])
        .env("EXEC_SERVER_RELAY_TOKEN", HARNESS_TOKEN)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(STEP_TIMEOUT * 3, run)
        .await
        .expect("the Python harness did not finish")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the Python harness failed ({}): {stderr}",
        output.status
    );
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("bad report ({e}): {stderr}"));
    // The prologue of §3.3 as the script builds it.
    assert_eq!(
        report["prologue_vector_sha256"],
        "61104073ea47510b85d9020fe87609c449d3b09aaa44c264d8834e112f6e69f1"
    );
    // IK message sizes of §3.4: msg1 = 96 + P, msg2 = 48.
    assert_eq!(
        report["msg1_len"].as_u64().unwrap(),
        96 + report["authorization_len"].as_u64().unwrap()
    );
    assert_eq!(report["msg2_len"], 48);
    // JSON-RPC answers decrypted by Python.
    assert!(report["session_id"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(report["status"], json!({"status": "ready"}));
    assert_eq!(
        report["shared_record"],
        json!([{"status": "ready"}, {"status": "ready"}])
    );
    assert_eq!(report["split_prefix"], json!({"status": "ready"}));
    // A 120,000-byte file through fs/writeFile and fs/readFile: multi-record messages in
    // both directions, full-size records from the executor.
    assert_eq!(report["file_written_by_executor"], true);
    assert_eq!(report["file_read_back"], true);
    assert!(report["records_for_read"].as_u64().unwrap() >= 3);
    assert_eq!(report["largest_record"], 61_440);
    assert_eq!(report["executor_ack"], report["records_sent"]);
    // A record with one flipped bit.
    assert_eq!(report["tampered_reset"], "decrypt_failed");
}

/// The library's harness connector (snow initiator) against a responder written in Python
/// with `noiseprotocol`: msg1, msg2 and records in both directions.
#[tokio::test]
async fn harness_connector_interoperates_with_a_python_noiseprotocol_responder() {
    require_python_noise().await;
    let authorization = "v1.python-interop-authorization";
    let mut child = tokio::process::Command::new("python3")
        .args([
            &interop_script("noise_executor.py"),
            "--environment",
            "env-py-exec",
            "--registration",
            "reg-python",
            "--authorization",
            authorization,
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut line))
        .await
        .expect("the Python responder announces itself")
        .unwrap();
    let hello: Value = serde_json::from_str(&line).expect("a JSON first line");
    let executor_key = NoisePublicKey::from_json(&json!({
        "suite": exec_server_relay_core::noise::SUITE_V1,
        "x25519_public_key": hello["public_key"],
    }))
    .unwrap();
    let identity = Arc::new(NoiseIdentity::generate());
    let bundle = ConnectBundle {
        environment_id: "env-py-exec".into(),
        url: format!(
            "ws://127.0.0.1:{}/ws/environment/env-py-exec?role=harness",
            hello["port"]
        ),
        security_profile: "noise_ik_v1".into(),
        executor_registration_id: "reg-python".into(),
        executor_public_key: executor_key,
        harness_key_authorization: SecretString::new(authorization),
    };
    let mut args = RelayConnectArgs::new(
        "http://127.0.0.1:9",
        "env-py-exec",
        SecretString::new("unused"),
    );
    args.identity = Some(Arc::clone(&identity));
    args.bundle_provider = Some(Arc::new(StaticBundle(bundle)));
    let (mut client, init) =
        RelayClient::open_with(args, json!({"clientName": "rust-harness-interop"})).await;
    assert_eq!(init, json!({"sessionId": "python-session"}));
    assert_eq!(
        client.call("environment/status", json!({})).await,
        json!({"status": "python-ready"})
    );
    // An orderly close: the stream flushes, then Reset{stream_closed}.
    drop(client);
    let mut report = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut report))
        .await
        .expect("the Python responder reports")
        .unwrap();
    let report: Value = serde_json::from_str(&report).expect("a JSON report");
    assert_eq!(report["authorization_matches"], true, "{report}");
    assert_eq!(
        report["harness_public_key"],
        identity.public().to_base64(),
        "the responder learned the pinned harness key"
    );
    assert_eq!(report["msg1_len"], 96 + authorization.len());
    assert_eq!(report["client_name"], "rust-harness-interop");
    assert_eq!(
        report["methods"],
        json!(["initialize", "initialized", "environment/status"])
    );
    assert_eq!(report["reset"], "stream_closed");
    assert!(child.wait().await.unwrap().success());
}

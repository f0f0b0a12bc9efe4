//! The registry HTTP API: bearer tokens and roles, `connect` answers, and the executor's
//! reaction to a revoked token.

use std::sync::atomic::Ordering;
use std::time::Duration;

use exec_server_relay_core::harness::{connect_relay, RelayError};
use exec_server_relay_core::noise::NoiseIdentity;
use serde_json::{json, Value};

use super::fixtures::*;
use crate::util::STEP_TIMEOUT;

#[tokio::test]
async fn registry_bearer_tokens_and_connect_answers() {
    let rdv = start_rendezvous(None).await;
    let key = NoiseIdentity::generate().public();
    let unknown = registry_as(&rdv.url, "not-a-configured-token");
    let executor = registry_as(&rdv.url, EXECUTOR_TOKEN);
    let harness = registry_as(&rdv.url, HARNESS_TOKEN);
    // Unknown token: 401 on every call.
    assert_eq!(
        status_of(unknown.register("env-tokens", &key, None).await),
        401
    );
    assert_eq!(status_of(unknown.connect("env-tokens", &key).await), 401);
    assert_eq!(
        status_of(
            unknown
                .validate("env-tokens", "reg-x", &key, "v1.x.y", "stream-1")
                .await
        ),
        401
    );
    // Wrong role: 403.
    assert_eq!(
        status_of(harness.register("env-tokens", &key, None).await),
        403
    );
    assert_eq!(
        status_of(
            harness
                .validate("env-tokens", "reg-x", &key, "v1.x.y", "stream-1")
                .await
        ),
        403
    );
    assert_eq!(status_of(executor.connect("env-tokens", &key).await), 403);
    // A 403 says which rule refused: the role, or the environment patterns.
    let wrong_role = harness
        .register("env-tokens", &key, None)
        .await
        .unwrap_err();
    assert!(
        wrong_role
            .to_string()
            .contains("this token's role is `harness`, and this call needs `executor`"),
        "{wrong_role}"
    );
    // The executor token only covers `env-*`.
    assert_eq!(
        status_of(executor.register("other-1", &key, None).await),
        403
    );
    let elsewhere = executor.register("other-1", &key, None).await.unwrap_err();
    assert!(
        elsewhere
            .to_string()
            .contains("environments patterns do not match this environment"),
        "{elsewhere}"
    );
    assert!(
        !elsewhere.to_string().contains("env-*"),
        "the patterns stay unsaid: {elsewhere}"
    );
    // connect: never registered → 404; registered, never attached → 503 + Retry-After: 1.
    let error = harness.connect("env-tokens", &key).await.unwrap_err();
    assert_eq!(error.status(), Some(404));
    assert!(
        error.to_string().contains("environment_not_found"),
        "{error}"
    );
    executor.register("env-tokens", &key, None).await.unwrap();
    let error = harness.connect("env-tokens", &key).await.unwrap_err();
    assert_eq!(error.status(), Some(503));
    assert!(
        error.to_string().contains("executor_unavailable"),
        "{error}"
    );
    assert_eq!(error.retry_after(), Some(Duration::from_secs(1)));
}

#[tokio::test]
async fn validate_refused_with_401_registers_again_once_then_exits_on_a_refused_register() {
    let rdv = start_rendezvous(None).await;
    let gate = start_gate(&rdv.direct).await;
    let mut executor = start_executor_with(
        &gate.url,
        "env-revoked",
        "[relay]\nreconnect_initial_backoff_ms = 50\n",
    );
    let mut a = RelayClient::open(harness_args(&rdv.url, "env-revoked")).await;
    assert_eq!(gate.registers.load(Ordering::SeqCst), 1);
    gate.refuse_validate.store(401, Ordering::SeqCst);
    let error = connect_relay(harness_args(&rdv.url, "env-revoked"))
        .await
        .expect_err("validation refused");
    assert_eq!(error, RelayError::Reset("validation_unavailable".into()));
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    while gate.registers.load(Ordering::SeqCst) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no second register");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The established stream carries on; the refusal was not a failed handshake.
    assert_eq!(
        a.call("environment/status", json!({})).await["status"],
        "ready"
    );
    assert_eq!(
        gate.registers.load(Ordering::SeqCst),
        2,
        "exactly one new register"
    );
    // Now the register is refused too: the executor exits with status 1.
    gate.refuse_register.store(403, Ordering::SeqCst);
    let refused = tokio::spawn(connect_relay(harness_args(&rdv.url, "env-revoked")));
    let status = tokio::time::timeout(STEP_TIMEOUT, executor.child.wait())
        .await
        .expect("the executor exits")
        .unwrap();
    assert_eq!(status.code(), Some(1));
    assert_eq!(gate.registers.load(Ordering::SeqCst), 3);
    // The Reset went out before the executor closed its socket.
    let error = refused.await.unwrap().expect_err("validation refused");
    assert_eq!(error, RelayError::Reset("validation_unavailable".into()));
    a.conn.abort();
}

/// One raw `POST` to the registry with `body` as it is (so malformed bodies can be sent);
/// the status and the parsed JSON answer.
async fn raw_post(base: &str, path: &str, token: &str, body: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://").trim_end_matches('/');
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\naccept: */*\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(STEP_TIMEOUT, tcp.read_to_end(&mut answer))
        .await
        .expect("the registry answers")
        .unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text[9..12].parse().unwrap();
    let (_, body) = text.split_once("\r\n\r\n").unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// codex's registration body (CODEX-0169 §4.2) is accepted and answered in codex's
/// shape; malformed ones get 400 with an error body naming the problem, and each refusal
/// is logged with its reason and never with the token.
#[tokio::test]
async fn codex_registrations_are_accepted_and_malformed_ones_are_named() {
    use exec_server_relay_core::noise::{HybridIkSuite, IkSuite};
    let rdv = start_rendezvous_logged().await;
    let path = "/cloud/environment/env-codex/register";
    let hybrid = NoiseIdentity::generate_for(&HybridIkSuite).public();
    let codex_body = format!(
        r#"{{"security_profile":"noise_hybrid_ik_v1","executor_public_key":{}}}"#,
        hybrid.to_json()
    );
    let (status, answer) = raw_post(&rdv.direct, path, EXECUTOR_TOKEN, &codex_body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["environment_id"], "env-codex");
    assert_eq!(answer["security_profile"], "noise_hybrid_ik_v1");
    assert!(answer["url"].as_str().unwrap().starts_with("ws://"));
    assert!(!answer["executor_registration_id"]
        .as_str()
        .unwrap()
        .trim()
        .is_empty());

    let classic = NoiseIdentity::generate_for(&IkSuite).public();
    let mut short_kem = hybrid.to_json();
    short_kem["mlkem768_public_key"] = "AAAA".into();
    let cases: Vec<(String, &str, Vec<String>)> = vec![
        (
            json!({"security_profile": "noise_xx_v1", "executor_public_key": hybrid.to_json()})
                .to_string(),
            "unsupported_security_profile",
            vec![
                "noise_xx_v1".into(),
                "noise_hybrid_ik_v1".into(),
                "noise_ik_v1".into(),
            ],
        ),
        (
            json!({"security_profile": "noise_hybrid_ik_v1", "executor_public_key": classic.to_json()})
                .to_string(),
            "invalid_request",
            vec![
                "Noise_IK_25519_AESGCM_SHA256".into(),
                "noise_hybrid_ik_v1".into(),
            ],
        ),
        (
            json!({"security_profile": "noise_hybrid_ik_v1", "executor_public_key": short_kem})
                .to_string(),
            "invalid_request",
            vec!["executor_public_key".into(), "mlkem768_public_key".into()],
        ),
        (
            json!({"executor_public_key": hybrid.to_json()}).to_string(),
            "invalid_request",
            vec!["security_profile".into()],
        ),
        (
            "{\"security_profile\": ".into(),
            "invalid_request",
            vec!["malformed JSON".into()],
        ),
    ];
    for (body, code, named) in &cases {
        let (status, answer) = raw_post(&rdv.direct, path, EXECUTOR_TOKEN, body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], *code, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        for name in named {
            assert!(
                message.contains(name.as_str()),
                "{message:?} lacks {name:?}"
            );
        }
    }
    // Each refusal left a log line with its reason; the token never appears.
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        let log = rdv.log.lock().unwrap().clone();
        let refusals = log
            .lines()
            .filter(|l| l.contains("registry request refused"))
            .count();
        if refusals >= cases.len() {
            assert!(
                log.contains("reason=\"unsupported_security_profile\""),
                "{log}"
            );
            assert!(log.contains("environment=env-codex"), "{log}");
            assert!(!log.contains(EXECUTOR_TOKEN), "{log}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "refusals not logged:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A harness (`exec-server run --remote`) waits out a registry that answers `connect` with
/// 503 and `Retry-After`, as the operations guide says harnesses do, and then runs.
#[tokio::test]
async fn run_remote_waits_out_a_busy_registry() {
    let rdv = start_rendezvous(None).await;
    let _executor = start_executor(&rdv.url, "env-busy");
    drop(connect(harness_args(&rdv.url, "env-busy")).await);
    let gate = start_gate(&rdv.direct).await;
    gate.busy_connects.store(2, Ordering::SeqCst);
    let (code, stdout, stderr) = run_remote(&gate.url, "env-busy", &[], &["echo", "via"]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "via\n");
    assert!(
        gate.connects.load(Ordering::SeqCst) >= 3,
        "two busy answers, then a bundle"
    );

    // Without a wait the harness fails at once with the registry's answer.
    gate.busy_connects.store(1, Ordering::SeqCst);
    let error = connect_relay(harness_args(&gate.url, "env-busy"))
        .await
        .expect_err("busy, and not waited for");
    assert!(error.to_string().contains("503"), "{error}");
}

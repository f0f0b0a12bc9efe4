//! The registry HTTP API: bearer tokens and roles, `connect` answers, and the executor's
//! reaction to a revoked token.

use std::sync::atomic::Ordering;
use std::time::Duration;

use exec_server_relay_core::harness::{connect_relay, RelayError};
use exec_server_relay_core::noise::NoiseIdentity;
use serde_json::json;

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
    // The executor token only covers `env-*`.
    assert_eq!(
        status_of(executor.register("other-1", &key, None).await),
        403
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
        "[relay]\nreconnect_initial_backoff_ms = 50\nmax_failed_handshakes = 1\n",
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

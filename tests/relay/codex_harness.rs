//! Our executor behind our rendezvous, with the real codex 0.171.0 as the harness
//! (CODEX-0169 §5.2): `codex exec` reaches the environment through the Noise relay
//! (`CODEX_EXEC_SERVER_NOISE_*`), and a fake model asks it for one shell command, which must
//! run on our executor. Skips (`SKIP:`) only without codex and without
//! `EXEC_SERVER_REQUIRE_CODEX_TESTS=1`.

use std::time::Duration;

use exec_server_relay_core::proto::{self, Body};

use super::fixtures::*;
use super::tls::Pki;
use crate::codex::fake_model::{FakeModel, FINAL_TEXT};
use crate::codex::{codex_bin, CodexHome};

/// How long the whole `codex exec` run may take before the test gives up.
const RUN_DEADLINE: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_exec_runs_a_shell_command_on_our_executor_through_the_relay() {
    let Some(codex) =
        codex_bin("codex_exec_runs_a_shell_command_on_our_executor_through_the_relay")
    else {
        return;
    };
    // Every socket passes the capturing proxy.
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor(&rdv.direct, "env-codex-harness");
    // Until the executor has registered and attached.
    harness_bundle(&rdv.direct, "env-codex-harness").await;
    let context =
        codex_turn_runs_on_our_executor(&codex, &rdv.direct, "env-codex-harness", &[]).await;

    // It went through the relay: codex's streams carried its requests as codex records
    // (seq from 0, no acks), our executor answered in kind, and codex reset nothing.
    let frames: Vec<(Side, proto::RelayMessageFrame)> = proxy
        .frames
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.up)
        .filter_map(|c| proto::decode(&c.bytes).ok().map(|f| (c.side, f)))
        .collect();
    let seqs = |side: Side| -> Vec<u32> {
        frames
            .iter()
            .filter(|(s, _)| *s == side)
            .filter_map(|(_, f)| match &f.body {
                Some(Body::Data(d)) => Some(d.seq),
                _ => None,
            })
            .collect()
    };
    let (from_codex, from_us) = (seqs(Side::Harness), seqs(Side::Executor));
    assert!(
        from_codex.len() > 5 && from_us.len() > 5,
        "{from_codex:?} {from_us:?}"
    );
    assert!(from_codex.contains(&0) && from_us.contains(&0));
    assert!(frames
        .iter()
        .all(|(_, f)| f.ack == 0 && f.ack_bits == 0 && !matches!(f.body, Some(Body::AckFrame(_)))));
    assert!(
        !frames
            .iter()
            .any(|(s, f)| *s == Side::Harness && matches!(f.body, Some(Body::Reset(_)))),
        "codex reset a stream\n{context}"
    );
}

/// Both ends over TLS: our executor trusts the CA through `relay.ca_file`, codex through
/// `SSL_CERT_FILE`, and the rendezvous serves TLS itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_exec_trusting_our_ca_runs_a_command_on_our_executor_through_a_tls_rendezvous() {
    let Some(codex) = codex_bin(
        "codex_exec_trusting_our_ca_runs_a_command_on_our_executor_through_a_tls_rendezvous",
    ) else {
        return;
    };
    let pki = Pki::issue(&["127.0.0.1"]);
    let rdv = start_tls_rendezvous(&pki.cert, &pki.key).await;
    let ca = pki.ca.display().to_string();
    let environment = "env-codex-harness-tls";
    let _executor = start_executor_with(
        &rdv.url,
        environment,
        &format!("[relay]\nca_file = \"{ca}\"\n"),
    );
    let mut args = harness_args(&rdv.url, environment);
    args.ca_file = Some(pki.ca.clone());
    // Until the executor has registered and attached.
    connect(args).await.abort();
    codex_turn_runs_on_our_executor(&codex, &rdv.url, environment, &[("SSL_CERT_FILE", &ca)]).await;
}

/// One `codex exec` turn whose fake model asks for a shell command, with codex's default
/// environment the relay environment `environment` at `registry`: the command must run on
/// our executor. Returns codex's output, for messages.
async fn codex_turn_runs_on_our_executor(
    codex: &std::path::Path,
    registry: &str,
    environment: &str,
    env: &[(&str, &str)],
) -> String {
    let home = CodexHome::new();
    let work = tempfile::tempdir().unwrap();
    let work_dir = std::fs::canonicalize(work.path()).unwrap();
    let marker = work_dir.join("made-by-codex.txt");
    let model = FakeModel::start("printf 'written through the relay' > made-by-codex.txt").await;
    home.use_model(&model.base_url);
    let mut cmd = home.exec_turn(codex, &work_dir);
    cmd.env("CODEX_EXEC_SERVER_NOISE_REGISTRY_URL", registry)
        .env("CODEX_EXEC_SERVER_NOISE_ENVIRONMENT_ID", environment)
        .env("CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN", HARNESS_TOKEN)
        .envs(env.iter().copied());
    let output = tokio::time::timeout(RUN_DEADLINE, cmd.output())
        .await
        .expect("codex exec finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(output.status.success(), "codex exec failed\n{context}");
    assert!(stdout.contains(FINAL_TEXT), "{context}");
    assert!(
        !stderr.contains("Noise harness handshake failed"),
        "{context}"
    );
    // The command ran on our executor's host, in the turn's working directory.
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default(),
        "written through the relay",
        "{context}"
    );
    assert!(model.requests().len() >= 2, "{context}");
    context
}

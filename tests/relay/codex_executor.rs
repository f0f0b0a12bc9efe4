//! The real codex 0.171.0 executor (`codex exec-server --remote … --registration-bearer-stdin`)
//! registered with our rendezvous, and our harness side — the Rust client's relay
//! transport and `exec-server run --remote` — running commands, a terminal and file round
//! trips through it (CODEX-0169 §5.1). Skips (`SKIP:`) only without codex and without
//! `EXEC_SERVER_REQUIRE_CODEX_TESTS=1`.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use exec_server_client::proto::process::StartParams;
use exec_server_client::relay::harness::{RelayConnectArgs, RelayError};
use exec_server_client::relay::proto::{self as frames, Body};
use exec_server_client::relay::registry::SecretString;
use exec_server_client::{ClientOptions, ExecServerClient};
use tokio::io::AsyncWriteExt;

use super::fixtures::*;
use super::tls::Pki;
use crate::codex::{codex_bin, CodexHome};

/// The lines codex logs once it registered and once its rendezvous socket is up.
const REGISTERED: &str = "Noise executor registration completed";
const CONNECTED: &str = "Noise executor connected to rendezvous";
const HANDSHAKE_DONE: &str = "Noise executor handshake completed";

/// A running codex executor (or `codex exec-server forward`) and everything it printed on
/// stderr.
pub(super) struct CodexExecutor {
    _child: tokio::process::Child,
    /// Held open: codex reads its bearer from it, and a closed stdin is no signal here.
    _stdin: tokio::process::ChildStdin,
    stderr: Arc<Mutex<String>>,
}

impl CodexExecutor {
    async fn start(
        bin: &std::path::Path,
        home: &CodexHome,
        registry: &str,
        environment: &str,
    ) -> Self {
        Self::start_with_env(bin, home, registry, environment, &[]).await
    }

    /// [`CodexExecutor::start`] with variables added to codex's environment.
    async fn start_with_env(
        bin: &std::path::Path,
        home: &CodexHome,
        registry: &str,
        environment: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let executor = Self::spawn_with_env(bin, home, registry, environment, &[], env).await;
        executor.wait_for_log(REGISTERED).await;
        executor.wait_for_log(CONNECTED).await;
        executor
    }

    /// `codex exec-server <subcommand…> --remote … --registration-bearer-stdin`, with the
    /// executor token written to its stdin; does not wait for it to register.
    pub(super) async fn spawn(
        bin: &std::path::Path,
        home: &CodexHome,
        registry: &str,
        environment: &str,
        subcommand: &[&str],
    ) -> Self {
        Self::spawn_with_env(bin, home, registry, environment, subcommand, &[]).await
    }

    /// [`CodexExecutor::spawn`] with variables added to codex's environment.
    async fn spawn_with_env(
        bin: &std::path::Path,
        home: &CodexHome,
        registry: &str,
        environment: &str,
        subcommand: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let mut cmd = home.command(bin);
        cmd.envs(env.iter().copied());
        cmd.arg("exec-server")
            .args(subcommand)
            .args([
                "--remote",
                registry,
                "--environment-id",
                environment,
                "--registration-bearer-stdin",
            ])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            // Its own process group, so that dropping it ends codex's launcher and the
            // binary it starts together (see `Drop`).
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn codex exec-server");
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(format!("{EXECUTOR_TOKEN}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
        let stderr = capture_stderr(&mut child);
        Self {
            _child: child,
            _stdin: stdin,
            stderr,
        }
    }

    pub(super) fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    async fn wait_for_log(&self, line: &str) {
        wait_for_log(&self.stderr, line, 1).await;
    }
}

impl Drop for CodexExecutor {
    fn drop(&mut self) {
        kill_process_group(&self._child);
    }
}

/// Kills the process group `child` leads: the `codex` launcher runs the real binary as its
/// child, which outlives a kill of the launcher alone.
pub(super) fn kill_process_group(child: &tokio::process::Child) {
    if let Some(pid) = child.id() {
        // SAFETY: a plain kill(2) of a group this test created; no memory is involved.
        unsafe {
            libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
        }
    }
}

/// `cwd` as the executor itself reports it (codex 0.169.0 wants a `file:` URI).
fn start_params(cwd: &str, argv: &[&str], tty: bool) -> StartParams {
    StartParams {
        process_id: ExecServerClient::new_process_id(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: cwd.to_owned(),
        env: BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
        tty,
        pipe_stdin: Some(false),
        arg0: None,
        env_policy: None,
        sandbox: None,
        size: None,
        network_proxy: None,
        enforce_managed_network: None,
        managed_network: None,
    }
}

/// The frames one side sent up to the rendezvous, decoded.
fn sent_by(proxy: &Proxy, side: Side) -> Vec<frames::RelayMessageFrame> {
    proxy
        .frames
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.side == side && c.up)
        .filter_map(|c| frames::decode(&c.bytes).ok())
        .collect()
}

#[tokio::test]
async fn codex_executor_serves_our_client_and_run_through_our_rendezvous() {
    let Some(bin) = codex_bin("codex_executor_serves_our_client_and_run_through_our_rendezvous")
    else {
        return;
    };
    let home = CodexHome::new();
    // Every socket passes the capturing proxy; registry calls go to the rendezvous.
    let (proxy, rdv) = proxied_rendezvous("").await;
    let codex = CodexExecutor::start(&bin, &home, &rdv.direct, "env-1").await;

    let args = RelayConnectArgs::new(&rdv.direct, "env-1", SecretString::new(HARNESS_TOKEN));
    let client = ExecServerClient::connect_relay(args, ClientOptions::default())
        .await
        .expect("our client connects to the codex executor");
    codex.wait_for_log(HANDSHAKE_DONE).await;
    let info = client.environment_info().await.unwrap();
    let cwd = info.cwd.expect("codex reports its working directory");

    // A command: stdout, stderr and the exit code.
    let process = client
        .start_process(start_params(
            &cwd,
            &["sh", "-c", "echo out; echo err >&2; exit 7"],
            false,
        ))
        .await
        .unwrap();
    let output = process.wait_with_output().await.unwrap();
    assert_eq!(output.stdout, b"out\n");
    assert_eq!(output.stderr, b"err\n");
    assert_eq!(output.exit_code, Some(7));

    // A terminal process sees a terminal.
    let pty = client
        .start_process(start_params(
            &cwd,
            &["sh", "-c", "[ -t 0 ] && [ -t 1 ] && echo on-a-tty; exit 3"],
            true,
        ))
        .await
        .unwrap();
    let output = pty.wait_with_output().await.unwrap();
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("on-a-tty"),
        "{:?}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert_eq!(output.exit_code, Some(3));

    // File round trips, one of them larger than several records in both directions.
    // Paths travel as `file:` URIs, as codex's own client sends them.
    let dir = tempfile::tempdir().unwrap();
    let uri = |path: &std::path::Path| format!("file://{}", path.display());
    let small = dir.path().join("small.txt");
    client
        .write_file(&uri(&small), b"hello codex\n")
        .await
        .unwrap();
    assert_eq!(std::fs::read(&small).unwrap(), b"hello codex\n");
    assert_eq!(
        client.read_file(&uri(&small)).await.unwrap(),
        b"hello codex\n"
    );
    let big: Vec<u8> = (0..200 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let big_path = dir.path().join("big.bin");
    client.write_file(&uri(&big_path), &big).await.unwrap();
    assert_eq!(std::fs::read(&big_path).unwrap(), big);
    assert_eq!(client.read_file(&uri(&big_path)).await.unwrap(), big);

    // `exec-server run --remote` through the same executor: output and exit code.
    let (code, stdout, _) = run_remote(
        &rdv.direct,
        "env-1",
        &[],
        &["sh", "-c", "echo via-run; exit 5"],
    )
    .await;
    assert_eq!(stdout, "via-run\n");
    assert_eq!(code, Some(5));

    // On the wire: codex's msg2 is 3,424 bytes and its records count from 0 with no ack
    // fields; our msg1 is 3,568 + P bytes and our records follow codex's numbering too.
    let from_codex = sent_by(&proxy, Side::Executor);
    let msg2: Vec<usize> = from_codex
        .iter()
        .filter_map(|f| match &f.body {
            Some(Body::Handshake(h)) => Some(h.payload.len()),
            _ => None,
        })
        .collect();
    assert!(
        !msg2.is_empty() && msg2.iter().all(|n| *n == 3_424),
        "{msg2:?}"
    );
    let stream = from_codex
        .iter()
        .find(|f| matches!(f.body, Some(Body::Data(_))))
        .map(|f| f.stream_id.clone())
        .expect("codex sent records");
    let seqs: Vec<u32> = from_codex
        .iter()
        .filter(|f| f.stream_id == stream)
        .filter_map(|f| match &f.body {
            Some(Body::Data(d)) => Some(d.seq),
            _ => None,
        })
        .collect();
    assert_eq!(seqs, (0..seqs.len() as u32).collect::<Vec<_>>());
    assert!(from_codex.iter().all(|f| f.ack == 0 && f.ack_bits == 0));
    let from_us = sent_by(&proxy, Side::Harness);
    assert!(from_us
        .iter()
        .all(|f| !matches!(f.body, Some(Body::AckFrame(_)) | Some(Body::Resume(_)))));
    let ours: Vec<u32> = from_us
        .iter()
        .filter(|f| f.stream_id == stream)
        .filter_map(|f| match &f.body {
            Some(Body::Data(d)) => Some(d.seq),
            _ => None,
        })
        .collect();
    assert_eq!(ours, (0..ours.len() as u32).collect::<Vec<_>>());
    assert!(from_us.iter().any(|f| matches!(
        &f.body,
        Some(Body::Handshake(h)) if h.payload.len() > 3_568
    )));
    drop(client);
}

#[tokio::test]
async fn codex_executor_trusting_our_ca_through_ssl_cert_file_serves_over_a_tls_rendezvous() {
    let Some(bin) = codex_bin(
        "codex_executor_trusting_our_ca_through_ssl_cert_file_serves_over_a_tls_rendezvous",
    ) else {
        return;
    };
    let home = CodexHome::new();
    let pki = Pki::issue(&["127.0.0.1"]);
    let rdv = start_tls_rendezvous(&pki.cert, &pki.key).await;
    let ca = pki.ca.display().to_string();
    // codex reads SSL_CERT_FILE for its registry client and its rendezvous socket alike.
    let codex = CodexExecutor::start_with_env(
        &bin,
        &home,
        &rdv.url,
        "env-codex-tls",
        &[("SSL_CERT_FILE", &ca)],
    )
    .await;
    let (code, stdout, stderr) = run_remote(
        &rdv.url,
        "env-codex-tls",
        &["--ca-file", &ca],
        &["sh", "-c", "echo codex-over-tls; exit 4"],
    )
    .await;
    assert_eq!(stdout, "codex-over-tls\n", "{stderr}");
    assert_eq!(code, Some(4), "{stderr}");
    codex.wait_for_log(HANDSHAKE_DONE).await;
}

/// A codex executor forgets its streams when its socket drops and says nothing about them
/// when it reconnects: the rendezvous resets them towards their harnesses, so a harness
/// waiting for output learns at once, and the session goes on on a new stream.
#[tokio::test]
async fn a_cut_codex_executor_socket_resets_its_streams_and_the_session_resumes() {
    let Some(bin) =
        codex_bin("a_cut_codex_executor_socket_resets_its_streams_and_the_session_resumes")
    else {
        return;
    };
    let home = CodexHome::new();
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _codex = CodexExecutor::start(&bin, &home, &rdv.direct, "env-codex-cut").await;
    let args = harness_args(&rdv.direct, "env-codex-cut");
    let (mut client, init) = RelayClient::open_with(
        args.clone(),
        serde_json::json!({"clientName": "relay-tests-client"}),
    )
    .await;
    let session = init["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(
        client
            .call("environment/status", serde_json::json!({}))
            .await["status"],
        "ready"
    );
    // Nothing is in flight: only the rendezvous can tell the harness its stream is gone.
    // It resets the stream and closes the socket; a codex stream ends with its socket, so
    // the harness may report either first — but it does not wait.
    proxy.faults.cut.notify_waiters();
    let ended = client.ended().await;
    assert!(
        ended == Some(RelayError::Reset("executor_unavailable".into()))
            || ended == Some(RelayError::Lost),
        "{ended:?}"
    );
    proxy
        .wait_for("codex to reconnect", |p| p.executor_sockets() >= 2)
        .await;
    let mut resumed = resume_session(&args, &session).await;
    assert_eq!(
        resumed
            .call("environment/status", serde_json::json!({}))
            .await["status"],
        "ready"
    );
}

/// codex's executor sends records without waiting for acknowledgements. A harness that
/// reads a large output late must hold its own socket (the rendezvous's queue towards it
/// and TCP then hold the rest) rather than take records it has no room for: the old
/// harness parked them until 64 were ahead and then failed the stream with
/// `sequence_error` about 2 MiB into the output. (Beyond about 12 MiB the rendezvous, whose
/// queue towards a harness is bounded, drops frames, which a codex stream cannot recover.)
#[tokio::test]
async fn a_harness_that_reads_a_large_output_late_still_gets_all_of_it() {
    let Some(bin) = codex_bin("a_harness_that_reads_a_large_output_late_still_gets_all_of_it")
    else {
        return;
    };
    let home = CodexHome::new();
    let rdv = start_rendezvous(None).await;
    let _codex = CodexExecutor::start(&bin, &home, &rdv.direct, "env-late").await;
    let mut client = RelayClient::open(harness_args(&rdv.direct, "env-late")).await;
    let bytes: u64 = 6 << 20;
    let argv = ["head", "-c", &bytes.to_string(), "/dev/zero"].map(str::to_owned);
    let params = serde_json::json!({"processId": "late", "argv": argv, "cwd": "file:///", "env": {},
                        "tty": false});
    client.call("process/start", params).await;
    // Read nothing while codex writes far more than the harness's inbound queue holds.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let mut received = 0u64;
    loop {
        let message = client.next().await;
        if message["params"]["processId"] != "late" {
            continue;
        }
        match message["method"].as_str() {
            Some("process/output") => {
                received += crate::util::b64decode(&message["params"]["chunk"]).len() as u64
            }
            Some("process/closed") => break,
            _ => {}
        }
    }
    assert_eq!(received, bytes);
}

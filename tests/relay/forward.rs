//! `exec-server forward` (CODEX-0169 §4.8): an executor that registers with the rendezvous
//! and copies each harness stream to its own WebSocket connection to a local exec-server.
//! Real processes throughout: our rendezvous, our forward (or codex's), our local server
//! (or codex's), and our harness (`exec-server run --remote`, the Rust client) or codex's
//! (`codex exec` with the `CODEX_EXEC_SERVER_NOISE_*` variables). The codex cases skip
//! (`SKIP:`) only without codex and without `EXEC_SERVER_REQUIRE_CODEX_TESTS=1`.

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exec_server_client::relay::harness::RelayConnectArgs;
use exec_server_client::relay::registry::SecretString;
use exec_server_client::{ClientOptions, ExecServerClient};
use serde_json::json;
use tokio::process::Child;

use super::codex_executor::{kill_process_group, CodexExecutor};
use super::fixtures::*;
use super::tls::Pki;
use crate::codex::fake_model::{FakeModel, FINAL_TEXT};
use crate::codex::{codex_bin, CodexHome};
use crate::util::{server_command, WsServer, STEP_TIMEOUT};

/// A variable set only in the destination server's environment: a command that prints it
/// ran there.
const MARK: &str = "FORWARD_DESTINATION_MARK";

/// A running `exec-server forward` and its stderr.
struct Forward {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Forward {
    /// `exec-server forward --remote … --environment-id … --connect <destination> <extra>`
    /// with the executor token in EXEC_SERVER_RELAY_TOKEN; returns once the environment
    /// is reachable.
    async fn start(rdv: &Rendezvous, environment: &str, destination: &str, extra: &[&str]) -> Self {
        Self::start_with_vars(rdv, environment, destination, extra, &[]).await
    }

    /// [`Forward::start`] with `vars` added to its environment.
    async fn start_with_vars(
        rdv: &Rendezvous,
        environment: &str,
        destination: &str,
        extra: &[&str],
        vars: &[(&str, &str)],
    ) -> Self {
        let mut cmd = server_command(
            &[
                &[
                    "forward",
                    "--remote",
                    &rdv.direct,
                    "--environment-id",
                    environment,
                    "--connect",
                    destination,
                ],
                extra,
            ]
            .concat(),
        );
        cmd.env("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN)
            // Each stream it forwards is logged at debug: the proof a stream went through.
            .env("RUST_LOG", "warn,exec_server_relay::forward=debug")
            .env("NO_COLOR", "1")
            .stderr(Stdio::piped());
        cmd.envs(vars.iter().copied());
        let mut child = cmd.spawn().expect("spawn exec-server forward");
        let log = capture_stderr(&mut child);
        harness_bundle(&rdv.direct, environment).await;
        Self { child, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    async fn wait_for_log(&self, text: &str) {
        wait_for_log(&self.log, text, 1).await;
    }

    fn assert_running(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "forward exited; its stderr:\n{}",
            self.log()
        );
    }
}

/// Our local WebSocket server with [`MARK`] set to `mark`, plus `args`, taking frames of
/// at most 9 MiB.
async fn our_destination(mark: &str, args: &[&str]) -> WsServer {
    let mut cmd = server_command(&[&["--listen", "ws://127.0.0.1:0"], args].concat());
    // Frames above 9 MiB are refused: a 12 MiB message arrives only in the forward's
    // 8 MiB fragments.
    cmd.env(MARK, mark).env(
        "EXEC_SERVER_WEBSOCKET__MAX_FRAME_BYTES",
        (9 << 20).to_string(),
    );
    WsServer::start_with(cmd).await
}

/// `exec-server run --remote … -- sh -c <script>` with the harness token: stdout and
/// exit code.
async fn run_script(registry: &str, environment: &str, script: &str) -> (String, Option<i32>) {
    let (code, stdout, _) = run_remote(registry, environment, &[], &["sh", "-c", script]).await;
    (stdout, code)
}

/// An owner-only file holding `token`.
fn token_file(dir: &std::path::Path, token: &str) -> std::path::PathBuf {
    let path = dir.join("destination.token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

async fn relay_client(registry: &str, environment: &str) -> ExecServerClient {
    let args = RelayConnectArgs::new(registry, environment, SecretString::new(HARNESS_TOKEN));
    ExecServerClient::connect_relay(args, ClientOptions::default())
        .await
        .expect("the client connects through the forward")
}

/// Writes and reads back a small file and one above the 8 MiB fragment size, so large
/// messages cross the forward both ways.
async fn fs_round_trip(client: &ExecServerClient, path: impl Fn(&std::path::Path) -> String) {
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small.txt");
    client
        .write_file(&path(&small), b"through the forward\n")
        .await
        .unwrap();
    assert_eq!(std::fs::read(&small).unwrap(), b"through the forward\n");
    let big: Vec<u8> = (0..9 * 1024 * 1024u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let big_path = dir.path().join("big.bin");
    // The client resends across reconnects: a message that cannot cross would be tried
    // for ever, so the guard turns that into a failure.
    tokio::time::timeout(STEP_TIMEOUT, client.write_file(&path(&big_path), &big))
        .await
        .expect("a 12 MiB message crosses the forward")
        .unwrap();
    assert!(std::fs::read(&big_path).unwrap() == big);
    let read = tokio::time::timeout(STEP_TIMEOUT, client.read_file(&path(&big_path)))
        .await
        .expect("a 12 MiB answer crosses the forward")
        .unwrap();
    assert!(read == big);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_serves_run_and_the_client_from_our_local_server_with_a_bearer() {
    let rdv = start_rendezvous(None).await;
    let secrets = tempfile::tempdir().unwrap();
    let token = token_file(secrets.path(), "destination-bearer-for-tests");
    let token_arg = token.to_str().unwrap();
    let destination = our_destination(
        "our-server",
        &[
            "--ws-auth",
            "capability-token",
            "--ws-token-file",
            token_arg,
        ],
    )
    .await;
    let mut forward = Forward::start(
        &rdv,
        "env-fwd-ours",
        &destination.url,
        &["--connect-bearer-token-file", token_arg],
    )
    .await;

    // The command ran on the destination (it sees the destination's variable), with its
    // output and exit code carried back.
    let (stdout, code) = run_script(
        &rdv.direct,
        "env-fwd-ours",
        &format!("echo \"ran on ${MARK}\"; exit 4"),
    )
    .await;
    assert_eq!(stdout, "ran on our-server\n");
    assert_eq!(code, Some(4));

    let client = relay_client(&rdv.direct, "env-fwd-ours").await;
    fs_round_trip(&client, |p| p.display().to_string()).await;
    drop(client);
    forward.assert_running();
    assert!(
        !forward.log().contains("destination-bearer-for-tests"),
        "{}",
        forward.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_without_the_destination_bearer_closes_the_stream_and_says_why() {
    let rdv = start_rendezvous(None).await;
    let secrets = tempfile::tempdir().unwrap();
    let token = token_file(secrets.path(), "destination-bearer-for-tests");
    let destination = our_destination(
        "our-server",
        &[
            "--ws-auth",
            "capability-token",
            "--ws-token-file",
            token.to_str().unwrap(),
        ],
    )
    .await;
    let mut forward = Forward::start(&rdv, "env-fwd-nobearer", &destination.url, &[]).await;
    let mut conn = connect(harness_args(&rdv.direct, "env-fwd-nobearer")).await;
    // The stream may already be closed by then: the send's outcome does not matter.
    let _ = conn
        .send(json!({"id": 1, "method": "initialize", "params": {"clientName": "t"}}).to_string())
        .await;
    // No answer: the stream ends, and the forward says why and keeps running.
    assert!(
        tokio::time::timeout(STEP_TIMEOUT, conn.recv())
            .await
            .expect("the stream ends")
            .is_none(),
        "a message arrived through a destination that refused the upgrade"
    );
    forward
        .wait_for_log("forward destination unreachable (the upgrade was refused with HTTP 401)")
        .await;
    forward.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_outlives_a_destination_that_is_down_or_goes_away() {
    let rdv = start_rendezvous(None).await;
    // A port nothing listens on (yet).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let destination_url = format!("ws://127.0.0.1:{port}");
    let mut forward = Forward::start(&rdv, "env-fwd-down", &destination_url, &[]).await;

    // Down: the stream is closed, with a log line; the forward keeps running.
    let mut conn = connect(harness_args(&rdv.direct, "env-fwd-down")).await;
    // The stream may already be closed by then: the send's outcome does not matter.
    let _ = conn
        .send(json!({"id": 1, "method": "initialize", "params": {"clientName": "t"}}).to_string())
        .await;
    assert!(tokio::time::timeout(STEP_TIMEOUT, conn.recv())
        .await
        .expect("the stream ends")
        .is_none());
    forward
        .wait_for_log("forward destination unreachable")
        .await;
    forward.assert_running();

    // Up on that port: the next stream is served.
    let mut destination = WsServer::start_with({
        let mut cmd = server_command(&["--listen", &destination_url]);
        cmd.env(MARK, "late-server");
        cmd
    })
    .await;
    let (mut client, init) = RelayClient::open_with(
        harness_args(&rdv.direct, "env-fwd-down"),
        json!({"clientName": "t"}),
    )
    .await;
    assert!(init["sessionId"].is_string(), "{init}");
    let info = client.call("environment/info", json!({})).await;
    assert!(info["cwd"].is_string(), "{info}");

    // Gone while the stream is open: the stream ends; the forward still runs.
    destination.child.kill().await.unwrap();
    client.ended().await;
    forward.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_through_one_forward_each_reach_their_own_session() {
    const STREAMS: usize = 8;
    let rdv = start_rendezvous(None).await;
    let destination = our_destination("many", &[]).await;
    let mut forward = Forward::start(&rdv, "env-fwd-many", &destination.url, &[]).await;
    let work = tempfile::tempdir().unwrap();
    let tasks: Vec<_> = (0..STREAMS)
        .map(|i| {
            let registry = rdv.direct.clone();
            let path = work.path().join(format!("stream-{i}.txt"));
            tokio::spawn(async move {
                let (mut client, init) = RelayClient::open_with(
                    harness_args(&registry, "env-fwd-many"),
                    json!({"clientName": format!("stream-{i}")}),
                )
                .await;
                let session = init["sessionId"].as_str().unwrap().to_owned();
                // Interleaved requests on every stream at once, each answered on its own.
                for round in 0..5 {
                    let text = format!("stream {i} round {round}");
                    client
                        .call(
                            "fs/writeFile",
                            json!({"path": path, "dataBase64": crate::util::b64(&text)}),
                        )
                        .await;
                    let read = client.call("fs/readFile", json!({"path": path})).await;
                    assert_eq!(crate::util::b64decode(&read["dataBase64"]), text.as_bytes());
                }
                session
            })
        })
        .collect();
    let mut sessions = Vec::new();
    for task in tasks {
        sessions.push(task.await.unwrap());
    }
    sessions.sort();
    sessions.dedup();
    assert_eq!(sessions.len(), STREAMS, "{sessions:?}");
    forward.assert_running();
}

/// codex's local server, ended with its launcher when dropped.
struct CodexServer(WsServer);

impl Drop for CodexServer {
    fn drop(&mut self) {
        kill_process_group(&self.0.child);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_fronts_codex_local_server_for_our_harness() {
    let Some(bin) = codex_bin("forward_fronts_codex_local_server_for_our_harness") else {
        return;
    };
    let home = CodexHome::new();
    let rdv = start_rendezvous(None).await;
    let mut cmd = home.command(&bin);
    cmd.args(["exec-server", "--listen", "ws://127.0.0.1:0"])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let destination = CodexServer(WsServer::start_with(cmd).await);
    let destination = &destination.0;
    let mut forward = Forward::start(&rdv, "env-fwd-codex", &destination.url, &[]).await;

    // codex answers initialize itself: the stream reached codex's server.
    let (_client, init) = RelayClient::open_with(
        harness_args(&rdv.direct, "env-fwd-codex"),
        json!({"clientName": "forward-tests"}),
    )
    .await;
    assert_eq!(
        init["environmentInfo"]["executorVersion"],
        crate::codex::CODEX_VERSION,
        "{init}"
    );
    let (stdout, code) = run_script(&rdv.direct, "env-fwd-codex", "echo via-codex; exit 6").await;
    assert_eq!(stdout, "via-codex\n");
    assert_eq!(code, Some(6));

    let client = relay_client(&rdv.direct, "env-fwd-codex").await;
    fs_round_trip(&client, |p| format!("file://{}", p.display())).await;
    forward.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_exec_runs_a_shell_command_through_our_forward() {
    let Some(codex) = codex_bin("codex_exec_runs_a_shell_command_through_our_forward") else {
        return;
    };
    let rdv = start_rendezvous(None).await;
    let destination = our_destination("codex-harness", &[]).await;
    let mut forward = Forward::start(&rdv, "env-fwd-harness", &destination.url, &[]).await;

    let home = CodexHome::new();
    let work = tempfile::tempdir().unwrap();
    let work_dir = std::fs::canonicalize(work.path()).unwrap();
    let marker = work_dir.join("made-by-codex.txt");
    let model = FakeModel::start("printf 'written through the forward' > made-by-codex.txt").await;
    home.use_model(&model.base_url);
    let mut cmd = home.exec_turn(&codex, &work_dir);
    cmd.env("CODEX_EXEC_SERVER_NOISE_REGISTRY_URL", &rdv.direct)
        .env("CODEX_EXEC_SERVER_NOISE_ENVIRONMENT_ID", "env-fwd-harness")
        .env("CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN", HARNESS_TOKEN);
    let output = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("codex exec finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let context = format!(
        "stdout:\n{stdout}\nstderr:\n{stderr}\nforward:\n{}",
        forward.log()
    );
    assert!(output.status.success(), "codex exec failed\n{context}");
    assert!(stdout.contains(FINAL_TEXT), "{context}");
    // The shell command ran, and codex's streams went through the forward to the
    // destination.
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default(),
        "written through the forward",
        "{context}"
    );
    assert!(forward.log().contains("forwarding stream"), "{context}");
    assert!(!forward.log().contains("unreachable"), "{context}");
    forward.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_forward_fronts_our_local_server_for_our_harness() {
    let Some(bin) = codex_bin("codex_forward_fronts_our_local_server_for_our_harness") else {
        return;
    };
    let home = CodexHome::new();
    let rdv = start_rendezvous(None).await;
    let destination = our_destination("behind-codex", &[]).await;
    let codex = CodexExecutor::spawn(
        &bin,
        &home,
        &rdv.direct,
        "env-codex-fwd",
        &["forward", "--connect", &destination.url],
    )
    .await;
    harness_bundle(&rdv.direct, "env-codex-fwd").await;

    let (stdout, code) = run_script(
        &rdv.direct,
        "env-codex-fwd",
        &format!("echo \"ran on ${MARK}\"; exit 3"),
    )
    .await;
    assert_eq!(stdout, "ran on behind-codex\n", "codex:\n{}", codex.log());
    assert_eq!(code, Some(3));
    let client = relay_client(&rdv.direct, "env-codex-fwd").await;
    let info = client.environment_info().await.unwrap();
    assert_eq!(info.executor_version, env!("CARGO_PKG_VERSION"));
    fs_round_trip(&client, |p| p.display().to_string()).await;
}

#[tokio::test]
async fn forward_refuses_a_destination_that_is_not_a_websocket_url() {
    for (args, expected) in [
        (
            vec!["--connect", "http://127.0.0.1:9"],
            "forward destination must be a ws:// or wss:// URL",
        ),
        (
            vec!["--connect", "ws://"],
            "forward destination must be a ws:// or wss:// URL",
        ),
    ] {
        let mut cmd = server_command(
            &[
                &[
                    "forward",
                    "--remote",
                    "http://127.0.0.1:9",
                    "--environment-id",
                    "env-x",
                ][..],
                &args,
            ]
            .concat(),
        );
        cmd.env("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN)
            .stderr(Stdio::piped());
        let output = tokio::time::timeout(STEP_TIMEOUT, cmd.output())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&output.stderr).trim(), expected);
    }
    // The same check for the configuration key.
    let config = crate::util::config_file(
        "[relay]\nurl = \"http://127.0.0.1:9\"\nenvironment_id = \"env-x\"\nforward_url = \"tcp://127.0.0.1:9\"\n",
    );
    let mut cmd = server_command(&["--config", config.to_str().unwrap()]);
    cmd.env("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN)
        .stderr(Stdio::piped());
    let output = tokio::time::timeout(STEP_TIMEOUT, cmd.output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("relay.forward_url forward destination must be a ws:// or wss:// URL"),
        "{stderr}"
    );
}

/// A TLS terminator in front of the plain `ws://` server at `plain`: each connection's TLS
/// is ended with `pki`'s server certificate and its bytes copied to and from `plain`.
/// Returns the `wss://` URL.
async fn tls_terminator(pki: &Pki, plain: &str) -> String {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&pki.cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&pki.key).unwrap();
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let plain = plain.strip_prefix("ws://").unwrap().to_owned();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, plain) = (acceptor.clone(), plain.clone());
            tokio::spawn(async move {
                // A client that does not trust the certificate ends the handshake here.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut server = tokio::net::TcpStream::connect(&plain).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
            });
        }
    });
    format!("wss://127.0.0.1:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_trusts_the_relay_ca_file_for_a_wss_destination() {
    let rdv = start_rendezvous(None).await;
    let pki = Pki::issue(&["127.0.0.1"]);
    let destination = our_destination("behind-tls", &[]).await;
    let wss = tls_terminator(&pki, &destination.url).await;

    // Without the CA file the destination's certificate is not trusted: the stream ends.
    let mut untrusting = Forward::start(&rdv, "env-fwd-wss-untrusted", &wss, &[]).await;
    let mut conn = connect(harness_args(&rdv.direct, "env-fwd-wss-untrusted")).await;
    // The stream may already be closed by then: the send's outcome does not matter.
    let _ = conn
        .send(json!({"id": 1, "method": "initialize", "params": {"clientName": "t"}}).to_string())
        .await;
    assert!(
        tokio::time::timeout(STEP_TIMEOUT, conn.recv())
            .await
            .expect("the stream ends")
            .is_none(),
        "a message arrived through a destination whose certificate is not trusted"
    );
    untrusting.wait_for_log("UnknownIssuer").await;
    untrusting.assert_running();

    // With relay.ca_file the same destination serves the stream.
    let ca = pki.ca.to_str().unwrap();
    let _trusting = Forward::start_with_vars(
        &rdv,
        "env-fwd-wss",
        &wss,
        &[],
        &[("EXEC_SERVER_RELAY__CA_FILE", ca)],
    )
    .await;
    let (stdout, code) = run_script(
        &rdv.direct,
        "env-fwd-wss",
        &format!("echo \"ran on ${MARK}\""),
    )
    .await;
    assert_eq!(stdout, "ran on behind-tls\n");
    assert_eq!(code, Some(0));
}

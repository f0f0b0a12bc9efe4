//! The server keeps its secrets out of its environment, its logs, its answers and its dumps.
//!
//! The attacker is a process the server started for a client (same user, no sandbox) or
//! any other process of that user: it reads `/proc/<server pid>/environ`, its own
//! inherited environment, the server's logs and answers. Tokens must be nowhere there.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::Stdio;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

use crate::util::{
    b64decode, http_body, http_get, server_bin, server_command, Client, WsServer, STEP_TIMEOUT,
};

const CONNECTION_TOKEN: &str = "hygiene-conn-token-5b0e";
const RELAY_TOKEN: &str = "hygiene-relay-token-91ac";
const LEGACY_RELAY_TOKEN: &str = "hygiene-legacy-token-77d2";
const CUSTOM_RELAY_TOKEN: &str = "hygiene-custom-token-0f3b";
/// Base64 of 32 bytes whose text is recognisable: "hygiene-signing-key-0123456789ab".
const SIGNING_KEY: &str = "aHlnaWVuZS1zaWduaW5nLWtleS0wMTIzNDU2Nzg5YWI=";
/// An ordinary variable, proving that the environment read was the right one.
const MARKER: &str = "HYGIENE_MARKER=still-here";

/// Every secret value, and the variables that carried them as `NAME=` (the name of the
/// custom variable also appears as the value of `EXEC_SERVER_RELAY__TOKEN_ENV`, which is
/// no secret).
const SECRETS: &[&str] = &[
    CONNECTION_TOKEN,
    RELAY_TOKEN,
    LEGACY_RELAY_TOKEN,
    CUSTOM_RELAY_TOKEN,
    SIGNING_KEY,
    "CODEX_EXEC_SERVER_CONNECTION_TOKEN=",
    "EXEC_SERVER_WEBSOCKET__BEARER_TOKEN=",
    "EXEC_SERVER_RELAY_TOKEN=",
    "CODEX_EXEC_SERVER_REMOTE_BEARER_TOKEN=",
    "EXEC_SERVER_RENDEZVOUS_SIGNING_KEY=",
    "MY_RELAY_TOKEN_VARIABLE=",
];

/// Puts every kind of secret variable the server knows in `cmd`'s environment.
fn with_secret_environment(cmd: &mut Command) {
    cmd.env("CODEX_EXEC_SERVER_CONNECTION_TOKEN", CONNECTION_TOKEN)
        .env("EXEC_SERVER_WEBSOCKET__BEARER_TOKEN", CONNECTION_TOKEN)
        .env("EXEC_SERVER_RELAY_TOKEN", RELAY_TOKEN)
        .env("CODEX_EXEC_SERVER_REMOTE_BEARER_TOKEN", LEGACY_RELAY_TOKEN)
        .env("EXEC_SERVER_RELAY__TOKEN_ENV", "MY_RELAY_TOKEN_VARIABLE")
        .env("MY_RELAY_TOKEN_VARIABLE", CUSTOM_RELAY_TOKEN)
        .env("EXEC_SERVER_RENDEZVOUS_SIGNING_KEY", SIGNING_KEY)
        .env("HYGIENE_MARKER", "still-here");
}

#[track_caller]
fn assert_no_secret(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} shows {secret}:\n{text}");
    }
}

/// Runs `argv` through `process/start` (no sandbox) and returns its output and exit code.
async fn run(client: &mut Client, id: &str, argv: &[&str], extra: Value) -> (String, i64) {
    let mut params = json!({
        "processId": id,
        "argv": argv,
        "cwd": "file:///",
        "env": {"PATH": "/usr/bin:/bin"},
        "tty": false,
    });
    for (key, value) in extra.as_object().unwrap() {
        params[key] = value.clone();
    }
    client.call("process/start", params).await;
    let mut output = Vec::new();
    let mut exit_code = None;
    loop {
        let message = client.next_message().await;
        if message["params"]["processId"] != id {
            continue;
        }
        match message["method"].as_str() {
            Some("process/output") => output.extend(b64decode(&message["params"]["chunk"])),
            Some("process/exited") => exit_code = message["params"]["exitCode"].as_i64(),
            Some("process/closed") => break,
            _ => {}
        }
    }
    (
        String::from_utf8_lossy(&output).replace('\0', "\n"),
        exit_code.expect("an exit code"),
    )
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The real uid of process `pid`, from `/proc/<pid>/status`.
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The files under `/proc/<pid>` of a process that is not dumpable are owned by root
/// whatever its uid (proc(5)); meaningful for a process whose uid is not root.
#[track_caller]
fn assert_non_dumpable(pid: u32, what: &str) {
    let uid = uid_of(pid);
    assert_ne!(
        uid, 0,
        "the check needs a process that does not run as root"
    );
    let environ = format!("/proc/{pid}/environ");
    let owner = std::fs::metadata(&environ).unwrap().uid();
    assert_eq!(
        owner, 0,
        "{what} (uid {uid}) is dumpable: {environ} is owned by uid {owner}"
    );
}

/// `cmd` run as uid/gid 65534 when this test runs as root (so that root's powers do not
/// hide a dumpable server); otherwise as the current user, who is not root anyway.
fn as_unprivileged_user(program: &Path, args: &[&str]) -> Command {
    let mut cmd = if is_root() {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(program);
        cmd
    } else {
        Command::new(program)
    };
    cmd.args(args)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "warn");
    }
    cmd
}

#[tokio::test]
async fn secrets_are_gone_from_the_server_environment_and_from_inheriting_children() {
    let mut cmd = server_command(&["--listen", "stdio"]);
    with_secret_environment(&mut cmd);
    let mut client = Client::stdio_with(cmd);
    let pid = client.child().id().unwrap();
    client.handshake().await;

    let environ = format!("/proc/{pid}/environ");
    let (server_env, code) = run(&mut client, "peek", &["cat", &environ], json!({})).await;
    assert_eq!(code, 0, "{server_env}");
    assert!(
        server_env.contains(MARKER),
        "the read did not show the server's environment:\n{server_env}"
    );
    assert_no_secret("/proc/<server pid>/environ", &server_env);

    // A child that inherits everything the server may pass on, default excludes off.
    let inherit = json!({"envPolicy": {"inherit": "all", "ignoreDefaultExcludes": true,
        "exclude": [], "set": {}, "includeOnly": []}});
    let (own_env, code) = run(
        &mut client,
        "inherit",
        &["cat", "/proc/self/environ"],
        inherit,
    )
    .await;
    assert_eq!(code, 0, "{own_env}");
    assert!(own_env.contains(MARKER), "{own_env}");
    assert_no_secret("an inheriting child's environment", &own_env);
}

#[tokio::test]
async fn the_sandbox_cannot_be_switched_off_and_the_server_is_non_dumpable_at_its_weakest() {
    // The switch that used to make the server non-dumpable lived in a `sandbox` plugin; the
    // table is a configuration section now, and a switch for it stops the server.
    let mut refused = as_unprivileged_user(&server_bin(), &["--listen", "stdio"]);
    refused.env("EXEC_SERVER_PLUGINS__SANDBOX__ENABLED", "false");
    let output = refused.output().await.expect("run the server");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("plugins.sandbox"), "{stderr}");

    // The weakest sandbox setting still leaves the server itself hardened.
    let mut cmd = as_unprivileged_user(&server_bin(), &["--listen", "stdio"]);
    with_secret_environment(&mut cmd);
    cmd.env("EXEC_SERVER_SANDBOX__ENFORCEMENT", "best-effort");
    let mut client = Client::stdio_with(cmd);
    client.handshake().await;
    // The server itself (not `setpriv`, which it replaced by exec).
    let pid = client.child().id().unwrap();
    assert_non_dumpable(pid, "the server");

    // A process of the same user cannot open the server's environment at all.
    let environ = format!("/proc/{pid}/environ");
    let (output, code) = run(&mut client, "peek", &["cat", &environ], json!({})).await;
    assert_ne!(code, 0, "a same-user process read {environ}:\n{output}");
    assert!(output.contains("Permission denied"), "{output}");
    assert_no_secret("the failed read", &output);
}

#[tokio::test]
async fn the_rendezvous_service_is_non_dumpable_and_drops_its_key_variable() {
    let mut cmd = as_unprivileged_user(
        &server_bin(),
        &[
            "rendezvous",
            "--listen",
            "http://127.0.0.1:0",
            "--insecure-no-auth",
        ],
    );
    with_secret_environment(&mut cmd);
    let mut child = cmd.spawn().expect("spawn rendezvous");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut url = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut url))
        .await
        .expect("rendezvous prints its URL")
        .unwrap();
    let pid = child.id().unwrap();
    assert_non_dumpable(pid, "the rendezvous service");
    if is_root() {
        // Root may still read it: the key must be gone from the block itself.
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let environ = String::from_utf8_lossy(&environ).replace('\0', "\n");
        assert!(environ.contains(MARKER), "{environ}");
        assert_no_secret("the rendezvous service's /proc/<pid>/environ", &environ);
    }
    assert_eq!(http_get(url.trim(), "/livez", "").await.0, 200);
}

fn file_with_mode(dir: &Path, name: &str, contents: &str, mode: u32) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path.to_str().unwrap().to_owned()
}

/// Runs `exec-server <args>` to its end (stdin closed); returns the exit code and stderr.
async fn start_and_fail(args: &[&str]) -> (Option<i32>, String) {
    let mut cmd = Command::new(server_bin());
    cmd.args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut stderr = String::new();
    let mut pipe = child.stderr.take().unwrap();
    let outcome = tokio::time::timeout(STEP_TIMEOUT, async {
        pipe.read_to_string(&mut stderr).await.unwrap();
        child.wait().await.unwrap()
    })
    .await;
    let status = outcome.unwrap_or_else(|_| panic!("`exec-server {args:?}` kept running"));
    (status.code(), stderr)
}

#[tokio::test]
async fn token_files_others_may_read_stop_the_server_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let token = file_with_mode(dir, "token", CONNECTION_TOKEN, 0o644);
    let key = file_with_mode(dir, "signing.key", &"k".repeat(32), 0o640);
    let cases = [
        (
            format!("[websocket]\nbearer_token_file = {token:?}\n"),
            vec!["--listen", "stdio"],
            token.clone(),
            "0644",
        ),
        (
            format!("[relay]\ntoken_file = {token:?}\n"),
            vec!["--listen", "stdio"],
            token.clone(),
            "0644",
        ),
        (
            format!("[rendezvous]\nsigning_key_file = {key:?}\n"),
            vec!["rendezvous", "--listen", "http://127.0.0.1:0"],
            key.clone(),
            "0640",
        ),
    ];
    for (i, (toml, args, file, mode)) in cases.into_iter().enumerate() {
        let config = file_with_mode(dir, &format!("config-{i}.toml"), &toml, 0o600);
        let args: Vec<&str> = args.into_iter().chain(["--config", &config]).collect();
        let (code, stderr) = start_and_fail(&args).await;
        assert_eq!(code, Some(2), "{toml}: {stderr}");
        let line = stderr
            .lines()
            .find(|l| l.contains(&file))
            .unwrap_or_else(|| panic!("{toml}: no line names {file}:\n{stderr}"));
        assert!(line.starts_with("invalid config: "), "{line}");
        assert!(line.contains(&format!("mode {mode}")), "{line}");
        assert!(line.contains(&format!("chmod 600 {file}")), "{line}");
        assert_no_secret("the error", &stderr);
    }

    // A config file that holds the token inline is a token file too.
    let inline = format!("[websocket]\nbearer_token = \"{CONNECTION_TOKEN}\"\n");
    let config = file_with_mode(dir, "inline.toml", &inline, 0o644);
    let (code, stderr) = start_and_fail(&["--listen", "stdio", "--config", &config]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains(&format!("chmod 600 {config}")), "{stderr}");
    assert_no_secret("the error", &stderr);

    // The switch that made non-dumpable optional is gone, and says so.
    let config = file_with_mode(
        dir,
        "dumpable.toml",
        "[sandbox]\nserver_non_dumpable = false\n",
        0o600,
    );
    let (code, stderr) = start_and_fail(&["--listen", "stdio", "--config", &config]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("invalid config: sandbox.server_non_dumpable was removed"),
        "{stderr}"
    );
}

/// The whole answer (head and body) to a WebSocket upgrade request with `headers`.
async fn upgrade_answer(base: &str, headers: &str) -> (u16, String) {
    use tokio::io::AsyncWriteExt as _;
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade, close\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{headers}\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stream.read_to_string(&mut answer))
        .await
        .expect("the server answers and closes")
        .unwrap();
    let status = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, answer)
}

#[tokio::test]
async fn secrets_never_appear_in_logs_answers_config_or_metrics() {
    let mut cmd = server_command(&["--listen", "ws://127.0.0.1:0"]);
    with_secret_environment(&mut cmd);
    cmd.env("RUST_LOG", "trace").stderr(Stdio::piped());
    let mut server = WsServer::start_with(cmd).await;
    let stderr = server.child.stderr.take().unwrap();
    let log = tokio::spawn(async move {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text).await;
        text
    });
    let base = server.http_base();

    let mut answers = Vec::new();
    for headers in ["", "Authorization: Bearer wrong-token\r\n"] {
        let (status, body) = http_body(&base, "/metrics", headers).await;
        assert_eq!(status, 401);
        answers.push(body);
        let (status, answer) = upgrade_answer(&base, headers).await;
        assert_eq!(status, 401, "{answer}");
        answers.push(answer);
    }
    let mut client = Client::websocket_with_bearer(&server.url, CONNECTION_TOKEN).await;
    client.handshake().await;
    let (output, _) = run(&mut client, "echo", &["echo", "hello"], json!({})).await;
    assert_eq!(output, "hello\n");
    let _ = client
        .request("fs/readFile", json!({"path": "/nonexistent/file"}))
        .await;
    let (status, metrics) = http_body(
        &base,
        "/metrics",
        &format!("Authorization: Bearer {CONNECTION_TOKEN}\r\n"),
    )
    .await;
    assert_eq!(status, 200);
    assert!(metrics.contains("exec_server_listener_connections_accepted_total"));
    answers.push(metrics);
    client.close().await;

    // SAFETY: kill has no memory preconditions; SIGTERM asks for the graceful shutdown.
    unsafe { libc::kill(server.child.id().unwrap() as i32, libc::SIGTERM) };
    let status = tokio::time::timeout(STEP_TIMEOUT, server.child.wait())
        .await
        .expect("the server exits on SIGTERM")
        .unwrap();
    assert!(status.success());
    let log = log.await.unwrap();
    assert!(
        log.contains("TRACE") || log.contains("DEBUG"),
        "the log was not verbose:\n{log}"
    );
    assert_no_secret("the trace log", &log);
    for answer in &answers {
        assert_no_secret("an HTTP answer", answer);
    }

    // `exec-server config` with the same environment.
    let mut cmd = Command::new(server_bin());
    cmd.arg("config").kill_on_drop(true);
    with_secret_environment(&mut cmd);
    let output = tokio::time::timeout(STEP_TIMEOUT, cmd.output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(stdout.contains("bearer_token = \"<redacted>\""), "{stdout}");
    assert_no_secret("`exec-server config`", &stdout);
    assert_no_secret(
        "`exec-server config` stderr",
        &String::from_utf8_lossy(&output.stderr),
    );
}

/// Captures a child's stderr whole; resolves when the child closes it.
fn collect_stderr(child: &mut tokio::process::Child) -> tokio::task::JoinHandle<String> {
    let stderr = child.stderr.take().expect("stderr is piped");
    tokio::spawn(async move {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text).await;
        text
    })
}

fn token_sha256(token: &str) -> String {
    exec_server_rendezvous::signing::token_digest(token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn relay_tokens_signing_keys_and_signed_urls_stay_out_of_trace_logs() {
    const HARNESS_TOKEN: &str = "hygiene-harness-token-3e8a";
    let dir = tempfile::tempdir().unwrap();
    let config = file_with_mode(
        dir.path(),
        "rendezvous.toml",
        &format!(
            "[[rendezvous.tokens]]\nname = \"executors\"\nsha256 = \"{}\"\nrole = \"executor\"\n\n\
             [[rendezvous.tokens]]\nname = \"harnesses\"\nsha256 = \"{}\"\nrole = \"harness\"\n",
            token_sha256(RELAY_TOKEN),
            token_sha256(HARNESS_TOKEN)
        ),
        0o600,
    );
    let mut rendezvous = server_command(&[
        "rendezvous",
        "--config",
        &config,
        "--listen",
        "http://127.0.0.1:0",
    ]);
    rendezvous
        .env("EXEC_SERVER_RENDEZVOUS_SIGNING_KEY", SIGNING_KEY)
        .env("RUST_LOG", "trace")
        .stderr(Stdio::piped());
    let mut rendezvous = rendezvous.spawn().unwrap();
    let rendezvous_log = collect_stderr(&mut rendezvous);
    let mut stdout = BufReader::new(rendezvous.stdout.take().unwrap());
    let mut url = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut url))
        .await
        .expect("rendezvous prints its URL")
        .unwrap();
    let url = url.trim().to_owned();

    let mut executor = server_command(&["--remote", &url, "--environment-id", "env-hygiene"]);
    executor
        .env("EXEC_SERVER_RELAY_TOKEN", RELAY_TOKEN)
        .env("RUST_LOG", "trace")
        .stderr(Stdio::piped());
    let mut executor = executor.spawn().unwrap();
    let executor_log = collect_stderr(&mut executor);

    // A harness runs one command through the relay (retrying until the executor is in).
    let mut run = Command::new(server_bin());
    run.args([
        "run",
        "--remote",
        &url,
        "--environment-id",
        "env-hygiene",
        "--",
        "echo",
        "relay-ok",
    ])
    .env("EXEC_SERVER_RELAY_TOKEN", HARNESS_TOKEN)
    .env("RUST_LOG", "trace")
    .stdin(Stdio::null())
    .kill_on_drop(true);
    let output = tokio::time::timeout(STEP_TIMEOUT, async {
        loop {
            let output = run.output().await.unwrap();
            if output.status.success() {
                break output;
            }
        }
    })
    .await
    .expect("the command ran through the relay");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "relay-ok\n");

    for child in [&executor, &rendezvous] {
        // SAFETY: kill has no memory preconditions; SIGTERM asks for the graceful shutdown.
        unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
    }
    let logs = [
        ("the executor's trace log", executor_log.await.unwrap()),
        ("the rendezvous' trace log", rendezvous_log.await.unwrap()),
        (
            "`exec-server run`'s stderr",
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ),
    ];
    for (what, log) in &logs[..2] {
        assert!(
            log.contains("TRACE") || log.contains("DEBUG"),
            "{what}:\n{log}"
        );
    }
    for (what, log) in &logs {
        assert_no_secret(what, log);
        assert!(
            !log.contains(HARNESS_TOKEN),
            "{what} shows the harness token"
        );
        assert!(!log.contains("sig="), "{what} shows a signed URL:\n{log}");
    }
    assert!(logs[0].1.contains("registered with the relay registry"));
}

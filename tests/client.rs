//! The client library and `exec-server run` against the real binary: every connect mode,
//! typed calls of each method family, resume through a TCP proxy the tests can cut, and
//! `run` in pipe mode and on a real pseudo-terminal.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exec_server_client::proto::fs::{
    CanonicalizeParams, CopyParams, CreateDirectoryParams, GetMetadataParams, OpenParams,
    ReadBlockParams, ReadDirectoryParams, RemoveParams, WalkOptions, WalkParams,
};
use exec_server_client::proto::process::{
    OutputStream, ReadParams, SandboxType, Signal, StartParams, TerminalSize, WriteStatus,
};
use exec_server_client::{
    ClientOptions, ExecServerClient, ExecServerError, ProcessEvent, ProcessHandle,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util_shim::CancellationToken;

use crate::util::{config_file, server_bin, server_command, Client, WsServer, STEP_TIMEOUT};

/// A cancellation flag, enough for the proxy (the root package does not depend on
/// tokio-util).
mod tokio_util_shim {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use tokio::sync::Notify;

    #[derive(Clone, Default)]
    pub struct CancellationToken(Arc<(AtomicBool, Notify)>);

    impl CancellationToken {
        pub fn cancel(&self) {
            self.0 .0.store(true, Ordering::SeqCst);
            self.0 .1.notify_waiters();
        }

        pub async fn cancelled(&self) {
            loop {
                let notified = self.0 .1.notified();
                if self.0 .0.load(Ordering::SeqCst) {
                    return;
                }
                notified.await;
            }
        }
    }
}

fn start_params(argv: &[&str], tty: bool, pipe_stdin: bool) -> StartParams {
    StartParams {
        process_id: ExecServerClient::new_process_id(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: "/tmp".into(),
        env: BTreeMap::new(),
        tty,
        pipe_stdin: Some(pipe_stdin),
        arg0: None,
        env_policy: None,
        sandbox: None,
        size: None,
        network_proxy: None,
        enforce_managed_network: None,
        managed_network: None,
    }
}

async fn stdio_client() -> ExecServerClient {
    ExecServerClient::connect_stdio(
        server_command(&["--listen", "stdio"]),
        ClientOptions::default(),
    )
    .await
    .expect("connect over stdio")
}

async fn next_event(process: &mut ProcessHandle) -> ProcessEvent {
    tokio::time::timeout(STEP_TIMEOUT, process.next_event())
        .await
        .expect("an event in time")
        .expect("the stream goes on")
        .expect("not an error")
}

/// Reads events until the process is closed, asserting that `seq` grows by exactly one
/// (nothing lost, nothing twice). Returns the exit code.
async fn collect_until_closed(
    process: &mut ProcessHandle,
    mut last_seq: u64,
    stdout: &mut Vec<u8>,
) -> i32 {
    let mut exit_code = None;
    loop {
        let event = next_event(process).await;
        assert_eq!(event.seq(), last_seq + 1, "gap or duplicate at {event:?}");
        last_seq = event.seq();
        match event {
            ProcessEvent::Output { bytes, .. } => stdout.extend_from_slice(&bytes),
            ProcessEvent::Exited {
                exit_code: code, ..
            } => exit_code = Some(code),
            ProcessEvent::Closed { .. } => return exit_code.expect("exit before close"),
            ProcessEvent::OutputLost { .. } => panic!("output lost: {event:?}"),
        }
    }
}

fn numbers(from: u32, to: u32) -> String {
    (from..=to).map(|i| format!("{i}\n")).collect()
}

// ---- a TCP proxy the tests can cut --------------------------------------------------

#[derive(Default)]
struct ProxyConnection {
    cut: CancellationToken,
    hold_server_side: AtomicBool,
    release: CancellationToken,
}

/// Forwards TCP connections to the server. `cut` closes the client's side of every
/// current connection; with `hold_server_side` the server's side stays open, so the server
/// does not notice and keeps the session attached.
struct Proxy {
    url: String,
    connections: Arc<Mutex<Vec<Arc<ProxyConnection>>>>,
    /// While set, new connections wait before they are forwarded.
    gate: Arc<Mutex<Option<Arc<Notify>>>>,
    /// Signalled when the server answers something with -32010.
    saw_attached: Arc<Notify>,
}

impl Proxy {
    async fn start(server_url: &str) -> Self {
        let upstream = server_url.trim_start_matches("ws://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let connections: Arc<Mutex<Vec<Arc<ProxyConnection>>>> = Arc::default();
        let gate: Arc<Mutex<Option<Arc<Notify>>>> = Arc::default();
        let saw_attached = Arc::new(Notify::new());
        let (conns, gate_, saw) = (connections.clone(), gate.clone(), saw_attached.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let connection = Arc::new(ProxyConnection::default());
                conns.lock().unwrap().push(connection.clone());
                let (upstream, gate, saw) = (upstream.clone(), gate_.clone(), saw.clone());
                tokio::spawn(async move {
                    let waiting = gate.lock().unwrap().clone();
                    if let Some(waiting) = waiting {
                        waiting.notified().await;
                    }
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    forward(client, server, connection, saw).await;
                });
            }
        });
        Self {
            url,
            connections,
            gate,
            saw_attached,
        }
    }

    fn cut(&self, hold_server_side: bool) -> Vec<Arc<ProxyConnection>> {
        let cut: Vec<_> = self.connections.lock().unwrap().drain(..).collect();
        for connection in &cut {
            connection
                .hold_server_side
                .store(hold_server_side, Ordering::SeqCst);
            connection.cut.cancel();
        }
        cut
    }
}

async fn forward(
    client: TcpStream,
    server: TcpStream,
    connection: Arc<ProxyConnection>,
    saw: Arc<Notify>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    {
        let up = tokio::io::copy(&mut client_read, &mut server_write);
        let down = async {
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let n = server_read.read(&mut buffer).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                if buffer[..n].windows(6).any(|w| w == b"-32010") {
                    saw.notify_one();
                }
                if client_write.write_all(&buffer[..n]).await.is_err() {
                    break;
                }
            }
        };
        tokio::select! {
            _ = connection.cut.cancelled() => {}
            _ = up => {}
            _ = down => {}
        }
    }
    drop(client_read);
    drop(client_write);
    if connection.hold_server_side.load(Ordering::SeqCst) {
        connection.release.cancelled().await;
    }
}

// ---- connect modes and typed calls ---------------------------------------------------

#[tokio::test]
async fn stdio_typed_calls_for_every_family() {
    let client = stdio_client().await;
    // environment/*
    assert_eq!(client.environment_status().await.unwrap().status, "ready");
    let info = client.environment_info().await.unwrap();
    assert!(!info.capabilities.sandboxed_file_streaming);

    // fs/*
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_owned();
    let sub = format!("{root}/a/b");
    client
        .fs_create_directory(CreateDirectoryParams {
            path: sub.clone(),
            recursive: Some(true),
            follow_symlinks: None,
            sandbox: None,
            sandbox_policy: None,
        })
        .await
        .unwrap();
    let file = format!("{sub}/f.txt");
    client.write_file(&file, b"hello world\n").await.unwrap();
    assert_eq!(
        client.read_file(&format!("file://{file}")).await.unwrap(),
        b"hello world\n"
    );
    let metadata = client
        .fs_get_metadata(GetMetadataParams {
            path: file.clone(),
            follow_symlinks: None,
            sandbox: None,
            sandbox_policy: None,
        })
        .await
        .unwrap();
    assert!(metadata.is_file && metadata.size == 12);
    let canonical = client
        .fs_canonicalize(CanonicalizeParams {
            path: format!("{sub}/../b/f.txt"),
            sandbox: None,
            sandbox_policy: None,
        })
        .await
        .unwrap();
    assert!(canonical.starts_with("file:///") && canonical.ends_with("/a/b/f.txt"));
    let entries = client
        .fs_read_directory(ReadDirectoryParams {
            path: sub.clone(),
            sandbox: None,
            sandbox_policy: None,
        })
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].file_name, "f.txt");
    let walk = client
        .fs_walk(WalkParams {
            path: root.clone(),
            options: WalkOptions {
                max_depth: 8,
                max_directories: 100,
                max_entries: 100,
                follow_directory_symlinks: false,
                prune_hidden_directories: None,
            },
            sandbox: None,
            sandbox_policy: None,
        })
        .await
        .unwrap();
    assert_eq!(walk.entries.len(), 3);
    let copy = format!("{root}/copy.txt");
    client
        .fs_copy(CopyParams {
            source_path: file.clone(),
            destination_path: copy.clone(),
            recursive: false,
            sandbox: None,
            sandbox_policy: None,
        })
        .await
        .unwrap();
    let handle = client
        .fs_open(OpenParams {
            handle_id: "h1".into(),
            path: copy.clone(),
            mode: None,
            sandbox: None,
            sandbox_policy: None,
        })
        .await
        .unwrap();
    let block = client
        .fs_read_block(ReadBlockParams {
            handle_id: handle.clone(),
            offset: 6,
            len: 100,
        })
        .await
        .unwrap();
    assert_eq!(block.chunk, b"world\n");
    assert!(block.eof);
    client.fs_close(&handle).await.unwrap();
    client
        .fs_remove(RemoveParams {
            path: format!("{root}/a"),
            recursive: None,
            force: None,
            follow_symlinks: None,
            sandbox: None,
            sandbox_policy: None,
        })
        .await
        .unwrap();
    let missing = client.read_file(&file).await.unwrap_err();
    assert_eq!(missing.code(), Some(-32004), "{missing}");

    // process/*
    let mut process = client
        .start_process(start_params(
            &["sh", "-c", "read x; echo got:$x; exec sleep 30"],
            false,
            true,
        ))
        .await
        .unwrap();
    assert_eq!(process.sandbox_type(), Some(SandboxType::None));
    assert_eq!(
        process.write(b"one\n").await.unwrap(),
        WriteStatus::Accepted
    );
    let ProcessEvent::Output {
        seq: 1,
        stream,
        bytes,
    } = next_event(&mut process).await
    else {
        panic!("first output");
    };
    assert_eq!(
        (stream, bytes.as_slice()),
        (OutputStream::Stdout, &b"got:one\n"[..])
    );
    let read = client
        .process_read(ReadParams {
            process_id: process.id().into(),
            after_seq: Some(0),
            max_bytes: None,
            wait_ms: Some(0),
        })
        .await
        .unwrap();
    assert_eq!(read.next_seq, 2);
    let resize = process.control().resize(40, 100).await.unwrap_err();
    assert_eq!(
        resize.code(),
        Some(-32600),
        "pipe processes have no terminal: {resize}"
    );
    process.control().signal(Signal::Terminate).await.unwrap();
    let mut rest = Vec::new();
    assert_eq!(collect_until_closed(&mut process, 1, &mut rest).await, 143);
    assert!(!process.control().terminate().await.unwrap());
}

#[tokio::test]
async fn websocket_with_bearer_token() {
    let mut command = server_command(&["--listen", "ws://127.0.0.1:0"]);
    command.env("CODEX_EXEC_SERVER_CONNECTION_TOKEN", "s3cret");
    let server = WsServer::start_with(command).await;
    let refused = ExecServerClient::connect_websocket(&server.url, None, ClientOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ExecServerError::Refused { status: 401, body, .. } if body == "missing websocket bearer token"),
        "{refused}"
    );
    let client = ExecServerClient::connect_websocket(
        &server.url,
        Some("s3cret".into()),
        ClientOptions::default(),
    )
    .await
    .unwrap();
    let mut process = client
        .start_process(start_params(&["sh", "-c", "stty size"], true, false))
        .await
        .unwrap();
    let mut output = Vec::new();
    assert_eq!(collect_until_closed(&mut process, 0, &mut output).await, 0);
    assert_eq!(output, b"24 80\r\n");
}

#[tokio::test]
async fn in_process_server() {
    // Links the built-in plugins into this test binary.
    let _ = exec_server::BUILT_IN_PLUGINS;
    let source = exec_server_config::ConfigSource::from_toml_str("");
    let client = ExecServerClient::connect_in_process(&source, ClientOptions::default())
        .await
        .unwrap();
    let process = client
        .start_process(start_params(
            &["sh", "-c", "echo out; echo err >&2; exit 4"],
            false,
            false,
        ))
        .await
        .unwrap();
    let output = process.wait_with_output().await.unwrap();
    assert_eq!(
        (output.stdout.as_slice(), output.stderr.as_slice()),
        (&b"out\n"[..], &b"err\n"[..])
    );
    assert_eq!(output.exit_code, Some(4));
}

#[tokio::test]
async fn concurrent_processes_deliver_in_seq_order() {
    let server = WsServer::start(&[]).await;
    let client = ExecServerClient::connect_websocket(&server.url, None, ClientOptions::default())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for n in 1..=4u32 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let script = format!(
                "seq 1 {}; seq 1 100 >&2; seq {} 9000",
                n * 1000,
                n * 1000 + 1
            );
            let mut process = client
                .start_process(start_params(&["sh", "-c", &script], false, false))
                .await
                .unwrap();
            let mut output = Vec::new();
            assert_eq!(collect_until_closed(&mut process, 0, &mut output).await, 0);
            assert_eq!(String::from_utf8(output).unwrap().lines().count(), 9100);
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

// ---- recovery -------------------------------------------------------------------------

/// Config that keeps every byte of a large output while the client is away.
const KEEP_ALL_OUTPUT: &str = "[process]\nretained_output_bytes = 67108864\n";

#[tokio::test]
async fn cut_in_the_middle_of_a_large_output_delivers_every_byte_once() {
    let config = config_file(KEEP_ALL_OUTPUT);
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let proxy = Proxy::start(&server.url).await;
    let client = ExecServerClient::connect_websocket(&proxy.url, None, ClientOptions::default())
        .await
        .unwrap();
    let mut process = client
        .start_process(start_params(
            &["sh", "-c", "read x; seq 1 200000; read y; echo end; exit 9"],
            false,
            true,
        ))
        .await
        .unwrap();
    process.write(b"go\n").await.unwrap();
    let mut output = Vec::new();
    let mut last_seq = 0;
    while output.len() < 100_000 {
        let ProcessEvent::Output { seq, bytes, .. } = next_event(&mut process).await else {
            panic!("output first");
        };
        assert_eq!(seq, last_seq + 1);
        last_seq = seq;
        output.extend_from_slice(&bytes);
    }
    proxy.cut(false);
    // In flight across the reconnect; repeated with the same writeId.
    let control = process.control().clone();
    let write = tokio::spawn(async move { control.write(b"more\n").await });
    assert_eq!(
        collect_until_closed(&mut process, last_seq, &mut output).await,
        9
    );
    assert_eq!(write.await.unwrap().unwrap(), WriteStatus::Accepted);
    assert_eq!(
        String::from_utf8(output).unwrap(),
        format!("{}end\n", numbers(1, 200000))
    );
}

#[tokio::test]
async fn resume_retries_while_the_server_still_sees_the_old_connection() {
    let config = config_file(KEEP_ALL_OUTPUT);
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let proxy = Proxy::start(&server.url).await;
    let client = ExecServerClient::connect_websocket(&proxy.url, None, ClientOptions::default())
        .await
        .unwrap();
    let mut process = client
        .start_process(start_params(
            &["sh", "-c", "read x; seq 1 50000; read y; echo end"],
            false,
            true,
        ))
        .await
        .unwrap();
    process.write(b"go\n").await.unwrap();
    let ProcessEvent::Output { seq: 1, bytes, .. } = next_event(&mut process).await else {
        panic!("output first");
    };
    let mut output = bytes;
    let held = proxy.cut(true);
    tokio::time::timeout(STEP_TIMEOUT, proxy.saw_attached.notified())
        .await
        .expect("the resume is answered with -32010 while the old connection is open");
    for connection in held {
        connection.release.cancel();
    }
    let control = process.control().clone();
    tokio::spawn(async move { control.write(b"done\n").await });
    assert_eq!(collect_until_closed(&mut process, 1, &mut output).await, 0);
    assert_eq!(
        String::from_utf8(output).unwrap(),
        format!("{}end\n", numbers(1, 50000))
    );
}

#[tokio::test]
async fn a_killed_server_ends_every_handle_with_an_error() {
    let mut server = WsServer::start(&[]).await;
    let options = ClientOptions {
        resume_deadline: Duration::from_secs(1),
        ..ClientOptions::default()
    };
    let client = ExecServerClient::connect_websocket(&server.url, None, options)
        .await
        .unwrap();
    let mut handles = Vec::new();
    for _ in 0..3 {
        handles.push(
            client
                .start_process(start_params(&["sleep", "60"], false, false))
                .await
                .unwrap(),
        );
    }
    server.child.kill().await.unwrap();
    for process in &mut handles {
        let end = tokio::time::timeout(STEP_TIMEOUT, process.next_event())
            .await
            .expect("the handle ends instead of hanging");
        let error = end.unwrap().unwrap_err();
        assert!(matches!(error, ExecServerError::SessionLost(_)), "{error}");
        assert!(process.next_event().await.is_none());
    }
    let later = client.environment_status().await.unwrap_err();
    assert!(matches!(later, ExecServerError::SessionLost(_)), "{later}");
}

#[tokio::test]
async fn an_expired_session_ends_every_handle_with_an_error() {
    let config = config_file("[session]\ndetached_ttl_ms = 1\n");
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let proxy = Proxy::start(&server.url).await;
    let client = ExecServerClient::connect_websocket(&proxy.url, None, ClientOptions::default())
        .await
        .unwrap();
    let session_id = client.session_id();
    let mut process = client
        .start_process(start_params(&["sleep", "60"], false, false))
        .await
        .unwrap();
    let gate = Arc::new(Notify::new());
    *proxy.gate.lock().unwrap() = Some(gate.clone());
    proxy.cut(false);
    // Wait (without resuming it for good) until the server has expired the session.
    loop {
        let mut raw = Client::websocket(&server.url).await;
        match raw.resume(&session_id).await {
            Ok(_) => raw.close().await,
            // The server has not yet seen the previous connection end.
            Err(error) if error["code"] == -32010 => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(error) => {
                assert_eq!(error["message"], format!("unknown session id {session_id}"));
                break;
            }
        }
    }
    *proxy.gate.lock().unwrap() = None;
    gate.notify_waiters();
    gate.notify_one();
    let error = tokio::time::timeout(STEP_TIMEOUT, process.next_event())
        .await
        .expect("the handle ends")
        .unwrap()
        .unwrap_err();
    let ExecServerError::SessionLost(reason) = &error else {
        panic!("{error}");
    };
    assert!(reason.contains("unknown session id"), "{reason}");
}

#[tokio::test]
async fn stdio_sessions_end_with_their_server() {
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let mut command = tokio::process::Command::new("sh");
    command
        .arg("-c")
        .arg(format!(
            "echo $$ > {}; exec {} --listen stdio",
            pid_file.path().display(),
            server_bin().display()
        ))
        .env("RUST_LOG", "warn");
    let client = ExecServerClient::connect_stdio(command, ClientOptions::default())
        .await
        .unwrap();
    let mut process = client
        .start_process(start_params(&["sleep", "60"], false, false))
        .await
        .unwrap();
    let pid: libc::pid_t = std::fs::read_to_string(pid_file.path())
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: plain kill(2) of the server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let error = tokio::time::timeout(STEP_TIMEOUT, process.next_event())
        .await
        .expect("the handle ends")
        .unwrap()
        .unwrap_err();
    assert!(matches!(error, ExecServerError::SessionLost(_)), "{error}");
}

// ---- exec-server run -----------------------------------------------------------------

pub(crate) fn run_command(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(server_bin());
    command
        .arg("run")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if std::env::var_os("RUST_LOG").is_none() {
        command.env("RUST_LOG", "warn");
    }
    command
}

pub(crate) async fn run_output(command: &mut tokio::process::Command) -> std::process::Output {
    tokio::time::timeout(STEP_TIMEOUT, command.output())
        .await
        .expect("run finishes")
        .unwrap()
}

#[tokio::test]
async fn run_pipe_mode_output_and_exit_codes() {
    let server = WsServer::start(&[]).await;
    let output = run_output(&mut run_command(&[
        "--url",
        &server.url,
        "--env",
        "GREETING=hi there",
        "--cwd",
        "/tmp",
        "--",
        "sh",
        "-c",
        "echo \"$GREETING\"; pwd; echo oops >&2; exit 7",
    ]))
    .await;
    assert_eq!(String::from_utf8_lossy(&output.stdout), "hi there\n/tmp\n");
    assert_eq!(String::from_utf8_lossy(&output.stderr), "oops\n");
    assert_eq!(output.status.code(), Some(7));

    let missing = run_output(&mut run_command(&[
        "--url",
        &server.url,
        "--",
        "no-such-program-x",
    ]))
    .await;
    assert_eq!(missing.status.code(), Some(127));
    // The error names the program, where it was started and the OS error.
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("cannot start `no-such-program-x` in ")
            && stderr.contains("failed to spawn process: No such file or directory (os error 2)"),
        "{stderr}"
    );

    let killed = run_output(&mut run_command(&[
        "--url",
        &server.url,
        "--",
        "sh",
        "-c",
        "kill -9 $$",
    ]))
    .await;
    assert_eq!(killed.status.code(), Some(137));
}

#[tokio::test]
async fn run_forwards_stdin_over_stdio() {
    let stdio = format!("{} --listen stdio", server_bin().display());
    let mut command = run_command(&[
        "--stdio",
        &stdio,
        "--",
        "sh",
        "-c",
        "read a; read b; echo \"$b-$a\"; exit 3",
    ]);
    command.stdin(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"first\nsecond\n").await.unwrap();
    let output = tokio::time::timeout(STEP_TIMEOUT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "second-first\n");
    assert_eq!(output.status.code(), Some(3));
}

#[tokio::test]
async fn run_survives_a_server_side_disconnect() {
    let config = config_file(KEEP_ALL_OUTPUT);
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let proxy = Proxy::start(&server.url).await;
    let mut command = run_command(&[
        "--url",
        &proxy.url,
        "--",
        "sh",
        "-c",
        "read x; seq 1 100000; read y; echo end; exit 5",
    ]);
    command.stdin(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    stdin.write_all(b"go\n").await.unwrap();
    let mut output = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    while output.len() < 50_000 {
        let n = tokio::time::timeout(STEP_TIMEOUT, stdout.read(&mut buffer))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "run ended early");
        output.extend_from_slice(&buffer[..n]);
    }
    proxy.cut(false);
    stdin.write_all(b"more\n").await.unwrap();
    tokio::time::timeout(STEP_TIMEOUT, stdout.read_to_end(&mut output))
        .await
        .unwrap()
        .unwrap();
    let status = tokio::time::timeout(STEP_TIMEOUT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        String::from_utf8(output).unwrap(),
        format!("{}end\n", numbers(1, 100000))
    );
    assert_eq!(status.code(), Some(5));
}

/// A pseudo-terminal for `run --tty`: the test holds the master side.
struct Pty {
    master: std::fs::File,
    slave: OwnedFd,
    output: Arc<Mutex<Vec<u8>>>,
}

impl Pty {
    fn open(rows: u16, cols: u16) -> Self {
        let mut master = -1;
        let mut slave = -1;
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: openpty writes two descriptors through valid pointers; the name, termios
        // and size pointers are null or point to live values.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                &size,
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors were just returned by openpty and are owned here.
        let (master, slave) = unsafe {
            (
                std::fs::File::from_raw_fd(master),
                OwnedFd::from_raw_fd(slave),
            )
        };
        let output = Arc::new(Mutex::new(Vec::new()));
        let mut reader = master.try_clone().unwrap();
        let sink = output.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buffer[..n]);
            }
        });
        Self {
            master,
            slave,
            output,
        }
    }

    fn stdio(&self) -> Stdio {
        Stdio::from(self.slave.try_clone().unwrap())
    }

    fn resize(&self, rows: u16, cols: u16) {
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize from a live value.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        assert_eq!(rc, 0);
    }

    fn write(&self, bytes: &[u8]) {
        (&self.master).write_all(bytes).unwrap();
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Waits until the output contains `needle`, doing `poke` between looks.
    async fn wait_for(&self, needle: &str, mut poke: impl FnMut()) {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        while !self.text().contains(needle) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {needle:?} in {:?}",
                self.text()
            );
            poke();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn canonical_mode(&self) -> bool {
        // SAFETY: an all-zero termios is valid; tcgetattr fills it.
        let mut termios: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptor is open and the pointer is to a live termios.
        assert_eq!(
            unsafe { libc::tcgetattr(self.slave.as_raw_fd(), &mut termios) },
            0
        );
        termios.c_lflag & libc::ICANON != 0
    }
}

fn run_on_pty(pty: &Pty, url: &str, script: &str) -> tokio::process::Child {
    let mut command = tokio::process::Command::new(server_bin());
    command
        .args(["run", "--url", url, "--tty", "--", "sh", "-c", script])
        .stdin(pty.stdio())
        .stdout(pty.stdio())
        .stderr(pty.stdio())
        .env("TERM", "xterm")
        .kill_on_drop(true);
    command.spawn().unwrap()
}

async fn exit_code(child: &mut tokio::process::Child) -> Option<i32> {
    tokio::time::timeout(STEP_TIMEOUT, child.wait())
        .await
        .unwrap()
        .unwrap()
        .code()
}

#[tokio::test]
async fn run_tty_size_input_resize_and_exit_code() {
    let server = WsServer::start(&[]).await;
    let pty = Pty::open(33, 101);
    let mut child = run_on_pty(
        &pty,
        &server.url,
        "stty size; echo term=$TERM; read x; echo got:$x; while read y; do stty size; [ \"$y\" = q ] && exit 5; done",
    );
    pty.wait_for("33 101", || {}).await;
    assert!(pty.text().contains("term=xterm"));
    assert!(
        !pty.canonical_mode(),
        "the local terminal is raw while the command runs"
    );
    pty.write(b"hello\r");
    pty.wait_for("got:hello", || {}).await;
    pty.resize(40, 120);
    let pid = child.id().unwrap() as libc::pid_t;
    // SAFETY: plain kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGWINCH) }, 0);
    pty.wait_for("40 120", || pty.write(b"\r")).await;
    pty.write(b"q\r");
    assert_eq!(exit_code(&mut child).await, Some(5));
    assert!(pty.canonical_mode(), "the local terminal is restored");
}

#[tokio::test]
async fn run_tty_ctrl_c_interrupts_the_remote_command() {
    let server = WsServer::start(&[]).await;
    let pty = Pty::open(24, 80);
    let mut child = run_on_pty(&pty, &server.url, "echo ready; exec sleep 60");
    pty.wait_for("ready", || {}).await;
    pty.write(b"\x03");
    assert_eq!(exit_code(&mut child).await, Some(130));
}

#[tokio::test]
async fn tty_process_gets_the_requested_size() {
    let server = WsServer::start(&[]).await;
    let client = ExecServerClient::connect_websocket(&server.url, None, ClientOptions::default())
        .await
        .unwrap();
    let mut params = start_params(&["stty", "size"], true, false);
    params.size = Some(TerminalSize { rows: 12, cols: 34 });
    let output = client
        .start_process(params)
        .await
        .unwrap()
        .wait_with_output()
        .await
        .unwrap();
    assert_eq!(output.stdout, b"12 34\r\n");
}

// ---- relay ----------------------------------------------------------------------------

const RELAY_EXECUTOR_TOKEN: &str = "client-executor-token";
const RELAY_HARNESS_TOKEN: &str = "client-harness-token";

/// `exec-server rendezvous` accepting the two tokens above (their SHA-256 digests), and
/// an executor serving `environment` through it. Returns the registry URL.
async fn relay_setup(
    environment: &str,
) -> (String, Vec<tokio::process::Child>, tempfile::TempPath) {
    use tokio::io::AsyncBufReadExt;
    let config = config_file(
        r#"
[rendezvous]

[[rendezvous.tokens]]
name = "executors"
sha256 = "13d4d81c01ac8d727f254dae24af9f0a0f56566af5cbd499265bf0e6b715799e"
role = "executor"

[[rendezvous.tokens]]
name = "harnesses"
sha256 = "873d34225a30aaf715b18470e9093f746d2e90c3f774bd4e2f44976ff4b51d96"
role = "harness"
"#,
    );
    let mut rendezvous = server_command(&[
        "rendezvous",
        "--config",
        config.to_str().unwrap(),
        "--listen",
        "http://127.0.0.1:0",
    ]);
    rendezvous.env(
        "EXEC_SERVER_RENDEZVOUS_SIGNING_KEY",
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
    );
    let mut rendezvous = rendezvous.spawn().unwrap();
    let mut stdout = tokio::io::BufReader::new(rendezvous.stdout.take().unwrap());
    let mut url = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut url))
        .await
        .unwrap()
        .unwrap();
    let url = url.trim().to_owned();
    tokio::spawn(async move {
        let mut rest = String::new();
        while stdout.read_line(&mut rest).await.unwrap_or(0) > 0 {}
    });
    let mut executor = server_command(&["--remote", &url, "--environment-id", environment]);
    executor.env("EXEC_SERVER_RELAY_TOKEN", RELAY_EXECUTOR_TOKEN);
    let executor = executor.spawn().unwrap();
    (url, vec![rendezvous, executor], config)
}

#[tokio::test]
async fn relay_connect_and_run() {
    use exec_server_client::relay::harness::RelayConnectArgs;
    use exec_server_client::relay::registry::SecretString;

    let (url, _children, _config) = relay_setup("env-client").await;
    // The executor registers asynchronously: retry until the registry knows it.
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    let client = loop {
        let args =
            RelayConnectArgs::new(&url, "env-client", SecretString::new(RELAY_HARNESS_TOKEN));
        match ExecServerClient::connect_relay(args, ClientOptions::default()).await {
            Ok(client) => break client,
            Err(error) => {
                assert!(tokio::time::Instant::now() < deadline, "{error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let process = client
        .start_process(start_params(
            &["sh", "-c", "echo relayed; exit 6"],
            false,
            false,
        ))
        .await
        .unwrap();
    let output = process.wait_with_output().await.unwrap();
    assert_eq!(
        (output.stdout.as_slice(), output.exit_code),
        (&b"relayed\n"[..], Some(6))
    );

    let mut run = run_command(&[
        "--remote",
        &url,
        "--environment-id",
        "env-client",
        "--",
        "sh",
        "-c",
        "echo via-run; exit 7",
    ]);
    run.env("EXEC_SERVER_RELAY_TOKEN", RELAY_HARNESS_TOKEN);
    let output = run_output(&mut run).await;
    assert_eq!(String::from_utf8_lossy(&output.stdout), "via-run\n");
    assert_eq!(output.status.code(), Some(7));
}

#[tokio::test]
async fn a_wss_url_is_reached_over_tls() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("wss://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let connecting = tokio::spawn(async move {
        ExecServerClient::connect_websocket(&url, None, ClientOptions::default()).await
    });
    let (mut tcp, _) = tokio::time::timeout(STEP_TIMEOUT, listener.accept())
        .await
        .expect("the client connects")
        .unwrap();
    let mut head = [0u8; 6];
    tokio::time::timeout(STEP_TIMEOUT, tcp.read_exact(&mut head))
        .await
        .expect("the client sends")
        .unwrap();
    // A TLS handshake record (0x16, TLS 0x03) holding a ClientHello (type 1).
    assert_eq!(
        (head[0], head[1], head[5]),
        (0x16, 0x03, 0x01),
        "{head:02x?}"
    );
    drop(tcp);
    let error = tokio::time::timeout(STEP_TIMEOUT, connecting)
        .await
        .expect("the client gives up")
        .unwrap()
        .expect_err("no TLS server");
    assert!(matches!(error, ExecServerError::Connect(_)), "{error:?}");
}

/// `echo hi | exec-server run -- cat` ends: the end of local stdin reaches the remote
/// process, and a large input arrives byte for byte.
#[tokio::test]
async fn run_forwards_end_of_input_and_copies_stdin_exactly() {
    use tokio::io::AsyncWriteExt;
    let server = WsServer::start(&[]).await;
    let mut command = run_command(&["--url", &server.url, "--", "cat"]);
    command.stdin(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"hi\n").await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(STEP_TIMEOUT, child.wait_with_output())
        .await
        .expect("run ends after end of input")
        .unwrap();
    assert_eq!(output.stdout, b"hi\n");
    assert_eq!(output.status.code(), Some(0));

    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy");
    let input: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let script = format!("cat > {}", copy.display());
    let mut command = run_command(&["--url", &server.url, "--", "sh", "-c", &script]);
    command.stdin(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = tokio::spawn(async move {
        stdin.write_all(&input).await.unwrap();
        input
    });
    let output = tokio::time::timeout(STEP_TIMEOUT, child.wait_with_output())
        .await
        .expect("run ends after end of input")
        .unwrap();
    let input = writer.await.unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(std::fs::read(&copy).unwrap() == input, "the copy differs");
}

/// `exec-server run --stdio "exec-server"` (a server that listens on a websocket, not on
/// stdio) fails at once with what to do, and leaves no server running.
#[tokio::test]
async fn run_with_a_stdio_command_that_is_no_stdio_server_fails_fast_and_cleans_up() {
    let marker = format!(
        "EXEC_SERVER_TEST_MARK={}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let command_line = format!("{marker} {}", server_bin().display());
    let output = run_output(&mut run_command(&[
        "--stdio",
        &command_line,
        "--no-stdin",
        "--",
        "true",
    ]))
    .await;
    assert_ne!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("does not speak JSON-RPC on this connection; it wrote `ws://")
            && stderr.contains("needs `--listen stdio`"),
        "{stderr}"
    );
    // No process started by that command line lives on.
    let running = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
            std::fs::read(entry.path().join("environ")).is_ok_and(|environ| {
                environ
                    .split(|b| *b == 0)
                    .any(|var| var == marker.as_bytes())
            })
        })
    };
    let deadline = std::time::Instant::now() + STEP_TIMEOUT;
    while running() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server started by --stdio is still running"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

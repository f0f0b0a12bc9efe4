//! The client against an in-process server, with a transport the tests can cut.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exec_server_client::proto::bytes::encode_base64;
use exec_server_client::proto::error::code;
use exec_server_client::proto::fs::CreateDirectoryParams;
use exec_server_client::proto::process::{
    OutputStream, SandboxType, StartParams, WriteParams, WriteStatus,
};
use exec_server_client::{
    ClientOptions, Connection, ExecServerClient, ExecServerError, ProcessEvent, ProcessHandle,
    Transport,
};
use exec_server_config::{ConfigSource, CoreConfig};
use exec_server_core::{InProcessConnection, ServerContext};
use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

/// Every step of these tests finishes in far less; this only turns a hang into a failure.
const STEP: Duration = Duration::from_secs(30);

fn server(toml: &str) -> Arc<ServerContext> {
    let source = ConfigSource::from_toml_str(toml);
    let core = CoreConfig::from_source(&source, None).unwrap();
    ServerContext::new(&source, core).unwrap()
}

fn start_params(argv: &[&str], pipe_stdin: bool) -> StartParams {
    StartParams {
        process_id: ExecServerClient::new_process_id(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: "/tmp".into(),
        env: BTreeMap::new(),
        tty: false,
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

/// One connection's cut: the client's end closes at once; the server's end closes at
/// once too, or — with `hold` — only on `release`, so the server still believes the
/// session is attached (the -32010 race of PROTOCOL §3.4).
#[derive(Default)]
struct Cut {
    cut: CancellationToken,
    hold: AtomicBool,
    release: CancellationToken,
}

/// An in-process transport whose connections the test can cut, and whose reconnects it
/// can hold back or refuse.
struct CuttableTransport {
    server: Arc<ServerContext>,
    current: Mutex<Option<Arc<Cut>>>,
    refuse: AtomicBool,
    /// While set, reconnects wait for it to be notified.
    gate: Mutex<Option<Arc<Notify>>>,
    connects: AtomicUsize,
    /// Signalled when the server answers a resume with -32010.
    saw_attached: Arc<Notify>,
}

impl CuttableTransport {
    fn new(server: Arc<ServerContext>) -> Arc<Self> {
        Arc::new(Self {
            server,
            current: Mutex::new(None),
            refuse: AtomicBool::new(false),
            gate: Mutex::new(None),
            connects: AtomicUsize::new(0),
            saw_attached: Arc::new(Notify::new()),
        })
    }

    /// Cuts the current connection.
    fn cut(&self, hold_server_side: bool) -> Arc<Cut> {
        let cut = self.current.lock().unwrap().take().expect("connected");
        cut.hold.store(hold_server_side, Ordering::SeqCst);
        cut.cut.cancel();
        cut
    }
}

impl Transport for CuttableTransport {
    fn connect(&self) -> BoxFuture<'_, Result<Connection, ExecServerError>> {
        Box::pin(async move {
            let gate = self.gate.lock().unwrap().clone();
            if let Some(gate) = gate {
                gate.notified().await;
            }
            if self.refuse.load(Ordering::SeqCst) {
                return Err(ExecServerError::Connect("refused by the test".into()));
            }
            self.connects.fetch_add(1, Ordering::SeqCst);
            let cut = Arc::new(Cut::default());
            *self.current.lock().unwrap() = Some(Arc::clone(&cut));
            let mut connection = InProcessConnection::open(&self.server);
            let (outgoing, mut to_server) = mpsc::unbounded_channel::<String>();
            let (from_server, incoming) = mpsc::channel(64);
            let saw_attached = Arc::clone(&self.saw_attached);
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = cut.cut.cancelled() => break,
                        message = to_server.recv() => match message {
                            Some(text) => connection.send_raw(text).await,
                            None => break,
                        },
                        message = connection.recv() => match message {
                            Some(value) => {
                                if value["error"]["code"] == -32010 {
                                    saw_attached.notify_one();
                                }
                                if from_server.send(value.to_string()).await.is_err() {
                                    break;
                                }
                            }
                            None => break,
                        },
                    }
                }
                drop(from_server);
                if cut.hold.load(Ordering::SeqCst) {
                    cut.release.cancelled().await;
                }
                drop(connection);
            });
            Ok(Connection::new(outgoing, incoming))
        })
    }

    fn resumable(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        "cuttable in-process server".into()
    }
}

async fn next(events: &mut ProcessHandle) -> ProcessEvent {
    tokio::time::timeout(STEP, events.next_event())
        .await
        .expect("an event in time")
        .expect("the stream goes on")
        .expect("not an error")
}

/// Reads events until the process is closed, checking that `seq` grows by exactly one.
async fn collect_until_closed(
    process: &mut ProcessHandle,
    mut last_seq: u64,
    stdout: &mut Vec<u8>,
) -> Option<i32> {
    let mut exit_code = None;
    loop {
        let event = next(process).await;
        assert_eq!(event.seq(), last_seq + 1, "gap or duplicate at {event:?}");
        last_seq = event.seq();
        match event {
            ProcessEvent::Output { bytes, .. } => stdout.extend_from_slice(&bytes),
            ProcessEvent::Exited {
                exit_code: code, ..
            } => exit_code = Some(code),
            ProcessEvent::Closed { .. } => return exit_code,
            ProcessEvent::OutputLost { .. } => panic!("output lost: {event:?}"),
        }
    }
}

fn numbers(from: u32, to: u32) -> String {
    (from..=to).map(|i| format!("{i}\n")).collect()
}

#[tokio::test]
async fn in_process_process_and_files() {
    let source = ConfigSource::from_toml_str("");
    let client = ExecServerClient::connect_in_process(&source, ClientOptions::default())
        .await
        .unwrap();
    assert_eq!(client.environment_status().await.unwrap().status, "ready");
    let process = client
        .start_process(start_params(
            &["sh", "-c", "echo out; echo err >&2; exit 3"],
            false,
        ))
        .await
        .unwrap();
    assert_eq!(process.sandbox_type(), Some(SandboxType::None));
    let output = process.wait_with_output().await.unwrap();
    assert_eq!(output.stdout, b"out\n");
    assert_eq!(output.stderr, b"err\n");
    assert_eq!(output.exit_code, Some(3));

    let dir = std::env::temp_dir().join(format!("client-unit-{}", std::process::id()));
    let path = dir.join("a.txt");
    let path = path.to_str().unwrap();
    client
        .fs_create_directory(CreateDirectoryParams {
            path: dir.to_str().unwrap().into(),
            recursive: None,
            follow_symlinks: None,
            sandbox: None,
            sandbox_policy: None,
        })
        .await
        .unwrap();
    client.write_file(path, b"hello").await.unwrap();
    assert_eq!(client.read_file(path).await.unwrap(), b"hello");
    let missing = client.read_file("/nonexistent/file").await.unwrap_err();
    assert_eq!(missing.code(), Some(code::NOT_FOUND));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn writes_are_numbered_per_process() {
    let source = ConfigSource::from_toml_str("");
    let client = ExecServerClient::connect_in_process(&source, ClientOptions::default())
        .await
        .unwrap();
    let mut process = client
        .start_process(start_params(
            &["sh", "-c", "read a; read b; echo $a$b"],
            true,
        ))
        .await
        .unwrap();
    assert_eq!(process.control().last_write_id(), 0);
    process.write(b"x\n").await.unwrap();
    process.write(b"y\n").await.unwrap();
    assert_eq!(process.control().last_write_id(), 2);
    // A repeat of writeId "2" is recognised by the server and not written again.
    let repeat = client
        .process_write(WriteParams {
            process_id: process.id().to_owned(),
            chunk: encode_base64(b"z\n"),
            write_id: Some("2".into()),
        })
        .await
        .unwrap();
    assert_eq!(repeat.status, WriteStatus::Accepted);
    let mut stdout = Vec::new();
    assert_eq!(
        collect_until_closed(&mut process, 0, &mut stdout).await,
        Some(0)
    );
    assert_eq!(stdout, b"xy\n");
}

#[tokio::test]
async fn resumes_after_a_cut_and_delivers_every_event_once() {
    let server = server("");
    let transport = CuttableTransport::new(Arc::clone(&server));
    let client = ExecServerClient::connect_with(transport.clone(), ClientOptions::default())
        .await
        .unwrap();
    let session = client.session_id();
    let mut process = client
        .start_process(start_params(
            &[
                "sh",
                "-c",
                "echo first; read x; seq 1 20000; read y; echo last",
            ],
            true,
        ))
        .await
        .unwrap();
    assert!(matches!(
        next(&mut process).await,
        ProcessEvent::Output { seq: 1, .. }
    ));
    transport.cut(false);
    // Queued while the client reconnects, then sent on the resumed connection.
    assert_eq!(process.write(b"go\n").await.unwrap(), WriteStatus::Accepted);
    let mut stdout = b"first\n".to_vec();
    let control = process.control().clone();
    let writer = tokio::spawn(async move { control.write(b"again\n").await });
    assert_eq!(
        collect_until_closed(&mut process, 1, &mut stdout).await,
        Some(0)
    );
    assert_eq!(writer.await.unwrap().unwrap(), WriteStatus::Accepted);
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        format!("first\n{}last\n", numbers(1, 20000))
    );
    assert_eq!(client.session_id(), session);
    assert_eq!(transport.connects.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn retries_while_the_session_is_still_attached() {
    let server = server("");
    let transport = CuttableTransport::new(Arc::clone(&server));
    let client = ExecServerClient::connect_with(transport.clone(), ClientOptions::default())
        .await
        .unwrap();
    let mut process = client
        .start_process(start_params(
            &["sh", "-c", "read x; seq 1 30000; read y; echo last"],
            true,
        ))
        .await
        .unwrap();
    process.write(b"go\n").await.unwrap();
    let mut stdout = Vec::new();
    let ProcessEvent::Output { bytes, .. } = next(&mut process).await else {
        panic!("output first");
    };
    stdout.extend_from_slice(&bytes);
    // The server keeps sending into the held connection: those notifications are lost and
    // only the catch-up read can bring them back.
    let cut = transport.cut(true);
    tokio::time::timeout(STEP, transport.saw_attached.notified())
        .await
        .expect("the resume is answered with -32010 while the old connection is held");
    cut.release.cancel();
    let control = process.control().clone();
    tokio::spawn(async move { control.write(b"done\n").await });
    assert_eq!(
        collect_until_closed(&mut process, 1, &mut stdout).await,
        Some(0)
    );
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        format!("{}last\n", numbers(1, 30000))
    );
}

#[tokio::test]
async fn events_of_concurrent_processes_arrive_in_order() {
    let source = ConfigSource::from_toml_str("");
    let client = ExecServerClient::connect_in_process(&source, ClientOptions::default())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for n in 0..4u32 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let script = format!("seq 1 {}; seq 1 500 >&2", 3000 + n * 1000);
            let mut process = client
                .start_process(start_params(&["sh", "-c", &script], false))
                .await
                .unwrap();
            let mut stdout = Vec::new();
            assert_eq!(
                collect_until_closed(&mut process, 0, &mut stdout).await,
                Some(0)
            );
            assert_eq!(
                String::from_utf8(stdout).unwrap().lines().count() as u32,
                3000 + n * 1000 + 500
            );
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test]
async fn an_unreachable_server_ends_every_handle() {
    let server = server("");
    let transport = CuttableTransport::new(Arc::clone(&server));
    let options = ClientOptions {
        resume_deadline: Duration::from_millis(300),
        ..ClientOptions::default()
    };
    let client = ExecServerClient::connect_with(transport.clone(), options)
        .await
        .unwrap();
    let mut first = client
        .start_process(start_params(&["sleep", "30"], false))
        .await
        .unwrap();
    let mut second = client
        .start_process(start_params(&["sleep", "30"], false))
        .await
        .unwrap();
    transport.refuse.store(true, Ordering::SeqCst);
    transport.cut(false);
    for process in [&mut first, &mut second] {
        let end = tokio::time::timeout(STEP, process.next_event())
            .await
            .expect("the handle ends instead of hanging");
        let error = end.unwrap().unwrap_err();
        assert!(matches!(error, ExecServerError::SessionLost(_)), "{error}");
        assert!(process.next_event().await.is_none());
    }
    let later = client.environment_status().await.unwrap_err();
    assert!(matches!(later, ExecServerError::SessionLost(_)), "{later}");
    server.begin_shutdown();
}

#[tokio::test]
async fn an_expired_session_ends_every_handle_at_once() {
    let server = server("[session]\ndetached_ttl_ms = 1\n");
    let transport = CuttableTransport::new(Arc::clone(&server));
    let client = ExecServerClient::connect_with(transport.clone(), ClientOptions::default())
        .await
        .unwrap();
    let mut process = client
        .start_process(start_params(&["sleep", "30"], false))
        .await
        .unwrap();
    let gate = Arc::new(Notify::new());
    *transport.gate.lock().unwrap() = Some(Arc::clone(&gate));
    transport.cut(false);
    while !server.sessions.is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    *transport.gate.lock().unwrap() = None;
    gate.notify_one();
    let error = tokio::time::timeout(STEP, process.next_event())
        .await
        .expect("the handle ends")
        .unwrap()
        .unwrap_err();
    let ExecServerError::SessionLost(reason) = error else {
        panic!("{error}");
    };
    assert!(reason.contains("unknown session id"), "{reason}");
}

#[tokio::test]
async fn stdout_and_stderr_keep_their_streams() {
    let source = ConfigSource::from_toml_str("");
    let client = ExecServerClient::connect_in_process(&source, ClientOptions::default())
        .await
        .unwrap();
    let mut process = client
        .start_process(start_params(&["sh", "-c", "echo a; echo b >&2"], false))
        .await
        .unwrap();
    let mut streams = Vec::new();
    while let Some(event) = process.next_event().await {
        if let ProcessEvent::Output { stream, .. } = event.unwrap() {
            streams.push(stream);
        }
    }
    streams.sort_by_key(|s| *s as u8);
    assert_eq!(streams, vec![OutputStream::Stdout, OutputStream::Stderr]);
}

//! Blocking file operations: sessions that make the server's file work wait — writes to a
//! FIFO nobody reads, reads of a FIFO whose writer never writes, a file whose every open
//! hangs like one on a dead network mount, many sessions flooding at once — while a victim
//! session keeps reading metadata and starts a process.
//!
//! Each abuser uses several connections (sessions), together far more requests than the
//! runtime has blocking threads (512), so a server without a per-session bound and a
//! global one below the runtime's would run out of threads and leave the victim without
//! an answer. The server here runs with small fair-share limits ([`CONFIG`]), so the bound
//! on its threads is easy to see.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{ServerResources, Victim, VictimReport};
use crate::util::{b64, config_file, http_body, server_command, Client, WsServer, STEP_TIMEOUT};

/// Small fair-share limits: `fs.max_blocking_total` = [`POOL`], two operations per
/// session, one-second deadlines.
pub(super) const CONFIG: &str = "\
[fs]
operation_timeout_ms = 1000
max_blocking_total = 32
max_blocking_per_session = 2

[sandbox]
max_helpers_per_session = 2
";

/// `fs.max_blocking_total` in [`CONFIG`].
pub(super) const POOL: u64 = 32;

/// Threads the server has besides its file workers: the main thread, the runtime's
/// workers, the process plugin's spawner and waiters, and blocking threads the runtime
/// keeps idle for a while. Far below the hundreds an unbounded pool reaches.
pub(super) const THREAD_SLACK: u64 = 16;

/// Sessions an abuser opens: 9 × 64 requests in flight is more than the runtime's 512
/// blocking threads.
const ABUSIVE_SESSIONS: usize = 9;

/// `dispatch.max_in_flight`: requests one connection has executing at once.
pub(super) const IN_FLIGHT: usize = 64;

/// How long the victim probes while an abuse is under way.
pub(super) const PROBE_FOR: Duration = Duration::from_secs(3);

/// The server under attack and its configuration file.
pub(super) struct Target {
    pub(super) server: WsServer,
    _config: tempfile::TempPath,
}

impl Target {
    pub(super) async fn start(toml: &str) -> Self {
        let config = config_file(toml);
        let server = WsServer::start_with(server_command(&[
            "--listen",
            "ws://127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ]))
        .await;
        Self {
            server,
            _config: config,
        }
    }

    pub(super) fn pid(&self) -> u32 {
        self.server.child.id().expect("the server runs")
    }

    /// `n` initialized connections, each its own session, opted in to the `search`
    /// extension (a search is one of the abuses).
    pub(super) async fn sessions(&self, n: usize) -> Vec<Client> {
        let mut clients = Vec::with_capacity(n);
        for _ in 0..n {
            let mut client = self.server.connect().await;
            client.opt_in(&["search"]);
            client.handshake().await;
            clients.push(client);
        }
        clients
    }

    pub(super) async fn metrics(&self) -> String {
        let (status, body) = http_body(&self.server.http_base(), "/metrics", "").await;
        assert_eq!(status, 200, "{body}");
        body
    }
}

/// Records the server's peak thread count until stopped.
pub(super) struct ThreadWatch {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<u64>,
}

impl ThreadWatch {
    pub(super) fn start(pid: u32) -> Self {
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut peak = 0;
            while !stopped.is_cancelled() {
                peak = peak.max(ServerResources::of(pid).threads);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            peak
        });
        Self { stop, task }
    }

    pub(super) async fn peak(self) -> u64 {
        self.stop.cancel();
        self.task.await.expect("the thread watch panicked")
    }
}

/// Sends `requests` requests on each client without waiting for answers.
pub(super) async fn flood(
    clients: &mut [Client],
    requests: usize,
    params: impl Fn(usize) -> (&'static str, Value),
) {
    for client in clients.iter_mut() {
        for n in 0..requests {
            let (method, params) = params(n);
            client.send_request(method, params).await;
        }
    }
}

/// The victim's side of every abuse: another session reads metadata for [`PROBE_FOR`]
/// (through `probe`), and a third starts a process; every request must be answered.
/// Returns what the prober saw, after printing it.
pub(super) async fn victim_is_served(
    target: &Target,
    abuse: &str,
    probe: (&'static str, Value),
) -> VictimReport {
    let victim = Victim::start(target.server.connect_initialized().await, probe.0, probe.1);
    tokio::time::sleep(PROBE_FOR).await;
    let mut starter = target.server.connect_initialized().await;
    let started = tokio::time::timeout(
        STEP_TIMEOUT,
        starter.request(
            "process/start",
            json!({"processId": "victim", "argv": ["true"], "cwd": "file:///",
                   "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("the victim's process/start got no answer during {abuse}"));
    assert!(
        started.is_ok(),
        "the victim's process/start failed: {started:?}"
    );
    let report = victim.finish().await;
    println!(
        "{abuse}: victim {} requests, p50 {:?}, p99 {:?}, max {:?}",
        report.requests, report.p50, report.p99, report.max
    );
    report
}

#[track_caller]
pub(super) fn assert_threads_bounded(peak: u64, abuse: &str) {
    println!("{abuse}: peak server threads {peak}");
    assert!(
        peak <= POOL + THREAD_SLACK,
        "{abuse}: the server reached {peak} threads, more than the pool ({POOL}) + {THREAD_SLACK}"
    );
}

/// The next response on `client` (skipping nothing else: abusers only get responses).
pub(super) async fn next_error(client: &mut Client) -> Value {
    let message = client.next_message().await;
    message
        .get("error")
        .cloned()
        .unwrap_or_else(|| panic!("expected an error response, got {message}"))
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// A FIFO at `path` whose buffer is full, and the descriptor that keeps it so: it holds
/// both ends and never reads, so every write to the FIFO must wait and every open for
/// writing succeeds.
pub(super) fn full_fifo(path: &Path) -> OwnedFd {
    let fifo = open_fifo(path, libc::O_RDWR | libc::O_NONBLOCK);
    let chunk = [0u8; 4096];
    // SAFETY: `fifo` is open and `chunk` is valid for its length.
    while unsafe { libc::write(fifo.as_raw_fd(), chunk.as_ptr().cast(), chunk.len()) } > 0 {}
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EAGAIN),
        "filling the FIFO"
    );
    fifo
}

/// A new FIFO at `path`, opened with `flags`.
pub(super) fn open_fifo(path: &Path, flags: i32) -> OwnedFd {
    let name = c_path(path);
    // SAFETY: `name` is a valid NUL-terminated path for both calls.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
    // SAFETY: as above; the descriptor is owned by the returned value.
    let fd = unsafe { libc::open(name.as_ptr(), flags | libc::O_CLOEXEC) };
    assert!(
        fd >= 0,
        "open the FIFO: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `fd` was just opened and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn canonical_tempdir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("exec-server-fair-")
        .tempdir()
        .unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap();
    (dir, path)
}

fn uri(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// The victim's probe: `fs/getMetadata` of a plain file.
fn metadata_probe(file: &Path) -> (&'static str, Value) {
    ("fs/getMetadata", json!({"path": uri(file)}))
}

#[tokio::test]
async fn writes_to_a_fifo_nobody_reads_leave_the_victim_served() {
    let (_dir, dir) = canonical_tempdir();
    let _reader = full_fifo(&dir.join("fifo"));
    std::fs::write(dir.join("probe.txt"), "probe").unwrap();
    let target = Target::start(CONFIG).await;
    let threads = ThreadWatch::start(target.pid());

    let mut abusers = target.sessions(ABUSIVE_SESSIONS).await;
    let fifo = uri(&dir.join("fifo"));
    flood(&mut abusers, IN_FLIGHT, |_| {
        (
            "fs/writeFile",
            json!({"path": fifo, "dataBase64": b64("x")}),
        )
    })
    .await;
    victim_is_served(
        &target,
        "FIFO writes",
        metadata_probe(&dir.join("probe.txt")),
    )
    .await;
    assert_threads_bounded(threads.peak().await, "FIFO writes");

    // The writes themselves end at their deadline with the error that names the key.
    let error = next_error(&mut abusers[0]).await;
    assert_eq!(error["code"], -32603, "{error}");
    assert_eq!(
        error["message"],
        "fs/writeFile timed out after 1000 ms (fs.operation_timeout_ms)"
    );
}

/// Swaps `a` and `b` (a regular file and a FIFO) over and over until stopped.
fn keep_swapping(a: PathBuf, b: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let (a, b) = (c_path(&a), c_path(&b));
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: both names are valid NUL-terminated paths.
            let swapped = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    a.as_ptr(),
                    libc::AT_FDCWD,
                    b.as_ptr(),
                    libc::RENAME_EXCHANGE,
                )
            };
            // The test is over once the directory is gone.
            if swapped != 0 {
                break;
            }
        }
    })
}

/// Keeps [`IN_FLIGHT`] requests of `make` outstanding on `client` until `stop`: each
/// answer is replaced by a new request.
async fn keep_flooding(
    mut client: Client,
    stop: CancellationToken,
    make: impl Fn(usize) -> (&'static str, Value),
) -> Client {
    let mut sent = 0;
    while sent < IN_FLIGHT {
        let (method, params) = make(sent);
        client.send_request(method, params).await;
        sent += 1;
    }
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            answer = client.read_wire() => {
                if answer.is_none() {
                    break;
                }
                let (method, params) = make(sent);
                client.send_request(method, params).await;
                sent += 1;
            }
        }
    }
    client
}

#[tokio::test]
async fn reads_of_a_fifo_whose_writer_never_writes_leave_the_victim_served() {
    // `fs/copy` checks that its source is a regular file, then opens it: a source swapped
    // for a FIFO in between is opened, and reading it waits for a writer that never
    // writes (the test holds both ends).
    let (_dir, dir) = canonical_tempdir();
    let source = dir.join("source");
    let swap = dir.join("swap");
    let _fifo_ends = open_fifo(&swap, libc::O_RDWR | libc::O_NONBLOCK);
    std::fs::write(&source, "a regular file").unwrap();
    std::fs::write(dir.join("probe.txt"), "probe").unwrap();
    let stop_swapping = Arc::new(AtomicBool::new(false));
    let swapper = keep_swapping(source.clone(), swap, Arc::clone(&stop_swapping));

    let target = Target::start(CONFIG).await;
    let threads = ThreadWatch::start(target.pid());
    let stop = CancellationToken::new();
    let mut floods = Vec::new();
    for (i, client) in target
        .sessions(ABUSIVE_SESSIONS)
        .await
        .into_iter()
        .enumerate()
    {
        let params = json!({"sourcePath": uri(&source),
            "destinationPath": uri(&dir.join(format!("copy-{i}"))), "recursive": false});
        floods.push(tokio::spawn(keep_flooding(
            client,
            stop.clone(),
            move |_| ("fs/copy", params.clone()),
        )));
    }
    victim_is_served(
        &target,
        "FIFO reads",
        metadata_probe(&dir.join("probe.txt")),
    )
    .await;
    assert_threads_bounded(threads.peak().await, "FIFO reads");
    stop.cancel();
    for flood in floods {
        flood.await.expect("a flood panicked");
    }
    stop_swapping.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
}

/// A fanotify group that holds every open of the files it marks until it answers, and
/// never answers: the kernel keeps the opener waiting as a dead network mount would. Closing it lets them
/// all through. `None` without the privilege to create one (`CAP_SYS_ADMIN`).
struct HangingOpens(OwnedFd);

impl HangingOpens {
    fn new() -> Option<Self> {
        // SAFETY: plain flags, no pointers.
        let fd = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC,
                libc::O_RDONLY as u32,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        Some(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn mark(&self, file: &Path) {
        let name = c_path(file);
        // SAFETY: the group is open and `name` is a valid NUL-terminated path.
        let marked = unsafe {
            libc::fanotify_mark(
                self.0.as_raw_fd(),
                libc::FAN_MARK_ADD,
                libc::FAN_OPEN_PERM,
                libc::AT_FDCWD,
                name.as_ptr(),
            )
        };
        assert_eq!(marked, 0, "{}", std::io::Error::last_os_error());
    }
}

/// The value of the series `name` (exact, labels included) in a metrics text.
pub(super) fn metric(text: &str, name: &str) -> i64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn opens_that_hang_like_a_dead_mount_stall_only_their_sessions() {
    let Some(hanging) = HangingOpens::new() else {
        eprintln!("SKIP: fanotify permission events need CAP_SYS_ADMIN");
        return;
    };
    let (_dir, dir) = canonical_tempdir();
    let stuck = dir.join("on-a-dead-mount.txt");
    std::fs::write(&stuck, "never read").unwrap();
    std::fs::write(dir.join("probe.txt"), "probe").unwrap();
    hanging.mark(&stuck);
    let target = Target::start(CONFIG).await;
    let threads = ThreadWatch::start(target.pid());

    let mut abusers = target.sessions(ABUSIVE_SESSIONS).await;
    let path = uri(&stuck);
    flood(&mut abusers, IN_FLIGHT, |_| {
        ("fs/readFile", json!({"path": path}))
    })
    .await;
    victim_is_served(
        &target,
        "hanging opens",
        metadata_probe(&dir.join("probe.txt")),
    )
    .await;
    assert_threads_bounded(threads.peak().await, "hanging opens");

    // Each abusive session's share is stuck in the kernel past its deadline: the
    // requests were answered, the threads still count, the rest of its requests wait.
    let error = next_error(&mut abusers[0]).await;
    assert_eq!(error["code"], -32603, "{error}");
    assert_eq!(
        error["message"],
        "fs/readFile timed out after 1000 ms (fs.operation_timeout_ms)"
    );
    // Every abusive session's two slots pass their deadline; on a loaded machine the
    // last ones may do so a little after the first answer, so wait for the count.
    let expected_overdue = 2 * ABUSIVE_SESSIONS as i64;
    let server = &target;
    super::eventually("every abusive session's slots are overdue", || async move {
        let metrics = server.metrics().await;
        let series = "exec_server_fair_slots_overdue{pool=\"fs_blocking\"}";
        let overdue = metric(&metrics, series);
        assert!(overdue <= expected_overdue, "{metrics}");
        overdue == expected_overdue
    })
    .await;
    let metrics = target.metrics().await;
    assert!(
        metric(
            &metrics,
            "exec_server_fair_slots_queued{pool=\"fs_blocking\"}"
        ) > 0,
        "{metrics}"
    );
    drop(hanging);
}

#[tokio::test]
async fn many_sessions_queueing_cannot_starve_another_sessions_request() {
    // Every abusive session keeps its whole share busy: copies into a full FIFO wait for
    // room until their deadline. Together they want far more than the pool, so the pool
    // is always full and every session queues; the victim's single request must still
    // get its turn.
    let (_dir, dir) = canonical_tempdir();
    let _reader = full_fifo(&dir.join("fifo"));
    std::fs::write(dir.join("source"), "x").unwrap();
    std::fs::write(dir.join("probe.txt"), "probe").unwrap();
    let target = Target::start(CONFIG).await;
    let threads = ThreadWatch::start(target.pid());

    let mut abusers = target.sessions(2 * ABUSIVE_SESSIONS).await;
    let (source, fifo) = (uri(&dir.join("source")), uri(&dir.join("fifo")));
    flood(&mut abusers, IN_FLIGHT, |_| {
        (
            "fs/copy",
            json!({"sourcePath": source, "destinationPath": fifo, "recursive": false}),
        )
    })
    .await;
    victim_is_served(
        &target,
        "many sessions",
        metadata_probe(&dir.join("probe.txt")),
    )
    .await;
    assert_threads_bounded(threads.peak().await, "many sessions");

    let error = next_error(&mut abusers[0]).await;
    assert_eq!(
        error["message"],
        "fs/copy timed out after 1000 ms (fs.operation_timeout_ms)"
    );
}

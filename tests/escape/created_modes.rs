//! Every file the server or the fs helper creates for a client is born no wider than the
//! mode it ends with (SECURITY.md, "Created with final permissions").
//!
//! The attacker is another local user (uid 65534) who watches a directory with inotify,
//! opens every file the moment it appears and keeps the descriptor: whatever is written
//! into that file later, and whatever its mode becomes, it reads through the descriptor.
//! A secret replaced with `fs/open` mode `replace` or copied with `fs/copy` (a file, a
//! tree, through the fs helper too) must never be reachable that way. The race is run as
//! the attacker would run it; the same property is then checked deterministically: every
//! file is seen at the instant it is first opened (a fanotify permission event holds the
//! creating open until the mode is read), and a copy that fails half-way leaves nothing
//! wider than its source.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

use super::process_tree::unique_digits;
use crate::sandbox::{entry, landlock_available, managed, root_read};
use crate::util::*;

/// The other local user.
const NOBODY: u32 = 65534;
/// Rounds of each operation the watcher races against.
const ROUNDS: usize = 40;
/// Set (to the directory to watch) in the test binary re-executed as the watcher.
const WATCH_DIR: &str = "EXEC_SERVER_TEST_CREATED_MODES_WATCH";
/// The text the watcher looks for in what it opened.
const WATCH_SECRET: &str = "EXEC_SERVER_TEST_CREATED_MODES_SECRET";
/// The line the watcher prints once its watch is in place.
const READY: &str = "created-modes-watcher-ready";
/// The prefix of a line that names a file the watcher read the secret from.
const LEAK: &str = "created-modes-leak ";
/// How long the watcher runs at most, whatever happens to the test.
const WATCHER_LIFETIME: Duration = Duration::from_secs(300);

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn secret() -> String {
    format!("SECRET-{}-{}", unique_digits(), "s".repeat(48))
}

/// A directory that uid 65534 may enter and list, holding `source`, a 0600 file with
/// `secret`, and `tree/`, a directory holding the same secret as `tree/key` (0600).
fn shared_dir(secret: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("exec-server-modes-")
        .tempdir()
        .unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    for file in [path.join("source"), path.join("tree/key")] {
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, secret).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::set_permissions(path.join("tree"), std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, path)
}

/// The server on stdio with the usual umask, so that a file created `0666` would be
/// readable by others whatever umask the test runs with; `fsize`, when given, caps the
/// size of the files it (and every helper it starts) may write, failing writes past it.
async fn server(fsize: Option<u64>) -> Client {
    let mut command = server_command(&["--listen", "stdio"]);
    // SAFETY: between fork and exec the closure only makes async-signal-safe calls
    // (umask, signal, setrlimit) and touches no memory of the parent.
    unsafe {
        command.pre_exec(move || {
            libc::umask(0o022);
            if let Some(bytes) = fsize {
                // A write past the limit fails with EFBIG instead of killing the process.
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let limit = libc::rlimit {
                    rlim_cur: bytes,
                    rlim_max: bytes,
                };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut client = Client::stdio_with(command);
    client.handshake().await;
    client
}

fn uri(path: &Path) -> String {
    exec_server_proto::path::to_file_uri(path)
}

/// Replaces `target` with `content` through a `replace` handle.
async fn replace(client: &mut Client, id: &str, target: &Path, content: &str) {
    let open = json!({"handleId": id, "path": uri(target), "mode": "replace"});
    client.call("fs/open", open).await;
    let block = json!({"handleId": id, "offset": 0, "chunk": b64(content)});
    client.call("fs/writeBlock", block).await;
    client.call("fs/close", json!({"handleId": id})).await;
}

async fn copy(
    client: &mut Client,
    from: &Path,
    to: &Path,
    sandbox: Option<&Value>,
) -> Result<Value, Value> {
    let mut params =
        json!({"sourcePath": uri(from), "destinationPath": uri(to), "recursive": true});
    if let Some(policy) = sandbox {
        params["sandbox"] = policy.clone();
    }
    client.request("fs/copy", params).await
}

/// `root: read` and `dir: write`: the copy runs in the fs helper.
fn helper_policy(dir: &Path) -> Value {
    managed(vec![root_read(), entry(dir.to_str().unwrap(), "write")])
}

// ---- the watcher: the test binary re-executed as uid 65534 ----------------------------------

/// The attacker: watches `WATCH_DIR` (and every directory created in it) with inotify,
/// opens each new file for reading at once and keeps it open; when its standard input
/// closes, reads what every kept file holds now and prints a [`LEAK`] line for each that
/// holds the secret.
#[test]
fn watcher() {
    let (Some(dir), Some(secret)) = (std::env::var_os(WATCH_DIR), std::env::var_os(WATCH_SECRET))
    else {
        return;
    };
    let mut watch = Inotify::new();
    watch.add(Path::new(&dir));
    println!("{READY}");
    std::io::stdout().flush().unwrap();
    let mut kept: Vec<(PathBuf, File)> = Vec::new();
    let deadline = Instant::now() + WATCHER_LIFETIME;
    while Instant::now() < deadline && !stdin_closed() {
        for (path, is_dir) in watch.created() {
            if is_dir {
                watch.add(&path);
                // Files made before the watch was in place.
                for entry in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                    kept.extend(open_for_reading(&entry.path()));
                }
            } else {
                kept.extend(open_for_reading(&path));
            }
        }
    }
    for (path, file) in &kept {
        let mut content = vec![0u8; 4096];
        let n = file.read_at(&mut content, 0).unwrap_or(0);
        if content[..n]
            .windows(secret.len())
            .any(|w| w == secret.as_bytes())
        {
            println!("{LEAK}{}", path.display());
        }
    }
    println!("created-modes-watcher-opened {}", kept.len());
}

/// `path` opened for reading, never following a link nor waiting on a FIFO.
fn open_for_reading(path: &Path) -> Option<(PathBuf, File)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    Some((path.to_path_buf(), file))
}

/// Whether the test has closed the watcher's standard input (polled without waiting).
fn stdin_closed() -> bool {
    let mut fds = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the length given.
    let ready = unsafe { libc::poll(&mut fds, 1, 0) };
    ready > 0 && fds.revents & (libc::POLLIN | libc::POLLHUP) != 0
}

/// An inotify instance reporting `IN_CREATE` in the directories added to it.
struct Inotify {
    fd: OwnedFd,
    dirs: Vec<(i32, PathBuf)>,
}

impl Inotify {
    fn new() -> Self {
        // SAFETY: no pointers; the result is checked before it is owned.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `fd` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Self {
            fd,
            dirs: Vec::new(),
        }
    }

    fn add(&mut self, dir: &Path) {
        let c_dir = CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c_dir` is a valid NUL-terminated string for the call.
        let wd = unsafe {
            libc::inotify_add_watch(self.fd.as_raw_fd(), c_dir.as_ptr(), libc::IN_CREATE)
        };
        if wd >= 0 {
            self.dirs.push((wd, dir.to_path_buf()));
        }
    }

    /// What was created since the last call (waiting at most 50 ms for it): each path and
    /// whether it is a directory.
    fn created(&self) -> Vec<(PathBuf, bool)> {
        let mut fds = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the length given.
        if unsafe { libc::poll(&mut fds, 1, 50) } <= 0 {
            return Vec::new();
        }
        let mut buffer = [0u8; 16 * 1024];
        // SAFETY: `buffer` is writable for its whole length.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
            )
        };
        let mut found = Vec::new();
        let mut at = 0usize;
        let header = std::mem::size_of::<libc::inotify_event>();
        while n > 0 && at + header <= n as usize {
            // SAFETY: the kernel wrote a whole event header at `at`; it may be unaligned.
            let event: libc::inotify_event =
                unsafe { std::ptr::read_unaligned(buffer.as_ptr().add(at).cast()) };
            let name = &buffer[at + header..at + header + event.len as usize];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if let Some((_, dir)) = self.dirs.iter().find(|(wd, _)| *wd == event.wd) {
                let is_dir = event.mask & libc::IN_ISDIR != 0;
                found.push((dir.join(OsStr::from_bytes(name)), is_dir));
            }
            at += header + event.len as usize;
        }
        found
    }
}

/// The watcher process, started as uid 65534 on `dir`.
struct Watcher {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Watcher {
    async fn start(dir: &Path, secret: &str) -> Self {
        let mut command = Command::new("setpriv");
        command
            .arg(format!("--reuid={NOBODY}"))
            .arg(format!("--regid={NOBODY}"))
            .args(["--clear-groups", "--"])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "escape::created_modes::watcher",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(WATCH_DIR, dir)
            .env(WATCH_SECRET, secret)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("spawn the watcher");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let ready = async {
            let mut line = String::new();
            // libtest prints the test's name on the same line first.
            while !line.trim_end().ends_with(READY) {
                line.clear();
                let n = stdout.read_line(&mut line).await.unwrap();
                assert!(n > 0, "the watcher ended before its watch was in place");
            }
        };
        tokio::time::timeout(STEP_TIMEOUT, ready)
            .await
            .expect("the watcher never got ready");
        Self { child, stdout }
    }

    /// Stops the watcher and returns the files it read the secret from.
    async fn leaks(mut self) -> Vec<String> {
        drop(self.child.stdin.take());
        let mut leaks = Vec::new();
        let mut saw_end = false;
        let read_all = async {
            let mut line = String::new();
            while self.stdout.read_line(&mut line).await.unwrap() > 0 {
                if let Some(path) = line.trim_end().strip_prefix(LEAK) {
                    leaks.push(path.to_owned());
                }
                saw_end |= line.starts_with("created-modes-watcher-opened ");
                line.clear();
            }
        };
        tokio::time::timeout(STEP_TIMEOUT, read_all)
            .await
            .expect("the watcher did not finish");
        let status = self.child.wait().await.unwrap();
        assert!(status.success() && saw_end, "the watcher failed: {status}");
        leaks
    }
}

/// Whether the watcher can run here: it needs root to become uid 65534.
fn can_watch_as_another_user() -> bool {
    if !is_root() {
        eprintln!("SKIP: running the watcher as another user needs root");
        return false;
    }
    let setpriv = std::process::Command::new("setpriv")
        .arg("--version")
        .stdout(Stdio::null())
        .status();
    if !setpriv.is_ok_and(|s| s.success()) {
        eprintln!("SKIP: setpriv is not installed");
        return false;
    }
    true
}

/// The permission bits of `path` (set-id and sticky bits left out).
fn permission_bits(path: impl AsRef<std::path::Path>) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o777
}

#[tokio::test]
async fn a_watching_user_never_reads_a_replaced_secret() {
    if !can_watch_as_another_user() {
        return;
    }
    let secret = secret();
    let (_keep, dir) = shared_dir("old content");
    let target = dir.join("source");
    let mut client = server(None).await;
    let watcher = Watcher::start(&dir, &secret).await;
    for round in 0..ROUNDS {
        replace(&mut client, &format!("r{round}"), &target, &secret).await;
        let mode = std::fs::metadata(&target).unwrap().mode();
        assert_eq!(mode & 0o7777, 0o600, "round {round}");
    }
    assert_eq!(watcher.leaks().await, Vec::<String>::new());
}

/// Copies the secret `source` file and `tree` directory `ROUNDS` times each into fresh
/// destinations in `dir` while the watcher watches, through `sandbox` when given.
async fn race_copies(sandbox: bool) {
    let secret = secret();
    let (_keep, dir) = shared_dir(&secret);
    let policy = sandbox.then(|| helper_policy(&dir));
    let mut client = server(None).await;
    let watcher = Watcher::start(&dir, &secret).await;
    for round in 0..ROUNDS {
        for (from, to) in [
            ("source", format!("copy-{round}")),
            ("tree", format!("tree-{round}")),
        ] {
            copy(
                &mut client,
                &dir.join(from),
                &dir.join(&to),
                policy.as_ref(),
            )
            .await
            .unwrap_or_else(|e| panic!("copy {from} → {to}: {e}"));
        }
        let copied = std::fs::read(dir.join(format!("tree-{round}/key"))).unwrap();
        assert_eq!(copied, secret.as_bytes());
    }
    assert_eq!(watcher.leaks().await, Vec::<String>::new());
}

#[tokio::test]
async fn a_watching_user_never_reads_a_copied_secret() {
    if can_watch_as_another_user() {
        race_copies(false).await;
    }
}

#[tokio::test]
async fn a_watching_user_never_reads_a_secret_copied_by_the_fs_helper() {
    if can_watch_as_another_user() && landlock_available() {
        race_copies(true).await;
    }
}

// ---- the mode at the instant of creation -----------------------------------------------------

/// A fanotify group holding every open in the marked directories (`FAN_OPEN_PERM`) until
/// it has recorded the mode of what is opened: for a file just created, the mode it was
/// born with, before its creator can change it.
struct OpenRecorder {
    fd: Arc<OwnedFd>,
    seen: Arc<Mutex<Vec<(PathBuf, u32)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const FAN_CLASS_CONTENT: u32 = 0x04;
const FAN_OPEN_PERM: u64 = 0x0001_0000;
const FAN_EVENT_ON_CHILD: u64 = 0x0800_0000;
const FAN_ALLOW: u32 = 0x01;

impl OpenRecorder {
    /// `None` where fanotify permission events are not available (not root, or a kernel
    /// built without them).
    fn start() -> Option<Self> {
        // SAFETY: no pointers; the result is checked before it is owned.
        let fd = unsafe {
            libc::fanotify_init(FAN_CLASS_CONTENT | libc::FAN_CLOEXEC, libc::O_RDONLY as u32)
        };
        if fd < 0 {
            eprintln!("SKIP: fanotify: {}", std::io::Error::last_os_error());
            return None;
        }
        // SAFETY: `fd` is a new descriptor nobody else owns.
        let fd = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (fd, seen, stop) = (fd.clone(), seen.clone(), stop.clone());
            std::thread::spawn(move || answer_opens(&fd, &seen, &stop))
        };
        Some(Self {
            fd,
            seen,
            stop,
            thread: Some(thread),
        })
    }

    /// Records the files opened in `dir` from now on.
    fn mark(&self, dir: &Path) {
        let c_dir = CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c_dir` is a valid NUL-terminated string for the call.
        let rc = unsafe {
            libc::fanotify_mark(
                self.fd.as_raw_fd(),
                libc::FAN_MARK_ADD,
                FAN_OPEN_PERM | FAN_EVENT_ON_CHILD,
                libc::AT_FDCWD,
                c_dir.as_ptr(),
            )
        };
        assert_eq!(rc, 0, "fanotify_mark: {}", std::io::Error::last_os_error());
    }

    /// The mode `path` had when it was first opened (by anyone).
    #[track_caller]
    fn first_mode(&self, path: &Path) -> u32 {
        let seen = self.seen.lock().unwrap();
        let found = seen.iter().find(|(p, _)| p == path).map(|&(_, mode)| mode);
        found.unwrap_or_else(|| panic!("{} was never opened: {seen:?}", path.display()))
    }

    /// The first mode of the one file in `dir` whose name starts with `prefix`.
    fn first_mode_of_name_starting(&self, dir: &Path, prefix: &str) -> u32 {
        let seen = self.seen.lock().unwrap();
        let found = seen.iter().find(|(p, _)| {
            p.parent() == Some(dir)
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        });
        found
            .unwrap_or_else(|| panic!("no {prefix}* was opened in {}: {seen:?}", dir.display()))
            .1
    }
}

impl Drop for OpenRecorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Answers every open held by the group `fd` with "allow" after recording the path and
/// mode of what was opened, until `stop`. The group's descriptor closing (this thread
/// ending, even by a panic) lets every held open go on.
fn answer_opens(fd: &OwnedFd, seen: &Mutex<Vec<(PathBuf, u32)>>, stop: &AtomicBool) {
    let metadata_len = std::mem::size_of::<libc::fanotify_event_metadata>();
    let mut buffer = vec![0u8; 64 * metadata_len];
    while !stop.load(Ordering::SeqCst) {
        let mut fds = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the length given.
        if unsafe { libc::poll(&mut fds, 1, 20) } <= 0 {
            continue;
        }
        // SAFETY: `buffer` is writable for its whole length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
        let mut at = 0usize;
        while n > 0 && at + metadata_len <= n as usize {
            // SAFETY: the kernel wrote a whole event at `at`; it may be unaligned.
            let event: libc::fanotify_event_metadata =
                unsafe { std::ptr::read_unaligned(buffer.as_ptr().add(at).cast()) };
            if event.fd >= 0 {
                // SAFETY: the event's descriptor is ours to close.
                let object = unsafe { File::from_raw_fd(event.fd) };
                let path = std::fs::read_link(format!("/proc/self/fd/{}", event.fd));
                if let (Ok(path), Ok(meta)) = (path, object.metadata()) {
                    seen.lock().unwrap().push((path, meta.mode() & 0o7777));
                }
                let response = libc::fanotify_response {
                    fd: event.fd,
                    response: FAN_ALLOW,
                };
                // SAFETY: `response` is a valid struct of the size given.
                unsafe {
                    libc::write(
                        fd.as_raw_fd(),
                        (&response as *const libc::fanotify_response).cast(),
                        std::mem::size_of::<libc::fanotify_response>(),
                    )
                };
            }
            at += event.event_len as usize;
        }
    }
}

/// What is wrong when `mode` (as born) has a bit the final mode `0o600` lacks.
fn wider_than_owner_only(mode: u32, what: &str) -> Option<String> {
    (mode & !0o600 != 0).then(|| format!("{what}: mode {mode:o}, wider than 600"))
}

#[tokio::test]
async fn every_file_is_born_no_wider_than_its_final_mode() {
    let Some(recorder) = is_root().then(OpenRecorder::start).flatten() else {
        return;
    };
    let secret = secret();
    let (_keep, dir) = shared_dir(&secret);
    // Directories the copies merge into, marked before the copies create files in them.
    for merged in ["merge", "merge/key-dir", "helper-merge"] {
        std::fs::create_dir(dir.join(merged)).unwrap();
    }
    std::fs::create_dir(dir.join("tree/key-dir")).unwrap();
    std::fs::copy(dir.join("tree/key"), dir.join("tree/key-dir/key")).unwrap();
    for marked in ["", "merge", "merge/key-dir", "helper-merge"] {
        recorder.mark(&dir.join(marked));
    }
    let mut client = server(None).await;
    let mut wider = Vec::new();

    // The temporary file of a replacement, seen at its creation and again before the close.
    let open = json!({"handleId": "r", "path": uri(&dir.join("source")), "mode": "replace"});
    client.call("fs/open", open).await;
    let born = recorder.first_mode_of_name_starting(&dir, ".source.");
    wider.extend(wider_than_owner_only(
        born,
        "the temporary file of a replacement",
    ));
    let block = json!({"handleId": "r", "offset": 0, "chunk": b64(&secret)});
    client.call("fs/writeBlock", block).await;
    client.call("fs/close", json!({"handleId": "r"})).await;

    copy(&mut client, &dir.join("source"), &dir.join("copy"), None)
        .await
        .unwrap();
    let born = recorder.first_mode(&dir.join("copy"));
    wider.extend(wider_than_owner_only(born, "a copied file"));
    copy(&mut client, &dir.join("tree"), &dir.join("merge"), None)
        .await
        .unwrap();
    for key in ["merge/key", "merge/key-dir/key"] {
        wider.extend(wider_than_owner_only(
            recorder.first_mode(&dir.join(key)),
            key,
        ));
    }
    if landlock_available() {
        let policy = helper_policy(&dir);
        copy(
            &mut client,
            &dir.join("source"),
            &dir.join("helper-copy"),
            Some(&policy),
        )
        .await
        .unwrap();
        let born = recorder.first_mode(&dir.join("helper-copy"));
        wider.extend(wider_than_owner_only(
            born,
            "a file copied by the fs helper",
        ));
        copy(
            &mut client,
            &dir.join("tree"),
            &dir.join("helper-merge"),
            Some(&policy),
        )
        .await
        .unwrap();
        let born = recorder.first_mode(&dir.join("helper-merge/key"));
        let what = "a tree's file copied by the fs helper";
        wider.extend(wider_than_owner_only(born, what));
    }
    assert_eq!(wider, Vec::<String>::new());
}

/// The regular files below `root` that hold a part of `secret`, with their modes.
fn files_with_secret(root: &Path, secret: &str) -> Vec<(PathBuf, u32)> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if meta.is_file() {
            let content = std::fs::read(&path).unwrap();
            if !content.is_empty() && secret.as_bytes().starts_with(&content) {
                found.push((path, meta.mode() & 0o7777));
            }
        }
    }
    found
}

#[tokio::test]
async fn a_copy_that_fails_half_way_leaves_nothing_wider_than_its_source() {
    let secret = secret();
    let (_keep, dir) = shared_dir(&secret);
    // An existing destination readable by everyone: the copy must narrow it before it
    // writes the first byte of the secret.
    std::fs::write(dir.join("existing"), "old").unwrap();
    std::fs::set_permissions(dir.join("existing"), std::fs::Permissions::from_mode(0o644)).unwrap();
    // Writes stop at 16 bytes: every copy below fails after writing a part of the secret.
    let mut client = server(Some(16)).await;
    let mut copies = vec![
        ("source", "new", None),
        ("source", "existing", None),
        ("tree", "tree-copy", None),
    ];
    let policy = landlock_available().then(|| helper_policy(&dir));
    if let Some(policy) = &policy {
        copies.push(("source", "helper-new", Some(policy)));
        copies.push(("tree", "helper-tree", Some(policy)));
    }
    let mut wider = Vec::new();
    for (from, to, sandbox) in copies {
        let result = copy(&mut client, &dir.join(from), &dir.join(to), sandbox).await;
        assert!(result.is_err(), "{from} → {to} did not fail: {result:?}");
        let left = files_with_secret(&dir.join(to), &secret);
        assert!(!left.is_empty(), "{from} → {to} wrote nothing");
        for (path, mode) in left {
            wider.extend(wider_than_owner_only(mode, &path.display().to_string()));
        }
    }
    assert_eq!(wider, Vec::<String>::new());
}

/// A set-id program of another user, copied by a root server, must not become a set-id
/// program of root's: the copy keeps its set-id bits only where it has the source's owner
/// (set-user-id) or group (set-group-id), as `cp` does. Server and fs helper, file and tree.
#[tokio::test]
async fn copies_of_another_users_set_id_programs_never_become_roots() {
    if !is_root() {
        eprintln!("SKIP: needs root to own files as another user");
        return;
    }
    let (_dir, path) = shared_dir(&secret());
    let program = path.join("tree/program");
    std::fs::write(&program, "#!/bin/sh\n").unwrap();
    std::os::unix::fs::chown(&program, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o6755)).unwrap();
    let mut client = server(None).await;
    let policy = helper_policy(&path);
    let mut sandboxes = vec![None];
    if landlock_available() {
        sandboxes.push(Some(&policy));
    }
    for (i, sandbox) in sandboxes.into_iter().enumerate() {
        let file = path.join(format!("copy-{i}"));
        let tree = path.join(format!("tree-{i}"));
        copy(&mut client, &program, &file, sandbox).await.unwrap();
        copy(&mut client, &path.join("tree"), &tree, sandbox)
            .await
            .unwrap();
        // Root's copy: no set-id bits, and the group's bits (meant for uid 65534's
        // group, not root's) stay off too.
        for copied in [file, tree.join("program")] {
            let meta = std::fs::metadata(&copied).unwrap();
            assert_eq!(meta.uid(), 0, "{copied:?}");
            assert_eq!(meta.mode() & 0o7777, 0o705, "{copied:?} kept set-id bits");
        }
    }
}

/// ACL entry tags (`linux/posix_acl_xattr.h`), and the id of an entry that has none.
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const NO_ID: u32 = u32::MAX;

/// An ACL as the kernel stores it: version 2, then tag, permissions and id of each entry.
fn acl_bytes(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut bytes = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        bytes.extend(tag.to_le_bytes());
        bytes.extend(perm.to_le_bytes());
        bytes.extend(id.to_le_bytes());
    }
    bytes
}

/// `u::rw-, u:<reader>:<perm>, g::---, m::<mask>, o::---`.
fn acl_granting(reader: u32, perm: u16, mask: u16) -> Vec<u8> {
    acl_bytes(&[
        (USER_OBJ, 6, NO_ID),
        (USER, perm, reader),
        (GROUP_OBJ, 0, NO_ID),
        (MASK, mask, NO_ID),
        (OTHER, 0, NO_ID),
    ])
}

/// `system.posix_acl_access`: `u::rw-, u:<reader>:r--, g::---, m::r--, o::---`. The mode
/// shows `0640`: its group bits are the mask, and the owning group may read nothing.
fn acl_denying_the_owning_group(reader: u32) -> Vec<u8> {
    acl_granting(reader, 4, 4)
}

const ACCESS_ACL: &str = "system.posix_acl_access";

/// Sets `acl` on `path`; false where the file system keeps no ACLs.
fn set_acl(path: &Path, acl: &[u8]) -> bool {
    set_xattr(path, ACCESS_ACL, acl)
}

/// Sets the extended attribute `name` of `path`; false where the file system keeps no
/// ACLs.
fn set_xattr(path: &Path, name: &str, acl: &[u8]) -> bool {
    let path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let name = CString::new(name).unwrap();
    // SAFETY: both strings are NUL-terminated and `acl` is valid for its length.
    let set = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            acl.as_ptr().cast(),
            acl.len(),
            0,
        )
    };
    if set != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP) {
        return false;
    }
    assert_eq!(set, 0, "setxattr: {}", std::io::Error::last_os_error());
    true
}

/// Removes the access ACL of `path`.
fn remove_acl(path: &Path) {
    let path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let name = CString::new(ACCESS_ACL).unwrap();
    // SAFETY: both strings are NUL-terminated.
    let removed = unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) };
    assert_eq!(
        removed,
        0,
        "removexattr: {}",
        std::io::Error::last_os_error()
    );
}

/// The access ACL of `path`, if it has one.
fn acl_of(path: &Path) -> Option<Vec<u8>> {
    let path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let name = CString::new(ACCESS_ACL).unwrap();
    let mut value = vec![0u8; 4096];
    // SAFETY: both strings are NUL-terminated and `value` is valid for its length.
    let len = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    let len = usize::try_from(len).ok()?;
    value.truncate(len);
    Some(value)
}

/// A file whose ACL denies its owning group what its mode's group bits (the mask) show:
/// a new version (`replace`) keeps the whole ACL, and a copy (which takes no ACL, as `cp`)
/// gives the owning group its own bits, not the mask. Made only from the mode, the owning
/// group could read both.
#[tokio::test]
async fn what_an_acl_denied_the_owning_group_stays_denied() {
    let (_dir, path) = shared_dir(&secret());
    let target = path.join("source");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
    let acl = acl_denying_the_owning_group(NOBODY);
    if !set_acl(&target, &acl) {
        eprintln!("SKIP: this file system keeps no ACLs");
        return;
    }
    assert_eq!(permission_bits(&target), 0o640);
    let mut client = server(None).await;
    replace(&mut client, "acl", &target, "new version").await;
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "new version");
    assert_eq!(acl_of(&target), Some(acl), "the new version lost its ACL");
    let mut copies = vec![("copy", None)];
    let policy = landlock_available().then(|| helper_policy(&path));
    if let Some(policy) = &policy {
        copies.push(("helper-copy", Some(policy)));
    }
    for (name, sandbox) in copies {
        let to = path.join(name);
        copy(&mut client, &target, &to, sandbox).await.unwrap();
        let mode = permission_bits(&to);
        assert_eq!(mode, 0o600, "{name}: the owning group got the ACL's mask");
    }
}

/// A root server replacing another user's set-group-id file gives the new version to that
/// user while the client writes it: that user could write their own content into it, and
/// it must not then get the set-id bits they could never have set themselves.
#[tokio::test]
async fn a_new_version_another_user_could_write_gets_no_set_id_bits() {
    if !is_root() {
        eprintln!("SKIP: needs root to own files as another user");
        return;
    }
    let (_dir, path) = shared_dir(&secret());
    let tool = path.join("tool");
    std::fs::write(&tool, "#!/bin/sh\necho tool\n").unwrap();
    std::os::unix::fs::chown(&tool, Some(NOBODY), Some(0)).unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o2755)).unwrap();
    let mut client = server(None).await;
    replace(&mut client, "sgid", &tool, "#!/bin/sh\necho tool v2\n").await;
    let meta = std::fs::metadata(&tool).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (NOBODY, 0));
    assert_eq!(meta.mode() & 0o7777, 0o755, "set-group-id kept");
    // The server's own file keeps its bits: nobody else could write it.
    let own = path.join("own-tool");
    std::fs::write(&own, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o2755)).unwrap();
    replace(&mut client, "own", &own, "#!/bin/sh\necho v2\n").await;
    assert_eq!(std::fs::metadata(&own).unwrap().mode() & 0o7777, 0o2755);
}

const DEFAULT_ACL: &str = "system.posix_acl_default";

/// Sets a directory's default ACL (what new files in it inherit) to one granting
/// `reader` `perm` (and a mask that lets it through); false where the file system keeps
/// no ACLs.
fn set_default_acl(dir: &Path, reader: u32, perm: u16) -> bool {
    set_xattr(dir, DEFAULT_ACL, &acl_granting(reader, perm, 7))
}

/// A directory whose default ACL grants uid 65534 read and write: a file the server makes
/// there (a copy, a new version) would inherit that entry, and the source's or the
/// target's mode would only set its mask. Copies and new versions lose what they
/// inherited: their modes alone say who may read them. An existing destination whose own
/// ACL grants more than the source loses it before the source's content is written.
#[tokio::test]
async fn nothing_inherited_or_left_over_grants_what_the_source_denied() {
    let (_keep, path) = shared_dir(&secret());
    let inheriting = path.join("inheriting");
    std::fs::create_dir(&inheriting).unwrap();
    if !set_default_acl(&inheriting, NOBODY, 6) {
        eprintln!("SKIP: this file system keeps no ACLs");
        return;
    }
    let source = path.join("source");
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o640)).unwrap();
    let target = inheriting.join("target");
    std::fs::write(&target, "old").unwrap();
    // The target itself has no ACL (it inherited one when the test made it).
    remove_acl(&target);
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
    let existing = path.join("existing");
    std::fs::write(&existing, "old").unwrap();
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert!(set_acl(&existing, &acl_granting(NOBODY, 6, 6)));
    let mut client = server(None).await;
    // The replaced file had no ACL of its own: the new version has none either.
    replace(&mut client, "inherit", &target, "new version").await;
    assert_eq!(
        acl_of(&target),
        None,
        "the new version kept an inherited ACL"
    );
    assert_eq!(permission_bits(&target), 0o640);
    let mut copies = vec![None];
    let policy = landlock_available().then(|| helper_policy(&path));
    if let Some(policy) = &policy {
        copies.push(Some(policy));
    }
    for (i, sandbox) in copies.into_iter().enumerate() {
        for to in [inheriting.join(format!("copy-{i}")), existing.clone()] {
            copy(&mut client, &source, &to, sandbox).await.unwrap();
            assert_eq!(acl_of(&to), None, "{to:?} grants uid 65534 through an ACL");
            assert_eq!(permission_bits(&to), 0o640, "{to:?}");
        }
    }
}

/// A root server copying into a set-group-id directory: the copy takes the directory's
/// group, and the source's group bits were meant for the source's group; they stay off.
/// A copy onto an existing file never gets set-id bits: anyone who could write the file
/// before may still hold it open for writing, and would write under them.
#[tokio::test]
async fn copies_give_another_group_or_an_old_writer_nothing() {
    if !is_root() {
        eprintln!("SKIP: needs root to own files as another user");
        return;
    }
    let (_keep, path) = shared_dir(&secret());
    let source = path.join("source");
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o640)).unwrap();
    let shared = path.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::os::unix::fs::chown(&shared, None, Some(NOBODY)).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o2775)).unwrap();
    let program = path.join("program");
    std::fs::write(&program, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let old = path.join("old");
    std::fs::write(&old, "old").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o664)).unwrap();
    let mut client = server(None).await;
    let policy = helper_policy(&path);
    let mut sandboxes = vec![None];
    if landlock_available() {
        sandboxes.push(Some(&policy));
    }
    for (i, sandbox) in sandboxes.into_iter().enumerate() {
        let to = shared.join(format!("copy-{i}"));
        copy(&mut client, &source, &to, sandbox).await.unwrap();
        let meta = std::fs::metadata(&to).unwrap();
        assert_eq!(meta.gid(), NOBODY);
        assert_eq!(
            meta.mode() & 0o7777,
            0o600,
            "the directory's group got the source's"
        );
        copy(&mut client, &program, &old, sandbox).await.unwrap();
        let mode = std::fs::metadata(&old).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o755, "an existing destination became set-user-id");
    }
}

/// The temporary file of a replace is the server's user's alone while the client writes
/// it, whatever the target allows (a descriptor opened meanwhile would read, or write,
/// whatever comes later); the new version takes the target's permissions as they are when
/// it is put in place: narrowed by the owner since `fs/open`, or those of a file put at the
/// name meanwhile.
#[tokio::test]
async fn a_replace_takes_the_permissions_the_target_has_at_close() {
    let (_keep, path) = shared_dir(&secret());
    let target = path.join("source");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o777)).unwrap();
    let fresh = path.join("fresh");
    let mut client = server(None).await;
    for (id, file) in [("late", &target), ("fresh", &fresh)] {
        let open = json!({"handleId": id, "path": uri(file), "mode": "replace"});
        client.call("fs/open", open).await;
    }
    let temps: Vec<u32> = std::fs::read_dir(&path)
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".tmp"))
        .map(|entry| entry.metadata().unwrap().mode() & 0o7777)
        .collect();
    assert_eq!(temps.len(), 2);
    assert!(temps.iter().all(|mode| mode & 0o077 == 0), "{temps:?}");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(&fresh, "made meanwhile").unwrap();
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o600)).unwrap();
    for id in ["late", "fresh"] {
        let block = json!({"handleId": id, "offset": 0, "chunk": b64("v2")});
        client.call("fs/writeBlock", block).await;
        client.call("fs/close", json!({"handleId": id})).await;
    }
    for file in [&target, &fresh] {
        assert_eq!(std::fs::read_to_string(file).unwrap(), "v2");
        assert_eq!(permission_bits(file), 0o600, "{file:?}");
    }
}

/// A name that did not exist at `fs/open`, in a directory whose default ACL gives the
/// group and others nothing: the new version gets what a file created there gets (as
/// `fs/writeFile` in the same directory), not `0666 & ~umask`.
#[tokio::test]
async fn a_new_file_by_replace_gets_what_its_directory_gives() {
    let (_keep, path) = shared_dir(&secret());
    let private = path.join("private");
    std::fs::create_dir(&private).unwrap();
    let owner_only = acl_bytes(&[
        (USER_OBJ, 7, NO_ID),
        (GROUP_OBJ, 0, NO_ID),
        (OTHER, 0, NO_ID),
    ]);
    if !set_xattr(&private, DEFAULT_ACL, &owner_only) {
        eprintln!("SKIP: this file system keeps no ACLs");
        return;
    }
    let mut client = server(None).await;
    let replaced = private.join("replaced");
    replace(&mut client, "new", &replaced, "content").await;
    let written = private.join("written");
    let params = json!({"path": uri(&written), "dataBase64": b64("content")});
    client.call("fs/writeFile", params).await;
    for file in [&replaced, &written] {
        assert_eq!(permission_bits(file), 0o600, "{file:?}");
    }
}

/// Someone who may write the target's directory moves the target away after `fs/open`
/// and puts a file of theirs, readable by all, at its name: the new version is not given
/// to them, nor made wider than the file `fs/open` found.
#[tokio::test]
async fn a_file_put_at_the_name_meanwhile_gets_neither_the_content_nor_wider_modes() {
    if !is_root() {
        eprintln!("SKIP: needs root to own files as another user");
        return;
    }
    let (_keep, path) = shared_dir(&secret());
    let target = path.join("source");
    let mut client = server(None).await;
    let open = json!({"handleId": "swap", "path": uri(&target), "mode": "replace"});
    client.call("fs/open", open).await;
    std::fs::rename(&target, path.join("moved")).unwrap();
    std::fs::write(&target, "theirs").unwrap();
    std::os::unix::fs::chown(&target, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    let block = json!({"handleId": "swap", "offset": 0, "chunk": b64("v2 of a secret")});
    client.call("fs/writeBlock", block).await;
    client.call("fs/close", json!({"handleId": "swap"})).await;
    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o600));
}

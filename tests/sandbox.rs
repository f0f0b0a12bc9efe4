//! Sandboxed `fs/*` and `process/start` against the real kernel (SANDBOX.md §10): the fs
//! helper and the launcher are the real `exec-server` binary, confined by Landlock and
//! seccomp on this machine.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::util::*;

/// `T` of §10: `T/allowed`, `T/outside` with `T/outside/secret.txt` = `secret`.
pub(crate) struct Tree {
    _dir: tempfile::TempDir,
    pub(crate) t: PathBuf,
}

impl Tree {
    pub(crate) fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("exec-server-sbx-")
            .tempdir()
            .unwrap();
        let t = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(t.join("allowed")).unwrap();
        std::fs::create_dir(t.join("outside")).unwrap();
        std::fs::write(t.join("outside/secret.txt"), "secret").unwrap();
        Self { _dir: dir, t }
    }

    pub(crate) fn path(&self, rel: &str) -> String {
        self.t.join(rel).to_str().unwrap().to_owned()
    }
}

/// True when this kernel offers Landlock; otherwise the test prints `SKIP` and passes,
/// unless `EXEC_SERVER_REQUIRE_SANDBOX_TESTS=1`.
pub(crate) fn landlock_available() -> bool {
    // SAFETY: the version query takes no pointers.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    if abi > 0 {
        return true;
    }
    assert!(
        std::env::var_os("EXEC_SERVER_REQUIRE_SANDBOX_TESTS").is_none(),
        "Landlock is required but not available"
    );
    eprintln!("SKIP: Landlock is not available on this host");
    false
}

pub(crate) fn entry(path: &str, access: &str) -> Value {
    json!({"path": {"type": "path", "path": path}, "access": access})
}

pub(crate) fn root_read() -> Value {
    json!({"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"})
}

pub(crate) fn managed(entries: Vec<Value>) -> Value {
    json!({"permissions": {"type": "managed",
        "file_system": {"type": "restricted", "entries": entries},
        "network": "restricted"}})
}

/// Example policy of §10.3: `root: read`, `T/allowed: write`.
pub(crate) fn default_policy(tree: &Tree) -> Value {
    managed(vec![root_read(), entry(&tree.path("allowed"), "write")])
}

pub(crate) async fn client() -> Client {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    client
}

pub(crate) async fn client_with_config(toml: &str) -> (Client, tempfile::TempPath) {
    let config = config_file(toml);
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    client.handshake().await;
    (client, config)
}

#[track_caller]
pub(crate) fn assert_denied(error: &Value) {
    assert_eq!(error["code"], -32600, "{error}");
    assert_eq!(error["data"], json!({"sandboxDenied": true}), "{error}");
}

pub(crate) async fn write(
    client: &mut Client,
    path: &str,
    data: &str,
    sandbox: &Value,
) -> Result<Value, Value> {
    client
        .request(
            "fs/writeFile",
            json!({"path": path, "dataBase64": b64(data), "sandbox": sandbox}),
        )
        .await
}

// ---- §10.3 filesystem enforcement -------------------------------------------------------

#[tokio::test]
async fn writes_outside_the_writable_roots_are_denied_and_create_nothing() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let mut client = client().await;
    let policy = default_policy(&tree);
    let error = write(&mut client, &tree.path("outside/new.txt"), "x", &policy)
        .await
        .unwrap_err();
    assert_denied(&error);
    assert_eq!(
        error["message"],
        format!(
            "write access to {} is not permitted by the filesystem sandbox",
            tree.path("outside/new.txt")
        )
    );
    assert!(!tree.t.join("outside/new.txt").exists());
}

#[tokio::test]
async fn writes_inside_round_trip() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let mut client = client().await;
    let policy = default_policy(&tree);
    let path = tree.path("allowed/new.txt");
    assert_eq!(
        write(&mut client, &path, "hello", &policy).await,
        Ok(json!({}))
    );
    let read = client
        .call("fs/readFile", json!({"path": path, "sandbox": policy}))
        .await;
    assert_eq!(b64decode(&read["dataBase64"]), b"hello");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "hello");
}

#[tokio::test]
async fn restricted_reads_hide_content_metadata_and_existence() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let mut client = client().await;
    let policy = managed(vec![entry(&tree.path("allowed"), "write")]);
    let secret = tree.path("outside/secret.txt");
    for (method, path) in [
        ("fs/readFile", secret.as_str()),
        ("fs/getMetadata", secret.as_str()),
        ("fs/canonicalize", secret.as_str()),
        ("fs/readDirectory", &tree.path("outside")),
        ("fs/readFile", &tree.path("outside/nope")),
    ] {
        let error = client
            .call_err(method, json!({"path": path, "sandbox": policy}))
            .await;
        assert_denied(&error);
    }
}

#[tokio::test]
async fn symlink_escapes_are_denied_for_every_operation() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    std::os::unix::fs::symlink(tree.t.join("outside"), tree.t.join("allowed/link")).unwrap();
    std::fs::write(tree.t.join("allowed/f"), "f").unwrap();
    std::fs::write(tree.t.join("outside/victim"), "v").unwrap();
    let mut client = client().await;
    let policy = default_policy(&tree);
    let restricted = managed(vec![entry(&tree.path("allowed"), "write")]);

    // E4: read through the link with reads restricted.
    let error = client
        .call_err(
            "fs/readFile",
            json!({"path": tree.path("allowed/link/secret.txt"), "sandbox": restricted}),
        )
        .await;
    assert_denied(&error);
    // E5: write and createDirectory through the link.
    assert_denied(
        &write(&mut client, &tree.path("allowed/link/x"), "x", &policy)
            .await
            .unwrap_err(),
    );
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": tree.path("allowed/link/d"), "sandbox": policy}),
        )
        .await;
    assert_denied(&error);
    assert!(!tree.t.join("outside/x").exists() && !tree.t.join("outside/d").exists());
    // E6: copy into and out of the link.
    let error = client
        .call_err(
            "fs/copy",
            json!({"sourcePath": tree.path("allowed/f"), "destinationPath": tree.path("allowed/link/f2"),
                   "recursive": false, "sandbox": policy}),
        )
        .await;
    assert_denied(&error);
    let error = client
        .call_err(
            "fs/copy",
            json!({"sourcePath": tree.path("allowed/link/secret.txt"), "destinationPath": tree.path("allowed/s"),
                   "recursive": false, "sandbox": restricted}),
        )
        .await;
    assert_denied(&error);
    assert!(!tree.t.join("outside/f2").exists() && !tree.t.join("allowed/s").exists());
    // E7: remove through the link.
    let error = client
        .call_err(
            "fs/remove",
            json!({"path": tree.path("allowed/link/victim"), "sandbox": policy}),
        )
        .await;
    assert_denied(&error);
    assert!(tree.t.join("outside/victim").exists());
    // E8: removing the link itself removes only the link.
    client
        .call(
            "fs/remove",
            json!({"path": tree.path("allowed/link"), "sandbox": policy}),
        )
        .await;
    assert!(std::fs::symlink_metadata(tree.t.join("allowed/link")).is_err());
    assert!(tree.t.join("outside/victim").exists());
}

#[tokio::test]
async fn dot_dot_escapes_are_denied() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    std::fs::create_dir_all(tree.t.join("allowed/sub")).unwrap();
    std::fs::create_dir_all(tree.t.join("outside/deep")).unwrap();
    std::os::unix::fs::symlink(tree.t.join("outside/deep"), tree.t.join("allowed/sub/link"))
        .unwrap();
    let mut client = client().await;
    let policy = default_policy(&tree);
    let native = format!("{}/allowed/../outside/dd.txt", tree.t.display());
    let uri = format!("file://{}/allowed/../outside/dd.txt", tree.t.display());
    for path in [native, uri, tree.path("allowed/sub/link/../x")] {
        let error = write(&mut client, &path, "x", &policy)
            .await
            .expect_err(&path);
        assert_denied(&error);
    }
    assert!(!tree.t.join("outside/dd.txt").exists());
    assert!(!tree.t.join("outside/x").exists());
}

#[tokio::test]
async fn carve_outs_and_deny_entries_are_honoured() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    std::fs::create_dir(tree.t.join("allowed/.git")).unwrap();
    std::fs::write(tree.t.join("allowed/.git/config"), "c").unwrap();
    std::fs::create_dir(tree.t.join("allowed/private")).unwrap();
    std::fs::write(tree.t.join("allowed/private/a"), "a").unwrap();
    std::fs::create_dir(tree.t.join("allowed/x")).unwrap();
    std::fs::write(tree.t.join("allowed/x/key.pem"), "k").unwrap();
    let mut client = client().await;
    let policy = default_policy(&tree);
    // E11
    assert_denied(
        &write(&mut client, &tree.path("allowed/.git/config"), "x", &policy)
            .await
            .unwrap_err(),
    );
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": tree.path("allowed/.codex"), "sandbox": policy}),
        )
        .await;
    assert_denied(&error);
    let error = client
        .call_err(
            "fs/remove",
            json!({"path": tree.path("allowed/.git"), "sandbox": policy}),
        )
        .await;
    assert_denied(&error);
    assert_eq!(
        std::fs::read_to_string(tree.t.join("allowed/.git/config")).unwrap(),
        "c"
    );
    assert!(!tree.t.join("allowed/.codex").exists());
    assert!(
        write(&mut client, &tree.path("allowed/src.rs"), "fn", &policy)
            .await
            .is_ok()
    );
    // E12b: the whole root cannot be removed around its carve-out.
    let error = client
        .call_err(
            "fs/remove",
            json!({"path": tree.path("allowed"), "recursive": true, "sandbox": policy}),
        )
        .await;
    assert_denied(&error);
    assert!(tree.t.join("allowed/.git/config").exists());
    // E14
    let mut with_denials = default_policy(&tree);
    let entries = with_denials["permissions"]["file_system"]["entries"]
        .as_array_mut()
        .unwrap();
    entries.push(entry(&tree.path("allowed/private"), "deny"));
    entries
        .push(json!({"path": {"type": "glob_pattern", "pattern": "**/*.pem"}, "access": "deny"}));
    with_denials["cwd"] = json!(tree.path("allowed"));
    for path in ["allowed/private/a", "allowed/x/key.pem"] {
        let error = client
            .call_err(
                "fs/readFile",
                json!({"path": tree.path(path), "sandbox": with_denials}),
            )
            .await;
        assert_denied(&error);
    }
    assert_denied(
        &write(
            &mut client,
            &tree.path("allowed/new.pem"),
            "x",
            &with_denials,
        )
        .await
        .unwrap_err(),
    );
}

/// A glob pattern with a character across byte 5 (where a `file:` scheme would end) is a
/// relative pattern like any other: the read runs (here: the file does not exist) instead
/// of the request panicking (-32603).
#[tokio::test]
async fn a_glob_pattern_with_a_character_across_byte_five_is_a_pattern_like_any_other() {
    let tree = Tree::new();
    let mut client = client().await;
    let mut policy = default_policy(&tree);
    policy["permissions"]["file_system"]["entries"]
        .as_array_mut()
        .unwrap()
        .push(json!({"path": {"type": "glob_pattern", "pattern": "ab😀"}, "access": "deny"}));
    policy["cwd"] = json!(tree.path("allowed"));
    let error = client
        .call_err(
            "fs/readFile",
            json!({"path": tree.path("allowed/x"), "sandbox": policy}),
        )
        .await;
    assert_eq!(error["code"], -32004, "{error}");
}

#[tokio::test]
async fn sandboxed_file_streaming_is_refused() {
    let tree = Tree::new();
    let mut client = client().await;
    let error = client
        .call_err(
            "fs/open",
            json!({"handleId": "h", "path": tree.path("outside/secret.txt"), "sandbox": default_policy(&tree)}),
        )
        .await;
    assert_error(
        &error,
        -32600,
        "streaming file reads do not support platform sandboxing",
    );
}

// ---- §10.2 the helper protocol ------------------------------------------------------------

/// Runs the real helper by hand with `args` and `stdin`.
pub(crate) async fn helper_by_hand(
    args: &[&str],
    stdin: &str,
) -> (std::process::ExitStatus, String, String) {
    let mut command = tokio::process::Command::new(server_bin());
    command
        .arg("--codex-run-as-fs-helper")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let _ = input.write_all(stdin.as_bytes()).await;
    drop(input);
    let output = tokio::time::timeout(STEP_TIMEOUT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    (
        output.status,
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

pub(crate) fn helper_policy(tree: &Tree) -> String {
    json!({"version": 1, "readable": "all",
           "writable": [format!("file://{}", tree.path("allowed"))],
           "readOnly": [], "deniedPaths": [], "deniedGlobs": [],
           "network": "restricted", "enforcement": "require"})
    .to_string()
}

#[tokio::test]
async fn the_helper_protocol_driven_directly() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    // H7
    let (status, stdout, stderr) = helper_by_hand(&[], "").await;
    // Without --policy the helper runs unconfined (as codex starts its own); an empty
    // request is then the failure.
    assert_eq!(status.code(), Some(1));
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        "fs sandbox helper failed: EOF while parsing a value at line 1 column 0\n"
    );
    // A write inside, then one outside.
    let policy = helper_policy(&tree);
    let request = json!({"operation": "fs/writeFile", "params": {
        "path": format!("file://{}", tree.path("allowed/a.txt")), "dataBase64": "aGVsbG8K",
        "followSymlinks": true, "sandbox": null}});
    let (status, stdout, _) = helper_by_hand(&["--policy", &policy], &request.to_string()).await;
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        stdout,
        "{\"status\":\"ok\",\"payload\":{\"operation\":\"fs/writeFile\",\"response\":{}}}\n"
    );
    assert_eq!(
        std::fs::read_to_string(tree.t.join("allowed/a.txt")).unwrap(),
        "hello\n"
    );
    let request = json!({"operation": "fs/writeFile", "params": {
        "path": tree.path("outside/a.txt"), "dataBase64": "eA==", "sandbox": null}});
    let (_, stdout, _) = helper_by_hand(&["--policy", &policy], &request.to_string()).await;
    let response: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(response["status"], "error");
    assert_denied(&response["payload"]);
    assert!(!tree.t.join("outside/a.txt").exists());
    // H8
    let request = json!({"operation": "fs/readFile", "params": {
        "path": tree.path("allowed/a.txt"), "sandbox": {"permissions": {"type": "disabled"}}}});
    let (_, stdout, _) = helper_by_hand(&["--policy", &policy], &request.to_string()).await;
    assert_eq!(
        stdout,
        "{\"status\":\"error\",\"payload\":{\"code\":-32600,\"message\":\"direct filesystem operations do not accept sandbox context\"}}\n"
    );
    // Not JSON: exit 1.
    let (status, _, stderr) = helper_by_hand(&["--policy", &policy], "nope").await;
    assert_eq!(status.code(), Some(1));
    assert!(stderr.starts_with("fs sandbox helper failed: "), "{stderr}");
}

/// A script standing in for the helper binary (`sandbox.helper_executable`).
fn helper_script(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("helper.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn helper_time_outs_and_crashes_are_answered() {
    let tree = Tree::new();
    let policy = default_policy(&tree);
    let target = tree.path("allowed/x");
    // H3: a helper that hangs is killed at the time-out.
    let script = helper_script(
        &tree.t,
        "echo $$ > \"$(dirname \"$0\")/pid\"; exec sleep 60",
    );
    let (mut client, _config) = client_with_config(&format!(
        "[sandbox]\nhelper_executable = \"{}\"\nhelper_timeout_ms = 200\n",
        script.display()
    ))
    .await;
    let started = Instant::now();
    let error = write(&mut client, &target, "x", &policy).await.unwrap_err();
    assert_error(&error, -32603, "fs sandbox helper timed out after 200 ms");
    assert!(started.elapsed() < Duration::from_secs(30));
    let pid: i32 = std::fs::read_to_string(tree.t.join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: signal 0 only checks for existence.
    assert_ne!(
        unsafe { libc::kill(pid, 0) },
        0,
        "the helper {pid} still runs"
    );

    // H4: a crashing helper's status and capped stderr.
    let script = helper_script(&tree.t, "head -c 10240 /dev/zero | tr '\\0' e >&2; exit 3");
    let (mut client, _config) = client_with_config(&format!(
        "[sandbox]\nhelper_executable = \"{}\"\n",
        script.display()
    ))
    .await;
    let error = write(&mut client, &target, "x", &policy).await.unwrap_err();
    assert_error(
        &error,
        -32603,
        &format!(
            "fs sandbox helper failed with status exit status: 3: {} [stderr truncated]",
            "e".repeat(4096)
        ),
    );
    // H2
    let script = helper_script(&tree.t, "echo 'not json'");
    let (mut client, _config) = client_with_config(&format!(
        "[sandbox]\nhelper_executable = \"{}\"\n",
        script.display()
    ))
    .await;
    let error = write(&mut client, &target, "x", &policy).await.unwrap_err();
    assert_eq!(error["code"], -32603);
    assert!(error["message"]
        .as_str()
        .unwrap()
        .starts_with("failed to encode or decode fs sandbox helper message:"));
}

#[tokio::test]
async fn a_real_helper_stuck_on_a_fifo_times_out() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let fifo = tree.t.join("allowed/fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    let (mut client, _config) = client_with_config("[sandbox]\nhelper_timeout_ms = 300\n").await;
    // Opening for writing never waits in the fs core (ENXIO without a reader), so hold a
    // reader open that never reads: the write then blocks once the pipe buffer is full.
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_nonblocking(&fifo);
    let big = "x".repeat(1024 * 1024);
    let error = write(
        &mut client,
        fifo.to_str().unwrap(),
        &big,
        &default_policy(&tree),
    )
    .await
    .unwrap_err();
    assert_error(&error, -32603, "fs sandbox helper timed out after 300 ms");
    // The server still answers.
    assert!(write(
        &mut client,
        &tree.path("allowed/after"),
        "y",
        &default_policy(&tree)
    )
    .await
    .is_ok());
}

trait OpenNonblocking {
    fn custom_flags_nonblocking(&mut self, path: &Path) -> std::fs::File;
}

impl OpenNonblocking for std::fs::OpenOptions {
    fn custom_flags_nonblocking(&mut self, path: &Path) -> std::fs::File {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK).open(path).unwrap()
    }
}

// ---- §10.5 fail closed where Landlock is genuinely unavailable ---------------------------

/// Environment variable that turns [`no_landlock_wrapper`] into the wrapper of C1: its
/// value is the server's argv, one argument per line.
const NO_LANDLOCK_ARGS: &str = "EXEC_SERVER_TEST_NO_LANDLOCK_ARGS";

/// The test binary re-executed as the wrapper of §10.5 C1: installs a seccomp filter that
/// answers `ENOSYS` for the three Landlock system calls (444–446), then execs the server,
/// so the server and every helper it spawns run where Landlock is unavailable.
#[test]
fn no_landlock_wrapper() {
    let Some(args) = std::env::var_os(NO_LANDLOCK_ARGS) else {
        return;
    };
    let args: Vec<std::ffi::CString> = args
        .to_str()
        .unwrap()
        .lines()
        .map(|a| std::ffi::CString::new(a).unwrap())
        .collect();
    // BPF_LD | BPF_W | BPF_ABS, BPF_JMP | BPF_JGE | BPF_K, BPF_JMP | BPF_JGT | BPF_K, BPF_RET | BPF_K.
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JGE_K: u16 = 0x05 | 0x30;
    const BPF_JGT_K: u16 = 0x05 | 0x20;
    const BPF_RET_K: u16 = 0x06;
    let stmt = |code, k| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code, k, jt, jf| libc::sock_filter { code, jt, jf, k };
    let filter = [
        stmt(BPF_LD_W_ABS, 0),
        jump(BPF_JGE_K, 444, 0, 2),
        jump(BPF_JGT_K, 446, 1, 0),
        stmt(BPF_RET_K, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW),
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: the filter program outlives the prctl call; argv is a null-terminated array
    // of C strings that outlives execv. The filter stays with this thread across execv.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &program as *const libc::sock_fprog
            ),
            0
        );
        libc::execv(argv[0], argv.as_ptr());
    }
    panic!("execv failed: {}", std::io::Error::last_os_error());
}

/// The wrapper command for `exec-server <server_args…>`.
pub(crate) fn no_landlock_command(server_args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "sandbox::no_landlock_wrapper",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(
            NO_LANDLOCK_ARGS,
            std::iter::once(server_bin().to_str().unwrap())
                .chain(server_args.iter().copied())
                .collect::<Vec<_>>()
                .join("\n"),
        )
        .kill_on_drop(true);
    if std::env::var_os("RUST_LOG").is_none() {
        command.env("RUST_LOG", "warn");
    }
    command
}

#[tokio::test]
async fn without_landlock_sandboxed_requests_fail_closed() {
    let tree = Tree::new();
    let mut command = no_landlock_command(&["--listen", "stdio"]);
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut client = Client::stdio_after_harness_preamble(command).await;
    client.handshake().await;
    let policy = default_policy(&tree);
    let error = write(&mut client, &tree.path("allowed/x"), "x", &policy)
        .await
        .unwrap_err();
    assert_eq!(
        error,
        json!({"code": -32600, "message": "filesystem sandbox cannot be enforced on this executor"})
    );
    assert!(!tree.t.join("allowed/x").exists());
    let error = client
        .call_err(
            "process/start",
            json!({"processId": "p", "argv": ["/bin/sh", "-c", "echo hi"], "cwd": tree.path("allowed"),
                   "env": {}, "tty": false, "sandbox": policy}),
        )
        .await;
    assert_error(
        &error,
        -32602,
        "sandbox intent cannot be enforced on this executor",
    );
    // Unsandboxed requests still work.
    assert_eq!(
        write(&mut client, &tree.path("allowed/y"), "y", &Value::Null).await,
        Ok(json!({}))
    );
}

#[tokio::test]
async fn the_helper_itself_refuses_without_landlock() {
    let tree = Tree::new();
    let request = json!({"operation": "fs/writeFile", "params": {
        "path": tree.path("allowed/x"), "dataBase64": "eA==", "sandbox": null}});
    let policy = helper_policy(&tree);
    let mut command = no_landlock_command(&["--codex-run-as-fs-helper", "--policy", &policy]);
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let _ = input.write_all(request.to_string().as_bytes()).await;
    drop(input);
    let output = child.wait_with_output().await.unwrap();
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(
        lines,
        [
            r#"{"status":"error","payload":{"code":-32600,"message":"filesystem sandbox cannot be enforced on this executor"}}"#
        ]
    );
    assert!(!tree.t.join("allowed/x").exists());
}

// ---- §10.6 processes ----------------------------------------------------------------------

/// Starts a sandboxed process and returns the start result.
pub(crate) async fn start_sandboxed(
    client: &mut Client,
    id: &str,
    argv: Value,
    cwd: &str,
    sandbox: &Value,
) -> Value {
    client
        .call(
            "process/start",
            json!({"processId": id, "argv": argv, "cwd": cwd, "env": {"PATH": "/usr/bin:/bin"},
                   "tty": false, "sandbox": sandbox}),
        )
        .await
}

/// Output and the `process/exited` notification of `id`.
pub(crate) async fn run_to_exit(client: &mut Client, id: &str) -> (String, Value) {
    let exited = client.notification("process/exited").await;
    assert_eq!(exited["processId"], id);
    let read = client
        .call(
            "process/read",
            json!({"processId": id, "afterSeq": 0, "waitMs": 0}),
        )
        .await;
    let output: Vec<u8> = read["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| b64decode(&c["chunk"]))
        .collect();
    (String::from_utf8_lossy(&output).into_owned(), exited)
}

#[tokio::test]
async fn sandboxed_processes_cannot_write_outside_their_roots() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    std::fs::create_dir(tree.t.join("allowed/.git")).unwrap();
    std::fs::write(tree.t.join("allowed/.git/config"), "c").unwrap();
    let mut client = client().await;
    let policy = default_policy(&tree);
    let cwd = tree.path("allowed");
    // P1
    let script = format!("echo x > {}", tree.path("outside/f"));
    let started = start_sandboxed(
        &mut client,
        "p1",
        json!(["/bin/sh", "-c", script]),
        &cwd,
        &policy,
    )
    .await;
    assert_eq!(started["sandboxType"], "linuxSeccomp");
    let (output, exited) = run_to_exit(&mut client, "p1").await;
    assert_ne!(exited["exitCode"], 0);
    assert!(output.contains("Permission denied"), "{output}");
    assert_eq!(exited["sandboxDenied"], true);
    assert!(!tree.t.join("outside/f").exists());
    // P2
    let script = format!("echo x > {}", tree.path("allowed/f"));
    start_sandboxed(
        &mut client,
        "p2",
        json!(["/bin/sh", "-c", script]),
        &cwd,
        &policy,
    )
    .await;
    let (_, exited) = run_to_exit(&mut client, "p2").await;
    assert_eq!(exited["exitCode"], 0);
    assert_eq!(exited["sandboxDenied"], false);
    assert_eq!(
        std::fs::read_to_string(tree.t.join("allowed/f")).unwrap(),
        "x\n"
    );
    // P3: the carve-out is a read-only mount inside the process's namespace.
    let script = format!("echo x >> {}", tree.path("allowed/.git/config"));
    start_sandboxed(
        &mut client,
        "p3",
        json!(["/bin/sh", "-c", script]),
        &cwd,
        &policy,
    )
    .await;
    let (output, exited) = run_to_exit(&mut client, "p3").await;
    assert_ne!(exited["exitCode"], 0);
    assert!(output.contains("Read-only file system"), "{output}");
    assert_eq!(exited["sandboxDenied"], true);
    assert_eq!(
        std::fs::read_to_string(tree.t.join("allowed/.git/config")).unwrap(),
        "c"
    );
    // P7
    let error = client
        .call_err(
            "process/start",
            json!({"processId": "p7", "argv": ["no-such-program"], "cwd": cwd,
                   "env": {"PATH": "/usr/bin:/bin"}, "tty": false, "sandbox": policy}),
        )
        .await;
    assert_eq!(
        error,
        json!({"code": -32603, "data": {"kind": "spawnNotFound"},
               "message": "failed to spawn process: No such file or directory (os error 2)"})
    );
    // P9: arg0 is preserved.
    client
        .call(
            "process/start",
            json!({"processId": "p9", "argv": ["/bin/sh", "-c", "echo $0"], "arg0": "custom0",
                   "cwd": cwd, "env": {}, "tty": false, "sandbox": policy}),
        )
        .await;
    let (output, _) = run_to_exit(&mut client, "p9").await;
    assert_eq!(output, "custom0\n");
}

#[tokio::test]
async fn sandboxed_processes_have_no_network_unless_enabled() {
    if !landlock_available() || !Path::new("/bin/bash").exists() {
        return;
    }
    let tree = Tree::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut client = client().await;
    let script = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");
    let cwd = tree.path("allowed");
    let policy = default_policy(&tree);
    start_sandboxed(
        &mut client,
        "n1",
        json!(["/bin/bash", "-c", script]),
        &cwd,
        &policy,
    )
    .await;
    let (output, exited) = run_to_exit(&mut client, "n1").await;
    assert_ne!(exited["exitCode"], 0, "{output}");
    assert!(listener.accept().is_err(), "the listener saw a connection");
    let mut enabled = policy.clone();
    enabled["permissions"]["network"] = json!("enabled");
    start_sandboxed(
        &mut client,
        "n2",
        json!(["/bin/bash", "-c", script]),
        &cwd,
        &enabled,
    )
    .await;
    let (output, exited) = run_to_exit(&mut client, "n2").await;
    assert_eq!(exited["exitCode"], 0, "{output}");
    assert!(output.contains("connected"));
}

// ---- §2.10 server additions -----------------------------------------------------------------

#[tokio::test]
async fn the_servers_own_config_file_is_denied_to_every_sandbox() {
    if !landlock_available() {
        return;
    }
    let (mut client, config) =
        client_with_config("[websocket]\nbearer_token = \"do-not-leak\"\n").await;
    let path = config.to_str().unwrap().to_owned();
    // Without a sandbox the server's user may read it; a sandbox that grants reading the
    // whole disk still may not, because it holds the server's secrets.
    let plain = client.call("fs/readFile", json!({"path": path})).await;
    assert!(String::from_utf8(b64decode(&plain["dataBase64"]))
        .unwrap()
        .contains("do-not-leak"));
    let tree = Tree::new();
    let error = client
        .call_err(
            "fs/readFile",
            json!({"path": path, "sandbox": default_policy(&tree)}),
        )
        .await;
    assert_denied(&error);
    // Metadata is read access too.
    let error = client
        .call_err(
            "fs/getMetadata",
            json!({"path": path, "sandbox": default_policy(&tree)}),
        )
        .await;
    assert_denied(&error);
}

// ---- the methods' own semantics inside the fs helper -----------------------------------------

/// E15: a walk lists a denied directory but never enters it, and leaves out links whose
/// target is denied.
#[tokio::test]
async fn walks_never_enter_denied_directories_or_reveal_denied_link_targets() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    std::fs::create_dir(tree.t.join("allowed/sub")).unwrap();
    std::fs::write(tree.t.join("allowed/sub/f"), "f").unwrap();
    std::os::unix::fs::symlink(
        tree.t.join("outside/secret.txt"),
        tree.t.join("allowed/out-link"),
    )
    .unwrap();
    std::os::unix::fs::symlink(tree.t.join("allowed/sub"), tree.t.join("allowed/in-link")).unwrap();
    let mut client = client().await;
    let policy = managed(vec![
        entry(&tree.path(""), "read"),
        entry(&tree.path("allowed"), "write"),
        entry(&tree.path("outside"), "deny"),
    ]);
    let walk = client
        .call(
            "fs/walk",
            json!({"path": tree.path(""), "sandbox": policy, "options": {"maxDepth": 8,
                   "maxDirectories": 100, "maxEntries": 100, "followDirectorySymlinks": true}}),
        )
        .await;
    let uri = |rel: &str| format!("file://{}", tree.t.join(rel).display());
    let listed: Vec<&str> = walk["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        [
            uri("allowed"),
            uri("outside"),
            uri("allowed/in-link"),
            uri("allowed/sub"),
            uri("allowed/in-link/f"),
        ],
        "{walk}"
    );
    assert_eq!(
        walk["errors"],
        json!([{"path": uri("outside"), "message": format!(
            "read access to {} is not permitted by the filesystem sandbox", tree.path("outside"))}])
    );
    // fs/readDirectory leaves the same link out and reports the other by its target's kind.
    let listing = client
        .call(
            "fs/readDirectory",
            json!({"path": tree.path("allowed"), "sandbox": policy}),
        )
        .await;
    let mut entries: Vec<(String, bool)> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["fileName"].as_str().unwrap().to_owned(),
                e["isDirectory"].as_bool().unwrap(),
            )
        })
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        [("in-link".to_owned(), true), ("sub".to_owned(), true)]
    );
    // Walking the denied directory itself is refused as a whole.
    let error = client
        .call_err(
            "fs/walk",
            json!({"path": tree.path("outside"), "sandbox": policy, "options": {"maxDepth": 1,
                   "maxDirectories": 10, "maxEntries": 10, "followDirectorySymlinks": false}}),
        )
        .await;
    assert_denied(&error);
}

/// Links, missing paths and existing paths behave inside the helper as in the server
/// (PROTOCOL §5.4–§5.13).
#[tokio::test]
async fn sandboxed_methods_keep_their_link_and_error_semantics() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let a = |rel: &str| tree.t.join("allowed").join(rel);
    let p = |rel: &str| a(rel).to_str().unwrap().to_owned();
    std::fs::write(a("target"), "12345").unwrap();
    std::os::unix::fs::symlink("target", a("link")).unwrap();
    std::os::unix::fs::symlink("made-by-write", a("dangling")).unwrap();
    let mut client = client().await;
    let policy = default_policy(&tree);
    let call = |method: &'static str, params: Value| {
        let mut params = params;
        params["sandbox"] = policy.clone();
        (method, params)
    };

    // readFile / writeFile refuse a last link unless following.
    for (method, params) in [
        call(
            "fs/readFile",
            json!({"path": p("link"), "followSymlinks": false}),
        ),
        call(
            "fs/writeFile",
            json!({"path": p("link"), "dataBase64": b64("x"), "followSymlinks": false}),
        ),
    ] {
        let error = client.call_err(method, params).await;
        assert_error(
            &error,
            -32600,
            &format!("path `{}` is a symbolic link", p("link")),
        );
    }
    let (method, params) = call("fs/readFile", json!({"path": p("link")}));
    assert_eq!(
        b64decode(&client.call(method, params).await["dataBase64"]),
        b"12345"
    );
    // Writing through a dangling link creates its target.
    let (method, params) = call(
        "fs/writeFile",
        json!({"path": p("dangling"), "dataBase64": b64("new")}),
    );
    client.call(method, params).await;
    assert_eq!(std::fs::read_to_string(a("made-by-write")).unwrap(), "new");
    // getMetadata describes the target or the link itself.
    let (method, params) = call("fs/getMetadata", json!({"path": p("link")}));
    let followed = client.call(method, params).await;
    assert_eq!(
        (
            &followed["isFile"],
            &followed["isSymlink"],
            &followed["size"]
        ),
        (&json!(true), &json!(true), &json!(5))
    );
    let (method, params) = call(
        "fs/getMetadata",
        json!({"path": p("link"), "followSymlinks": false}),
    );
    let own = client.call(method, params).await;
    assert_eq!(
        (&own["isFile"], &own["isSymlink"], &own["size"]),
        (&json!(false), &json!(true), &json!(6))
    );
    // canonicalize answers the target; a missing path is -32004.
    let (method, params) = call("fs/canonicalize", json!({"path": p("link")}));
    assert_eq!(
        client.call(method, params).await["path"],
        format!("file://{}", p("target"))
    );
    let (method, params) = call("fs/canonicalize", json!({"path": p("nope")}));
    assert_eq!(client.call_err(method, params).await["code"], -32004);
    // createDirectory: recursive creates every level; single needs its parent.
    let (method, params) = call("fs/createDirectory", json!({"path": p("d1/d2/d3")}));
    client.call(method, params).await;
    assert!(a("d1/d2/d3").is_dir());
    let (method, params) = call(
        "fs/createDirectory",
        json!({"path": p("x/y"), "recursive": false}),
    );
    assert_eq!(client.call_err(method, params).await["code"], -32004);
    let (method, params) = call(
        "fs/createDirectory",
        json!({"path": p("d1"), "recursive": false}),
    );
    assert_eq!(client.call_err(method, params).await["code"], -32603);
    let (method, params) = call("fs/createDirectory", json!({"path": p("target/sub")}));
    assert_eq!(client.call_err(method, params).await["code"], -32603);
    // copy: files by content, links as links, trees merged; an existing link destination.
    std::fs::write(a("d1/d2/f"), "f").unwrap();
    std::os::unix::fs::symlink("f", a("d1/d2/f-link")).unwrap();
    let (method, params) = call(
        "fs/copy",
        json!({"sourcePath": p("d1"), "destinationPath": p("c1"), "recursive": true}),
    );
    client.call(method, params).await;
    assert_eq!(std::fs::read_to_string(a("c1/d2/f")).unwrap(), "f");
    assert_eq!(
        std::fs::read_link(a("c1/d2/f-link")).unwrap(),
        Path::new("f")
    );
    assert!(a("c1/d2/d3").is_dir());
    let (method, params) = call(
        "fs/copy",
        json!({"sourcePath": p("link"), "destinationPath": p("c1/d2/f-link"), "recursive": false}),
    );
    assert_eq!(client.call_err(method, params).await["code"], -32603);
    let (method, params) = call(
        "fs/copy",
        json!({"sourcePath": p("d1"), "destinationPath": p("d1/d2/inner"), "recursive": true}),
    );
    assert_error(
        &client.call_err(method, params).await,
        -32600,
        "fs/copy cannot copy a directory to itself or one of its descendants",
    );
    // remove: force hides a missing path; a tree goes; a link goes without its target.
    let (method, params) = call("fs/remove", json!({"path": p("nope")}));
    client.call(method, params).await;
    let (method, params) = call("fs/remove", json!({"path": p("nope"), "force": false}));
    assert_eq!(client.call_err(method, params).await["code"], -32004);
    let (method, params) = call("fs/remove", json!({"path": p("c1"), "recursive": false}));
    assert_eq!(client.call_err(method, params).await["code"], -32603);
    let (method, params) = call("fs/remove", json!({"path": p("c1")}));
    client.call(method, params).await;
    assert!(!a("c1").exists());
    let (method, params) = call("fs/remove", json!({"path": p("link")}));
    client.call(method, params).await;
    assert!(std::fs::symlink_metadata(a("link")).is_err() && a("target").exists());
}

/// The launcher and the PID namespace's init keep every signal blocked: a group signal
/// reaches the target alone, and its death by that signal is the process's exit code, in
/// both modes, as for unsandboxed processes (PROTOCOL.md §4.8, §4.11).
#[tokio::test]
async fn group_signals_reach_the_sandboxed_target_and_its_status_is_reported() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let mut client = client().await;
    let cwd = tree.path("allowed");
    let policy = default_policy(&tree);
    for (i, (tty, signal, code)) in [
        (false, "interrupt", 130),
        (false, "terminate", 143),
        (true, "hangup", 129),
        (false, "kill", 137),
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("s{i}");
        client
            .call(
                "process/start",
                json!({"processId": id, "argv": ["/bin/sh", "-c", "echo ready; exec sleep 1000"],
                       "cwd": cwd, "env": {"PATH": "/usr/bin:/bin"}, "tty": tty, "sandbox": policy}),
            )
            .await;
        loop {
            let output = client.notification("process/output").await;
            assert_eq!(output["processId"], id);
            if String::from_utf8_lossy(&b64decode(&output["chunk"])).contains("ready") {
                break;
            }
        }
        client
            .call("process/signal", json!({"processId": id, "signal": signal}))
            .await;
        let exited = client.notification("process/exited").await;
        assert_eq!(exited["processId"], id);
        assert_eq!(exited["exitCode"], code, "{signal}");
        let closed = client.notification("process/closed").await;
        assert_eq!(closed["processId"], id);
    }
}

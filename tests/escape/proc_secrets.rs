//! Sandboxed processes cannot read the server's or other sessions' secrets through `/proc`.
//!
//! The attacker is a sandboxed process whose policy is generous (the whole disk readable, a
//! writable directory, network enabled). It goes after the server's `environ` (where tokens
//! live), `cmdline`, memory, descriptors and root, and the same of a process another session
//! started with a secret in its environment. None of it may be readable; neither process may
//! even be visible. The server runs as root, and again as an unprivileged user.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::process_tree::{pids_running, unique_digits};
use crate::sandbox::{entry, landlock_available, managed, root_read, run_to_exit, Tree};
use crate::util::*;

/// The policy of the attack: everything readable, `T/allowed` writable, network enabled.
fn generous_policy(tree: &Tree) -> Value {
    let mut policy = managed(vec![root_read(), entry(&tree.path("allowed"), "write")]);
    policy["permissions"]["network"] = json!("enabled");
    policy
}

/// Tries every `/proc` door of each pid and prints what opened, then the pids it can see.
fn attack_script(pids: &[u32], canary: &str) -> String {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    format!(
        r#"for pid in {pids}; do
  tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -q '{canary}' && echo "LEAK environ $pid"
  test -s /proc/$pid/cmdline 2>/dev/null && echo "LEAK cmdline $pid"
  (exec 3< /proc/$pid/mem) 2>/dev/null && echo "LEAK mem $pid"
  ls /proc/$pid/fd/ >/dev/null 2>&1 && echo "LEAK fd $pid"
  ls /proc/$pid/root/ >/dev/null 2>&1 && echo "LEAK root $pid"
  test -e /proc/$pid && echo "LEAK visible $pid"
done
echo "PIDS $(ls /proc | grep -E '^[0-9]+$' | tr '\n' ' ')"
"#,
        pids = pids.join(" ")
    )
}

/// Runs the attack against `server` (a WebSocket server started with `ESCAPE_CANARY` =
/// `canary` in its environment): a second session holds the victim process.
async fn attack(server: &WsServer, tree: &Tree, canary: &str) {
    let mut victim_session = server.connect_initialized().await;
    let marker = format!("7779.{}", unique_digits());
    victim_session
        .call(
            "process/start",
            json!({"processId": "victim", "argv": ["sleep", marker], "cwd": tree.path("allowed"),
                   "env": {"PATH": "/usr/bin:/bin", "ESCAPE_CANARY": canary}, "tty": false}),
        )
        .await;
    let deadline = Instant::now() + STEP_TIMEOUT;
    let victim = loop {
        if let [pid] = pids_running(&marker)[..] {
            break pid as u32;
        }
        assert!(Instant::now() < deadline, "the victim never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let server_pid = server.child.id().unwrap();
    // The victim's secret really is in its environment: the attack is meaningful.
    let environ = std::fs::read(format!("/proc/{victim}/environ")).unwrap();
    assert!(String::from_utf8_lossy(&environ).contains(canary));

    let mut attacker = server.connect_initialized().await;
    let started = attacker
        .call(
            "process/start",
            json!({"processId": "attack", "argv": ["/bin/sh", "-c", attack_script(&[server_pid, victim], canary)],
                   "cwd": tree.path("allowed"), "env": {"PATH": "/usr/bin:/bin"}, "tty": false,
                   "sandbox": generous_policy(tree)}),
        )
        .await;
    assert_eq!(started["sandboxType"], "linuxSeccomp");
    let (output, exited) = run_to_exit(&mut attacker, "attack").await;
    assert_eq!(exited["exitCode"], 0, "{output}");
    let leaks: Vec<&str> = output.lines().filter(|l| l.starts_with("LEAK")).collect();
    assert!(
        leaks.is_empty(),
        "the sandbox let through: {leaks:?}\n{output}"
    );
    let visible: Vec<u32> = output
        .lines()
        .find_map(|l| l.strip_prefix("PIDS "))
        .expect("the pid listing")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(
        !visible.contains(&server_pid) && !visible.contains(&victim),
        "server {server_pid} or victim {victim} visible in {visible:?}"
    );
    // Only the sandbox's own namespace: its init, the shell and the listing pipeline.
    assert!(visible.len() <= 8, "{visible:?}");
}

fn canary() -> String {
    format!("canary-{}", unique_digits())
}

#[tokio::test]
async fn a_sandboxed_process_cannot_read_the_servers_or_other_sessions_proc_entries() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let canary = canary();
    let mut command = server_command(&["--listen", "ws://127.0.0.1:0"]);
    command.env("ESCAPE_CANARY", &canary);
    let server = WsServer::start_with(command).await;
    // The server's own secret is in its environment too.
    let environ = std::fs::read(format!("/proc/{}/environ", server.child.id().unwrap())).unwrap();
    assert!(String::from_utf8_lossy(&environ).contains(&canary));
    attack(&server, &tree, &canary).await;
}

/// The user the unprivileged server runs as.
const NOBODY: u32 = 65534;

/// Whether `nobody` may create a user namespace here (it is what confines an unprivileged
/// server's processes).
fn user_namespaces_for_nobody() -> bool {
    std::process::Command::new("unshare")
        .args(["--user", "true"])
        .uid(NOBODY)
        .gid(NOBODY)
        .status()
        .is_ok_and(|s| s.success())
}

use std::os::unix::process::CommandExt;

#[tokio::test]
async fn an_unprivileged_servers_sandboxed_processes_cannot_read_its_proc_entries() {
    if !landlock_available() {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: starting the server as another user needs root");
        return;
    }
    if !user_namespaces_for_nobody() {
        eprintln!("SKIP: user namespaces are not available to unprivileged users here");
        return;
    }
    let tree = Tree::new();
    for dir in [tree.t.clone(), tree.t.join("allowed")] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let canary = canary();
    let mut command = server_command(&["--listen", "ws://127.0.0.1:0"]);
    command
        .env("ESCAPE_CANARY", &canary)
        .current_dir("/")
        .uid(NOBODY)
        .gid(NOBODY);
    let server = WsServer::start_with(command).await;
    attack(&server, &tree, &canary).await;
}

// ---- where the kernel refuses PID namespaces ------------------------------------------------

/// Environment variable that turns [`no_pid_namespace_wrapper`] into a wrapper: its value
/// is the server's argv, one argument per line.
const NO_PID_NAMESPACE_ARGS: &str = "EXEC_SERVER_TEST_NO_PID_NAMESPACE_ARGS";

/// The test binary re-executed as a wrapper that makes `unshare` fail with `EPERM` whenever
/// it asks for a PID namespace (as some container runtimes do), then execs the server: the
/// server and every launcher it starts run where PID namespaces cannot be created.
#[test]
fn no_pid_namespace_wrapper() {
    let Some(args) = std::env::var_os(NO_PID_NAMESPACE_ARGS) else {
        return;
    };
    let args: Vec<std::ffi::CString> = args
        .to_str()
        .unwrap()
        .lines()
        .map(|a| std::ffi::CString::new(a).unwrap())
        .collect();
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const AND_K: u16 = 0x54;
    const RET_K: u16 = 0x06;
    let stmt = |code, k| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code, k, jt, jf| libc::sock_filter { code, jt, jf, k };
    let newpid = libc::CLONE_NEWPID as u32;
    let filter = [
        stmt(LD_W_ABS, 0),
        jump(JEQ_K, libc::SYS_unshare as u32, 0, 4),
        stmt(LD_W_ABS, 16),
        stmt(AND_K, newpid),
        jump(JEQ_K, newpid, 0, 1),
        stmt(RET_K, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        stmt(RET_K, libc::SECCOMP_RET_ALLOW),
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

/// Without a PID namespace the sandboxed process sees the host's `/proc`, but the next
/// strongest measures still hold: the server's `environ`, memory and root stay unreadable
/// (Landlock's ptrace scope, every capability dropped), it cannot signal the server, and
/// its background descendants still die with it.
#[tokio::test]
async fn without_pid_namespaces_the_servers_secrets_stay_unreadable() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let canary = canary();
    let mut command = tokio::process::Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "escape::proc_secrets::no_pid_namespace_wrapper",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(
            NO_PID_NAMESPACE_ARGS,
            [server_bin().to_str().unwrap(), "--listen", "stdio"].join("\n"),
        )
        .env("ESCAPE_CANARY", &canary)
        .env("RUST_LOG", "error")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut client = Client::stdio_after_harness_preamble(command).await;
    client.handshake().await;
    let server_pid = client.child().id().unwrap();
    let marker = format!("7778.{}", unique_digits());
    let script = format!(
        "{attack}kill -0 {server_pid} 2>/dev/null && echo 'LEAK signal {server_pid}'\n\
         setsid sleep {marker} </dev/null >/dev/null 2>&1 &\n\
         exec sleep 1000",
        attack = attack_script(&[server_pid], &canary),
    );
    let started = client
        .call(
            "process/start",
            json!({"processId": "attack", "argv": ["/bin/sh", "-c", script],
                   "cwd": tree.path("allowed"), "env": {"PATH": "/usr/bin:/bin"}, "tty": false,
                   "sandbox": generous_policy(&tree)}),
        )
        .await;
    assert_eq!(started["sandboxType"], "linuxSeccomp");
    let mut output = String::new();
    while !output.contains("PIDS ") {
        let chunk = client.notification("process/output").await;
        output.push_str(&String::from_utf8_lossy(&b64decode(&chunk["chunk"])));
    }
    // What a host /proc still shows: the server is listed (the weaker fallback) …
    assert!(
        output.contains(&format!("LEAK visible {server_pid}")),
        "{output}"
    );
    // … but none of its secrets, and it cannot be signalled.
    for door in ["environ", "mem", "root", "signal"] {
        assert!(
            !output.contains(&format!("LEAK {door} {server_pid}")),
            "{door} readable without a PID namespace:\n{output}"
        );
    }
    let deadline = Instant::now() + STEP_TIMEOUT;
    while pids_running(&marker).is_empty() {
        assert!(Instant::now() < deadline, "the daemon never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client
        .call("process/terminate", json!({"processId": "attack"}))
        .await;
    let deadline = Instant::now() + STEP_TIMEOUT;
    while !pids_running(&marker).is_empty() {
        if Instant::now() >= deadline {
            for pid in pids_running(&marker) {
                // SAFETY: kill has no memory effects; clean up after the failure.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            panic!("the daemon outlived process/terminate without a PID namespace");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

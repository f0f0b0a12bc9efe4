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

//! Every descendant of a started process dies with it, with its session and with the server.
//!
//! The attacker's process forks into the background in every way a shell offers — a plain
//! `&` job, a `setsid` job in a session of its own, a double fork re-parented away from it —
//! and then execs, so the started process itself is just one more `sleep`. Each way out is
//! tried against `process/terminate`, session expiry and a SIGKILL of the server, for an
//! unsandboxed and a sandboxed process. The processes are found from the host by unique
//! markers in their command lines (pids inside a PID namespace differ from host pids).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::sandbox::{client, default_policy, landlock_available, Tree};
use crate::util::*;

/// How a process is started.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    Sandboxed,
}

/// What ends the process tree.
#[derive(Clone, Copy)]
enum Ending {
    Terminate,
    SessionExpiry,
    ServerKilled,
}

/// The four `sleep` arguments of one escape attempt, unique to this run.
struct Markers([String; 4]);

impl Markers {
    fn new() -> Self {
        let unique = unique_digits();
        Self(std::array::from_fn(|i| format!("777{}.{unique}", i + 1)))
    }

    /// A `&` job, a `setsid` job, a double fork, and the process itself via `exec`.
    fn script(&self) -> String {
        let [m1, m2, m3, m4] = &self.0;
        format!("sleep {m1} & setsid sleep {m2} & (sleep {m3} &) ; exec sleep {m4}")
    }

    /// How many of the four still run, seen from the host.
    fn running(&self) -> usize {
        self.0
            .iter()
            .filter(|m| !pids_running(m).is_empty())
            .count()
    }

    async fn wait_until_all_run(&self) {
        let deadline = Instant::now() + STEP_TIMEOUT;
        while self.running() < 4 {
            assert!(
                Instant::now() < deadline,
                "only {} of the four sleeps started",
                self.running()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn wait_until_none_runs(&self, after: &str) {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let left: Vec<&String> = self
                .0
                .iter()
                .filter(|m| !pids_running(m).is_empty())
                .collect();
            if left.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                panic!("after {after}, these escaped: sleep {left:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Markers {
    /// Whatever escaped a failed test does not outlive it.
    fn drop(&mut self) {
        for marker in &self.0 {
            for pid in pids_running(marker) {
                // SAFETY: kill has no memory effects.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// Decimal digits unique to this call in this test run (a `sleep` argument's fraction).
pub(crate) fn unique_digits() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{}{nanos:09}{n}", std::process::id())
}

/// Pids of live processes (not zombies) whose command line contains `sleep <marker>`.
pub(crate) fn pids_running(marker: &str) -> Vec<i32> {
    let needle = format!("sleep\0{marker}\0");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            // A zombie's command line is empty.
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                cmdline
                    .windows(needle.len())
                    .any(|w| w == needle.as_bytes())
            })
        })
        .collect()
}

/// The `process/start` params of the escape attempt.
fn start_params(kind: Kind, id: &str, script: &str, tree: &Tree) -> Value {
    let mut params = json!({"processId": id, "argv": ["/bin/sh", "-c", script],
        "cwd": tree.path("allowed"), "env": {"PATH": "/usr/bin:/bin"}, "tty": false});
    if kind == Kind::Sandboxed {
        params["sandbox"] = default_policy(tree);
    }
    params
}

async fn escape_attempt(kind: Kind, ending: Ending) {
    if kind == Kind::Sandboxed && !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let markers = Markers::new();
    let params = start_params(kind, "escape", &markers.script(), &tree);
    match ending {
        Ending::Terminate => {
            let mut client = client().await;
            client.call("process/start", params).await;
            markers.wait_until_all_run().await;
            let result = client
                .call("process/terminate", json!({"processId": "escape"}))
                .await;
            assert_eq!(result, json!({"running": true}));
            markers.wait_until_none_runs("process/terminate").await;
            // The process itself reports its death by SIGKILL.
            let exited = client.notification("process/exited").await;
            assert_eq!(exited["exitCode"], 137, "{exited}");
            client.notification("process/closed").await;
        }
        Ending::SessionExpiry => {
            let config = config_file("[session]\ndetached_ttl_ms = 200\n");
            let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
            let mut client = server.connect_initialized().await;
            client.call("process/start", params).await;
            markers.wait_until_all_run().await;
            drop(client);
            markers.wait_until_none_runs("the session expired").await;
        }
        Ending::ServerKilled => {
            let mut client = client().await;
            client.call("process/start", params).await;
            markers.wait_until_all_run().await;
            client.child().start_kill().unwrap();
            client.child().wait().await.unwrap();
            markers
                .wait_until_none_runs("the server was SIGKILLed")
                .await;
        }
    }
}

#[tokio::test]
async fn terminate_kills_every_background_descendant() {
    escape_attempt(Kind::Plain, Ending::Terminate).await;
}

#[tokio::test]
async fn terminate_kills_every_background_descendant_of_a_sandboxed_process() {
    escape_attempt(Kind::Sandboxed, Ending::Terminate).await;
}

#[tokio::test]
async fn session_expiry_kills_every_background_descendant() {
    escape_attempt(Kind::Plain, Ending::SessionExpiry).await;
}

#[tokio::test]
async fn session_expiry_kills_every_background_descendant_of_a_sandboxed_process() {
    escape_attempt(Kind::Sandboxed, Ending::SessionExpiry).await;
}

#[tokio::test]
async fn a_killed_server_takes_every_background_descendant_with_it() {
    escape_attempt(Kind::Plain, Ending::ServerKilled).await;
}

#[tokio::test]
async fn a_killed_server_takes_every_background_descendant_of_a_sandboxed_process_with_it() {
    escape_attempt(Kind::Sandboxed, Ending::ServerKilled).await;
}

/// A daemon that closed its output outlives `process/closed`; terminating the closed
/// process still ends it.
#[tokio::test]
async fn terminate_after_close_kills_a_daemon_that_closed_its_output() {
    let tree = Tree::new();
    let markers = Markers::new();
    let [m1, ..] = &markers.0;
    let script = format!("setsid sleep {m1} </dev/null >/dev/null 2>&1 &");
    let mut client = client().await;
    client
        .call(
            "process/start",
            start_params(Kind::Plain, "daemon", &script, &tree),
        )
        .await;
    client.notification("process/closed").await;
    let deadline = Instant::now() + STEP_TIMEOUT;
    while pids_running(m1).is_empty() {
        assert!(Instant::now() < deadline, "the daemon never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let result = client
        .call("process/terminate", json!({"processId": "daemon"}))
        .await;
    assert_eq!(result, json!({"running": false}));
    let deadline = Instant::now() + STEP_TIMEOUT;
    while !pids_running(m1).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the daemon outlived process/terminate"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Background output after the exit is still delivered, between `exited` and `closed`
/// (PROTOCOL §4.3): containment must not end a tree nobody asked to end.
async fn late_output_after_exit(kind: Kind) {
    if kind == Kind::Sandboxed && !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let mut client = client().await;
    let script = "(sleep 0.3; echo late) & echo early";
    client
        .call("process/start", start_params(kind, "late", script, &tree))
        .await;
    let mut events = Vec::new();
    loop {
        let message = client.next_message().await;
        assert_eq!(message["params"]["processId"], "late", "{message}");
        match message["method"].as_str().unwrap() {
            "process/output" => {
                let text = String::from_utf8(b64decode(&message["params"]["chunk"])).unwrap();
                events.push(format!("output:{}", text.trim()));
            }
            "process/exited" => {
                assert_eq!(message["params"]["exitCode"], 0, "{message}");
                events.push("exited".to_owned());
            }
            "process/closed" => {
                events.push("closed".to_owned());
                break;
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(events, ["output:early", "exited", "output:late", "closed"]);
}

#[tokio::test]
async fn background_output_after_the_exit_is_still_delivered() {
    late_output_after_exit(Kind::Plain).await;
}

#[tokio::test]
async fn background_output_after_a_sandboxed_exit_is_still_delivered() {
    late_output_after_exit(Kind::Sandboxed).await;
}

/// The tree runs as the server's user, so it can signal its own keeper. Whatever it does
/// to the keeper, every descendant dies at once, without anyone asking (a stopped keeper
/// would ignore its kill and the server's death alike); in a sandbox it cannot reach the
/// keeper, and `process/terminate` still ends the tree.
#[derive(Clone, Copy)]
enum KeeperAttack {
    /// `kill -9` of the keeper.
    Kill,
    /// `kill -STOP` of the keeper.
    Stop,
}

async fn attack_the_keeper(kind: Kind, attack: KeeperAttack) {
    if kind == Kind::Sandboxed && !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let markers = Markers::new();
    let [m1, m2, m3, m4] = &markers.0;
    // In a sandbox the parent is the PID namespace's init, which cannot be killed from
    // inside it; the keeper is not even visible.
    let signal = match attack {
        KeeperAttack::Kill => "-KILL",
        KeeperAttack::Stop => "-STOP",
    };
    let script = format!(
        "sleep {m1} & setsid sleep {m2} & (setsid sleep {m3} &) ; sleep 1; \
         kill {signal} $PPID; exec sleep {m4}"
    );
    let mut client = client().await;
    client
        .call(
            "process/start",
            start_params(kind, "attack", &script, &tree),
        )
        .await;
    match kind {
        Kind::Plain => {
            // The three background sleeps run during the script's pause; the target itself
            // dies with its keeper before it reaches `exec sleep`.
            let deadline = Instant::now() + STEP_TIMEOUT;
            while markers.running() < 3 {
                assert!(
                    Instant::now() < deadline,
                    "the background sleeps never started"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            markers
                .wait_until_none_runs("the tree attacked its keeper")
                .await;
        }
        Kind::Sandboxed => {
            markers.wait_until_all_run().await;
            client
                .call("process/terminate", json!({"processId": "attack"}))
                .await;
            markers
                .wait_until_none_runs("process/terminate of a tree that attacked its keeper")
                .await;
        }
    }
}

#[tokio::test]
async fn a_tree_that_kills_its_keeper_dies_with_it() {
    attack_the_keeper(Kind::Plain, KeeperAttack::Kill).await;
}

#[tokio::test]
async fn a_tree_that_stops_its_keeper_dies_with_it() {
    attack_the_keeper(Kind::Plain, KeeperAttack::Stop).await;
}

#[tokio::test]
async fn a_sandboxed_tree_cannot_kill_its_init() {
    attack_the_keeper(Kind::Sandboxed, KeeperAttack::Kill).await;
}

#[tokio::test]
async fn a_sandboxed_tree_cannot_stop_its_init() {
    attack_the_keeper(Kind::Sandboxed, KeeperAttack::Stop).await;
}

/// A tree that keeps forking while its keeper is killed: every generation it makes is
/// stopped before it is killed, so none gets away.
#[tokio::test]
async fn a_tree_forking_as_fast_as_it_can_still_dies_with_its_killed_keeper() {
    let tree = Tree::new();
    let markers = Markers::new();
    let [m1, ..] = &markers.0;
    let script = format!(
        "(i=0; while [ $i -lt 3000 ]; do (setsid sleep {m1} &); i=$((i+1)); done) & \
         (i=0; while [ $i -lt 3000 ]; do (sleep {m1} &); i=$((i+1)); done) & \
         sleep 0.5; kill -KILL $PPID; sleep 30"
    );
    let mut client = client().await;
    client
        .call(
            "process/start",
            start_params(Kind::Plain, "forker", &script, &tree),
        )
        .await;
    let deadline = Instant::now() + STEP_TIMEOUT;
    while pids_running(m1).is_empty() {
        assert!(Instant::now() < deadline, "the forks never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    markers
        .wait_until_none_runs("the forking tree killed its keeper")
        .await;
}

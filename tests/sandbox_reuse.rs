//! Confined fs helpers kept between requests (`sandbox.fs_helper_idle_ms`): a helper serves
//! only the session it was started for under the one policy it confined itself to, and is
//! never weaker than a fresh one. The server, its helpers and their confinement are the real
//! binary on this kernel; which helper answered is read from `/proc`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::sandbox::{
    assert_denied, default_policy, entry, helper_by_hand, helper_policy, landlock_available,
    managed, root_read, write, Tree,
};
use crate::util::*;

/// The fs helpers the server `server` has started that are still alive (not zombies).
fn live_helpers(server: u32) -> Vec<u32> {
    let mut helpers = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces, so read after the last `)`.
        let Some(after) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
            continue;
        };
        let mut fields = after.split_whitespace();
        let (state, ppid) = (fields.next(), fields.next());
        if state == Some("Z") || ppid != Some(&server.to_string()) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline
            .split(|b| *b == 0)
            .any(|arg| arg == b"--codex-run-as-fs-helper")
        {
            helpers.push(pid);
        }
    }
    helpers.sort_unstable();
    helpers
}

/// Waits (bounded) until the server's live helpers are `expected`.
async fn wait_for_helpers(server: u32, expected: &[u32]) {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    while live_helpers(server) != expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "helpers of {server}: {:?}, expected {expected:?}",
            live_helpers(server)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded) until `pid` has exited: a zombie or gone. (While it exits, its
/// `cmdline` already reads empty, so [`live_helpers`] stops listing it a little earlier.)
async fn wait_until_dead(pid: u32) {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let (_, rest) = stat.rsplit_once(')')?;
                rest.split_whitespace().next().map(str::to_owned)
            });
        if state.is_none_or(|state| state == "Z") {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{pid} still runs");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn read(client: &mut Client, path: &str, sandbox: &Value) -> Result<Value, Value> {
    client
        .request("fs/readFile", json!({"path": path, "sandbox": sandbox}))
        .await
}

/// A server on this kernel, one initialized session, and the test tree with its default
/// policy (`T/allowed` writable); `None` (the test passes) without Landlock.
struct Setup {
    tree: Tree,
    policy: Value,
    server: WsServer,
    /// The server's pid: its helpers are its children.
    pid: u32,
    client: Client,
    /// Kept for as long as the server reads it.
    _config: Option<tempfile::TempPath>,
}

impl Setup {
    async fn start(config: Option<&str>) -> Option<Self> {
        if !landlock_available() {
            return None;
        }
        let tree = Tree::new();
        let policy = default_policy(&tree);
        let config = config.map(config_file);
        let args: Vec<&str> = match &config {
            Some(path) => vec!["--config", path.to_str().unwrap()],
            None => Vec::new(),
        };
        let server = WsServer::start(&args).await;
        let pid = server.child.id().unwrap();
        let client = server.connect_initialized().await;
        Some(Self {
            tree,
            policy,
            server,
            pid,
            client,
            _config: config,
        })
    }

    /// Writes `data` to `T/allowed/<name>` under the default policy, which must succeed.
    async fn write_allowed(&mut self, name: &str, data: &str) {
        let path = self.tree.path(&format!("allowed/{name}"));
        write(&mut self.client, &path, data, &self.policy)
            .await
            .unwrap();
    }
}

/// The one helper the server runs right now.
#[track_caller]
fn only_helper(server: u32) -> u32 {
    let helpers = live_helpers(server);
    assert_eq!(helpers.len(), 1, "helpers: {helpers:?}");
    helpers[0]
}

#[tokio::test]
async fn one_sessions_requests_under_one_policy_are_served_by_one_confined_helper() {
    let Some(mut setup) = Setup::start(None).await else {
        return;
    };
    setup.write_allowed("a", "one").await;
    let helper = only_helper(setup.pid);
    for round in 0..5 {
        let Setup {
            tree,
            policy,
            client,
            ..
        } = &mut setup;
        let answer = read(client, &tree.path("allowed/a"), policy).await.unwrap();
        assert_eq!(b64decode(&answer["dataBase64"]), b"one");
        // The kept helper is as confined as the first request found it: the write
        // outside is refused by the kernel rules and the checks, and nothing is created.
        let outside = tree.path(&format!("outside/{round}"));
        assert_denied(&write(client, &outside, "x", policy).await.unwrap_err());
        assert!(!tree.t.join(format!("outside/{round}")).exists());
        assert_eq!(only_helper(setup.pid), helper, "round {round}");
    }
    setup.server.child.kill().await.unwrap();
}

#[tokio::test]
async fn sessions_and_policies_never_share_a_helper() {
    let Some(mut setup) = Setup::start(None).await else {
        return;
    };
    let pid = setup.pid;
    let read_only = managed(vec![root_read()]);
    let mut second = setup.server.connect_initialized().await;

    setup.write_allowed("a", "x").await;
    let first_helper = only_helper(pid);

    // The same policy in another session: a helper of its own.
    write(
        &mut second,
        &setup.tree.path("allowed/b"),
        "y",
        &setup.policy,
    )
    .await
    .unwrap();
    let helpers = live_helpers(pid);
    assert_eq!(helpers.len(), 2, "{helpers:?}");
    let second_helper = *helpers.iter().find(|h| **h != first_helper).unwrap();

    // A narrower policy in the first session: a third helper, and the narrower rules hold
    // although a helper that may write there waits for the same session.
    let target = setup.tree.path("allowed/c");
    let narrower = write(&mut setup.client, &target, "z", &read_only).await;
    assert_denied(&narrower.unwrap_err());
    assert!(!setup.tree.t.join("allowed/c").exists());
    let helpers = live_helpers(pid);
    assert_eq!(helpers.len(), 3, "{helpers:?}");
    assert!(helpers.contains(&first_helper) && helpers.contains(&second_helper));

    // And back: the first session's writable helper is the one it had.
    setup.write_allowed("d", "w").await;
    assert_eq!(live_helpers(pid).len(), 3);
    setup.server.child.kill().await.unwrap();
}

#[tokio::test]
async fn a_kept_helper_that_died_is_replaced_and_the_request_still_runs() {
    let Some(mut setup) = Setup::start(None).await else {
        return;
    };
    setup.write_allowed("a", "x").await;
    let helper = only_helper(setup.pid);
    // SAFETY: a plain signal to a process of this test's own server.
    assert_eq!(unsafe { libc::kill(helper as i32, libc::SIGKILL) }, 0);
    wait_until_dead(helper).await;

    setup.write_allowed("b", "y").await;
    assert_ne!(only_helper(setup.pid), helper);
    let written = std::fs::read_to_string(setup.tree.t.join("allowed/b")).unwrap();
    assert_eq!(written, "y");
    setup.server.child.kill().await.unwrap();
}

#[tokio::test]
async fn a_kept_helper_ends_once_idle_for_fs_helper_idle_ms() {
    let Some(mut setup) = Setup::start(Some("[sandbox]\nfs_helper_idle_ms = 300\n")).await else {
        return;
    };
    setup.write_allowed("a", "x").await;
    let helper = only_helper(setup.pid);
    wait_for_helpers(setup.pid, &[]).await;
    // The next request gets a new one.
    setup.write_allowed("b", "y").await;
    assert_ne!(only_helper(setup.pid), helper);
    setup.server.child.kill().await.unwrap();
}

#[tokio::test]
async fn kept_helpers_end_with_their_session() {
    // Kept for an hour, but the session ends 100 ms after its connection closes.
    let config = "[sandbox]\nfs_helper_idle_ms = 3600000\n[session]\ndetached_ttl_ms = 100\n";
    let Some(mut setup) = Setup::start(Some(config)).await else {
        return;
    };
    let mut other = setup.server.connect_initialized().await;
    setup.write_allowed("a", "x").await;
    let helper = only_helper(setup.pid);
    write(
        &mut other,
        &setup.tree.path("allowed/b"),
        "y",
        &setup.policy,
    )
    .await
    .unwrap();
    let others = live_helpers(setup.pid)
        .into_iter()
        .filter(|h| *h != helper)
        .collect::<Vec<_>>();
    assert_eq!(others.len(), 1);
    setup.client.close().await;
    // Only the ended session's helper goes.
    wait_for_helpers(setup.pid, &others).await;
    setup.server.child.kill().await.unwrap();
}

#[tokio::test]
async fn with_an_idle_time_of_zero_every_request_has_its_own_helper() {
    let Some(mut setup) = Setup::start(Some("[sandbox]\nfs_helper_idle_ms = 0\n")).await else {
        return;
    };
    for name in ["a", "b", "c"] {
        setup.write_allowed(name, name).await;
        // The helper was reaped before the answer was sent.
        assert_eq!(live_helpers(setup.pid), Vec::<u32>::new());
    }
    let target = setup.tree.path("allowed/a");
    let denied = managed(vec![root_read(), entry(&target, "read")]);
    let refused = write(&mut setup.client, &target, "w", &denied).await;
    assert_denied(&refused.unwrap_err());
    setup.server.child.kill().await.unwrap();
}

#[tokio::test]
async fn the_serving_helper_driven_directly() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let policy = helper_policy(&tree);
    let request = |operation: &str, path: &str, extra: Value| {
        let mut params = json!({"path": format!("file://{}", tree.path(path)),
                                "followSymlinks": true, "sandbox": null});
        params
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"operation": operation, "params": params}).to_string()
    };
    // Three requests, one per line: three response lines, then exit 0 at the end of stdin.
    let input = [
        request("fs/writeFile", "allowed/a", json!({"dataBase64": "aGk="})),
        request("fs/writeFile", "outside/a", json!({"dataBase64": "aGk="})),
        request("fs/readFile", "allowed/a", json!({})),
    ]
    .join("\n")
        + "\n";
    let (status, stdout, stderr) =
        helper_by_hand(&["--policy", &policy, "--serve", "60000"], &input).await;
    assert_eq!(status.code(), Some(0), "{stderr}");
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert_eq!(lines[0]["status"], "ok");
    assert_eq!(lines[1]["status"], "error");
    assert_denied(&lines[1]["payload"]);
    assert!(!tree.t.join("outside/a").exists());
    assert_eq!(lines[2]["payload"]["response"]["dataBase64"], "aGk=");

    // A line over --max-request-bytes ends it with status 1; so does --serve without a
    // policy (a usage error, 2).
    let long = request("fs/readFile", "allowed/a", json!({"pad": "x".repeat(500)}));
    let (status, _, stderr) = helper_by_hand(
        &[
            "--policy",
            &policy,
            "--serve",
            "60000",
            "--max-request-bytes",
            "300",
        ],
        &format!("{long}\n"),
    )
    .await;
    assert_eq!(status.code(), Some(1));
    assert_eq!(
        stderr,
        "fs sandbox helper failed: request exceeds 300 bytes\n"
    );
    let (status, _, stderr) = helper_by_hand(&["--serve", "60000"], "").await;
    assert_eq!(status.code(), Some(2));
    assert_eq!(
        stderr,
        "fs sandbox helper usage error: --serve needs --policy\n"
    );
}

#[tokio::test]
async fn a_serving_helper_left_idle_exits_on_its_own() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let mut helper = tokio::process::Command::new(server_bin())
        .args(["--codex-run-as-fs-helper", "--policy"])
        .arg(helper_policy(&tree))
        .args(["--serve", "200"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Its stdin stays open: only the idle time can end it.
    let _stdin = helper.stdin.take().unwrap();
    let status = tokio::time::timeout(STEP_TIMEOUT, helper.wait())
        .await
        .expect("the idle helper exits")
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

use std::path::Path;

use serde_json::json;

use super::*;
use crate::policy::{Network, Readable};

fn policy() -> SandboxPolicy {
    SandboxPolicy {
        readable: Readable::All,
        writable: vec![PathBuf::from("/srv/repo")],
        read_only: vec![PathBuf::from("/srv/repo/.git")],
        denied_paths: Vec::new(),
        denied_globs: Vec::new(),
        network: Network::Restricted,
        full_disk_write: false,
        glob_scan_max_depth: 16,
    }
}

fn runner(program: &Path, timeout_ms: u64) -> FsHelperRunner {
    runner_with(program, timeout_ms, None, 2, 1)
}

fn runner_with(
    program: &Path,
    timeout_ms: u64,
    reuse_for: Option<Duration>,
    total: usize,
    per_session: usize,
) -> FsHelperRunner {
    FsHelperRunner::new(
        FsHelperSettings {
            program: program.to_path_buf(),
            argv0: PathBuf::from("/usr/local/bin/exec-server"),
            timeout: Duration::from_millis(timeout_ms),
            max_response_bytes: 1024 * 1024,
            max_request_bytes: 1000,
            enforcement: Enforcement::Require,
            reuse_for,
        },
        total,
        per_session,
    )
}

/// A shell script standing in for the helper, ready to be executed.
///
/// Written by a short-lived `sh`, never by this process: executing a file fails with
/// `ETXTBSY` while any process holds it open for writing, and a descriptor this process
/// opened would be copied into every child another test thread forks meanwhile (until that
/// child execs, or for its whole life if it never does), whatever `O_CLOEXEC` says. The
/// writer here has exited before the script runs, and no other process ever had its
/// descriptor, so the race cannot happen.
fn script(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("helper.sh");
    let status = std::process::Command::new("/bin/sh")
        .args([
            "-c",
            r#"printf '#!/bin/sh\n%s\n' "$1" > "$0" && chmod 755 "$0""#,
        ])
        .arg(&path)
        .arg(body)
        .status()
        .unwrap();
    assert!(status.success(), "writing {} failed", path.display());
    path
}

async fn run_script(body: &str, timeout_ms: u64) -> Result<Box<RawValue>, RpcError> {
    let dir = tempfile::tempdir().unwrap();
    let program = script(dir.path(), body);
    runner(&program, timeout_ms)
        .run(
            "session",
            "fs/readFile",
            serde_json::value::to_raw_value(&json!({"path": "/x", "sandbox": null})).unwrap(),
            &policy(),
        )
        .await
}

#[test]
fn the_command_has_the_documented_shape() {
    let runner = runner(Path::new("/proc/self/exe"), 1000);
    let command = runner.command(&policy());
    let std = command.as_std();
    assert_eq!(std.get_program(), "/proc/self/exe");
    let args: Vec<_> = std.get_args().collect();
    assert_eq!(args[0], FS_HELPER_ARG1);
    assert_eq!(args[1], "--policy");
    assert_eq!(
        args[2],
        policy().to_helper_json(Enforcement::Require).as_str()
    );
    assert_eq!(&args[3..], ["--max-request-bytes", "1000"]);
    assert_eq!(std.get_current_dir(), Some(Path::new("/")));
    let names: Vec<_> = std.get_envs().map(|(k, _)| k.to_owned()).collect();
    assert!(
        names.iter().all(|n| ENV_ALLOW_LIST.iter().any(|a| n == *a)),
        "{names:?}"
    );
}

#[tokio::test]
async fn undecodable_output_is_reported() {
    let error = run_script("echo 'not json'", 5000).await.unwrap_err();
    assert_eq!(error.code, -32603);
    assert!(
        error
            .message
            .starts_with("failed to encode or decode fs sandbox helper message:"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn a_slow_helper_is_killed_at_the_time_out() {
    let started = std::time::Instant::now();
    let error = run_script("sleep 60", 200).await.unwrap_err();
    assert_eq!(error, RpcError::fs_helper_timed_out(200));
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[tokio::test]
async fn stderr_is_capped() {
    let error = run_script("head -c 10240 /dev/zero | tr '\\0' x >&2; exit 3", 5000)
        .await
        .unwrap_err();
    let expected = format!(
        "fs sandbox helper failed with status exit status: 3: {} [stderr truncated]",
        "x".repeat(STDERR_CAP)
    );
    assert_eq!(error.message, expected);
}

#[tokio::test]
async fn silence_and_wrong_operations_are_reported() {
    assert_eq!(
        run_script("exit 0", 5000).await.unwrap_err(),
        RpcError::fs_helper_no_response()
    );
    let answer = r#"{"status":"ok","payload":{"operation":"fs/writeFile","response":{}}}"#;
    assert_eq!(
        run_script(&format!("echo '{answer}'"), 5000)
            .await
            .unwrap_err(),
        RpcError::fs_helper_unexpected_response("fs/readFile", "fs/writeFile")
    );
}

#[tokio::test]
async fn responses_and_errors_pass_through() {
    let answer =
        r#"{"status":"ok","payload":{"operation":"fs/readFile","response":{"dataBase64":"eA=="}}}"#;
    let ok = run_script(&format!("cat >/dev/null; echo '{answer}'"), 5000)
        .await
        .unwrap();
    assert_eq!(ok.get(), r#"{"dataBase64":"eA=="}"#);
    let answer = r#"{"status":"error","payload":{"code":-32004,"message":"No such file or directory (os error 2)"}}"#;
    let error = run_script(&format!("echo '{answer}'"), 5000)
        .await
        .unwrap_err();
    assert_eq!(
        error,
        RpcError::not_found("No such file or directory (os error 2)")
    );
}

#[tokio::test]
async fn oversized_output_is_cut_off() {
    let error = run_script("head -c 2000000 /dev/zero", 5000)
        .await
        .unwrap_err();
    assert_eq!(error, RpcError::fs_helper_response_too_large(1024 * 1024));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sessions_burst_of_slow_helpers_does_not_hold_up_another_session() {
    let dir = tempfile::tempdir().unwrap();
    // Requests for /slow never finish on their own; the others answer at once.
    let program = script(
        dir.path(),
        r#"read request
case "$request" in *slow*) sleep 60 ;; esac
echo '{"status":"ok","payload":{"operation":"fs/readFile","response":{"dataBase64":""}}}'"#,
    );
    // Two helpers at once, one per session.
    let runner = runner(&program, 120_000);
    let params = |path: &str| {
        serde_json::value::to_raw_value(&json!({"path": path, "sandbox": null})).unwrap()
    };
    let mut burst = Vec::new();
    for _ in 0..20 {
        let runner = runner.clone();
        let params = params("/slow");
        burst.push(tokio::spawn(async move {
            runner.run("burst", "fs/readFile", params, &policy()).await
        }));
    }
    while runner.slots.held_by("burst") == 0 {
        tokio::task::yield_now().await;
    }
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        runner.run("victim", "fs/readFile", params("/quick"), &policy()),
    )
    .await
    .expect("the other session's helper ran although one session queued twenty");
    assert_eq!(answer.unwrap().get(), r#"{"dataBase64":""}"#);
    assert_eq!(runner.slots.held_by("burst"), 1);
    assert_eq!(runner.slots.queued(), 19);
    for request in burst {
        request.abort();
    }
}

// ---- serving helpers, kept between requests ----------------------------------------------

/// The answer every stand-in below gives.
const EMPTY_READ: &str =
    r#"{"status":"ok","payload":{"operation":"fs/readFile","response":{"dataBase64":""}}}"#;

/// A stand-in for a serving helper: counts its starts in `starts` beside itself, then runs
/// `body`.
fn serving_script(dir: &Path, body: &str) -> PathBuf {
    script(
        dir,
        &format!("echo started >> \"$(dirname \"$0\")/starts\"\n{body}"),
    )
}

/// A runner keeping helpers for a minute (two in all, one per session) whose helper is a
/// [`serving_script`] running `body`, in a directory that lives as long as the runner.
fn kept_script(body: &str) -> (tempfile::TempDir, FsHelperRunner) {
    let dir = tempfile::tempdir().unwrap();
    let program = serving_script(dir.path(), body);
    let runner = kept_runner(&program, 2, 1);
    (dir, runner)
}

fn starts(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("starts"))
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

fn kept_runner(program: &Path, total: usize, per_session: usize) -> FsHelperRunner {
    runner_with(
        program,
        5000,
        Some(Duration::from_secs(60)),
        total,
        per_session,
    )
}

async fn read_in(
    runner: &FsHelperRunner,
    session: &str,
    policy: &SandboxPolicy,
) -> Result<Box<RawValue>, RpcError> {
    let params = serde_json::value::to_raw_value(&json!({"path": "/x", "sandbox": null})).unwrap();
    runner.run(session, "fs/readFile", params, policy).await
}

fn other_policy() -> SandboxPolicy {
    SandboxPolicy {
        writable: Vec::new(),
        ..policy()
    }
}

#[tokio::test]
async fn a_serving_helper_answers_its_sessions_requests_one_line_each() {
    let (dir, runner) = kept_script(&format!(
        "while read -r request; do echo '{EMPTY_READ}'; done"
    ));
    for _ in 0..3 {
        let answer = read_in(&runner, "session", &policy()).await.unwrap();
        assert_eq!(answer.get(), r#"{"dataBase64":""}"#);
    }
    assert_eq!(starts(dir.path()), 1);
    assert_eq!(runner.idle.len(), 1);
    runner.forget_session("session");
    assert_eq!(runner.idle.len(), 0);
}

#[tokio::test]
async fn the_serving_command_is_the_one_request_command_with_serve() {
    let runner = kept_runner(Path::new("/proc/self/exe"), 2, 1);
    let policy_json = policy().to_helper_json(Enforcement::Require);
    let command = runner.command_for(&policy_json, Some(Duration::from_millis(62_000)));
    let args: Vec<_> = command.as_std().get_args().collect();
    let one_request = runner.command(&policy());
    let mut expected: Vec<_> = one_request.as_std().get_args().collect();
    expected.extend([std::ffi::OsStr::new(SERVE_ARG), "62000".as_ref()]);
    assert_eq!(args, expected);
}

#[tokio::test]
async fn a_kept_helper_that_left_between_requests_is_replaced_without_losing_the_request() {
    // Answers one request, then exits 0 as a serving helper does between requests.
    let (dir, runner) = kept_script(&format!("read -r request; echo '{EMPTY_READ}'"));
    for _ in 0..3 {
        let answer = read_in(&runner, "session", &policy()).await.unwrap();
        assert_eq!(answer.get(), r#"{"dataBase64":""}"#);
    }
    assert_eq!(starts(dir.path()), 3);
}

#[tokio::test]
async fn a_helper_that_breaks_the_protocol_is_never_asked_again() {
    let (dir, runner) = kept_script("while read -r request; do echo 'not json'; done");
    for _ in 0..2 {
        let error = read_in(&runner, "session", &policy()).await.unwrap_err();
        assert!(
            error
                .message
                .starts_with("failed to encode or decode fs sandbox helper message:"),
            "{}",
            error.message
        );
    }
    assert_eq!(starts(dir.path()), 2);
    assert_eq!(runner.idle.len(), 0);
}

#[tokio::test]
async fn a_kept_helper_that_fails_mid_request_is_reported_not_retried() {
    // The second request makes it fail after reading it.
    let (dir, runner) = kept_script(&format!(
        "read -r request; echo '{EMPTY_READ}'\nread -r request; echo broken >&2; exit 1"
    ));
    read_in(&runner, "session", &policy()).await.unwrap();
    let error = read_in(&runner, "session", &policy()).await.unwrap_err();
    assert_eq!(
        error.message,
        "fs sandbox helper failed with status exit status: 1: broken"
    );
    assert_eq!(starts(dir.path()), 1);
}

#[tokio::test]
async fn a_kept_helper_that_hangs_is_killed_at_the_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let program = serving_script(
        dir.path(),
        &format!("read -r request; echo '{EMPTY_READ}'\nexec sleep 60"),
    );
    let runner = runner_with(&program, 300, Some(Duration::from_secs(60)), 2, 1);
    read_in(&runner, "session", &policy()).await.unwrap();
    let error = read_in(&runner, "session", &policy()).await.unwrap_err();
    assert_eq!(error, RpcError::fs_helper_timed_out(300));
    assert_eq!(runner.idle.len(), 0);
}

#[tokio::test]
async fn kept_helpers_are_bounded_per_session_and_in_all() {
    // Two in all, one per session.
    let (dir, runner) = kept_script(&format!(
        "while read -r request; do echo '{EMPTY_READ}'; done"
    ));
    read_in(&runner, "a", &policy()).await.unwrap();
    read_in(&runner, "a", &other_policy()).await.unwrap();
    assert_eq!(runner.idle.len(), 1, "one per session");
    read_in(&runner, "b", &policy()).await.unwrap();
    read_in(&runner, "c", &policy()).await.unwrap();
    assert_eq!(runner.idle.len(), 2, "two in all");
    // `a`'s helper was the oldest: gone, so `a` starts a new one; `c`'s is reused.
    let before = starts(dir.path());
    read_in(&runner, "c", &policy()).await.unwrap();
    assert_eq!(starts(dir.path()), before);
    read_in(&runner, "a", &other_policy()).await.unwrap();
    assert_eq!(starts(dir.path()), before + 1);
}

#[tokio::test]
async fn a_helper_that_moved_a_large_answer_is_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    // Every answer carries a little over a mebibyte of base64.
    let program = serving_script(
        dir.path(),
        r#"big=$(head -c 800000 /dev/zero | base64 -w0)
while read -r request; do
  printf '{"status":"ok","payload":{"operation":"fs/readFile","response":{"dataBase64":"%s"}}}\n' "$big"
done"#,
    );
    let runner = runner_with(&program, 5000, Some(Duration::from_secs(60)), 2, 1);
    let settings = FsHelperSettings {
        max_response_bytes: 4 * 1024 * 1024,
        ..runner.settings().clone()
    };
    let runner = FsHelperRunner::new(settings, 2, 1);
    for _ in 0..2 {
        read_in(&runner, "session", &policy()).await.unwrap();
    }
    assert_eq!(starts(dir.path()), 2);
    assert_eq!(runner.idle.len(), 0);
}

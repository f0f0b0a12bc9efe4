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
    FsHelperRunner::new(
        FsHelperSettings {
            program: program.to_path_buf(),
            argv0: PathBuf::from("/usr/local/bin/exec-server"),
            timeout: Duration::from_millis(timeout_ms),
            max_response_bytes: 1024 * 1024,
            max_request_bytes: 1000,
            enforcement: Enforcement::Require,
        },
        2,
        1,
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

//! `data.kind` of a failed `process/start` (CODEX-0171 §2.2, docs/PROTOCOL.md §4.2.3): one
//! case per row of codex 0.171.0's table, with our code and message, and the failures that
//! carry no `data`. The same rows against codex itself are in `codex::conformance`.

use std::os::unix::fs::PermissionsExt;

use serde_json::{json, Value};

use crate::sandbox::{entry, landlock_available, managed, no_landlock_command, root_read, Tree};
use crate::util::{assert_error, Client};

const NOT_FOUND: &str = "failed to spawn process: No such file or directory (os error 2)";
const PERMISSION_DENIED: &str = "failed to spawn process: Permission denied (os error 13)";

/// Files for the spawn rows: a program without the execute bit, a file that is executable
/// but no program, a script whose `#!` interpreter is missing.
struct Programs {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
}

impl Programs {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        for (name, text, mode) in [
            ("not-executable", "#!/bin/sh\necho hi\n", 0o644),
            ("not-a-program", "garbage\n", 0o755),
            (
                "missing-interpreter",
                "#!/nonexistent/interpreter\necho hi\n",
                0o755,
            ),
        ] {
            let path = root.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        Self { _dir: dir, root }
    }

    fn path(&self, name: &str) -> String {
        self.root.join(name).to_str().unwrap().to_owned()
    }
}

fn start(id: &str, extra: Value) -> Value {
    let mut params = json!({
        "processId": id,
        "argv": ["/bin/true"],
        "cwd": "file:///tmp",
        "env": {"PATH": "/usr/bin:/bin"},
        "tty": false,
    });
    for (key, value) in extra.as_object().unwrap() {
        params[key] = value.clone();
    }
    params
}

/// A policy that reads everything and writes nothing, with `extra` members.
fn read_only(extra: Value) -> Value {
    let mut sandbox = managed(vec![root_read()]);
    for (key, value) in extra.as_object().unwrap() {
        sandbox[key] = value.clone();
    }
    sandbox
}

/// A policy granting one `path` entry (besides reading everything).
fn with_permission_path(path: &str) -> Value {
    managed(vec![root_read(), entry(path, "read")])
}

#[track_caller]
fn assert_kind(error: &Value, code: i64, message: &str, kind: &str) {
    assert_error(error, code, message);
    assert_eq!(error["data"], json!({"kind": kind}), "{error}");
}

async fn client() -> Client {
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    client
}

/// Rows `spawnNotFound`: a missing program (absolute, looked up in `PATH`, with a terminal
/// and with piped stdin), a missing `cwd` and a missing `#!` interpreter.
#[tokio::test]
async fn process_start_spawn_not_found_rows() {
    let programs = Programs::new();
    let mut client = client().await;
    let cases = [
        json!({"argv": ["/nonexistent/program"]}),
        json!({"argv": ["no-such-program-xyz"]}),
        json!({"argv": ["/nonexistent/program"], "tty": true}),
        json!({"argv": ["/nonexistent/program"], "pipeStdin": true}),
        json!({"cwd": "file:///nonexistent-directory-xyz"}),
        json!({"argv": [programs.path("missing-interpreter")]}),
    ];
    for (i, extra) in cases.into_iter().enumerate() {
        let error = client
            .call_err("process/start", start(&format!("p{i}"), extra.clone()))
            .await;
        assert_kind(&error, -32603, NOT_FOUND, "spawnNotFound");
    }
}

/// Rows `spawnPermissionDenied`: a program without the execute bit, and a directory.
#[tokio::test]
async fn process_start_spawn_permission_denied_rows() {
    let programs = Programs::new();
    let mut client = client().await;
    for (i, program) in [programs.path("not-executable"), "/tmp".to_owned()]
        .into_iter()
        .enumerate()
    {
        let error = client
            .call_err(
                "process/start",
                start(&format!("p{i}"), json!({"argv": [program]})),
            )
            .await;
        assert_kind(&error, -32603, PERMISSION_DENIED, "spawnPermissionDenied");
    }
}

/// Rows `spawnFailed`: a `cwd` that is a regular file, a file that is no program, and a
/// NUL byte in an argument (and in `arg0`).
#[tokio::test]
async fn process_start_spawn_failed_rows() {
    let programs = Programs::new();
    let mut client = client().await;
    let nul = "failed to spawn process: argument, environment or path contains a NUL byte";
    let cases = [
        (
            json!({"cwd": format!("file://{}", programs.path("not-a-program"))}),
            "failed to spawn process: Not a directory (os error 20)",
        ),
        (
            json!({"argv": [programs.path("not-a-program")]}),
            "failed to spawn process: Exec format error (os error 8)",
        ),
        (json!({"argv": ["/bin/echo", "a\u{0}b"]}), nul),
        (json!({"arg0": "a\u{0}b"}), nul),
    ];
    for (i, (extra, message)) in cases.into_iter().enumerate() {
        let error = client
            .call_err("process/start", start(&format!("p{i}"), extra))
            .await;
        assert_kind(&error, -32603, message, "spawnFailed");
    }
}

/// Rows `sandboxPreparation`: a permission path, the sandbox's `cwd` and a workspace root
/// that name a file of another OS (`C:`) or of another machine (a host).
#[tokio::test]
async fn process_start_sandbox_preparation_rows() {
    let mut client = client().await;
    let foreign =
        |uri: &str| format!("invalid sandbox permission path URI: '{uri}' is invalid on 'linux'");
    let remote = "invalid path `file://otherhost/x`: file URI host `otherhost` is not supported; only an empty host or localhost";
    let cases = [
        (with_permission_path("file:///C:/x"), foreign("file:///C:/x")),
        (with_permission_path("file://otherhost/x"), remote.to_owned()),
        (read_only(json!({"cwd": "file:///C:/x"})), foreign("file:///C:/x")),
        (read_only(json!({"cwd": "file://otherhost/x"})), remote.to_owned()),
        (
            read_only(json!({"workspaceRoots": ["file:///C:/x"]})),
            "file system sandbox workspace root is not native to this exec-server host: 'file:///C:/x' is invalid on 'linux'".to_owned(),
        ),
        (
            read_only(json!({"workspaceRoots": ["file://otherhost/x"]})),
            remote.to_owned(),
        ),
    ];
    for (i, (sandbox, message)) in cases.into_iter().enumerate() {
        let error = client
            .call_err(
                "process/start",
                start(&format!("p{i}"), json!({"sandbox": sandbox})),
            )
            .await;
        assert_kind(&error, -32602, &message, "sandboxPreparation");
    }
}

/// Row `sandboxUnavailable`: a sandbox the host cannot enforce (here: no Landlock). Also
/// for a missing `cwd`, which is only looked at once the sandbox could be enforced.
#[tokio::test]
async fn process_start_sandbox_unavailable_row() {
    let tree = Tree::new();
    let mut command = no_landlock_command(&["--listen", "stdio"]);
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    let mut client = Client::stdio_after_harness_preamble(command).await;
    client.handshake().await;
    for (i, cwd) in [tree.path("allowed"), tree.path("missing")]
        .into_iter()
        .enumerate()
    {
        let error = client
            .call_err(
                "process/start",
                start(
                    &format!("p{i}"),
                    json!({"cwd": cwd, "sandbox": read_only(json!({}))}),
                ),
            )
            .await;
        assert_kind(
            &error,
            -32602,
            "sandbox intent cannot be enforced on this executor",
            "sandboxUnavailable",
        );
    }
    // The same policy's preparation errors come first, as on an enforcing host.
    let error = client
        .call_err(
            "process/start",
            start(
                "p9",
                json!({"sandbox": with_permission_path("file:///C:/x")}),
            ),
        )
        .await;
    assert_eq!(error["data"], json!({"kind": "sandboxPreparation"}));
}

/// The spawn rows inside an enforced sandbox: the launcher's failures carry the same kinds
/// (a missing `cwd`, a program without the execute bit, a `cwd` that is a file); a
/// program the policy forbids to execute carries the kind next to `sandboxDenied`. And the
/// one row where we differ (docs/PROTOCOL.md, "Differences from codex"): a
/// `windowsSandboxLevel` of `mxc` is ignored on Linux, not refused.
#[tokio::test]
async fn process_start_sandboxed_spawn_rows() {
    if !landlock_available() {
        return;
    }
    let programs = Programs::new();
    let tree = Tree::new();
    let mut client = client().await;
    let sandbox = read_only(json!({}));
    let cases = [
        (
            json!({"cwd": tree.path("missing")}),
            NOT_FOUND,
            "spawnNotFound",
        ),
        (
            json!({"argv": [programs.path("not-executable")]}),
            PERMISSION_DENIED,
            "spawnPermissionDenied",
        ),
        (
            json!({"cwd": programs.path("not-a-program")}),
            "failed to spawn process: Not a directory (os error 20)",
            "spawnFailed",
        ),
        (
            json!({"argv": ["/bin/echo", "a\u{0}b"]}),
            "failed to spawn process: argument, environment or path contains a NUL byte",
            "spawnFailed",
        ),
    ];
    for (i, (mut extra, message, kind)) in cases.into_iter().enumerate() {
        extra["sandbox"] = sandbox.clone();
        let error = client
            .call_err("process/start", start(&format!("p{i}"), extra))
            .await;
        assert_kind(&error, -32603, message, kind);
    }

    // A program the policy does not let the process read (or execute).
    std::fs::copy("/bin/true", tree.t.join("outside/prog")).unwrap();
    let denied = managed(vec![root_read(), entry(&tree.path("outside"), "deny")]);
    let error = client
        .call_err(
            "process/start",
            start(
                "denied",
                json!({"argv": [tree.path("outside/prog")], "cwd": tree.path("allowed"),
                       "sandbox": denied}),
            ),
        )
        .await;
    assert_error(&error, -32603, PERMISSION_DENIED);
    assert_eq!(
        error["data"],
        json!({"kind": "spawnPermissionDenied", "sandboxDenied": true}),
        "{error}"
    );

    // Deliberate difference: codex answers -32602 `native MXC is unavailable on this
    // executor` (`sandboxUnavailable`); the Windows members have no effect on Linux.
    let result = client
        .call(
            "process/start",
            start(
                "mxc",
                json!({"sandbox": read_only(json!({"windowsSandboxLevel": "mxc"}))}),
            ),
        )
        .await;
    assert_eq!(result["sandboxType"], "linuxSeccomp", "{result}");
}

/// Failures that are not spawn or sandbox failures carry no `data`, as in codex 0.171.0:
/// params that do not decode, validation of `argv`, `cwd` and `env`, malformed sandbox
/// paths, and a duplicate id.
#[tokio::test]
async fn process_start_errors_without_a_kind() {
    let mut client = client().await;
    client
        .call("process/start", start("taken", json!({})))
        .await;
    let cases = [
        json!({"argv": "not-a-list"}),
        json!({"argv": []}),
        json!({"cwd": "file:///C:/x"}),
        json!({"cwd": "relative/dir"}),
        json!({"env": {"A": "a\u{0}b"}}),
        json!({"sandbox": with_permission_path("relative/x")}),
        json!({"sandbox": with_permission_path("http://host/x")}),
        json!({"sandbox": {"permissions": {"type": "managed"}, "sandboxPolicy": {"type": "read-only"}}}),
        json!({"processId": "taken"}),
    ];
    for (i, extra) in cases.into_iter().enumerate() {
        let error = client
            .call_err("process/start", start(&format!("p{i}"), extra.clone()))
            .await;
        assert!(error.get("data").is_none(), "{extra}: {error}");
        assert!(
            matches!(error["code"].as_i64(), Some(-32600 | -32602)),
            "{error}"
        );
    }
    // fs/* errors neither.
    let error = client
        .call_err(
            "fs/readFile",
            json!({"path": "file:///nonexistent-xyz", "sandbox": null}),
        )
        .await;
    assert!(error.get("data").is_none(), "{error}");
}

//! The fs helper started the way codex starts its own (`<exe> --codex-run-as-fs-helper`,
//! no `--policy`): it runs the request with the rights it was started with, and answers
//! byte for byte what codex 0.169.0's helper answers.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use tokio::io::AsyncWriteExt;

use super::temp_dir;
use crate::util::{server_bin, STEP_TIMEOUT};

/// Runs `program --codex-run-as-fs-helper` with `request` on stdin.
async fn run_helper(program: &Path, request: &str) -> (Option<i32>, String, String) {
    let mut child = tokio::process::Command::new(program)
        .arg("--codex-run-as-fs-helper")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(request.as_bytes()).await;
    drop(stdin);
    let output = tokio::time::timeout(STEP_TIMEOUT, child.wait_with_output())
        .await
        .expect("the helper answers")
        .unwrap();
    (
        output.status.code(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// The same tree every time: `root/{a.txt, sub/{b.txt}, link -> a.txt}` with fixed times.
fn fresh_tree(root: &Path) {
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("a.txt"), b"hello\n").unwrap();
    std::fs::write(root.join("sub/b.txt"), b"b").unwrap();
    std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
    let fixed = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
    for file in ["a.txt", "sub/b.txt"] {
        let file = std::fs::File::options()
            .write(true)
            .open(root.join(file))
            .unwrap();
        file.set_modified(fixed).unwrap();
    }
}

/// Every path under `root` with its content (files) or target (links), sorted.
fn snapshot(root: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let what = if meta.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                "dir".to_owned()
            } else {
                String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned()
            };
            out.push((path.strip_prefix(root).unwrap().to_path_buf(), what));
        }
    }
    out.sort();
    out
}

/// One request line per operation, on the tree at `root`.
fn requests(root: &Path) -> Vec<String> {
    let uri = |p: &str| format!("file://{}/{p}", root.display());
    vec![
        format!(
            r#"{{"operation":"fs/readFile","params":{{"path":"{}","followSymlinks":true,"sandbox":null}}}}"#,
            uri("a.txt")
        ),
        format!(
            r#"{{"operation":"fs/readFile","params":{{"path":"{}","followSymlinks":false,"sandbox":null}}}}"#,
            uri("link")
        ),
        format!(
            r#"{{"operation":"fs/readFile","params":{{"path":"{}","sandbox":null}}}}"#,
            uri("missing")
        ),
        format!(
            r#"{{"operation":"fs/readFile","params":{{"path":"{}","sandbox":null}}}}"#,
            uri("sub")
        ),
        format!(
            r#"{{"operation":"fs/writeFile","params":{{"path":"{}","dataBase64":"aGk=","followSymlinks":true,"sandbox":null}}}}"#,
            uri("new.txt")
        ),
        format!(
            r#"{{"operation":"fs/writeFile","params":{{"path":"{}","dataBase64":"!","sandbox":null}}}}"#,
            uri("bad.txt")
        ),
        format!(
            r#"{{"operation":"fs/createDirectory","params":{{"path":"{}","recursive":true,"sandbox":null}}}}"#,
            uri("x/y")
        ),
        format!(
            r#"{{"operation":"fs/createDirectory","params":{{"path":"{}","recursive":false,"sandbox":null}}}}"#,
            uri("p/q")
        ),
        format!(
            r#"{{"operation":"fs/getMetadata","params":{{"path":"{}","sandbox":null}}}}"#,
            uri("a.txt")
        ),
        format!(
            r#"{{"operation":"fs/getMetadata","params":{{"path":"{}","followSymlinks":false,"sandbox":null}}}}"#,
            uri("missing")
        ),
        format!(
            r#"{{"operation":"fs/canonicalize","params":{{"path":"{}","sandbox":null}}}}"#,
            uri("sub/../link")
        ),
        format!(
            r#"{{"operation":"fs/readDirectory","params":{{"path":"{}","sandbox":null}}}}"#,
            uri("sub")
        ),
        format!(
            r#"{{"operation":"fs/walk","params":{{"path":"{}","options":{{"maxDepth":3,"maxDirectories":10,"maxEntries":10,"followDirectorySymlinks":false}},"sandbox":null}}}}"#,
            uri("sub")
        ),
        format!(
            r#"{{"operation":"fs/remove","params":{{"path":"{}","recursive":true,"force":true,"sandbox":null}}}}"#,
            uri("sub")
        ),
        format!(
            r#"{{"operation":"fs/remove","params":{{"path":"{}","force":false,"sandbox":null}}}}"#,
            uri("missing")
        ),
        format!(
            r#"{{"operation":"fs/copy","params":{{"sourcePath":"{}","destinationPath":"{}","recursive":true,"sandbox":null}}}}"#,
            uri("sub"),
            uri("copy")
        ),
        format!(
            r#"{{"operation":"fs/copy","params":{{"sourcePath":"{}","destinationPath":"{}","recursive":false,"sandbox":null}}}}"#,
            uri("sub"),
            uri("copy2")
        ),
        r#"{"operation":"fs/readFile","params":{"sandbox":null}}"#.to_owned(),
        "not json".to_owned(),
    ]
}

/// Requests whose answers differ from codex's on purpose (docs/PROTOCOL.md, "Differences
/// from codex 0.169.0"), and why.
fn known_difference(request: &str) -> Option<&'static str> {
    if request.contains(r#""followSymlinks":false,"sandbox":null}}"#) && request.contains("/link") {
        Some("a refused last link is -32600 `is a symbolic link`, as the server answers")
    } else if request.contains("fs/getMetadata") && request.contains("a.txt") {
        Some("createdAtMs is the birth time where the file system has one; codex's build reports 0")
    } else if request.contains(r#"{"sandbox":null}"#) {
        Some("params that do not decode are a -32602 answer, not a helper failure")
    } else {
        None
    }
}

#[tokio::test]
async fn without_a_policy_the_helper_answers_like_codex() {
    let (_keep, dir) = temp_dir();
    let root = dir.join("tree");
    let ours = server_bin();
    let codex = crate::codex::codex_bin("without_a_policy_the_helper_answers_like_codex");
    for request in requests(&root) {
        fresh_tree(&root);
        let (status, stdout, stderr) = run_helper(&ours, &request).await;
        let after = snapshot(&root);
        // Ours on its own: one answer line on success or a failure of the request, a
        // message on stderr when the request itself cannot be read.
        match status {
            Some(0) => {
                assert!(
                    stdout.ends_with('\n') && stdout.lines().count() == 1,
                    "{stdout:?}"
                );
                assert!(stderr.is_empty(), "{request}: {stderr}");
            }
            Some(1) => {
                assert!(stdout.is_empty(), "{request}: {stdout}");
                assert!(stderr.starts_with("fs sandbox helper failed: "), "{stderr}");
            }
            other => panic!("{request}: exit {other:?}, {stderr}"),
        }
        let Some(codex) = &codex else { continue };
        fresh_tree(&root);
        let (codex_status, codex_stdout, codex_stderr) = run_helper(codex, &request).await;
        assert_eq!(after, snapshot(&root), "{request}");
        if let Some(why) = known_difference(&request) {
            assert_ne!(stdout, codex_stdout, "no longer differs ({why}): {request}");
            continue;
        }
        assert_eq!(
            (status, &stdout),
            (codex_status, &codex_stdout),
            "{request}\nours: {stderr}\ncodex: {codex_stderr}"
        );
    }
}

#[tokio::test]
async fn without_a_policy_the_helper_gains_nothing() {
    let (_keep, dir) = temp_dir();
    let request = r#"{"operation":"fs/readFile","params":{"path":"file:///proc/self/status","sandbox":null}}"#;
    let (status, stdout, stderr) = run_helper(&server_bin(), request).await;
    assert_eq!(status, Some(0), "{stderr}");
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let status_text = crate::util::b64decode(&answer["payload"]["response"]["dataBase64"]);
    let status_text = String::from_utf8(status_text).unwrap();
    assert!(
        status_text.lines().any(|l| l == "NoNewPrivs:\t1"),
        "{status_text}"
    );
    // A request carrying a sandbox is not run (it must go through a policy).
    let request = format!(
        r#"{{"operation":"fs/writeFile","params":{{"path":"file://{}/x","dataBase64":"eA==","sandbox":{{"permissions":{{"type":"disabled"}}}}}}}}"#,
        dir.display()
    );
    let (_, stdout, _) = run_helper(&server_bin(), &request).await;
    assert_eq!(
        stdout,
        "{\"status\":\"error\",\"payload\":{\"code\":-32600,\"message\":\"direct filesystem operations do not accept sandbox context\"}}\n"
    );
    assert!(!dir.join("x").exists());
}

//! Anything resolved before confinement keeps the unconfined view: the launcher of a
//! sandboxed process runs in the working directory the keeper entered before the mounts of
//! mount narrowing existed. Each member the launcher holds from before confinement is tried
//! here: a working directory inside a denied directory, below it, reached through a link,
//! inside a read-only carve-out, and the same through `/proc/self/cwd`.

use serde_json::{json, Value};

use crate::sandbox::{client, entry, landlock_available, managed, root_read, run_to_exit, Tree};

const SECRET: &str = "the-denied-secret";

/// `T/allowed` writable with `T/allowed/private` denied, holding a secret.
fn denied_tree() -> (Tree, Value) {
    let tree = Tree::new();
    std::fs::create_dir_all(tree.t.join("allowed/private/sub")).unwrap();
    std::fs::write(tree.t.join("allowed/private/secret.txt"), SECRET).unwrap();
    std::fs::write(tree.t.join("allowed/private/sub/secret.txt"), SECRET).unwrap();
    std::os::unix::fs::symlink(tree.t.join("allowed/private"), tree.t.join("allowed/link"))
        .unwrap();
    let policy = managed(vec![
        root_read(),
        entry(&tree.path("allowed"), "write"),
        entry(&tree.path("allowed/private"), "deny"),
    ]);
    (tree, policy)
}

/// Starts `script` in `cwd`; the output and exit, or the start's error.
async fn run_in(cwd: &str, script: &str, policy: &Value) -> Result<String, Value> {
    let mut client = client().await;
    let params = json!({"processId": "p", "argv": ["/bin/sh", "-c", script], "cwd": cwd,
        "env": {"PATH": "/usr/bin:/bin"}, "tty": false, "sandbox": policy});
    client.request("process/start", params).await?;
    Ok(run_to_exit(&mut client, "p").await.0)
}

/// Every way the process could read the secret from where it starts.
const READ_SECRET: &str = "cat secret.txt; cat ./sub/secret.txt; cat /proc/self/cwd/secret.txt; \
     cat ../private/secret.txt; ls -la; true";

#[tokio::test]
async fn a_working_directory_in_a_denied_directory_shows_nothing_of_it() {
    if !landlock_available() {
        return;
    }
    let (tree, policy) = denied_tree();
    for cwd in ["allowed/private", "allowed/private/sub", "allowed/link"] {
        match run_in(&tree.path(cwd), READ_SECRET, &policy).await {
            Ok(output) => assert!(!output.contains(SECRET), "cwd {cwd}: {output}"),
            // The directory is gone behind the narrowing: the start fails, leaking nothing.
            Err(error) => assert!(
                error["message"].as_str().unwrap().contains("No such file"),
                "cwd {cwd}: {error}"
            ),
        }
    }
}

#[tokio::test]
async fn a_working_directory_in_a_carve_out_cannot_write_it() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    std::fs::create_dir_all(tree.t.join("allowed/.git/hooks")).unwrap();
    std::fs::write(tree.t.join("allowed/.git/config"), "[core]\n").unwrap();
    let policy = managed(vec![root_read(), entry(&tree.path("allowed"), "write")]);
    let script = "echo '[core] fsmonitor = evil' >> config; \
                  echo evil > hooks/post-checkout; echo evil > /proc/self/cwd/HEAD; true";
    let output = run_in(&tree.path("allowed/.git"), script, &policy)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(tree.t.join("allowed/.git/config")).unwrap(),
        "[core]\n",
        "{output}"
    );
    assert!(!tree.t.join("allowed/.git/hooks/post-checkout").exists());
    assert!(!tree.t.join("allowed/.git/HEAD").exists());
    assert!(output.contains("Read-only file system"), "{output}");
}

/// The launcher's own descriptors: none but the target's stdio reaches it.
#[tokio::test]
async fn a_sandboxed_process_holds_no_descriptor_beyond_its_stdio() {
    if !landlock_available() {
        return;
    }
    let (tree, policy) = denied_tree();
    let output = run_in(&tree.path("allowed"), "ls /proc/self/fd", &policy)
        .await
        .unwrap();
    let mut fds: Vec<&str> = output.split_whitespace().collect();
    fds.sort_unstable();
    // 0–2, plus the descriptor `ls` itself opened to list the directory.
    assert_eq!(fds, ["0", "1", "2", "3"], "{output}");
}

//! Recursive `fs/copy` and the other recursive operations never hand out what the policy denies.
//!
//! The attacker copies a tree that holds denied entries into a writable root and then reads
//! them from the copy; or merges a tree into a destination whose links lead into a carve-out;
//! or removes a directory around a glob-denied file. Each refusal is checked on the disk.

use std::os::unix::fs::symlink;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::{json, Value};

use crate::sandbox::{assert_denied, client, entry, landlock_available, managed, root_read, Tree};
use crate::util::*;

/// `root: read`, `T/allowed: write`, deny `T/src/private`, deny `**/*.pem` (cwd = T).
fn denying_policy(tree: &Tree) -> Value {
    let mut policy = managed(vec![
        root_read(),
        entry(&tree.path("allowed"), "write"),
        entry(&tree.path("src/private"), "deny"),
        json!({"path": {"type": "glob_pattern", "pattern": "**/*.pem"}, "access": "deny"}),
    ]);
    policy["cwd"] = json!(tree.t.to_str().unwrap());
    policy
}

async fn copy(client: &mut Client, from: &str, to: &str, sandbox: &Value) -> Result<Value, Value> {
    client
        .request(
            "fs/copy",
            json!({"sourcePath": from, "destinationPath": to, "recursive": true, "sandbox": sandbox}),
        )
        .await
}

/// Every path below `root` (links not followed), relative to it.
fn listing(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            found.push(
                path.strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
            );
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    found.sort();
    found
}

#[tokio::test]
async fn copying_a_tree_never_copies_what_the_policy_denies() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let src = tree.t.join("src");
    std::fs::create_dir_all(src.join("private")).unwrap();
    std::fs::write(src.join("normal.txt"), "normal").unwrap();
    std::fs::write(src.join("private/secret"), "SECRET").unwrap();
    std::fs::write(src.join("key.pem"), "KEY").unwrap();
    // One tree per kind of denied entry, each next to a harmless file, so each rule is
    // proven on its own.
    for (dir, denied) in [("only-pem", "key.pem"), ("only-link", "link")] {
        std::fs::create_dir_all(tree.t.join(dir)).unwrap();
        std::fs::write(tree.t.join(dir).join("normal.txt"), "normal").unwrap();
        if denied == "link" {
            symlink(src.join("private/secret"), tree.t.join(dir).join("link")).unwrap();
        } else {
            std::fs::write(tree.t.join(dir).join(denied), "KEY").unwrap();
        }
    }
    symlink(src.join("private/secret"), src.join("link")).unwrap();
    let mut client = client().await;
    let policy = denying_policy(&tree);

    for (from, to, denied_entry) in [
        ("src", "allowed/dst", None),
        ("only-pem", "allowed/dst-pem", Some("only-pem/key.pem")),
        ("only-link", "allowed/dst-link", Some("src/private/secret")),
    ] {
        let error = copy(&mut client, &tree.path(from), &tree.path(to), &policy)
            .await
            .expect_err(from);
        assert_denied(&error);
        let message = error["message"].as_str().unwrap();
        assert!(
            message.starts_with("read access to ")
                && message.ends_with(" is not permitted by the filesystem sandbox"),
            "{message}"
        );
        if let Some(entry) = denied_entry {
            assert_eq!(
                message,
                format!(
                    "read access to {} is not permitted by the filesystem sandbox",
                    tree.path(entry)
                )
            );
        }
        // The refusal comes before anything is written.
        let copied = listing(&tree.t.join(to));
        assert!(copied.is_empty(), "{from} → {to} left {copied:?}");
    }
    // What is allowed still copies.
    std::fs::remove_file(tree.t.join("only-pem/key.pem")).unwrap();
    copy(
        &mut client,
        &tree.path("only-pem"),
        &tree.path("allowed/dst-pem"),
        &policy,
    )
    .await
    .unwrap();
    assert_eq!(listing(&tree.t.join("allowed/dst-pem")), ["normal.txt"]);
}

#[tokio::test]
async fn copying_a_tree_never_copies_the_servers_config_file() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let conf = tree.t.join("conf");
    std::fs::create_dir(&conf).unwrap();
    std::fs::write(conf.join("notes.txt"), "notes").unwrap();
    let config = conf.join("server.toml");
    std::fs::write(&config, "[websocket]\nbearer_token = \"do-not-leak\"\n").unwrap();
    // A config file holding a secret must be owner-only, or the server refuses to start.
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    client.handshake().await;
    let policy = managed(vec![root_read(), entry(&tree.path("allowed"), "write")]);
    let error = copy(
        &mut client,
        &tree.path("conf"),
        &tree.path("allowed/conf-copy"),
        &policy,
    )
    .await
    .unwrap_err();
    assert_denied(&error);
    assert_eq!(
        error["message"],
        format!(
            "read access to {} is not permitted by the filesystem sandbox",
            config.display()
        )
    );
    assert!(!tree.t.join("allowed/conf-copy/server.toml").exists());
    let read = client
        .request(
            "fs/readFile",
            json!({"path": tree.path("allowed/conf-copy/server.toml"), "sandbox": policy}),
        )
        .await;
    assert!(read.is_err(), "the config file leaked through a copy");
}

#[tokio::test]
async fn copying_into_a_tree_never_writes_into_its_read_only_git() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let git = tree.t.join("allowed/.git");
    std::fs::create_dir(&git).unwrap();
    std::fs::write(git.join("config"), "c").unwrap();
    // The destination tree reaches the carve-out through a link inside it.
    std::fs::create_dir(tree.t.join("allowed/proj")).unwrap();
    symlink("../.git", tree.t.join("allowed/proj/meta")).unwrap();
    std::fs::create_dir_all(tree.t.join("incoming/meta")).unwrap();
    std::fs::write(tree.t.join("incoming/meta/config"), "evil").unwrap();
    std::fs::write(tree.t.join("incoming/readme"), "r").unwrap();
    // And a tree that brings its own `.git` into one with an explicit read-only `.git`.
    std::fs::create_dir_all(tree.t.join("allowed/proj2/.git")).unwrap();
    std::fs::write(tree.t.join("allowed/proj2/.git/HEAD"), "h").unwrap();
    std::fs::create_dir_all(tree.t.join("incoming2/.git")).unwrap();
    std::fs::write(tree.t.join("incoming2/.git/HEAD"), "evil").unwrap();
    let mut client = client().await;
    let policy = managed(vec![
        root_read(),
        entry(&tree.path("allowed"), "write"),
        entry(&tree.path("allowed/proj2/.git"), "read"),
    ]);

    let error = copy(
        &mut client,
        &tree.path("incoming"),
        &tree.path("allowed/proj"),
        &policy,
    )
    .await
    .unwrap_err();
    assert_denied(&error);
    // The entry `meta` would be merged into the directory its link leads to.
    assert_eq!(
        error["message"],
        format!(
            "write access to {} is not permitted by the filesystem sandbox",
            tree.path("allowed/.git")
        )
    );
    assert_eq!(std::fs::read_to_string(git.join("config")).unwrap(), "c");
    assert!(!tree.t.join("allowed/proj/readme").exists());

    let error = copy(
        &mut client,
        &tree.path("incoming2"),
        &tree.path("allowed/proj2"),
        &policy,
    )
    .await
    .unwrap_err();
    assert_denied(&error);
    assert_eq!(
        std::fs::read_to_string(tree.t.join("allowed/proj2/.git/HEAD")).unwrap(),
        "h"
    );
}

#[tokio::test]
async fn removing_a_tree_around_a_glob_denied_file_deletes_nothing() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let doomed = tree.t.join("allowed/doomed");
    std::fs::create_dir_all(doomed.join("a/b")).unwrap();
    std::fs::write(doomed.join("first.txt"), "1").unwrap();
    std::fs::write(doomed.join("a/b/key.pem"), "KEY").unwrap();
    std::fs::write(doomed.join("a/z.txt"), "z").unwrap();
    let before = listing(&doomed);
    let mut client = client().await;
    let mut policy = denying_policy(&tree);
    policy["cwd"] = json!(tree.path("allowed"));
    let error = client
        .call_err(
            "fs/remove",
            json!({"path": tree.path("allowed/doomed"), "recursive": true, "sandbox": policy}),
        )
        .await;
    assert_denied(&error);
    assert_eq!(
        error["message"],
        format!(
            "write access to {} is not permitted by the filesystem sandbox",
            tree.path("allowed/doomed/a/b/key.pem")
        )
    );
    assert_eq!(listing(&doomed), before);
    // Without the denied file the same removal goes through.
    std::fs::remove_file(doomed.join("a/b/key.pem")).unwrap();
    client
        .call(
            "fs/remove",
            json!({"path": tree.path("allowed/doomed"), "recursive": true, "sandbox": policy}),
        )
        .await;
    assert!(!doomed.exists());
}

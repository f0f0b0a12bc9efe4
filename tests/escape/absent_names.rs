//! A rule about a name that does not exist yet must still hold: under `write` on a root
//! whose `.git`, `.codex` or `.agents` is missing, a sandboxed process tries to create each
//! of them in every way a shell offers — as a directory with the payload inside, as a file,
//! as a symbolic link, by renaming a prepared directory over the name — and none of it may
//! reach the host. Afterwards the names are as absent as before.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::sandbox::{
    client, entry, landlock_available, managed, root_read, run_to_exit, start_sandboxed, Tree,
};
use crate::util::*;

const NAMES: [&str; 3] = [".git", ".codex", ".agents"];

fn policy(tree: &Tree) -> Value {
    managed(vec![root_read(), entry(&tree.path("allowed"), "write")])
}

/// Waits until none of the carve-out names exists under `allowed`.
async fn wait_until_absent(tree: &Tree) {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let left: Vec<&str> = NAMES
            .into_iter()
            .filter(|n| std::fs::symlink_metadata(tree.t.join("allowed").join(n)).is_ok())
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "still there: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn missing_carve_outs_cannot_be_created_in_any_way() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let script = "mkdir -p .git/hooks; echo '[core] hooksPath = /tmp' > .git/config; \
         echo evil > .git/hooks/post-checkout; \
         mkdir -p .codex; echo 'mcp = evil' > .codex/config.toml; \
         mkdir -p .agents/skills; echo evil > .agents/skills/SKILL.md; \
         echo 'gitdir: /tmp/evil' > .git; ln -s /tmp .codex; \
         mkdir -p prepared/hooks && echo evil > prepared/hooks/post-checkout; \
         mv -T prepared .agents; mv prepared .git; rmdir .git; \
         echo ok > allowed-file; true";
    let mut client = client().await;
    let started = start_sandboxed(
        &mut client,
        "p",
        serde_json::json!(["/bin/sh", "-c", script]),
        &tree.path("allowed"),
        &policy(&tree),
    )
    .await;
    assert_eq!(started["sandboxType"], "linuxSeccomp");
    let (output, _) = run_to_exit(&mut client, "p").await;
    // Ordinary writes still work.
    assert_eq!(
        std::fs::read_to_string(tree.t.join("allowed/allowed-file")).unwrap(),
        "ok\n",
        "{output}"
    );
    wait_until_absent(&tree).await;
}

/// The name is held while any process that needs it runs: the start that created the
/// placeholder ends first, and the one that shares it is still protected.
#[tokio::test]
async fn a_missing_carve_out_stays_protected_while_any_process_of_the_root_runs() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let mut client = client().await;
    let cwd = tree.path("allowed");
    let first = serde_json::json!(["/bin/sh", "-c", "sleep 1"]);
    start_sandboxed(&mut client, "first", first, &cwd, &policy(&tree)).await;
    let argv = serde_json::json!(["/bin/sh", "-c", "sleep 4; mkdir .git/hooks; echo $?"]);
    start_sandboxed(&mut client, "second", argv, &cwd, &policy(&tree)).await;
    let exited = client.notification("process/exited").await;
    assert_eq!(exited["processId"], "first");
    // The start that made the placeholder has ended; the other still cannot create there.
    let (output, _) = run_to_exit(&mut client, "second").await;
    assert!(output.contains("Read-only file system"), "{output}");
    assert!(!tree.t.join("allowed/.git/hooks").exists());
    wait_until_absent(&tree).await;
}

/// A carve-out's protection must not come off by renaming a directory above it and making
/// the path again: with `T/allowed` and `T/allowed/repo` both writable, and an explicit
/// read-only entry two levels below a root, each rename is refused.
#[tokio::test]
async fn renaming_a_directory_above_a_carve_out_is_refused() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    std::fs::create_dir_all(tree.t.join("allowed/repo/.git")).unwrap();
    std::fs::write(tree.t.join("allowed/repo/.git/config"), "[core]\n").unwrap();
    std::fs::create_dir_all(tree.t.join("allowed/repo/conf/app")).unwrap();
    std::fs::write(tree.t.join("allowed/repo/conf/app/settings.json"), "{}").unwrap();
    let policy = managed(vec![
        root_read(),
        entry(&tree.path("allowed"), "write"),
        entry(&tree.path("allowed/repo"), "write"),
        entry(&tree.path("allowed/repo/conf/app/settings.json"), "read"),
    ]);
    let script = "mv repo repo.old; mkdir -p repo/.git/hooks; echo evil > repo/.git/config; \
         cd repo; mv conf conf.old; mkdir -p conf/app; echo evil > conf/app/settings.json; \
         mv conf/app conf/app.old; true";
    let mut client = client().await;
    let argv = serde_json::json!(["/bin/sh", "-c", script]);
    start_sandboxed(&mut client, "p", argv, &tree.path("allowed"), &policy).await;
    let (output, _) = run_to_exit(&mut client, "p").await;
    assert!(!tree.t.join("allowed/repo.old").exists(), "{output}");
    assert!(!tree.t.join("allowed/repo/conf.old").exists(), "{output}");
    let config = std::fs::read_to_string(tree.t.join("allowed/repo/.git/config")).unwrap();
    assert_eq!(config, "[core]\n", "{output}");
    let settings =
        std::fs::read_to_string(tree.t.join("allowed/repo/conf/app/settings.json")).unwrap();
    assert_eq!(settings, "{}", "{output}");
}

/// A carve-out that is a symbolic link: `.codex` pointing at a shared directory, `.git`
/// pointing at a repository that is not there yet, and an explicit read-only entry that is
/// a link into the writable root. Before, only what each link pointed at was protected:
/// the process removed the link and put a directory of its own in its place, planting git
/// hooks and agent configuration in the writable root. Now the link itself is pinned and
/// its target is a carve-out too, existing or not.
#[tokio::test]
async fn a_carve_out_that_is_a_link_keeps_its_name_and_its_target() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let allowed = tree.t.join("allowed");
    std::fs::create_dir(tree.t.join("shared-codex")).unwrap();
    std::os::unix::fs::symlink(tree.t.join("shared-codex"), allowed.join(".codex")).unwrap();
    std::os::unix::fs::symlink("gitdir-missing", allowed.join(".git")).unwrap();
    std::fs::create_dir(allowed.join("policies.d")).unwrap();
    std::os::unix::fs::symlink("policies.d", allowed.join("policies")).unwrap();
    let policy = managed(vec![
        root_read(),
        entry(&tree.path("allowed"), "write"),
        entry(&tree.path("allowed/policies"), "read"),
    ]);
    let script = "rm -f .codex; mkdir .codex; echo 'mcp = evil' > .codex/config.toml; \
         mv .codex moved; echo evil > .codex/config.toml; \
         rm -f .git; mkdir -p .git/hooks; echo evil > .git/config; \
         mkdir -p gitdir-missing/hooks; echo evil > gitdir-missing/config; \
         rm -f policies; mkdir policies; echo 'trusted = true' > policies/allow.toml; \
         echo evil > policies.d/allow.toml; \
         echo ok > allowed-file; true";
    let mut client = client().await;
    let started = start_sandboxed(
        &mut client,
        "p",
        serde_json::json!(["/bin/sh", "-c", script]),
        &tree.path("allowed"),
        &policy,
    )
    .await;
    assert_eq!(started["sandboxType"], "linuxSeccomp");
    let (output, _) = run_to_exit(&mut client, "p").await;
    assert_eq!(
        std::fs::read_to_string(allowed.join("allowed-file")).unwrap(),
        "ok\n",
        "{output}"
    );
    for (name, target) in [
        (".codex", tree.t.join("shared-codex")),
        (".git", "gitdir-missing".into()),
        ("policies", "policies.d".into()),
    ] {
        assert_eq!(
            std::fs::read_link(allowed.join(name)).ok(),
            Some(target),
            "{name} was replaced: {output}"
        );
    }
    assert!(std::fs::read_dir(tree.t.join("shared-codex"))
        .unwrap()
        .next()
        .is_none());
    assert!(!allowed.join("gitdir-missing/config").exists(), "{output}");
    assert!(!allowed.join("policies.d/allow.toml").exists(), "{output}");
    assert!(!allowed.join("moved").exists(), "{output}");
}

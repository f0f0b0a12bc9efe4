use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::symlink;

use super::*;
use crate::config::FsConfig;
use crate::walk::validate;

fn options(max_depth: usize, max_directories: usize, max_entries: usize) -> WalkOptions {
    WalkOptions {
        max_depth,
        max_directories,
        max_entries,
        follow_directory_symlinks: false,
        prune_hidden_directories: None,
    }
}

const BUDGET: usize = 4 * 1024 * 1024;

/// The entries' paths relative to `root`, with a `/` after directories.
fn listed(root: &Path, result: &WalkResult) -> Vec<String> {
    let prefix = to_file_uri(root);
    result
        .entries
        .iter()
        .map(|e| {
            let rel = e
                .path
                .strip_prefix(&prefix)
                .unwrap()
                .trim_start_matches('/');
            match e.kind {
                WalkEntryKind::Directory => format!("{rel}/"),
                WalkEntryKind::File => rel.to_owned(),
            }
        })
        .collect()
}

fn tree(paths: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for path in paths {
        let full = dir.path().join(path.trim_end_matches('/'));
        if path.ends_with('/') {
            fs::create_dir_all(full).unwrap();
        } else {
            fs::create_dir_all(full.parent().unwrap()).unwrap();
            fs::write(full, b"x").unwrap();
        }
    }
    dir
}

#[test]
fn breadth_first_in_byte_order() {
    let dir = tree(&["b/x", "a/y", "a/d/z", "c.txt", "Z"]);
    let result = walk(dir.path(), &options(8, 100, 100), BUDGET).unwrap();
    assert_eq!(
        listed(dir.path(), &result),
        ["Z", "a/", "b/", "c.txt", "a/d/", "a/y", "b/x", "a/d/z"]
    );
    assert!(!result.truncated);
    assert!(result.errors.is_empty());
}

#[test]
fn depth_zero_lists_only_the_roots_entries() {
    let dir = tree(&["a/y", "f"]);
    let result = walk(dir.path(), &options(0, 100, 100), BUDGET).unwrap();
    assert_eq!(listed(dir.path(), &result), ["a/", "f"]);
    assert!(!result.truncated);
    let result = walk(dir.path(), &options(1, 100, 100), BUDGET).unwrap();
    assert_eq!(listed(dir.path(), &result), ["a/", "f", "a/y"]);
}

#[test]
fn entry_limit_counts_skipped_names_and_stops_the_walk() {
    let dir = tree(&["a", "b", "c"]);
    symlink("missing", dir.path().join("0-dangling")).unwrap();
    // Exactly as many names as allowed: not truncated.
    let result = walk(dir.path(), &options(8, 100, 4), BUDGET).unwrap();
    assert_eq!(listed(dir.path(), &result), ["a", "b", "c"]);
    assert!(!result.truncated);
    // The dangling link is the first name and uses up one of the three.
    let result = walk(dir.path(), &options(8, 100, 3), BUDGET).unwrap();
    assert_eq!(listed(dir.path(), &result), ["a", "b"]);
    assert_eq!(result.errors.len(), 1);
    assert!(result.truncated);
}

#[test]
fn directory_limit_counts_the_root_and_lets_queued_directories_finish() {
    let dir = tree(&["a/x", "b/y", "c/z"]);
    let result = walk(dir.path(), &options(8, 2, 100), BUDGET).unwrap();
    assert_eq!(listed(dir.path(), &result), ["a/", "b/", "c/", "a/x"]);
    assert!(result.truncated);
    let result = walk(dir.path(), &options(8, 4, 100), BUDGET).unwrap();
    assert_eq!(
        listed(dir.path(), &result),
        ["a/", "b/", "c/", "a/x", "b/y", "c/z"]
    );
    assert!(!result.truncated);
}

#[test]
fn response_budget_truncates_before_the_item_that_does_not_fit() {
    let dir = tree(&["a", "b", "c"]);
    let per_item = to_file_uri(&dir.path().join("a")).len() + WALK_ITEM_OVERHEAD_BYTES;
    let result = walk(dir.path(), &options(8, 100, 100), 2 * per_item).unwrap();
    assert_eq!(listed(dir.path(), &result), ["a", "b"]);
    assert!(result.truncated);
    let result = walk(dir.path(), &options(8, 100, 100), 3 * per_item).unwrap();
    assert_eq!(listed(dir.path(), &result), ["a", "b", "c"]);
    assert!(!result.truncated);
}

#[test]
fn errors_are_recorded_charged_and_the_walk_goes_on() {
    let dir = tree(&["b"]);
    symlink("missing", dir.path().join("a")).unwrap();
    let result = walk(dir.path(), &options(8, 100, 100), BUDGET).unwrap();
    assert_eq!(listed(dir.path(), &result), ["b"]);
    assert_eq!(
        result.errors,
        [WalkError {
            path: to_file_uri(&dir.path().join("a")),
            message: io_error_text(&io::Error::from_raw_os_error(libc::ENOENT)),
        }]
    );
    // A budget too small for the error record stops the walk before `b`.
    let error_cost = result.errors[0].path.len() + result.errors[0].message.len() + 64;
    let result = walk(dir.path(), &options(8, 100, 100), error_cost - 1).unwrap();
    assert!(result.entries.is_empty() && result.errors.is_empty());
    assert!(result.truncated);
}

#[test]
fn directory_links_are_skipped_unless_followed_and_cycles_are_listed_once() {
    let dir = tree(&["real/f"]);
    symlink("real", dir.path().join("link")).unwrap();
    symlink("..", dir.path().join("real/up")).unwrap();
    symlink("real/f", dir.path().join("file-link")).unwrap();

    let result = walk(dir.path(), &options(8, 100, 100), BUDGET).unwrap();
    assert_eq!(listed(dir.path(), &result), ["real/", "real/f"]);

    let mut follow = options(8, 100, 100);
    follow.follow_directory_symlinks = true;
    let result = walk(dir.path(), &follow, BUDGET).unwrap();
    // `link` sorts first, so `real` is listed through it; `real` itself is then a directory
    // already visited, and `up` leads back to the root. Links to files are never listed.
    assert_eq!(
        listed(dir.path(), &result),
        ["link/", "real/", "link/f", "link/up/"]
    );
    assert!(!result.truncated);
}

#[test]
fn followed_links_are_reported_under_the_links_path() {
    let dir = tree(&["outside/inner/f", "root/"]);
    let root = dir.path().join("root");
    symlink("../outside", root.join("link")).unwrap();
    let mut follow = options(8, 100, 100);
    follow.follow_directory_symlinks = true;
    let result = walk(&root, &follow, BUDGET).unwrap();
    assert_eq!(
        listed(&root, &result),
        ["link/", "link/inner/", "link/inner/f"]
    );
}

#[test]
fn hidden_directories_are_listed_but_pruned_on_request() {
    let dir = tree(&[".git/HEAD", ".env", "src/main.rs"]);
    let mut prune = options(8, 100, 100);
    prune.prune_hidden_directories = Some(true);
    let result = walk(dir.path(), &prune, BUDGET).unwrap();
    assert_eq!(
        listed(dir.path(), &result),
        [".env", ".git/", "src/", "src/main.rs"]
    );
    let result = walk(dir.path(), &options(8, 100, 100), BUDGET).unwrap();
    assert_eq!(
        listed(dir.path(), &result),
        [".env", ".git/", "src/", ".git/HEAD", "src/main.rs"]
    );
}

#[test]
fn roots_that_are_not_walkable_directories() {
    let dir = tree(&["f", "d/x"]);
    let empty = |r: &WalkResult| r.entries.is_empty() && r.errors.is_empty() && !r.truncated;
    let result = walk(&dir.path().join("f"), &options(8, 100, 100), BUDGET).unwrap();
    assert!(empty(&result));
    symlink("d", dir.path().join("link")).unwrap();
    let link = dir.path().join("link");
    assert!(empty(&walk(&link, &options(8, 100, 100), BUDGET).unwrap()));
    let mut follow = options(8, 100, 100);
    follow.follow_directory_symlinks = true;
    assert_eq!(listed(&link, &walk(&link, &follow, BUDGET).unwrap()), ["x"]);
    let missing = walk(&dir.path().join("nope"), &options(8, 100, 100), BUDGET).unwrap_err();
    assert_eq!(missing.code, -32004);
}

#[test]
fn names_that_are_not_utf8_are_percent_encoded() {
    let dir = tree(&[]);
    let name = OsString::from_vec(b"caf\xe9 #1".to_vec());
    fs::write(dir.path().join(&name), b"").unwrap();
    let result = walk(dir.path(), &options(0, 1, 10), BUDGET).unwrap();
    let expected = format!("{}/caf%E9%20%231", to_file_uri(dir.path()));
    assert_eq!(result.entries[0].path, expected);
}

#[test]
fn limits_are_validated_against_the_configured_maximums() {
    let config = FsConfig::default();
    assert_eq!(
        validate(&options(0, 0, 1), &config),
        Err(RpcError::walk_limits_zero())
    );
    assert_eq!(
        validate(&options(0, 1, 0), &config),
        Err(RpcError::walk_limits_zero())
    );
    assert!(validate(&options(64, 10_000, 50_000), &config).is_ok());
    for too_much in [
        options(65, 1, 1),
        options(0, 10_001, 1),
        options(0, 1, 50_001),
    ] {
        assert_eq!(
            validate(&too_much, &config).unwrap_err().message,
            "filesystem walk limits exceed maximums: depth=64, directories=10000, entries=50000"
        );
    }
    let small = FsConfig {
        walk_max_depth: 2,
        walk_max_directories: 3,
        walk_max_entries: 4,
        ..FsConfig::default()
    };
    assert_eq!(
        validate(&options(3, 1, 1), &small),
        Err(RpcError::walk_limits_exceed(2, 3, 4))
    );
}

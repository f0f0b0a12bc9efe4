//! `fs/walk` (§5.11).

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::{assert_os_error, forms, started, temp_dir, uri, walk_options};
use crate::util::assert_error;

/// root/{Z, a/{d/{z}, y}, b/{x}, c.txt, .hidden/{h}}
fn walk_tree() -> (tempfile::TempDir, PathBuf) {
    let (keep, dir) = temp_dir();
    for d in ["a/d", "b", ".hidden"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    for f in ["Z", "a/d/z", "a/y", "b/x", "c.txt", ".hidden/h"] {
        std::fs::write(dir.join(f), b"").unwrap();
    }
    (keep, dir)
}

#[tokio::test]
async fn walk_is_breadth_first_sorted_and_pruned_on_request() {
    let mut client = started(None).await;
    let (_keep, dir) = walk_tree();
    for path in forms(&dir) {
        let result = client
            .call(
                "fs/walk",
                json!({"path": path, "options": walk_options(8, 100, 100)}),
            )
            .await;
        assert_eq!(
            walked(&dir, &result),
            [
                ".hidden/",
                "Z",
                "a/",
                "b/",
                "c.txt",
                ".hidden/h",
                "a/d/",
                "a/y",
                "b/x",
                "a/d/z"
            ]
        );
        assert_eq!(result["errors"], json!([]));
        assert_eq!(result["truncated"], false);
    }
    let mut prune = walk_options(8, 100, 100);
    prune["pruneHiddenDirectories"] = json!(true);
    let result = client
        .call("fs/walk", json!({"path": uri(&dir), "options": prune}))
        .await;
    assert_eq!(
        walked(&dir, &result),
        [".hidden/", "Z", "a/", "b/", "c.txt", "a/d/", "a/y", "b/x", "a/d/z"]
    );
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(0, 100, 100)}),
        )
        .await;
    assert_eq!(
        walked(&dir, &result),
        [".hidden/", "Z", "a/", "b/", "c.txt"]
    );
    assert_eq!(result["truncated"], false);
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(1, 100, 100)}),
        )
        .await;
    assert_eq!(
        walked(&dir, &result),
        [
            ".hidden/",
            "Z",
            "a/",
            "b/",
            "c.txt",
            ".hidden/h",
            "a/d/",
            "a/y",
            "b/x"
        ]
    );
}

#[tokio::test]
async fn walk_truncates_at_entry_and_directory_limits() {
    let mut client = started(None).await;
    let (_keep, dir) = walk_tree();
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(8, 100, 3)}),
        )
        .await;
    assert_eq!(walked(&dir, &result), [".hidden/", "Z", "a/"]);
    assert_eq!(result["truncated"], true);
    // The root counts as one directory: only `.hidden` is queued, the rest are listed but
    // not descended.
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(8, 2, 100)}),
        )
        .await;
    assert_eq!(
        walked(&dir, &result),
        [".hidden/", "Z", "a/", "b/", "c.txt", ".hidden/h"]
    );
    assert_eq!(result["truncated"], true);
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(8, 1, 100)}),
        )
        .await;
    assert_eq!(
        walked(&dir, &result),
        [".hidden/", "Z", "a/", "b/", "c.txt"]
    );
    assert_eq!(result["truncated"], true);
    // Exactly enough is not truncated.
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(8, 5, 10)}),
        )
        .await;
    assert_eq!(walked(&dir, &result).len(), 10);
    assert_eq!(result["truncated"], false);
}

#[tokio::test]
async fn walk_links_errors_and_roots() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::create_dir_all(dir.join("root/real")).unwrap();
    std::fs::create_dir_all(dir.join("outside/inner")).unwrap();
    std::fs::write(dir.join("root/real/f"), b"").unwrap();
    let root = dir.join("root");
    symlink("../outside", root.join("out")).unwrap();
    symlink("real/f", root.join("file-link")).unwrap();
    symlink("missing", root.join("dangling")).unwrap();
    symlink("..", root.join("real/up")).unwrap();

    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&root), "options": walk_options(8, 100, 100)}),
        )
        .await;
    assert_eq!(walked(&root, &result), ["real/", "real/f"]);
    assert_eq!(
        result["errors"],
        json!([{"path": uri(&root.join("dangling")), "message": "No such file or directory (os error 2)"}])
    );

    let mut follow = walk_options(8, 100, 100);
    follow["followDirectorySymlinks"] = json!(true);
    let result = client
        .call("fs/walk", json!({"path": uri(&root), "options": follow}))
        .await;
    // Followed directories are reported under the link's path; `real/up` leads back to
    // the root, which is listed but not descended again.
    assert_eq!(
        walked(&root, &result),
        ["out/", "real/", "out/inner/", "real/f", "real/up/"]
    );
    assert_eq!(result["errors"].as_array().unwrap().len(), 1);

    // Roots: a file or a non-followed link give an empty walk; a missing root is -32004.
    let empty = json!({"entries": [], "errors": [], "truncated": false});
    let file_root = client
        .call(
            "fs/walk",
            json!({"path": uri(&root.join("real/f")), "options": walk_options(8, 100, 100)}),
        )
        .await;
    assert_eq!(file_root, empty);
    let link_root = client
        .call(
            "fs/walk",
            json!({"path": uri(&root.join("out")), "options": walk_options(8, 100, 100)}),
        )
        .await;
    assert_eq!(link_root, empty);
    let followed_root = client
        .call(
            "fs/walk",
            json!({"path": uri(&root.join("out")), "options": follow}),
        )
        .await;
    assert_eq!(walked(&root.join("out"), &followed_root), ["inner/"]);
    let error = client
        .call_err(
            "fs/walk",
            json!({"path": uri(&dir.join("missing")), "options": walk_options(8, 100, 100)}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
}

#[tokio::test]
async fn walk_limits_are_validated_before_the_root_is_touched() {
    let mut client = started(Some(
        "[fs]\nwalk_max_depth = 2\nwalk_max_directories = 3\nwalk_max_entries = 4\n",
    ))
    .await;
    let missing = "file:///definitely/not/here";
    for options in [walk_options(0, 0, 1), walk_options(0, 1, 0)] {
        let error = client
            .call_err("fs/walk", json!({"path": missing, "options": options}))
            .await;
        assert_error(
            &error,
            -32600,
            "filesystem walk limits must be greater than zero",
        );
    }
    for options in [
        walk_options(3, 1, 1),
        walk_options(0, 4, 1),
        walk_options(0, 1, 5),
    ] {
        let error = client
            .call_err("fs/walk", json!({"path": missing, "options": options}))
            .await;
        assert_error(
            &error,
            -32600,
            "filesystem walk limits exceed maximums: depth=2, directories=3, entries=4",
        );
    }
    let error = client
        .call_err(
            "fs/walk",
            json!({"path": missing, "options": walk_options(2, 3, 4)}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    let error = client.call_err("fs/walk", json!({"path": missing})).await;
    assert_eq!(error["code"], -32602);
    let error = client
        .call_err("fs/walk", json!({"path": missing, "options": {"maxDepth": 1, "maxDirectories": 1, "maxEntries": 1}}))
        .await;
    assert_eq!(error["code"], -32602, "followDirectorySymlinks is required");
}

#[tokio::test]
async fn walk_response_budget_truncates() {
    let (_keep, dir) = temp_dir();
    for name in ["a", "b", "c", "d"] {
        std::fs::write(dir.join(name), b"").unwrap();
    }
    let per_entry = uri(&dir.join("a")).len() + 64;
    let config = format!("[fs]\nwalk_response_budget_bytes = {}\n", 2 * per_entry + 1);
    let mut client = started(Some(&config)).await;
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(8, 100, 100)}),
        )
        .await;
    assert_eq!(walked(&dir, &result), ["a", "b"]);
    assert_eq!(result["truncated"], true);
}

// ---- fixtures of this topic ---------------------------------------------------------

/// Walk entries as paths relative to `root` (directories end in `/`).
fn walked(root: &Path, result: &Value) -> Vec<String> {
    let prefix = uri(root);
    result["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let path = e["path"].as_str().unwrap();
            let rel = path.strip_prefix(&prefix).unwrap().trim_start_matches('/');
            match e["kind"].as_str().unwrap() {
                "directory" => format!("{rel}/"),
                "file" => rel.to_owned(),
                other => panic!("unknown kind {other}"),
            }
        })
        .collect()
}

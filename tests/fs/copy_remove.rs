//! `fs/remove` and `fs/copy` (§5.12, §5.13).

use std::os::unix::fs::symlink;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::json;

use super::{assert_os_error, forms, mkfifo, native, started, temp_dir, uri};
use crate::util::assert_error;

#[tokio::test]
async fn remove_files_trees_and_missing_paths() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    for path in forms(&dir.join("f")) {
        std::fs::write(dir.join("f"), b"").unwrap();
        assert_eq!(
            client.call("fs/remove", json!({"path": path})).await,
            json!({})
        );
        assert!(!dir.join("f").exists());
        // Missing: fine by default (force), -32004 without force.
        assert_eq!(
            client.call("fs/remove", json!({"path": path})).await,
            json!({})
        );
        let error = client
            .call_err("fs/remove", json!({"path": path, "force": false}))
            .await;
        assert_os_error(&error, -32004, libc::ENOENT);
    }
    std::fs::create_dir_all(dir.join("tree/a/b")).unwrap();
    std::fs::write(dir.join("tree/a/b/f"), b"").unwrap();
    let error = client
        .call_err(
            "fs/remove",
            json!({"path": uri(&dir.join("tree")), "recursive": false}),
        )
        .await;
    assert_os_error(&error, -32603, libc::ENOTEMPTY);
    client
        .call("fs/remove", json!({"path": uri(&dir.join("tree"))}))
        .await;
    assert!(!dir.join("tree").exists());
    std::fs::create_dir(dir.join("empty")).unwrap();
    client
        .call(
            "fs/remove",
            json!({"path": uri(&dir.join("empty")), "recursive": false, "force": false}),
        )
        .await;
    assert!(!dir.join("empty").exists());
    mkfifo(&dir.join("fifo"));
    client
        .call("fs/remove", json!({"path": uri(&dir.join("fifo"))}))
        .await;
    assert!(std::fs::symlink_metadata(dir.join("fifo")).is_err());
}

#[tokio::test]
async fn remove_takes_the_link_never_the_target() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::create_dir_all(dir.join("target/keep")).unwrap();
    std::fs::write(dir.join("target/keep/f"), b"precious").unwrap();
    for follow in [true, false] {
        symlink("target", dir.join("link")).unwrap();
        client
            .call("fs/remove", json!({"path": uri(&dir.join("link")), "followSymlinks": follow, "recursive": false}))
            .await;
        assert!(std::fs::symlink_metadata(dir.join("link")).is_err());
        assert_eq!(
            std::fs::read(dir.join("target/keep/f")).unwrap(),
            b"precious"
        );
    }
    // Links inside a removed tree are removed, not followed.
    std::fs::create_dir(dir.join("tree")).unwrap();
    symlink(dir.join("target"), dir.join("tree/inner-link")).unwrap();
    client
        .call("fs/remove", json!({"path": uri(&dir.join("tree"))}))
        .await;
    assert!(!dir.join("tree").exists());
    assert_eq!(
        std::fs::read(dir.join("target/keep/f")).unwrap(),
        b"precious"
    );
    // A dangling link is removed too.
    symlink("missing", dir.join("dangling")).unwrap();
    client
        .call(
            "fs/remove",
            json!({"path": uri(&dir.join("dangling")), "force": false}),
        )
        .await;
    assert!(std::fs::symlink_metadata(dir.join("dangling")).is_err());
}

#[tokio::test]
async fn copy_files_with_their_permission_bits() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let source = dir.join("script.sh");
    std::fs::write(&source, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o751)).unwrap();
    for (from, destination) in forms(&source).into_iter().zip(forms(&dir.join("copy.sh"))) {
        client
            .call(
                "fs/copy",
                json!({"sourcePath": from, "destinationPath": destination, "recursive": false}),
            )
            .await;
        assert_eq!(std::fs::read(dir.join("copy.sh")).unwrap(), b"#!/bin/sh\n");
        let mode = std::fs::metadata(dir.join("copy.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o751);
    }
    // Overwrites an existing, longer file.
    std::fs::write(dir.join("longer"), b"a much longer existing file").unwrap();
    client
        .call("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": uri(&dir.join("longer")), "recursive": true}))
        .await;
    assert_eq!(std::fs::read(dir.join("longer")).unwrap(), b"#!/bin/sh\n");
    // Onto itself, directly or through a link: the content survives.
    symlink("script.sh", dir.join("self-link")).unwrap();
    for destination in [uri(&source), uri(&dir.join("self-link"))] {
        client
            .call("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": destination, "recursive": false}))
            .await;
        assert_eq!(std::fs::read(&source).unwrap(), b"#!/bin/sh\n");
    }
    let error = client
        .call_err("fs/copy", json!({"sourcePath": uri(&dir.join("missing")), "destinationPath": uri(&dir.join("x")), "recursive": false}))
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    let error = client
        .call_err("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": uri(&dir.join("no/parent")), "recursive": false}))
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
}

#[tokio::test]
async fn copy_trees_keep_links_skip_specials_and_merge() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let source = dir.join("src");
    std::fs::create_dir_all(source.join("nested/deeper")).unwrap();
    std::fs::write(source.join("nested/deeper/f"), b"deep").unwrap();
    std::fs::write(source.join("top"), b"top").unwrap();
    symlink("nested", source.join("dir-link")).unwrap();
    symlink("/nonexistent/target", source.join("dangling")).unwrap();
    mkfifo(&source.join("fifo"));
    let destination = dir.join("dst");
    std::fs::create_dir(&destination).unwrap();
    std::fs::write(destination.join("already-there"), b"kept").unwrap();
    std::fs::write(destination.join("top"), b"overwritten?").unwrap();

    client
        .call("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": native(&destination), "recursive": true}))
        .await;
    assert_eq!(
        std::fs::read(destination.join("nested/deeper/f")).unwrap(),
        b"deep"
    );
    assert_eq!(std::fs::read(destination.join("top")).unwrap(), b"top");
    assert_eq!(
        std::fs::read(destination.join("already-there")).unwrap(),
        b"kept"
    );
    assert_eq!(
        std::fs::read_link(destination.join("dir-link")).unwrap(),
        Path::new("nested")
    );
    assert_eq!(
        std::fs::read_link(destination.join("dangling")).unwrap(),
        Path::new("/nonexistent/target")
    );
    assert!(
        std::fs::symlink_metadata(destination.join("fifo")).is_err(),
        "specials are skipped"
    );

    // A missing destination is created, including missing parents.
    client
        .call("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": uri(&dir.join("new/copy")), "recursive": true}))
        .await;
    assert!(dir.join("new/copy/nested/deeper/f").is_file());

    let error = client
        .call_err("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": uri(&dir.join("x")), "recursive": false}))
        .await;
    assert_error(
        &error,
        -32600,
        "fs/copy requires recursive: true when sourcePath is a directory",
    );
}

#[tokio::test]
async fn copy_into_itself_is_refused() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let source = dir.join("src");
    std::fs::create_dir_all(source.join("nested")).unwrap();
    symlink("src", dir.join("alias")).unwrap();
    for destination in [
        uri(&source),
        native(&source.join("nested/copy")),
        uri(&dir.join("alias/nested/new/deeper")),
        format!("{}/alias/", native(&dir)),
    ] {
        let error = client
            .call_err("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": destination, "recursive": true}))
            .await;
        assert_error(
            &error,
            -32600,
            "fs/copy cannot copy a directory to itself or one of its descendants",
        );
    }
    assert_eq!(
        std::fs::read_dir(source.join("nested")).unwrap().count(),
        0,
        "nothing was copied"
    );
    // A link to the directory is a link source: copied as a link, not refused.
    client
        .call("fs/copy", json!({"sourcePath": uri(&dir.join("alias")), "destinationPath": uri(&dir.join("alias2")), "recursive": false}))
        .await;
    assert_eq!(
        std::fs::read_link(dir.join("alias2")).unwrap(),
        Path::new("src")
    );
}

#[tokio::test]
async fn copy_links_as_links_and_refuses_specials() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::write(dir.join("target"), b"t").unwrap();
    symlink("target", dir.join("link")).unwrap();
    client
        .call("fs/copy", json!({"sourcePath": uri(&dir.join("link")), "destinationPath": uri(&dir.join("link2")), "recursive": false}))
        .await;
    assert_eq!(
        std::fs::read_link(dir.join("link2")).unwrap(),
        Path::new("target")
    );
    let error = client
        .call_err("fs/copy", json!({"sourcePath": uri(&dir.join("link")), "destinationPath": uri(&dir.join("target")), "recursive": false}))
        .await;
    assert_error(&error, -32603, "File exists (os error 17)");
    assert_eq!(std::fs::read(dir.join("target")).unwrap(), b"t");
    // Dangling links copy too.
    symlink("nowhere", dir.join("dangling")).unwrap();
    client
        .call("fs/copy", json!({"sourcePath": uri(&dir.join("dangling")), "destinationPath": uri(&dir.join("dangling2")), "recursive": true}))
        .await;
    assert_eq!(
        std::fs::read_link(dir.join("dangling2")).unwrap(),
        Path::new("nowhere")
    );

    mkfifo(&dir.join("fifo"));
    let error = client
        .call_err("fs/copy", json!({"sourcePath": uri(&dir.join("fifo")), "destinationPath": uri(&dir.join("fifo2")), "recursive": true}))
        .await;
    assert_error(
        &error,
        -32600,
        "fs/copy only supports regular files, directories, and symlinks",
    );
}

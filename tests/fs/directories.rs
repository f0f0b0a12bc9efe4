//! `fs/createDirectory`, `fs/getMetadata`, `fs/canonicalize`, `fs/readDirectory` (§5.7–§5.10).

use std::os::unix::fs::symlink;

use serde_json::{json, Value};

use super::{assert_os_error, forms, mkfifo, native, started, temp_dir, uri};
use crate::util::assert_error;

#[tokio::test]
async fn create_directory_recursive_and_single() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    for path in forms(&dir.join("a/b/c")) {
        assert_eq!(
            client
                .call("fs/createDirectory", json!({"path": path}))
                .await,
            json!({})
        );
        assert!(dir.join("a/b/c").is_dir());
    }
    // recursive: false needs the parent and refuses anything existing.
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": uri(&dir.join("x/y")), "recursive": false}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    client
        .call(
            "fs/createDirectory",
            json!({"path": uri(&dir.join("x")), "recursive": false}),
        )
        .await;
    assert!(dir.join("x").is_dir());
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": uri(&dir.join("x")), "recursive": false}),
        )
        .await;
    assert_error(&error, -32603, "File exists (os error 17)");
    // An existing non-directory on the way.
    std::fs::write(dir.join("file"), b"").unwrap();
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": uri(&dir.join("file"))}),
        )
        .await;
    assert_os_error(&error, -32603, libc::EEXIST);
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": uri(&dir.join("file/sub"))}),
        )
        .await;
    assert_os_error(&error, -32603, libc::ENOTDIR);
}

#[tokio::test]
async fn create_directory_over_a_link() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::create_dir(dir.join("real")).unwrap();
    symlink("real", dir.join("link")).unwrap();
    let link = uri(&dir.join("link"));
    assert_eq!(
        client
            .call("fs/createDirectory", json!({"path": link}))
            .await,
        json!({})
    );
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": link, "followSymlinks": false}),
        )
        .await;
    assert_os_error(&error, -32603, libc::EEXIST);
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": link, "recursive": false}),
        )
        .await;
    assert_os_error(&error, -32603, libc::EEXIST);
    // Through a link in an earlier component.
    client
        .call(
            "fs/createDirectory",
            json!({"path": uri(&dir.join("link/new"))}),
        )
        .await;
    assert!(dir.join("real/new").is_dir());
}

#[tokio::test]
async fn metadata_of_files_directories_links_and_specials() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let file = dir.join("f");
    std::fs::write(&file, b"12345").unwrap();
    let modified = std::fs::metadata(&file)
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for path in forms(&file) {
        let meta = client.call("fs/getMetadata", json!({"path": path})).await;
        assert_eq!(meta["isFile"], true);
        assert_eq!(meta["isDirectory"], false);
        assert_eq!(meta["isSymlink"], false);
        assert_eq!(meta["size"], 5);
        assert_eq!(meta["modifiedAtMs"], modified);
        assert!(meta["createdAtMs"].as_i64().unwrap() >= 0, "{meta}");
    }
    let meta = client
        .call("fs/getMetadata", json!({"path": uri(&dir)}))
        .await;
    assert_eq!(
        (meta["isDirectory"].as_bool(), meta["isFile"].as_bool()),
        (Some(true), Some(false))
    );

    symlink("f", dir.join("link")).unwrap();
    let followed = client
        .call("fs/getMetadata", json!({"path": uri(&dir.join("link"))}))
        .await;
    assert_eq!(followed["isFile"], true);
    assert_eq!(followed["isSymlink"], true);
    assert_eq!(followed["size"], 5);
    let own = client
        .call(
            "fs/getMetadata",
            json!({"path": uri(&dir.join("link")), "followSymlinks": false}),
        )
        .await;
    assert_eq!(own["isFile"], false);
    assert_eq!(own["isSymlink"], true);
    assert_eq!(own["size"], 1, "the length of the link text");

    symlink("missing", dir.join("dangling")).unwrap();
    let error = client
        .call_err(
            "fs/getMetadata",
            json!({"path": uri(&dir.join("dangling"))}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    let own = client
        .call(
            "fs/getMetadata",
            json!({"path": uri(&dir.join("dangling")), "followSymlinks": false}),
        )
        .await;
    assert_eq!(own["isSymlink"], true);

    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let meta = client
        .call("fs/getMetadata", json!({"path": uri(&fifo)}))
        .await;
    assert_eq!(
        (meta["isDirectory"].as_bool(), meta["isFile"].as_bool()),
        (Some(false), Some(false))
    );
    let error = client
        .call_err("fs/getMetadata", json!({"path": uri(&dir.join("missing"))}))
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
}

#[tokio::test]
async fn canonicalize_resolves_links_and_dots() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::create_dir_all(dir.join("real/sub")).unwrap();
    symlink("real", dir.join("link")).unwrap();
    let result = client
        .call(
            "fs/canonicalize",
            json!({"path": format!("{}/link/./sub/../sub", native(&dir))}),
        )
        .await;
    assert_eq!(result, json!({"path": uri(&dir.join("real/sub"))}));
    let result = client
        .call("fs/canonicalize", json!({"path": uri(&dir.join("link"))}))
        .await;
    assert_eq!(result, json!({"path": uri(&dir.join("real"))}));
    let error = client
        .call_err(
            "fs/canonicalize",
            json!({"path": uri(&dir.join("link/missing"))}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    symlink("missing", dir.join("dangling")).unwrap();
    let error = client
        .call_err(
            "fs/canonicalize",
            json!({"path": uri(&dir.join("dangling"))}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
}

#[tokio::test]
async fn read_directory_types_links_by_target_and_omits_dangling_ones() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("file"), b"").unwrap();
    symlink("sub", dir.join("sub-link")).unwrap();
    symlink("file", dir.join("file-link")).unwrap();
    symlink("missing", dir.join("dangling")).unwrap();
    mkfifo(&dir.join("fifo"));
    for path in forms(&dir) {
        let result = client.call("fs/readDirectory", json!({"path": path})).await;
        let mut entries = result["entries"].as_array().unwrap().clone();
        entries.sort_by_key(|e| e["fileName"].as_str().unwrap().to_owned());
        assert_eq!(
            Value::from(entries),
            json!([
                {"fileName": "fifo", "isDirectory": false, "isFile": false},
                {"fileName": "file", "isDirectory": false, "isFile": true},
                {"fileName": "file-link", "isDirectory": false, "isFile": true},
                {"fileName": "sub", "isDirectory": true, "isFile": false},
                {"fileName": "sub-link", "isDirectory": true, "isFile": false}
            ])
        );
    }
    let error = client
        .call_err(
            "fs/readDirectory",
            json!({"path": uri(&dir.join("missing"))}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    let error = client
        .call_err("fs/readDirectory", json!({"path": uri(&dir.join("file"))}))
        .await;
    assert_os_error(&error, -32603, libc::ENOTDIR);
    // Through a link to a directory.
    let result = client
        .call(
            "fs/readDirectory",
            json!({"path": uri(&dir.join("sub-link"))}),
        )
        .await;
    assert_eq!(result, json!({"entries": []}));
}

#[tokio::test]
async fn read_directory_entry_limit() {
    let mut client = started(Some("[fs]\nmax_directory_entries = 3\n")).await;
    let (_keep, dir) = temp_dir();
    for name in ["a", "b", "c"] {
        std::fs::write(dir.join(name), b"").unwrap();
    }
    let result = client
        .call("fs/readDirectory", json!({"path": uri(&dir)}))
        .await;
    assert_eq!(result["entries"].as_array().unwrap().len(), 3);
    for name in ["d", "e"] {
        std::fs::write(dir.join(name), b"").unwrap();
    }
    let error = client
        .call_err("fs/readDirectory", json!({"path": uri(&dir)}))
        .await;
    assert_error(
        &error,
        -32603,
        "fs/readDirectory returned 4 entries; limit is 3",
    );
}

/// `fs/getMetadata` of a name the kernel has cached on a local file system is answered on
/// the connection's thread, without a worker thread (`exec_server_fs_cached_answers_total`
/// counts them), once a worker judged the mount: the first request on a mount goes to a
/// worker. A final link to follow, a link inside the path, a file on another file system
/// (procfs), a missing name and a dangling link are answered by the worker threads, the
/// same answers as before.
#[tokio::test]
async fn cached_metadata_is_answered_without_a_worker_and_the_rest_by_the_workers() {
    use crate::fair_share::metric;
    const ANSWERED: &str = "exec_server_fs_cached_answers_total";
    let server = crate::util::WsServer::start(&[]).await;
    let mut client = server.connect_initialized().await;
    let (_keep, dir) = temp_dir();
    let file = dir.join("f");
    std::fs::write(&file, b"12345").unwrap();
    symlink("f", dir.join("link")).unwrap();
    symlink(".", dir.join("here")).unwrap();
    symlink("missing", dir.join("dangling")).unwrap();
    let answered = || metric(&server, ANSWERED, "");

    let meta = client
        .call("fs/getMetadata", json!({"path": uri(&file)}))
        .await;
    assert_eq!(meta["size"], 5);
    assert_eq!(
        answered().await,
        0.0,
        "the first lookup on a mount judges it, on a worker"
    );
    for _ in 0..3 {
        let meta = client
            .call("fs/getMetadata", json!({"path": uri(&file)}))
            .await;
        assert_eq!(
            (meta["isFile"].as_bool(), meta["size"].as_u64()),
            (Some(true), Some(5))
        );
    }
    let cached = answered().await;
    assert_eq!(
        cached,
        3.0,
        "a cached name on {} is answered inline",
        dir.display()
    );

    for path in [dir.join("link"), dir.join("here/f")] {
        let meta = client
            .call("fs/getMetadata", json!({"path": uri(&path)}))
            .await;
        assert_eq!(
            (meta["isFile"].as_bool(), meta["size"].as_u64()),
            (Some(true), Some(5))
        );
    }
    let meta = client
        .call("fs/getMetadata", json!({"path": "/proc/self/status"}))
        .await;
    assert_eq!(meta["isFile"], true);
    let error = client
        .call_err(
            "fs/getMetadata",
            json!({"path": uri(&dir.join("dangling"))}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    let error = client
        .call_err("fs/getMetadata", json!({"path": uri(&dir.join("none"))}))
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    assert_eq!(answered().await, cached);
}

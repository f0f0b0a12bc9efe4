//! Streamed reads: `fs/open`, `fs/readBlock`, `fs/close` (§5.14–§5.16).

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{assert_os_error, forms, mkfifo, native, pattern, started, temp_dir, uri};
use crate::util::{assert_error, b64, b64decode, config_file, WsServer};

#[tokio::test]
async fn open_read_block_and_close() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let file = dir.join("f");
    std::fs::write(&file, b"0123456789").unwrap();
    for (i, path) in forms(&file).into_iter().enumerate() {
        let id = format!("h{i}");
        let opened = client
            .call("fs/open", json!({"handleId": id, "path": path}))
            .await;
        assert_eq!(opened, json!({"handleId": id}));
        let read = |offset: u64, len: u64| json!({"handleId": id, "offset": offset, "len": len});
        let cases: [(u64, u64, &[u8], bool); 5] = [
            (0, 4, b"0123", false),
            (8, 2, b"89", false),
            (8, 5, b"89", true),
            (10, 1, b"", true),
            (u64::MAX, 1, b"", true),
        ];
        for (offset, len, expected, eof) in cases {
            let block = client.call("fs/readBlock", read(offset, len)).await;
            assert_eq!(
                block,
                json!({"chunk": b64(expected), "eof": eof}),
                "{offset}+{len}"
            );
        }
        assert_eq!(
            client.call("fs/close", json!({"handleId": id})).await,
            json!({})
        );
        // Idempotent.
        assert_eq!(
            client.call("fs/close", json!({"handleId": id})).await,
            json!({})
        );
        let error = client.call_err("fs/readBlock", read(0, 1)).await;
        assert_error(&error, -32004, &format!("unknown file handle `{id}`"));
    }
    assert_eq!(
        client
            .call("fs/close", json!({"handleId": "never-opened"}))
            .await,
        json!({})
    );
}

#[tokio::test]
async fn handle_ids_and_block_lengths_are_validated() {
    let mut client = started(Some("[fs]\nmax_read_block_bytes = 4\n")).await;
    let (_keep, dir) = temp_dir();
    let file = uri(&dir.join("f"));
    std::fs::write(dir.join("f"), b"0123456789").unwrap();
    let long = "x".repeat(33);
    let longest = "é".repeat(16);
    assert_eq!(longest.len(), 32);
    let too_long = "file handle ID must not exceed 32 bytes";
    let error = client
        .call_err("fs/open", json!({"handleId": long, "path": file}))
        .await;
    assert_error(&error, -32600, too_long);
    let error = client
        .call_err(
            "fs/readBlock",
            json!({"handleId": long, "offset": 0, "len": 1}),
        )
        .await;
    assert_error(&error, -32600, too_long);
    let error = client.call_err("fs/close", json!({"handleId": long})).await;
    assert_error(&error, -32600, too_long);
    // A multi-byte id of 16 characters is 32 bytes: accepted.
    client
        .call("fs/open", json!({"handleId": longest, "path": file}))
        .await;

    let error = client
        .call_err("fs/open", json!({"handleId": longest, "path": file}))
        .await;
    assert_error(
        &error,
        -32600,
        &format!("file handle `{longest}` already exists"),
    );
    for len in [0, 5] {
        let error = client
            .call_err(
                "fs/readBlock",
                json!({"handleId": longest, "offset": 0, "len": len}),
            )
            .await;
        assert_error(
            &error,
            -32600,
            "file read block length must be between 1 and 4",
        );
    }
    // The length is checked before the handle.
    let error = client
        .call_err(
            "fs/readBlock",
            json!({"handleId": "unknown", "offset": 0, "len": 0}),
        )
        .await;
    assert_error(
        &error,
        -32600,
        "file read block length must be between 1 and 4",
    );
    let block = client
        .call(
            "fs/readBlock",
            json!({"handleId": longest, "offset": 0, "len": 4}),
        )
        .await;
    assert_eq!(block, json!({"chunk": b64("0123"), "eof": false}));
}

#[tokio::test]
async fn open_refuses_non_files_without_blocking_and_follows_links() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let error = client
        .call_err("fs/open", json!({"handleId": "p", "path": uri(&fifo)}))
        .await;
    assert_error(
        &error,
        -32600,
        &format!("path `{}` is not a file", native(&fifo)),
    );
    let error = client
        .call_err("fs/open", json!({"handleId": "d", "path": native(&dir)}))
        .await;
    assert_error(
        &error,
        -32600,
        &format!("path `{}` is not a file", native(&dir)),
    );
    let error = client
        .call_err(
            "fs/open",
            json!({"handleId": "m", "path": uri(&dir.join("missing"))}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    // Failed opens leave no handle behind: the ids are free again.
    std::fs::write(dir.join("target"), b"linked").unwrap();
    symlink("target", dir.join("link")).unwrap();
    for id in ["p", "d", "m"] {
        client
            .call(
                "fs/open",
                json!({"handleId": id, "path": uri(&dir.join("link"))}),
            )
            .await;
        let block = client
            .call(
                "fs/readBlock",
                json!({"handleId": id, "offset": 0, "len": 100}),
            )
            .await;
        assert_eq!(block["chunk"], b64("linked"));
    }
}

#[tokio::test]
async fn a_handle_reads_the_file_it_opened() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let file = dir.join("f");
    std::fs::write(&file, b"original").unwrap();
    client
        .call("fs/open", json!({"handleId": "h", "path": uri(&file)}))
        .await;
    std::fs::rename(&file, dir.join("moved")).unwrap();
    std::fs::write(&file, b"replacement").unwrap();
    std::fs::remove_file(dir.join("moved")).unwrap();
    let block = client
        .call(
            "fs/readBlock",
            json!({"handleId": "h", "offset": 0, "len": 100}),
        )
        .await;
    assert_eq!(block, json!({"chunk": b64("original"), "eof": true}));
}

/// The server's own `/proc/self/mem` is a regular file whose first page is unmapped, so
/// reading it at offset 0 fails with `EIO`.
#[tokio::test]
async fn a_failed_read_closes_the_handle() {
    let mut client = started(None).await;
    client
        .call(
            "fs/open",
            json!({"handleId": "mem", "path": "/proc/self/mem"}),
        )
        .await;
    let error = client
        .call_err(
            "fs/readBlock",
            json!({"handleId": "mem", "offset": 0, "len": 16}),
        )
        .await;
    assert_os_error(&error, -32603, libc::EIO);
    let error = client
        .call_err(
            "fs/readBlock",
            json!({"handleId": "mem", "offset": 0, "len": 16}),
        )
        .await;
    assert_error(&error, -32004, "unknown file handle `mem`");
}

#[tokio::test]
async fn concurrent_reads_on_one_handle() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let data = pattern(64 * 1024);
    std::fs::write(dir.join("f"), &data).unwrap();
    client
        .call(
            "fs/open",
            json!({"handleId": "h", "path": uri(&dir.join("f"))}),
        )
        .await;
    // Sent without waiting, in descending order: positional reads do not interfere.
    let mut sent = Vec::new();
    for i in (0..16).rev() {
        let offset = i * 4096;
        let id = client
            .send_request(
                "fs/readBlock",
                json!({"handleId": "h", "offset": offset, "len": 4096}),
            )
            .await;
        sent.push((id, offset));
    }
    for (id, offset) in sent {
        let block = client.response(id).await.unwrap();
        assert_eq!(b64decode(&block["chunk"]), &data[offset..offset + 4096]);
        assert_eq!(block["eof"], false);
    }
}

#[tokio::test]
async fn open_handle_limit_per_connection() {
    let config = config_file("[fs]\nmax_open_handles = 2\n");
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let (_keep, dir) = temp_dir();
    let file = uri(&dir.join("f"));
    std::fs::write(dir.join("f"), b"x").unwrap();
    let mut first = server.connect_initialized().await;
    first
        .call("fs/open", json!({"handleId": "a", "path": file}))
        .await;
    first
        .call("fs/open", json!({"handleId": "b", "path": file}))
        .await;
    let error = first
        .call_err("fs/open", json!({"handleId": "c", "path": file}))
        .await;
    assert_error(
        &error,
        -32600,
        "at most 2 file handles may be open per connection",
    );
    // Check 2 comes before check 3.
    let error = first
        .call_err("fs/open", json!({"handleId": "a", "path": file}))
        .await;
    assert_error(&error, -32600, "file handle `a` already exists");
    first.call("fs/close", json!({"handleId": "a"})).await;
    first
        .call("fs/open", json!({"handleId": "c", "path": file}))
        .await;

    // Another connection has its own table: same ids, own limit, no access to these.
    let mut second = server.connect_initialized().await;
    let error = second
        .call_err(
            "fs/readBlock",
            json!({"handleId": "b", "offset": 0, "len": 1}),
        )
        .await;
    assert_error(&error, -32004, "unknown file handle `b`");
    second
        .call("fs/open", json!({"handleId": "b", "path": file}))
        .await;
    second
        .call("fs/open", json!({"handleId": "c", "path": file}))
        .await;
    second.call("fs/close", json!({"handleId": "b"})).await;
    let block = first
        .call(
            "fs/readBlock",
            json!({"handleId": "b", "offset": 0, "len": 1}),
        )
        .await;
    assert_eq!(block["chunk"], b64("x"));
}

/// The server's open descriptors that refer to `path`.
fn open_descriptors(pid: u32, path: &Path) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target == path)
        .count()
}

#[tokio::test]
async fn handles_close_with_their_connection_and_do_not_survive_a_resume() {
    let mut server = WsServer::start(&[]).await;
    let pid = server.child.id().unwrap();
    let (_keep, dir) = temp_dir();
    let file = dir.join("held-open");
    std::fs::write(&file, b"x").unwrap();

    let mut client = server.connect_initialized().await;
    let session = client.session_id.clone().unwrap();
    client
        .call("fs/open", json!({"handleId": "h1", "path": uri(&file)}))
        .await;
    client
        .call("fs/open", json!({"handleId": "h2", "path": uri(&file)}))
        .await;
    assert_eq!(open_descriptors(pid, &file), 2);
    client.call("fs/close", json!({"handleId": "h2"})).await;
    assert_eq!(open_descriptors(pid, &file), 1);

    client.close().await;
    drop(client);
    let deadline = Instant::now() + crate::util::STEP_TIMEOUT;
    while open_descriptors(pid, &file) > 0 {
        assert!(
            Instant::now() < deadline,
            "the handle outlived its connection"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The session resumes; its new connection has no handles.
    let mut resumed = server.connect().await;
    loop {
        match resumed.resume(&session).await {
            Ok(_) => break,
            Err(error) if error["code"] == -32010 => {
                assert!(Instant::now() < deadline, "the session never detached");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("resume failed: {error}"),
        }
    }
    let error = resumed
        .call_err(
            "fs/readBlock",
            json!({"handleId": "h1", "offset": 0, "len": 1}),
        )
        .await;
    assert_error(&error, -32004, "unknown file handle `h1`");
    let _ = server.child.kill().await;
}

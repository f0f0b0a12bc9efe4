//! Streamed writes: `fs/open` mode `replace`, `fs/writeBlock`, and the atomic replacement
//! at `fs/close` (codex 0.169.0 `fileWriteStreaming`).

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{mkfifo, started, temp_dir, uri};
use crate::util::{assert_error, b64, Client, WsServer, STEP_TIMEOUT};

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

async fn open_replace(client: &mut Client, id: &str, path: &Path) -> Result<Value, Value> {
    client
        .request(
            "fs/open",
            json!({"handleId": id, "path": uri(path), "mode": "replace"}),
        )
        .await
}

async fn write_block(client: &mut Client, id: &str, offset: u64, chunk: &[u8]) -> Value {
    client
        .call(
            "fs/writeBlock",
            json!({"handleId": id, "offset": offset, "chunk": b64(chunk)}),
        )
        .await
}

/// Waits until `dir` holds exactly `expected`.
async fn wait_for_names(dir: &Path, expected: &[&str], what: &str) {
    let deadline = Instant::now() + STEP_TIMEOUT;
    while names(dir) != expected {
        assert!(Instant::now() < deadline, "{what}: {:?}", names(dir));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

both_transports!(replace_round_trip, |mut client: Client| async move {
    client.handshake().await;
    let (_keep, dir) = temp_dir();
    let target = dir.join("t");
    std::fs::write(&target, b"old content").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();

    let opened = open_replace(&mut client, "w", &target).await.unwrap();
    assert_eq!(opened, json!({"handleId": "w"}));
    assert_eq!(write_block(&mut client, "w", 6, b"world").await, json!({}));
    assert_eq!(write_block(&mut client, "w", 0, b"hello ").await, json!({}));
    // Until the close, the target is the old version and the new one lies beside it.
    assert_eq!(std::fs::read(&target).unwrap(), b"old content");
    assert_eq!(names(&dir).len(), 2, "{:?}", names(&dir));
    let error = client
        .call_err(
            "fs/readBlock",
            json!({"handleId": "w", "offset": 0, "len": 4}),
        )
        .await;
    assert_error(&error, -32603, "Bad file descriptor (os error 9)");

    assert_eq!(
        client.call("fs/close", json!({"handleId": "w"})).await,
        json!({})
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"hello world");
    let mode = std::fs::metadata(&target).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o640);
    assert_eq!(names(&dir), ["t"]);
    let error = client
        .call_err(
            "fs/writeBlock",
            json!({"handleId": "w", "offset": 0, "chunk": b64(b"x")}),
        )
        .await;
    assert_error(&error, -32004, "unknown file handle `w`");

    // A new file; a hole is zero-filled.
    let fresh = dir.join("fresh");
    open_replace(&mut client, "n", &fresh).await.unwrap();
    write_block(&mut client, "n", 3, b"x").await;
    assert!(!fresh.exists());
    client.call("fs/close", json!({"handleId": "n"})).await;
    assert_eq!(std::fs::read(&fresh).unwrap(), b"\0\0\0x");

    // No mode means read; a read handle cannot be written.
    client
        .call("fs/open", json!({"handleId": "r", "path": uri(&target)}))
        .await;
    let error = client
        .call_err(
            "fs/writeBlock",
            json!({"handleId": "r", "offset": 0, "chunk": b64(b"x")}),
        )
        .await;
    assert_error(&error, -32603, "Bad file descriptor (os error 9)");
    let error = client
        .call_err(
            "fs/open",
            json!({"handleId": "b", "path": uri(&target), "mode": "append"}),
        )
        .await;
    assert_error(
        &error,
        -32602,
        "unknown variant `append`, expected `read` or `replace`",
    );
});

both_transports!(
    write_block_limits_and_texts,
    |mut client: Client| async move {
        client.handshake().await;
        let (_keep, dir) = temp_dir();
        open_replace(&mut client, "w", &dir.join("t"))
            .await
            .unwrap();
        let write = |id: &str, offset: Value, chunk: Value| json!({"handleId": id, "offset": offset, "chunk": chunk});
        let cases = [
            (
                write(&"x".repeat(33), json!(0), json!(b64(b"x"))),
                -32600,
                "file handle ID must not exceed 32 bytes",
            ),
            (
                write("w", json!(0), json!("")),
                -32600,
                "file write block length must be between 1 and 1048576",
            ),
            (
                write("w", json!(0), json!(b64(vec![0u8; 1024 * 1024 + 1]))),
                -32600,
                "file write block length must be between 1 and 1048576",
            ),
            (
                write("w", json!(i64::MAX as u64), json!(b64(b"x"))),
                -32600,
                "file write range exceeds the signed 64-bit file offset limit",
            ),
            (
                write("nope", json!(0), json!(b64(b"x"))),
                -32004,
                "unknown file handle `nope`",
            ),
            (
                write("w", json!(0), json!("!")),
                -32602,
                "Invalid symbol 33, offset 0.",
            ),
            (
                json!({"handleId": "w", "offset": 0}),
                -32602,
                "missing field `chunk`",
            ),
        ];
        for (params, code, message) in cases {
            let error = client.call_err("fs/writeBlock", params.clone()).await;
            assert_error(&error, code, message);
        }
        let error = client
            .call_err("fs/writeBlock", write("w", json!(-1), json!(b64(b"x"))))
            .await;
        assert_eq!(error["code"], -32602, "{error}");
        // Exactly the largest block is fine, and nothing failed reached the file.
        write_block(&mut client, "w", 0, &vec![7u8; 1024 * 1024]).await;
        client.call("fs/close", json!({"handleId": "w"})).await;
        assert_eq!(
            std::fs::read(dir.join("t")).unwrap(),
            vec![7u8; 1024 * 1024]
        );
    }
);

#[tokio::test]
async fn read_and_replace_handles_share_the_limit() {
    let mut client = started(Some("[fs]\nmax_open_handles = 2\n")).await;
    let (_keep, dir) = temp_dir();
    std::fs::write(dir.join("r"), b"x").unwrap();
    client
        .call(
            "fs/open",
            json!({"handleId": "r", "path": uri(&dir.join("r"))}),
        )
        .await;
    open_replace(&mut client, "w", &dir.join("t"))
        .await
        .unwrap();
    let error = open_replace(&mut client, "w2", &dir.join("t2"))
        .await
        .unwrap_err();
    assert_error(
        &error,
        -32600,
        "at most 2 file handles may be open per connection",
    );
    let error = open_replace(&mut client, "r", &dir.join("t3"))
        .await
        .unwrap_err();
    assert_error(&error, -32600, "file handle `r` already exists");
    // Neither refused open left a file behind.
    assert_eq!(names(&dir).len(), 2, "{:?}", names(&dir));
}

/// A reader polling the target while blocks are written and the handle closed sees the
/// old content or the new, never anything in between.
#[tokio::test]
async fn readers_never_see_a_partial_target() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let target = dir.join("t");
    let old = vec![b'o'; 256 * 1024];
    let new = vec![b'n'; 512 * 1024];
    std::fs::write(&target, &old).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (target, stop, old, new) =
            (target.clone(), Arc::clone(&stop), old.clone(), new.clone());
        std::thread::spawn(move || {
            let mut reads = 0usize;
            loop {
                // One more read after the stop, so the last one sees the final target.
                let stopping = stop.load(Ordering::SeqCst);
                let seen = std::fs::read(&target).unwrap();
                assert!(
                    seen == old || seen == new,
                    "a partial target ({} bytes)",
                    seen.len()
                );
                reads += 1;
                if stopping {
                    return (reads, seen == new);
                }
            }
        })
    };
    for round in 0..5 {
        let id = format!("w{round}");
        open_replace(&mut client, &id, &target).await.unwrap();
        for (i, block) in new.chunks(64 * 1024).enumerate() {
            write_block(&mut client, &id, (i * 64 * 1024) as u64, block).await;
        }
        client.call("fs/close", json!({"handleId": id})).await;
    }
    stop.store(true, Ordering::SeqCst);
    let (reads, ends_new) = reader.join().unwrap();
    assert!(ends_new, "the last of {reads} reads saw the old version");
    assert_eq!(std::fs::read(&target).unwrap(), new);
}

#[tokio::test]
async fn unclosed_versions_are_removed_with_their_websocket_connection() {
    let server = WsServer::start(&[]).await;
    let mut client = server.connect_initialized().await;
    let (_keep, dir) = temp_dir();
    std::fs::write(dir.join("t"), b"old").unwrap();
    for id in ["a", "b"] {
        open_replace(&mut client, id, &dir.join("t")).await.unwrap();
        write_block(&mut client, id, 0, b"new").await;
    }
    assert_eq!(names(&dir).len(), 3);
    client.close().await;
    drop(client);
    wait_for_names(&dir, &["t"], "temporary files outlived their connection").await;
    assert_eq!(std::fs::read(dir.join("t")).unwrap(), b"old");
}

#[tokio::test]
async fn unclosed_versions_are_removed_when_stdio_ends() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    open_replace(&mut client, "a", &dir.join("t"))
        .await
        .unwrap();
    write_block(&mut client, "a", 0, b"new").await;
    assert_eq!(names(&dir).len(), 1);
    client.close().await;
    let status = tokio::time::timeout(STEP_TIMEOUT, client.child().wait())
        .await
        .expect("the server exits at the end of stdin")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(names(&dir).is_empty(), "{:?}", names(&dir));
}

both_transports!(hostile_targets, |mut client: Client| async move {
    client.handshake().await;
    let (_keep, dir) = temp_dir();
    let work = dir.join("work");
    let outside = dir.join("outside");
    std::fs::create_dir(&work).unwrap();
    std::fs::create_dir(&outside).unwrap();

    // A directory cannot be opened; a FIFO or device is not a file (and nothing waits).
    let error = open_replace(&mut client, "d", &work).await.unwrap_err();
    assert_error(&error, -32603, "Is a directory (os error 21)");
    let fifo = work.join("fifo");
    mkfifo(&fifo);
    let error = open_replace(&mut client, "f", &fifo).await.unwrap_err();
    assert_error(
        &error,
        -32600,
        &format!("path `{}` is not a file", fifo.display()),
    );
    let error = open_replace(&mut client, "n", Path::new("/dev/null"))
        .await
        .unwrap_err();
    assert_error(&error, -32600, "path `/dev/null` is not a file");
    let error = open_replace(&mut client, "m", &dir.join("missing/t"))
        .await
        .unwrap_err();
    assert_error(&error, -32004, "No such file or directory (os error 2)");
    std::fs::remove_file(&fifo).unwrap();

    // A link as the last component is followed, as codex does: its target is replaced
    // and the link stays.
    std::fs::write(outside.join("linked"), b"old").unwrap();
    symlink(outside.join("linked"), work.join("link")).unwrap();
    open_replace(&mut client, "l", &work.join("link"))
        .await
        .unwrap();
    write_block(&mut client, "l", 0, b"new").await;
    client.call("fs/close", json!({"handleId": "l"})).await;
    assert_eq!(std::fs::read(outside.join("linked")).unwrap(), b"new");
    assert!(std::fs::symlink_metadata(work.join("link"))
        .unwrap()
        .file_type()
        .is_symlink());

    // The target swapped for a link after the open: the close replaces the link, never
    // writes through it.
    std::fs::write(outside.join("secret"), b"secret").unwrap();
    std::fs::write(work.join("t"), b"old").unwrap();
    open_replace(&mut client, "s", &work.join("t"))
        .await
        .unwrap();
    write_block(&mut client, "s", 0, b"new").await;
    std::fs::remove_file(work.join("t")).unwrap();
    symlink(outside.join("secret"), work.join("t")).unwrap();
    client.call("fs/close", json!({"handleId": "s"})).await;
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"secret");
    assert!(std::fs::symlink_metadata(work.join("t")).unwrap().is_file());
    assert_eq!(std::fs::read(work.join("t")).unwrap(), b"new");

    // The directory swapped for a link after the open: the new version lands in the
    // directory that was opened, nothing in the link's target.
    let moved = dir.join("moved");
    open_replace(&mut client, "p", &work.join("t"))
        .await
        .unwrap();
    write_block(&mut client, "p", 0, b"newer").await;
    std::fs::rename(&work, &moved).unwrap();
    symlink(&outside, &work).unwrap();
    client.call("fs/close", json!({"handleId": "p"})).await;
    assert_eq!(names(&outside), ["linked", "secret"]);
    assert_eq!(std::fs::read(moved.join("t")).unwrap(), b"newer");
});

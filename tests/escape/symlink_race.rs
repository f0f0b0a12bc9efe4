//! Sandboxed fs operations act on what they checked: symlink swaps cannot redirect them.
//!
//! A thread flips a link inside a readable root between a harmless target and a denied one
//! as fast as it can (atomically, by renaming a fresh link over it) while the client fires
//! hundreds of sandboxed requests through the link. A helper that checks the path and then
//! opens it again by path (check-then-use) hands out the denied target now and then; one
//! that acts on the descriptor it checked never does.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde_json::{json, Value};

use crate::sandbox::{entry, landlock_available, managed};
use crate::util::*;

const SECRET: &str = "SECRET-CONTENT";
const HARMLESS: &str = "harmless";
/// Requests in flight at once: enough to keep every helper slot busy.
const WINDOW: usize = 32;

/// Swaps `link` between two targets until stopped.
struct Flipper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl Flipper {
    fn start(link: &Path, targets: [PathBuf; 2]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let staging = link.with_extension("flipping");
        let link = link.to_path_buf();
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut flips = 0u64;
            while !flag.load(Ordering::Relaxed) {
                for target in &targets {
                    let _ = std::fs::remove_file(&staging);
                    symlink(target, &staging).unwrap();
                    std::fs::rename(&staging, &link).unwrap();
                    flips += 1;
                }
            }
            flips
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Flipper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What one attack saw.
#[derive(Debug, Default)]
struct Tally {
    ran: usize,
    succeeded: usize,
    leaked: usize,
}

/// Sends `count` requests built by `params`, [`WINDOW`] at a time; `leaked` judges each
/// answer (and may look at the disk).
async fn attack(
    client: &mut Client,
    method: &str,
    count: usize,
    params: impl Fn(usize) -> Value,
    mut leaked: impl FnMut(usize, &Result<Value, Value>) -> bool,
) -> Tally {
    let mut tally = Tally::default();
    let mut next = 0;
    while next < count {
        let window: Vec<(usize, i64)> = {
            let mut ids = Vec::new();
            for i in next..count.min(next + WINDOW) {
                ids.push((i, client.send_request(method, params(i)).await));
            }
            ids
        };
        next += window.len();
        for (i, id) in window {
            let answer = client.response(id).await;
            tally.ran += 1;
            tally.succeeded += usize::from(answer.is_ok());
            tally.leaked += usize::from(leaked(i, &answer));
        }
    }
    tally
}

fn data(answer: &Result<Value, Value>) -> Option<Vec<u8>> {
    answer.as_ref().ok().map(|r| b64decode(&r["dataBase64"]))
}

#[tokio::test]
async fn symlink_swaps_never_redirect_sandboxed_operations() {
    if !landlock_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let t = std::fs::canonicalize(dir.path()).unwrap();
    let r = t.join("r");
    let w = t.join("w");
    std::fs::create_dir_all(r.join("private")).unwrap();
    std::fs::create_dir_all(r.join("hdir")).unwrap();
    std::fs::create_dir_all(w.join(".git")).unwrap();
    std::fs::create_dir_all(w.join("copies")).unwrap();
    std::fs::write(r.join("harmless"), HARMLESS).unwrap();
    std::fs::write(r.join("private/secret"), SECRET).unwrap();
    std::fs::write(r.join("private/only-in-private"), "x").unwrap();
    std::fs::write(r.join("hdir/secret"), HARMLESS).unwrap();
    std::fs::write(w.join(".git/config"), "c").unwrap();
    std::fs::write(w.join("ok"), "").unwrap();
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    let policy = managed(vec![
        entry(&path(&r), "read"),
        entry(&path(&w), "write"),
        entry(&path(&r.join("private")), "deny"),
    ]);
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let mut report = Vec::new();

    // fs/readFile and fs/getMetadata through a link that flips between a file and a
    // denied file.
    let link = r.join("link");
    symlink(r.join("harmless"), &link).unwrap();
    let flipper = Flipper::start(&link, [r.join("harmless"), r.join("private/secret")]);
    let tally = attack(
        &mut client,
        "fs/readFile",
        300,
        |_| json!({"path": path(&link), "sandbox": policy}),
        |_, answer| data(answer).is_some_and(|d| d == SECRET.as_bytes()),
    )
    .await;
    report.push(("fs/readFile", tally));
    let tally = attack(
        &mut client,
        "fs/getMetadata",
        200,
        |_| json!({"path": path(&link), "sandbox": policy}),
        |_, answer| {
            answer
                .as_ref()
                .is_ok_and(|m| m["size"] == SECRET.len() as u64)
        },
    )
    .await;
    report.push(("fs/getMetadata", tally));
    let flips = flipper.stop();

    // fs/copy from and fs/readDirectory of a path through a directory link that flips
    // between a harmless directory and a denied one.
    let dlink = r.join("dlink");
    symlink(r.join("hdir"), &dlink).unwrap();
    let flipper = Flipper::start(&dlink, [r.join("hdir"), r.join("private")]);
    let copies = w.join("copies");
    let tally = attack(
        &mut client,
        "fs/copy",
        200,
        |i| {
            json!({"sourcePath": path(&dlink.join("secret")),
                   "destinationPath": path(&copies.join(format!("c{i}"))),
                   "recursive": false, "sandbox": policy})
        },
        |i, _| std::fs::read(copies.join(format!("c{i}"))).is_ok_and(|d| d == SECRET.as_bytes()),
    )
    .await;
    report.push(("fs/copy", tally));
    let tally = attack(
        &mut client,
        "fs/readDirectory",
        200,
        |_| json!({"path": path(&dlink), "sandbox": policy}),
        |_, answer| {
            answer.as_ref().is_ok_and(|listing| {
                listing["entries"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["fileName"] == "only-in-private")
            })
        },
    )
    .await;
    report.push(("fs/readDirectory", tally));
    let flips = flips + flipper.stop();

    // fs/writeFile through a link that flips between a writable file and a carve-out.
    let wlink = w.join("wlink");
    symlink(w.join("ok"), &wlink).unwrap();
    let flipper = Flipper::start(&wlink, [w.join("ok"), w.join(".git/config")]);
    let config = w.join(".git/config");
    let tally = attack(
        &mut client,
        "fs/writeFile",
        200,
        |_| json!({"path": path(&wlink), "dataBase64": b64("pwned"), "sandbox": policy}),
        |_, _| {
            let written = std::fs::read(&config).unwrap() != b"c";
            if written {
                std::fs::write(&config, "c").unwrap();
            }
            written
        },
    )
    .await;
    report.push(("fs/writeFile", tally));
    let flips = flips + flipper.stop();

    println!("symlink race: {flips} link flips while the requests ran");
    for (method, tally) in &report {
        println!(
            "symlink race: {method}: {} requests, {} succeeded, {} leaked",
            tally.ran, tally.succeeded, tally.leaked
        );
    }
    for (method, tally) in &report {
        assert_eq!(tally.leaked, 0, "{method} was redirected: {tally:?}");
        // The race must have been run for real: some requests got the harmless target.
        assert!(tally.succeeded > 0, "{method} never succeeded: {tally:?}");
    }
}

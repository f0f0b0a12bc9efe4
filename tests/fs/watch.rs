//! Watches: `fs/watchMissing` / `fs/missingChanged` (codex 0.169.0) and the `fs/watch` /
//! `fs/unwatch` extension, with real inotify events from real files.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{temp_dir, uri};
use crate::util::{assert_error, config_file, Client, WsServer, STEP_TIMEOUT};

async fn watch_missing(
    client: &mut Client,
    id: u64,
    missing: &[&Path],
    present: Option<&Path>,
) -> bool {
    let missing: Vec<String> = missing.iter().map(|p| uri(p)).collect();
    let result = client
        .call(
            "fs/watchMissing",
            json!({"watchId": id, "missing": missing, "present": present.map(uri)}),
        )
        .await;
    result["watching"].as_bool().unwrap()
}

/// The watch id of the next `fs/missingChanged`.
async fn next_missing_changed(client: &mut Client) -> u64 {
    let params = client.notification("fs/missingChanged").await;
    params["watchId"].as_u64().unwrap()
}

both_transports!(watch_missing_semantics, |mut client: Client| async move {
    client.handshake().await;
    let (_keep, dir) = temp_dir();

    // An ancestor of a missing path coming into existence fires, once.
    assert!(
        watch_missing(
            &mut client,
            1,
            &[&dir.join(".git"), &dir.join("a/b/c")],
            None
        )
        .await
    );
    std::fs::write(dir.join("k.tmp"), b"").unwrap();
    std::fs::create_dir(dir.join("a")).unwrap();
    assert_eq!(next_missing_changed(&mut client).await, 1);

    // Ids only go up: a stale id answers false and leaves the current watch alone.
    assert!(watch_missing(&mut client, 2, &[&dir.join("m2")], None).await);
    assert!(!watch_missing(&mut client, 2, &[&dir.join("x")], None).await);
    assert!(!watch_missing(&mut client, 1, &[&dir.join("x")], None).await);
    // A new watch replaces the old one: m2 appearing first sends nothing for watch 2.
    assert!(watch_missing(&mut client, 3, &[&dir.join("m3")], None).await);
    std::fs::create_dir(dir.join("m2")).unwrap();
    std::fs::write(dir.join(".git"), b"gitdir: x").unwrap();
    std::fs::write(dir.join("m3"), b"").unwrap();
    // Had watch 1 fired twice or watch 2 survived, their notifications would come first.
    assert_eq!(next_missing_changed(&mut client).await, 3);

    // A rename into place fires; so does a link, even dangling.
    assert!(watch_missing(&mut client, 4, &[&dir.join("renamed")], None).await);
    std::fs::rename(dir.join("m3"), dir.join("renamed")).unwrap();
    assert_eq!(next_missing_changed(&mut client).await, 4);
    assert!(watch_missing(&mut client, 5, &[&dir.join("deep/er/link")], None).await);
    symlink("nowhere", dir.join("deep")).unwrap();
    assert_eq!(next_missing_changed(&mut client).await, 5);

    // The present path: its own change fires, a child's does not come first.
    std::fs::create_dir(dir.join("p")).unwrap();
    let file = dir.join("present.txt");
    std::fs::write(&file, b"a").unwrap();
    assert!(watch_missing(&mut client, 6, &[&dir.join("none")], Some(&file)).await);
    let mut append = std::fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .unwrap();
    std::io::Write::write_all(&mut append, b"b").unwrap();
    drop(append);
    assert_eq!(next_missing_changed(&mut client).await, 6);
    assert!(watch_missing(&mut client, 7, &[&dir.join("none")], Some(&dir.join("p"))).await);
    std::fs::write(dir.join("p/child"), b"").unwrap();
    std::fs::remove_dir_all(dir.join("p")).unwrap();
    assert_eq!(next_missing_changed(&mut client).await, 7);

    // Everything codex answers `watching: false` for (each id is used up).
    let file_child = dir.join("present.txt/child");
    let unwatchable: Vec<Value> = vec![
        json!({"missing": []}),
        json!({"missing": [], "present": uri(&file)}),
        json!({"missing": (0..65).map(|i| uri(&dir.join(format!("n{i}")))).collect::<Vec<_>>()}),
        json!({"missing": [uri(&dir.join("a"))]}),
        json!({"missing": [uri(&dir.join("deep"))]}),
        json!({"missing": ["file:///proc/nonexistent"]}),
        json!({"missing": ["file://host/x"]}),
        json!({"missing": [uri(&file_child)]}),
        json!({"missing": [uri(&dir.join("none"))], "present": uri(&dir.join("gone"))}),
    ];
    for (i, mut params) in unwatchable.into_iter().enumerate() {
        params["watchId"] = json!(100 + i);
        let result = client.call("fs/watchMissing", params.clone()).await;
        assert_eq!(result, json!({"watching": false}), "{params}");
    }
    let many: Vec<String> = (0..64).map(|i| uri(&dir.join(format!("n{i}")))).collect();
    let result = client
        .call("fs/watchMissing", json!({"watchId": 200, "missing": many}))
        .await;
    assert_eq!(result, json!({"watching": true}));
    // A path whose parents do not exist is watched at its nearest existing ancestor.
    assert!(
        watch_missing(
            &mut client,
            201,
            &[Path::new("/nonexistent-root-dir/x/y")],
            None
        )
        .await
    );

    let error = client
        .call_err("fs/watchMissing", json!({"watchId": "1", "missing": []}))
        .await;
    assert_eq!(error["code"], -32602, "{error}");
    let error = client
        .call_err(
            "fs/watchMissing",
            json!({"watchId": 300, "missing": ["relative/x"]}),
        )
        .await;
    assert_eq!(error["code"], -32602, "{error}");
    // Params in error change nothing: the id is still free.
    assert!(watch_missing(&mut client, 300, &[&dir.join("later")], None).await);
});

/// Lines `inotify wd:` in the fdinfo of every inotify instance of process `pid`: its
/// kernel watches.
fn kernel_watches(pid: u32) -> usize {
    let mut watches = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let entry = entry.unwrap();
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if target.to_str() != Some("anon_inode:inotify") {
            continue;
        }
        let fdinfo = format!("/proc/{pid}/fdinfo/{}", entry.file_name().to_str().unwrap());
        let Ok(text) = std::fs::read_to_string(fdinfo) else {
            continue;
        };
        watches += text
            .lines()
            .filter(|l| l.starts_with("inotify wd:"))
            .count();
    }
    watches
}

async fn wait_for_watches(pid: u32, expected: usize, what: &str) {
    let deadline = Instant::now() + STEP_TIMEOUT;
    while kernel_watches(pid) != expected {
        assert!(
            Instant::now() < deadline,
            "{what}: {} kernel watches",
            kernel_watches(pid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn kernel_watches_are_bounded_and_released_with_the_session() {
    let config =
        config_file("[session]\ndetached_ttl_ms = 200\n\n[fs]\nmax_watches_per_session = 3\n");
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let pid = server.child.id().unwrap();
    let (_keep, dir) = temp_dir();
    for sub in ["a", "b", "c", "d"] {
        std::fs::create_dir(dir.join(sub)).unwrap();
    }
    let mut client = server.connect().await;
    client.opt_in(&["fsWatch"]);
    client.handshake().await;
    let missing = |subs: &[&str]| -> Vec<std::path::PathBuf> {
        subs.iter().map(|s| dir.join(s).join("missing")).collect()
    };
    // Four ancestors are more than the session may watch.
    let four = missing(&["a", "b", "c", "d"]);
    let four: Vec<&Path> = four.iter().map(|p| p.as_path()).collect();
    assert!(!watch_missing(&mut client, 1, &four, None).await);
    assert_eq!(kernel_watches(pid), 0);
    let two = missing(&["a", "b"]);
    let two: Vec<&Path> = two.iter().map(|p| p.as_path()).collect();
    assert!(watch_missing(&mut client, 2, &two, None).await);
    assert_eq!(kernel_watches(pid), 2);
    let watch = |id: &str, path: &Path| json!({"watchId": id, "path": uri(path)});
    client.call("fs/watch", watch("w", &dir.join("c"))).await;
    assert_eq!(kernel_watches(pid), 3);
    let error = client
        .call_err("fs/watch", watch("x", &dir.join("d")))
        .await;
    assert_error(
        &error,
        -32600,
        "session quota reached: at most 3 file system watches at once (fs.max_watches_per_session)",
    );
    client.call("fs/unwatch", json!({"watchId": "w"})).await;
    assert_eq!(kernel_watches(pid), 2);
    client.call("fs/watch", watch("w", &dir.join("c"))).await;
    assert_eq!(kernel_watches(pid), 3);

    // The session ends when it expires detached: every kernel watch goes with it.
    client.close().await;
    drop(client);
    wait_for_watches(pid, 0, "the watches outlived their session").await;
    drop(server);
}

/// The kernel counts inotify watches per user: sessions that each stay within
/// `fs.max_watches_per_session` must not, together, take more than `fs.max_watches_total`
/// (nor the user's `max_user_watches`), and a session started before them keeps its
/// guaranteed part whatever they take.
#[tokio::test]
async fn sessions_together_hold_the_watch_budget_and_an_earlier_session_keeps_its_part() {
    let config = config_file("[fs]\nmax_watches_per_session = 8\nmax_watches_total = 64\n");
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let pid = server.child.id().unwrap();
    let (_keep, dir) = temp_dir();
    let watch = |id: &str, path: &Path| json!({"watchId": id, "path": uri(path)});
    let mut victim = server.connect().await;
    victim.opt_in(&["fsWatch"]);
    victim.handshake().await;
    // The victim's first watch, then hogs that each try to take their whole share.
    std::fs::create_dir(dir.join("victim-0")).unwrap();
    victim
        .call("fs/watch", watch("v0", &dir.join("victim-0")))
        .await;
    let mut hogs = Vec::new();
    let mut refused = 0;
    for h in 0..12 {
        let mut hog = server.connect().await;
        hog.opt_in(&["fsWatch"]);
        hog.handshake().await;
        for w in 0..8 {
            let sub = dir.join(format!("hog-{h}-{w}"));
            std::fs::create_dir(&sub).unwrap();
            if let Err(error) = hog.request("fs/watch", watch(&format!("w{w}"), &sub)).await {
                let message = error["message"].as_str().unwrap_or_default().to_owned();
                assert!(message.starts_with("watch budget reached"), "{error}");
                refused += 1;
            }
        }
        hogs.push(hog);
    }
    assert!(refused > 0, "12 sessions took 96 watches of a budget of 64");
    assert!(
        kernel_watches(pid) <= 64,
        "{} kernel watches",
        kernel_watches(pid)
    );
    // The victim still gets its guaranteed part: min(8, 64 / 2 / 13 live sessions) = 2.
    std::fs::create_dir(dir.join("victim-1")).unwrap();
    victim
        .call("fs/watch", watch("v1", &dir.join("victim-1")))
        .await;
    for hog in &mut hogs {
        hog.close().await;
    }
    victim.close().await;
    drop(server);
}

#[tokio::test]
async fn a_fired_watch_releases_its_kernel_watches() {
    let server = WsServer::start(&[]).await;
    let pid = server.child.id().unwrap();
    let (_keep, dir) = temp_dir();
    let mut client = server.connect_initialized().await;
    assert!(watch_missing(&mut client, 1, &[&dir.join("x")], None).await);
    assert_eq!(kernel_watches(pid), 1);
    std::fs::write(dir.join("x"), b"").unwrap();
    assert_eq!(next_missing_changed(&mut client).await, 1);
    wait_for_watches(pid, 0, "a fired watch kept its kernel watch").await;
}

both_transports!(
    watch_reports_changes_to_opted_in_clients,
    |mut client: Client| async move {
        let (_keep, dir) = temp_dir();
        client.opt_in(&["fsWatch"]);
        client.handshake().await;
        let result = client
            .call("fs/watch", json!({"watchId": "w", "path": uri(&dir)}))
            .await;
        assert_eq!(result, json!({"watchId": "w"}));
        let error = client
            .call_err("fs/watch", json!({"watchId": "w", "path": uri(&dir)}))
            .await;
        assert_error(&error, -32600, "watch `w` already exists");
        let error = client
            .call_err(
                "fs/watch",
                json!({"watchId": "m", "path": uri(&dir.join("missing"))}),
            )
            .await;
        assert_error(&error, -32004, "No such file or directory (os error 2)");

        std::fs::write(dir.join("new"), b"x").unwrap();
        let changed = client.notification("fs/changed").await;
        assert_eq!(changed["watchId"], "w", "{changed}");
        let changes = changed["changes"].as_array().unwrap();
        assert!(
            changes.contains(&json!({"path": uri(&dir.join("new")), "kind": "create"})),
            "{changed}"
        );
        assert_eq!(
            client.call("fs/unwatch", json!({"watchId": "w"})).await,
            json!({})
        );
        assert_eq!(
            client
                .call("fs/unwatch", json!({"watchId": "unknown"}))
                .await,
            json!({})
        );
    }
);

#[tokio::test]
async fn watch_needs_the_opt_in_and_refuses_enforced_sandboxes() {
    let (_keep, dir) = temp_dir();
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let error = client
        .call_err("fs/watch", json!({"watchId": "w", "path": uri(&dir)}))
        .await;
    assert_error(
        &error,
        -32600,
        "fs/watch sends `fs/changed` notifications, which this connection did not opt in to; list `fsWatch` in initialize.params.extensions",
    );
    let sandbox = json!({"sandboxPolicy": {"type": "read-only"}});
    let error = client
        .call_err(
            "fs/watchMissing",
            json!({"watchId": 1, "missing": [uri(&dir.join("x"))], "sandbox": sandbox}),
        )
        .await;
    assert_error(
        &error,
        -32600,
        "filesystem sandbox cannot be enforced on this executor",
    );
}

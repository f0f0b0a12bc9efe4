//! One budget per resource — descriptors: every descriptor the server holds for a client
//! (connections, processes, `fs/open` handles, fs helpers, searches) is charged to one
//! budget under the open-file limit, shared out by session, so that no client can take the
//! descriptors another one needs (`docs/SECURITY.md`, "One budget per resource —
//! descriptors").
//!
//! Each test starts the real server with `RLIMIT_NOFILE` = 1,024 (soft and hard, so it
//! cannot raise it), connects a victim first, lets a hog take all it can, and then checks
//! that the hog was refused by the budget and that the victim is still served.

use std::path::Path;

use serde_json::{json, Value};

use crate::fair_share::{server, shell};
use crate::sandbox::{landlock_available, managed, root_read};
use crate::util::{Client, WsServer};

const NOFILE: u64 = 1024;

/// The start of every refusal of the budget.
const REFUSED: &str = "descriptor budget reached: ";

fn uri(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// Asserts that `error` is the budget's -32600 refusal of `what`.
#[track_caller]
fn assert_budget_refusal(error: &Value, what: &str) {
    assert_eq!(error["code"], -32600, "{error}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!("{REFUSED}{what} does not fit within ")),
        "not the budget's refusal of {what}: {error}"
    );
    assert!(
        message.ends_with("(descriptors.session_max_percent)")
            || message.ends_with("(descriptors.session_guarantee)"),
        "the refusal names no key: {error}"
    );
}

/// A connected, initialized client, opted in to search notifications.
async fn client(server: &WsServer) -> Client {
    let mut client = server.connect().await;
    client.opt_in(&["search"]);
    client.handshake().await;
    client
}

/// Opens up to `count` `replace` handles on files in `dir`, stopping at the first refusal,
/// which it returns.
async fn open_replace_handles(
    client: &mut Client,
    dir: &Path,
    prefix: &str,
    count: usize,
) -> Option<Value> {
    for i in 0..count {
        let path = dir.join(format!("{prefix}{i}"));
        let params =
            json!({"handleId": format!("{prefix}{i}"), "path": uri(&path), "mode": "replace"});
        if let Err(error) = client.request("fs/open", params).await {
            return Some(error);
        }
    }
    None
}

/// A sandboxed `fs/readFile` of `path` (it runs in an fs helper).
async fn sandboxed_read(client: &mut Client, path: &Path) -> Result<Value, Value> {
    let params = json!({"path": path.to_str().unwrap(), "sandbox": managed(vec![root_read()])});
    client.request("fs/readFile", params).await
}

/// Starts `true` for `client` and waits for it to be answered; the process exits at once.
async fn short_process(client: &mut Client, id: &str) -> Result<Value, Value> {
    client.request("process/start", shell(id, "true")).await
}

/// A search of `root` for "needle", run to its `search/done`; its number of matches.
async fn search(client: &mut Client, id: &str, root: &Path) -> Result<u64, Value> {
    let params = json!({"searchId": id, "path": uri(root), "pattern": "needle"});
    client.request("search/start", params).await?;
    loop {
        let done = client.notification("search/done").await;
        if done["searchId"] == id {
            return Ok(done["matches"].as_u64().unwrap_or(0));
        }
    }
}

/// A file the victim reads to show it is still served, in a directory of its own.
fn victim_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("victim.txt");
    std::fs::write(&file, b"still readable").unwrap();
    (dir, file)
}

/// The reported attack: one client on six connections opens replace handles (two
/// descriptors each) until refused. Before the budget it took 1,002 of the 1,024
/// descriptors, and a victim connected earlier got "failed to spawn fs sandbox helper: Too
/// many open files" and its `process/start` refused. Now every hog session stops at its
/// share and the victim's sandboxed read (an fs helper) and process start are served.
#[tokio::test]
async fn replace_handles_from_many_connections_leave_the_victim_its_share() {
    if !landlock_available() {
        return;
    }
    let server = server(Some(NOFILE), &[]).await;
    let (dir, file) = victim_file();
    let mut victim = client(&server).await;
    let mut hogs = Vec::new();
    for _ in 0..6 {
        hogs.push(client(&server).await);
    }

    // 501 handles in all, at most 84 per connection (fs.max_open_handles is 128).
    let mut refusals = Vec::new();
    let mut left = 501;
    for (n, hog) in hogs.iter_mut().enumerate() {
        let count = left.min(84);
        left -= count;
        if let Some(refusal) = open_replace_handles(hog, dir.path(), &format!("h{n}-"), count).await
        {
            refusals.push(refusal);
        }
    }
    let read = sandboxed_read(&mut victim, &file)
        .await
        .expect("the victim's sandboxed read");
    assert_eq!(read["dataBase64"], crate::util::b64("still readable"));
    short_process(&mut victim, "victim")
        .await
        .expect("the victim's process start");
    assert!(
        !refusals.is_empty(),
        "every one of the 501 handles was opened"
    );
    for refusal in &refusals {
        assert_budget_refusal(refusal, "an fs/open handle");
    }

    for hog in &mut hogs {
        hog.close().await;
    }
}

/// One session starts `sleep`s until it is refused (`process.max_processes_per_session`,
/// 256, is more than the limit holds). Before the budget it took every descriptor the
/// process reserve let starts have, and the victim's start was refused with it. Now the
/// hog stops at its share and the victim's start succeeds.
#[tokio::test]
async fn one_session_starting_processes_leaves_the_victim_its_share() {
    let server = server(Some(NOFILE), &[]).await;
    let mut victim = client(&server).await;
    let mut hog = client(&server).await;

    let mut started = Vec::new();
    let mut refusal = None;
    for i in 0..256 {
        let id = format!("sleeper-{i}");
        match hog
            .request("process/start", shell(&id, "exec sleep 600"))
            .await
        {
            Ok(_) => started.push(id),
            Err(error) => {
                refusal = Some(error);
                break;
            }
        }
    }
    let outcome = short_process(&mut victim, "victim").await;
    for id in &started {
        let _ = hog
            .request("process/terminate", json!({"processId": id}))
            .await;
    }
    hog.close().await;
    outcome.expect("the victim's process start");
    let refusal = refusal.expect("the hog started 256 processes");
    assert_budget_refusal(&refusal, "a process start");
}

/// The members a session can only fill its share with together: one session's share is
/// made small (`descriptors.session_max_percent = 10`: 96 of the 960), the hog fills it
/// with replace handles, and then its fs helper (a sandboxed read) and its search are
/// refused by the budget while the victim's are served.
#[tokio::test]
async fn helpers_and_searches_are_charged_to_the_session_they_serve() {
    if !landlock_available() {
        return;
    }
    let server = server(
        Some(NOFILE),
        &[("EXEC_SERVER_DESCRIPTORS__SESSION_MAX_PERCENT", "10")],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    std::fs::write(tree.join("a.txt"), b"needle\n").unwrap();
    let file = tree.join("a.txt");
    let mut victim = client(&server).await;
    let mut hog = client(&server).await;

    let refusal = open_replace_handles(&mut hog, dir.path(), "h", 128)
        .await
        .expect("the hog's handles fill its share");
    assert_budget_refusal(&refusal, "an fs/open handle");
    let helper = sandboxed_read(&mut hog, &file).await.unwrap_err();
    assert_budget_refusal(&helper, "an fs helper");
    let searched = search(&mut hog, "hog", &tree).await.unwrap_err();
    assert_budget_refusal(&searched, "a search");

    sandboxed_read(&mut victim, &file)
        .await
        .expect("the victim's sandboxed read");
    assert_eq!(
        search(&mut victim, "victim", &tree)
            .await
            .expect("the victim's search"),
        1
    );
    hog.close().await;
}

/// Sessions a hog opens after it filled what it may take cannot take the guarantee of a
/// session started before them: they are guaranteed only what is left. Two hog sessions
/// start `sleep`s until refused, two more connections initialize afterwards, and the
/// victim, which holds nothing, still opens a handle and starts a process.
#[tokio::test]
async fn sessions_opened_later_never_take_an_earlier_sessions_guarantee() {
    let server = server(Some(NOFILE), &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut victim = client(&server).await;
    // Upgraded but not initialized yet: their sessions start after the fill.
    let mut late: Vec<Client> = Vec::new();
    for _ in 0..2 {
        late.push(server.connect().await);
    }
    let mut hogs = Vec::new();
    for n in 0..2 {
        let mut hog = client(&server).await;
        let mut refused = None;
        for i in 0..256 {
            let id = format!("hog{n}-{i}");
            if let Err(error) = hog.request("process/start", shell(&id, "sleep 600")).await {
                refused = Some(error);
                break;
            }
        }
        let refused = refused.expect("the hog was never refused");
        assert_budget_refusal(&refused, "a process start");
        hogs.push(hog);
    }
    for connection in &mut late {
        connection.handshake().await;
    }
    let params =
        json!({"handleId": "victim", "path": uri(&dir.path().join("v")), "mode": "replace"});
    victim
        .request("fs/open", params)
        .await
        .expect("the victim's fs/open");
    short_process(&mut victim, "victim")
        .await
        .expect("the victim's process start");
}

/// Streamed `http/request` bodies from an origin that sends its head and then nothing.
/// Before, each stream's connection to the origin was charged to nobody and outlived the
/// client's connection: hogs that opened streams and left took every descriptor the
/// server had. Now each request is charged to its session while it runs, and a stream ends
/// with its connection.
#[tokio::test]
async fn http_streams_are_charged_and_end_with_their_connection() {
    if !landlock_available() {
        return;
    }
    let origin = crate::http::origin::Origin::start().await;
    let stalled = origin.url("/sse?chunks=1&delay=600000");
    let server = server(
        Some(NOFILE),
        &[("EXEC_SERVER_HTTP__MAX_STREAMS_PER_CONNECTION", "1000")],
    )
    .await;
    let pid = crate::fair_share::pid(&server);
    let (_dir, file) = victim_file();
    let mut victim = client(&server).await;
    let mut hogs = vec![client(&server).await, client(&server).await];
    let baseline = open_fds(pid);

    // Two sessions of up to 1,000 streams each: more than the whole limit.
    let mut refusals = Vec::new();
    for (n, hog) in hogs.iter_mut().enumerate() {
        for i in 0..1000 {
            let params = json!({"method": "GET", "url": stalled, "streamResponse": true,
                                "requestId": format!("h{n}-{i}")});
            if let Err(error) = hog.request("http/request", params).await {
                refusals.push(error);
                break;
            }
        }
    }
    assert_eq!(refusals.len(), 2, "every one of the 2,000 streams ran");
    for refusal in &refusals {
        assert_budget_refusal(refusal, "an http/request");
    }
    let read = sandboxed_read(&mut victim, &file)
        .await
        .expect("the victim's sandboxed read");
    assert_eq!(read["dataBase64"], crate::util::b64("still readable"));
    short_process(&mut victim, "victim")
        .await
        .expect("the victim's process start");

    // The hogs leave; their streams, and the origin connections they held, end with them.
    for hog in &mut hogs {
        hog.close().await;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while open_fds(pid) > baseline + 16 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let left = open_fds(pid);
    assert!(
        left <= baseline + 16,
        "{left} descriptors open after the hogs left, {baseline} before"
    );
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// What a hostile managed child does: opens 300 connections to its proxy and holds them.
const HOLD_PROXY_CONNECTIONS: &str = r#"
import socket, time
held = []
for _ in range(300):
    try:
        held.append(socket.create_connection(("127.0.0.1", 3128), timeout=2))
    except OSError:
        pass
print("held", len(held), flush=True)
time.sleep(120)
"#;

/// Managed children that open connections to their proxies by the hundred. Before, each
/// proxy let 256 connections in, charged to nobody, two descriptors each: four children
/// took the whole limit and the victim's next start failed with EMFILE. Now every
/// connection is charged to the children's session and refused past its share.
#[tokio::test]
async fn managed_network_connections_are_charged_to_the_session() {
    if !landlock_available() {
        return;
    }
    let server = server(Some(NOFILE), &[]).await;
    let (_dir, file) = victim_file();
    let mut victim = client(&server).await;
    let mut hog = client(&server).await;
    let proxy = json!({"proxy": {"enabled": true, "enableSocks5": false,
        "enableSocks5Udp": false, "allowUpstreamProxy": false,
        "dangerouslyAllowAllUnixSockets": false, "mode": "full", "domains": {},
        "allowLocalBinding": false}});
    for n in 0..4 {
        let params = json!({"processId": format!("hog{n}"), "cwd": "file:///tmp", "tty": false,
            "argv": ["python3", "-c", HOLD_PROXY_CONNECTIONS],
            "env": {"PATH": std::env::var("PATH").unwrap()},
            "sandbox": managed(vec![root_read()]), "networkProxy": proxy,
            "enforceManagedNetwork": true});
        hog.call("process/start", params).await;
    }
    let mut held = 0;
    while held < 4 {
        let output = hog.notification("process/output").await;
        held += String::from_utf8_lossy(&crate::util::b64decode(&output["chunk"]))
            .matches("held ")
            .count();
    }
    let read = sandboxed_read(&mut victim, &file)
        .await
        .expect("the victim's sandboxed read");
    assert_eq!(read["dataBase64"], crate::util::b64("still readable"));
    short_process(&mut victim, "victim")
        .await
        .expect("the victim's process start");
    hog.close().await;
}

/// A session's own connection counts within its guarantee: once a connection attaches to a
/// session its socket is charged to that session. Before, every socket stayed charged to
/// no session and so could take only what the sessions' guarantees left (half the
/// capacity): with 1,024 descriptors the 481st initialized connection was refused at
/// accept (503) while the server had hundreds of descriptors free.
#[tokio::test]
async fn a_session_s_own_connection_counts_within_its_guarantee() {
    let server = server(Some(NOFILE), &[]).await;
    let mut clients = Vec::new();
    for _ in 0..600 {
        clients.push(server.connect_initialized().await);
    }
    let dir = tempfile::tempdir().unwrap();
    let first = &mut clients[0];
    let params = json!({"handleId": "h", "path": uri(&dir.path().join("f")), "mode": "replace"});
    first
        .request("fs/open", params)
        .await
        .expect("a session keeps room for its own work");
}

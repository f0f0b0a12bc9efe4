//! Bytes held for a peer (docs/SECURITY.md, "One budget per resource: bytes held for a
//! peer"): a WebSocket client asks for many large answers and never reads its socket. The
//! server must hold about its outbound byte budget for it, not every answer it asked for;
//! must go on serving other clients meanwhile; and, once the peer has taken nothing for
//! `connection.stalled_peer_timeout_ms`, must close that connection and detach its
//! session.

use std::time::Duration;

use serde_json::json;
use tokio::net::TcpStream;

use crate::util::{config_file, Client, WsServer, STEP_TIMEOUT};

/// The reported attack: this many `fs/readFile` of one file of [`FILE_BYTES`].
const REQUESTS: usize = 120;
const FILE_BYTES: usize = 2 * 1024 * 1024;
/// What the server may grow by while it serves the attacker: the default outbound budget
/// (16 MiB), a second copy of it in tungstenite's write buffer, the answers being made
/// and allocator slack. The old code grew by about 330 MiB.
const GROWTH_BOUND_KIB: u64 = 100 * 1024;
/// How often the server's memory is looked at, and for how many looks at most.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
const MAX_SAMPLES: usize = 300;
/// The server has finished growing once its memory stayed within this for
/// [`STABLE_SAMPLES`] looks in a row.
const STABLE_KIB: u64 = 1024;
const STABLE_SAMPLES: usize = 15;

/// `VmRSS` of process `pid`, in KiB.
pub(super) fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// A file of [`FILE_BYTES`] in a fresh directory.
fn large_file() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large.bin");
    let data: Vec<u8> = (0..FILE_BYTES).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, data).unwrap();
    (dir, path.to_str().unwrap().to_owned())
}

/// A client over a plain socket that completes the handshake, sends the attack's
/// requests and then never reads again. Returns it (the socket stays open) and its session.
async fn stalled_reader(server: &WsServer, path: &str) -> (Client, String) {
    stalled_sending(server, "fs/readFile", json!({"path": path}), REQUESTS).await
}

/// [`stalled_reader`] sending `count` requests of `method` with `params`.
async fn stalled_sending(
    server: &WsServer,
    method: &str,
    params: serde_json::Value,
    count: usize,
) -> (Client, String) {
    let addr = server.url.trim_start_matches("ws://").trim_end_matches('/');
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut client = Client::websocket_over(stream, &server.url, None)
        .await
        .expect("websocket upgrade");
    let session = client.handshake().await;
    for _ in 0..count {
        let send = client.send_request(method, params.clone());
        tokio::time::timeout(STEP_TIMEOUT, send)
            .await
            .expect("the server reads requests");
    }
    (client, session)
}

/// Looks at the server's memory until it stops growing (or the looks run out), failing
/// as soon as it grew past [`GROWTH_BOUND_KIB`]. Returns the largest value seen.
async fn peak_while_stalled(pid: u32, baseline: u64) -> u64 {
    let mut peak = baseline;
    let mut stable = 0;
    let mut last = baseline;
    for _ in 0..MAX_SAMPLES {
        tokio::time::sleep(SAMPLE_EVERY).await;
        let now = rss_kib(pid);
        peak = peak.max(now);
        assert!(
            now.saturating_sub(baseline) < GROWTH_BOUND_KIB,
            "the server holds {} MiB more for a client that does not read (started at {} MiB)",
            now.saturating_sub(baseline) / 1024,
            baseline / 1024
        );
        stable = if now.abs_diff(last) <= STABLE_KIB {
            stable + 1
        } else {
            0
        };
        last = now;
        if stable >= STABLE_SAMPLES {
            break;
        }
    }
    peak
}

/// A second client is answered while the first one stalls.
async fn others_are_served(server: &WsServer, path: &str) {
    let mut other = server.connect_initialized().await;
    other.call("environment/status", json!({})).await;
    let answer = other.call("fs/readFile", json!({"path": path})).await;
    assert_eq!(
        crate::util::b64decode(&answer["dataBase64"]).len(),
        FILE_BYTES
    );
}

/// A server started with `args` while a client sends `count` requests of `method` with
/// `params` and reads none of the answers (`what` names them): the server's memory must
/// stay within [`GROWTH_BOUND_KIB`] and other clients must be served before and after.
async fn held_to_the_outbound_budget(
    args: &[&str],
    method: &str,
    params: serde_json::Value,
    count: usize,
    what: &str,
) {
    let (_dir, path) = large_file();
    let mut server = WsServer::start(args).await;
    let pid = server.child.id().unwrap();
    // Warm up the paths a read takes, so the baseline includes what every reader costs.
    others_are_served(&server, &path).await;
    let baseline = rss_kib(pid);

    let (_stalled, _session) = stalled_sending(&server, method, params, count).await;
    let peak = peak_while_stalled(pid, baseline).await;
    others_are_served(&server, &path).await;
    eprintln!(
        "baseline {} MiB, peak {} MiB while a client did not read {what}",
        baseline / 1024,
        peak / 1024
    );
    server.child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_held_to_the_outbound_budget() {
    let (_dir, path) = large_file();
    let params = json!({"path": path});
    held_to_the_outbound_budget(&[], "fs/readFile", params, REQUESTS, "its files").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_dropped_and_its_session_detached() {
    let (_dir, path) = large_file();
    let config = config_file("[connection]\nstalled_peer_timeout_ms = 2000\n");
    let mut server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let pid = server.child.id().unwrap();
    others_are_served(&server, &path).await;
    let baseline = rss_kib(pid);

    let (mut stalled, session) = stalled_reader(&server, &path).await;
    let peak = peak_while_stalled(pid, baseline).await;

    // The server gave up on the peer: reading what the kernel still holds ends at the
    // close (or the reset) instead of going on forever.
    let mut closed = false;
    for _ in 0..REQUESTS + 16 {
        if stalled.read_wire().await.is_none() {
            closed = true;
            break;
        }
    }
    assert!(closed, "the stalled connection was never closed");

    // Its session was detached as on any disconnect: another connection may take it over.
    let mut other = server.connect().await;
    let resumed = tokio::time::timeout(STEP_TIMEOUT, other.resume(&session)).await;
    assert!(
        matches!(resumed, Ok(Ok(_))),
        "the session of the dropped connection could not be resumed: {resumed:?}"
    );
    other.call("environment/status", json!({})).await;
    eprintln!(
        "baseline {} MiB, peak {} MiB, after the close {} MiB",
        baseline / 1024,
        peak / 1024,
        rss_kib(pid) / 1024
    );
    server.child.kill().await.unwrap();
}

/// The same with listings: 64 `fs/readDirectory` (the most a connection runs at once) of
/// a directory whose answer is about 5 MB. Its size is known only once listed, so the
/// most it can be is reserved first: the old code held every listing in flight (the
/// attacker measured 1.2 GB for 64 listings of 15 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_listings_is_held_to_the_outbound_budget() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..20_000 {
        std::fs::File::create(dir.path().join(format!("{i:05}-{}", "n".repeat(194)))).unwrap();
    }
    let params = json!({"path": dir.path().to_str().unwrap()});
    held_to_the_outbound_budget(&[], "fs/readDirectory", params, 64, "its listings").await;
}

/// The same with capability discovery: 16 `capabilityRoots/discoverV1` of 16 roots each,
/// every root a tree of 8 skills of 900 KB, with a 4 MiB answer budget. Each answer is at
/// most its budget and reserved before anything is read: the old code read the budget
/// again for every root and reserved nothing (about 1 GiB held here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_discoveries_is_held_to_the_outbound_budget() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..8 {
        let skill = dir.path().join(format!("skills/s{i}/SKILL.md"));
        std::fs::create_dir_all(skill.parent().unwrap()).unwrap();
        std::fs::write(&skill, "z".repeat(900_000)).unwrap();
    }
    let root = exec_server_proto::path::to_file_uri(dir.path());
    let config = config_file("[capabilities]\nmax_total_bytes = 4194304\n");
    let roots: Vec<_> = (0..16)
        .map(|i| json!({"id": i.to_string(), "path": root}))
        .collect();
    held_to_the_outbound_budget(
        &["--config", config.to_str().unwrap()],
        "capabilityRoots/discoverV1",
        json!({"roots": roots}),
        16,
        "its discoveries",
    )
    .await;
}

/// The same attack on a file whose size says nothing: procfs reports 0 for
/// `/proc/kallsyms` (about 5 MB). Nothing was reserved for its answers, so 64 of them
/// were made whole for a peer that read none (+540 MiB); now every piece the reader
/// encodes is covered by reserved room first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_files_without_a_size_is_held_to_the_outbound_budget() {
    let unsized_file = "/proc/kallsyms";
    let length = std::fs::read(unsized_file).map_or(0, |content| content.len());
    let reported = std::fs::metadata(unsized_file).map_or(1, |m| m.len());
    if length < 2 << 20 || reported != 0 {
        eprintln!("SKIP: {unsized_file} is not a large file that reports size 0 here");
        return;
    }
    let params = json!({"path": unsized_file});
    held_to_the_outbound_budget(&[], "fs/readFile", params, 64, unsized_file).await;
}

/// The same attack on answers the fs helper makes: nothing was reserved for a sandboxed
/// `fs/readFile`, and the helper slot that was to bound them is free again before the
/// answer waits for room, so every request in flight held a whole answer (64 reads of a
/// 10 MB file: +900 MiB). Now the most such an answer can be is reserved first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_sandboxed_files_is_held_to_the_outbound_budget() {
    if !crate::sandbox::landlock_available() {
        eprintln!("SKIP: no Landlock here, so no fs helper answers");
        return;
    }
    let (_dir, path) = large_file();
    let params = json!({"path": path, "sandbox": {"sandboxPolicy": {"type": "read-only"}}});
    held_to_the_outbound_budget(&[], "fs/readFile", params, REQUESTS, "sandboxed files").await;
}

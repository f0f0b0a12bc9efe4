//! Process floods: a session that starts processes until the server has nothing left must
//! be stopped at its own share, so that another session can still start its processes.
//!
//! The abuser is an authenticated client on its own session. It starts `sleep`s as fast as
//! it can, or processes whose daemons outlive them, or so many that descriptors run out;
//! the victim, on another session, keeps starting short processes (or reading a file) and
//! every one of its requests must succeed.

use serde_json::{json, Value};

use super::{eventually, metric, metrics_reachable, pid, server, shell, ServerResources, Victim};
use crate::util::{assert_error, b64, Client};

/// The default `process.max_processes_per_session`.
const DEFAULT_PROCESS_QUOTA: usize = 256;
/// Descriptors the server holds for one running pipe-mode process without `pipeStdin`:
/// stdout, stderr, the keeper's status pipe and its pidfd.
const DESCRIPTORS_PER_PROCESS: u64 = 4;

fn sleeper(process_id: &str) -> Value {
    json!({
        "processId": process_id,
        "argv": ["sleep", "600"],
        "cwd": "/",
        "env": {"PATH": "/usr/bin:/bin"},
        "tty": false,
    })
}

/// The victim's request: a short process of its own, under a new id each time.
fn short_process(n: u64) -> Value {
    json!({
        "processId": format!("victim-{n}"),
        "argv": ["true"],
        "cwd": "/",
        "env": {"PATH": "/usr/bin:/bin"},
        "tty": false,
    })
}

/// Sends `count` `process/start`s of `sleep 600` without waiting between them (the server
/// runs up to `dispatch.max_in_flight` at once), in batches so that neither side's socket
/// buffers fill, and returns every answer in order.
async fn flood(client: &mut Client, prefix: &str, count: usize) -> Vec<Result<Value, Value>> {
    let mut answers = Vec::with_capacity(count);
    for batch in (0..count).collect::<Vec<_>>().chunks(64) {
        let mut ids = Vec::with_capacity(batch.len());
        for i in batch {
            ids.push(
                client
                    .send_request("process/start", sleeper(&format!("{prefix}{i}")))
                    .await,
            );
        }
        for id in ids {
            answers.push(client.response(id).await);
        }
    }
    answers
}

fn successes(answers: &[Result<Value, Value>]) -> usize {
    answers.iter().filter(|a| a.is_ok()).count()
}

/// One session starts 600 `sleep`s, more than the descriptor limit leaves room for;
/// another keeps starting `true`. The first is stopped at its quota, the second never
/// fails. Before the quota, the flood ran the server out of descriptors and every other
/// session's `process/start` failed with "Too many open files". The limit is high enough
/// that the session's share of the descriptor budget (half of it) holds 256 processes, so
/// the process quota is what stops it.
#[tokio::test]
async fn a_process_flood_stops_at_the_session_quota_and_others_keep_starting() {
    const NOFILE: u64 = 4096;
    let server = server(Some(NOFILE), &[]).await;
    let pid = pid(&server);
    let mut abuser = server.connect_initialized().await;
    let victim = server.connect_initialized().await;
    let before = ServerResources::of(pid);
    let victim = Victim::start_with(victim, "process/start", short_process);

    let answers = flood(&mut abuser, "sleep-", 600).await;
    let during = ServerResources::of(pid);
    let report = victim.finish().await;
    eprintln!("victim during the process flood: {report}");
    eprintln!("server before: {before}; with the flood running: {during}");

    assert_eq!(successes(&answers), DEFAULT_PROCESS_QUOTA);
    for refused in answers.iter().filter_map(|a| a.as_ref().err()) {
        assert_error(
            refused,
            -32600,
            "session quota reached: at most 256 live processes at once (process.max_processes_per_session)",
        );
    }
    // The quota is the descriptor budget: 256 processes and nothing more.
    let budget = DEFAULT_PROCESS_QUOTA as u64 * DESCRIPTORS_PER_PROCESS + 32;
    assert!(
        during.fds <= before.fds + budget,
        "{} descriptors more than before the flood (budget {budget})",
        during.fds - before.fds
    );
    assert!(during.threads <= before.threads + 4, "{during} vs {before}");
    // Per process: a task, its table entry and a keeper's stack pages (rss_per_proc).
    let rss_budget_kib = DEFAULT_PROCESS_QUOTA as u64 * 128 + 16 * 1024;
    assert!(
        during.rss_kib <= before.rss_kib + rss_budget_kib,
        "RSS grew {} KiB (budget {rss_budget_kib} KiB)",
        during.rss_kib - before.rss_kib
    );
    assert_eq!(
        metric(
            &server,
            "exec_server_quota_refusals_total",
            r#"quota="processes""#
        )
        .await,
        (600 - DEFAULT_PROCESS_QUOTA) as f64
    );
}

/// Processes that exit at once but leave a daemon behind are closed, yet their trees live:
/// they keep counting against the quota until the tree is gone, so a session cannot
/// multiply itself through daemons. Terminating one (its keeper kills the tree) gives its
/// share back, and so does the end of the session.
#[tokio::test]
async fn processes_count_until_their_whole_tree_is_gone() {
    let server = server(
        None,
        &[
            ("EXEC_SERVER_PROCESS__MAX_PROCESSES_PER_SESSION", "3"),
            ("EXEC_SERVER_SESSION__DETACHED_TTL_MS", "200"),
        ],
    )
    .await;
    let mut abuser = server.connect_initialized().await;
    let daemon = "sleep 600 </dev/null >/dev/null 2>&1 &";
    for i in 0..3 {
        abuser
            .call("process/start", shell(&format!("d{i}"), daemon))
            .await;
    }
    for _ in 0..3 {
        abuser.notification("process/closed").await;
    }
    let refused = abuser
        .call_err("process/start", shell("one-more", daemon))
        .await;
    assert_error(
        &refused,
        -32600,
        "session quota reached: at most 3 live processes at once (process.max_processes_per_session)",
    );
    // A refused start touches nothing: its id was never reserved.
    let read = abuser
        .call_err("process/read", json!({"processId": "one-more"}))
        .await;
    assert_error(&read, -32600, "unknown process id one-more");

    // Terminating a closed process kills its daemon; once the keeper is reaped, its share
    // is back.
    let terminated = abuser
        .call("process/terminate", json!({"processId": "d0"}))
        .await;
    assert_eq!(terminated, json!({"running": false}));
    let deadline = std::time::Instant::now() + crate::util::STEP_TIMEOUT;
    for attempt in 0.. {
        let params = shell(&format!("again-{attempt}"), daemon);
        if abuser.request("process/start", params).await.is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the terminated tree's share was never given back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // The session's end kills every tree; every share is given back.
    assert_eq!(
        metric(&server, "exec_server_quota_in_use", r#"quota="processes""#).await,
        3.0
    );
    abuser.close().await;
    drop(abuser);
    eventually("every keeper of the ended session is reaped", || async {
        metric(&server, "exec_server_quota_in_use", r#"quota="processes""#).await == 0.0
    })
    .await;
}

/// Many sessions together (each within its quota) still cannot run the server out of
/// descriptors: every start is charged to the descriptor budget, a start that does not fit
/// in its session's share is refused with a clear error, and the server keeps the
/// descriptors it needs for everything else, so a victim's `fs/readFile` still works.
/// Before the reserve, the flood reached `EMFILE` and the victim's file read failed.
#[tokio::test]
async fn starts_stop_short_of_the_descriptor_limit() {
    const NOFILE: u64 = 256;
    let server = server(
        Some(NOFILE),
        &[("EXEC_SERVER_SESSION__DETACHED_TTL_MS", "100")],
    )
    .await;
    let pid = pid(&server);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), b"still readable").unwrap();
    let mut abusers = Vec::new();
    for _ in 0..4 {
        abusers.push(server.connect_initialized().await);
    }
    let victim = server.connect_initialized().await;
    let victim = Victim::start(
        victim,
        "fs/readFile",
        json!({"path": file.path().to_str().unwrap()}),
    );

    // Four sessions, each far below its quota of 256, start 40 processes each: together
    // more than the descriptor limit holds.
    let mut started = 0;
    let mut refusals = Vec::new();
    for (n, abuser) in abusers.iter_mut().enumerate() {
        for answer in flood(abuser, &format!("s{n}-"), 40).await {
            match answer {
                Ok(_) => started += 1,
                Err(error) => refusals.push(error),
            }
        }
    }
    let during = ServerResources::of(pid);
    let report = victim.finish().await;
    eprintln!("victim during the descriptor flood: {report}");
    eprintln!("server with {started} processes running: {during}");

    assert!(!refusals.is_empty(), "no start was refused");
    for refused in &refusals {
        let message = refused["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("descriptor budget reached: a process start does not fit within "),
            "{refused}"
        );
    }
    assert!(
        during.fds < NOFILE,
        "the server holds {} descriptors, at the limit",
        during.fds
    );
    drop(abusers);
    eventually("the abusers' processes are gone", || async {
        ServerResources::of(pid).fds < 64
    })
    .await;
    // Their descriptors go back to the budget once their keepers are reaped; until then a
    // new connection (this one, for `/metrics`) may find no room outside the victim's
    // guarantee.
    eventually("the budget takes connections again", || {
        metrics_reachable(&server)
    })
    .await;
    let refused = metric(
        &server,
        "exec_server_descriptor_refusals_total",
        r#"reason="session_max""#,
    )
    .await
        + metric(
            &server,
            "exec_server_descriptor_refusals_total",
            r#"reason="guarantees""#,
        )
        .await;
    assert_eq!(refused, refusals.len() as f64);
}

/// A process that never reads its stdin keeps every write to it pending, and the server
/// holds each pending write's bytes. One session pipelines 160 MiB of writes into such a
/// process: it may have 64 MiB pending (the default share), the rest is refused at once,
/// and the server holds no more than the share. Before the quota, the server held all
/// 160 MiB (and their base64 text) for as long as the process lived.
#[tokio::test]
async fn writes_to_a_process_that_never_reads_are_held_to_the_session_share() {
    const WRITE: usize = 4 << 20;
    const WRITES: usize = 40;
    const SHARE: usize = 64 << 20;
    let server = server(None, &[]).await;
    let pid = pid(&server);
    let mut abuser = server.connect_initialized().await;
    let mut stuck = sleeper("stuck");
    stuck["pipeStdin"] = json!(true);
    abuser.call("process/start", stuck).await;

    let mut victim = server.connect_initialized().await;
    let mut cat = shell("cat", "exec cat >/dev/null");
    cat["pipeStdin"] = json!(true);
    victim.call("process/start", cat).await;
    let victim = Victim::start(
        victim,
        "process/write",
        json!({"processId": "cat", "chunk": b64("a small write\n")}),
    );

    let before = ServerResources::of(pid);
    let chunk = b64(vec![b'x'; WRITE]);
    let mut ids = Vec::with_capacity(WRITES);
    for _ in 0..WRITES {
        let params = json!({"processId": "stuck", "chunk": chunk});
        ids.push(abuser.send_request("process/write", params).await);
    }
    // The writes within the share stay pending; every other one is answered at once.
    let pending = SHARE / WRITE;
    for id in &ids[pending..] {
        let refused = abuser.response(*id).await.unwrap_err();
        assert_error(
            &refused,
            -32600,
            "session quota reached: at most 67108864 bytes of process/write data waiting for their process at once (process.max_pending_write_bytes_per_session)",
        );
    }
    let during = ServerResources::of(pid);
    let report = victim.finish().await;
    eprintln!("victim during the write flood: {report}");
    eprintln!("server before: {before}; with {pending} writes pending: {during}");
    let grown = during.rss_kib.saturating_sub(before.rss_kib);
    // The share, plus refused writes' messages on their way through.
    let rss_budget_kib = (SHARE as u64 + (48 << 20)) / 1024;
    assert!(
        grown <= rss_budget_kib,
        "pending writes grew the server by {grown} KiB (budget {rss_budget_kib} KiB)"
    );
    assert_eq!(
        metric(
            &server,
            "exec_server_quota_in_use",
            r#"quota="pending_write_bytes""#
        )
        .await,
        (pending * WRITE) as f64
    );

    // Killing the process fails its pending writes and gives the share back.
    abuser
        .call("process/terminate", json!({"processId": "stuck"}))
        .await;
    for id in &ids[..pending] {
        let failed = abuser.response(*id).await.unwrap_err();
        assert_error(&failed, -32603, "failed to write to process stdin");
    }
    assert_eq!(
        metric(
            &server,
            "exec_server_quota_in_use",
            r#"quota="pending_write_bytes""#
        )
        .await,
        0.0
    );
}

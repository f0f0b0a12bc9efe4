//! Output floods: processes that write and keep running make the server retain their
//! output for `process/read` (PROTOCOL §4.6). What one session retains is capped, what all
//! sessions retain together is budgeted, and what is counted is what is really held, so
//! that the server's memory stays within the configuration however many processes write.
//!
//! Each abusing process waits for a line on its stdin before it writes, so the server's
//! memory is measured with every process already running: what grows afterwards is output.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::{metric, pid, server, ServerResources, Victim};
use crate::util::{b64, b64decode, Client};

const MIB: u64 = 1024 * 1024;

/// `process/start` params of a process that writes `bytes` zero bytes once a line arrives
/// on its stdin, then sleeps.
fn writer(process_id: &str, bytes: u64) -> Value {
    json!({
        "processId": process_id,
        "argv": ["sh", "-c", format!("read go; head -c {bytes} /dev/zero; exec sleep 600")],
        "cwd": "/",
        "env": {"PATH": "/usr/bin:/bin"},
        "tty": false,
        "pipeStdin": true,
    })
}

/// Starts `count` writers of `bytes` each on `client`; returns their ids.
async fn start_writers(client: &mut Client, prefix: &str, count: usize, bytes: u64) -> Vec<String> {
    let mut ids = Vec::with_capacity(count);
    for i in 0..count {
        let id = format!("{prefix}{i}");
        client.call("process/start", writer(&id, bytes)).await;
        ids.push(id);
    }
    ids
}

/// Lets every writer go, then reads output notifications until each has delivered
/// `bytes`: from then on the server holds whatever it retains of them.
async fn release_and_collect(client: &mut Client, ids: &[String], bytes: u64) {
    for id in ids {
        client
            .call(
                "process/write",
                json!({"processId": id, "chunk": b64("go\n")}),
            )
            .await;
    }
    let mut received: HashMap<String, u64> = ids.iter().map(|id| (id.clone(), 0)).collect();
    let mut incomplete = ids.len();
    while incomplete > 0 {
        let message = client.next_message().await;
        if message["method"] != "process/output" {
            continue;
        }
        let id = message["params"]["processId"].as_str().unwrap();
        let count = received.get_mut(id).expect("output of a known process");
        *count += b64decode(&message["params"]["chunk"]).len() as u64;
        if *count == bytes {
            incomplete -= 1;
        }
    }
}

/// The series of `/metrics` this file checks, for the log.
async fn retention_metrics(server: &crate::util::WsServer) -> String {
    let mut text = format!(
        "retained {} bytes of a budget of {}; evicted bytes by cause:",
        metric(server, "exec_server_process_retained_output_bytes", "").await,
        metric(
            server,
            "exec_server_process_retained_output_budget_bytes",
            ""
        )
        .await,
    );
    for cause in ["process_limit", "session_cap", "global_budget"] {
        let value = metric(
            server,
            "exec_server_process_output_evicted_bytes_total",
            &format!(r#"cause="{cause}""#),
        )
        .await;
        text.push_str(&format!(" {cause} {value}"));
    }
    text
}

/// Two sessions each run 48 processes that write 1 MiB (the per-process retention) and
/// keep running: 96 MiB of output that, before the session cap and the global budget, the
/// server held for as long as the sessions lived. Now each session keeps at most its cap,
/// all together at most the budget, the oldest output of the biggest holder going first —
/// and a quiet session's output is never touched.
#[tokio::test]
async fn an_output_flood_is_held_to_the_session_cap_and_the_global_budget() {
    const SESSION_CAP: u64 = 16 * MIB;
    const BUDGET: u64 = 24 * MIB;
    let server = server(
        None,
        &[
            (
                "EXEC_SERVER_PROCESS__MAX_RETAINED_OUTPUT_BYTES_PER_SESSION",
                &SESSION_CAP.to_string(),
            ),
            (
                "EXEC_SERVER_PROCESS__RETAINED_OUTPUT_BUDGET_BYTES",
                &BUDGET.to_string(),
            ),
            ("EXEC_SERVER_SESSION__DETACHED_TTL_MS", "200"),
            // What waits for a slow client is the connection's, not retained output: keep
            // it small, so that what is measured is retention.
            ("EXEC_SERVER_CONNECTION__OUTBOUND_QUEUE_MESSAGES", "16"),
        ],
    )
    .await;
    let pid = pid(&server);

    // The quiet session: one process with half a MiB of output nobody has read yet.
    let mut quiet = server.connect_initialized().await;
    quiet.call("process/start", writer("mine", MIB / 2)).await;
    release_and_collect(&mut quiet, &["mine".to_owned()], MIB / 2).await;
    let victim = Victim::start(
        quiet,
        "process/read",
        json!({"processId": "mine", "afterSeq": 1_000_000, "waitMs": 0}),
    );

    let mut abusers = Vec::new();
    for n in 0..2 {
        let mut abuser = server.connect_initialized().await;
        let ids = start_writers(&mut abuser, &format!("a{n}-"), 48, MIB).await;
        abusers.push((abuser, ids));
    }
    let before = ServerResources::of(pid);
    for (abuser, ids) in &mut abusers {
        release_and_collect(abuser, ids, MIB).await;
    }
    let after = ServerResources::of(pid);
    let (report, mut quiet) = victim.finish_with_client().await;
    eprintln!("victim during the output flood: {report}");
    eprintln!("server with every process running: {before}; after 96 MiB of output: {after}");
    eprintln!("{}", retention_metrics(&server).await);

    let grown = after.rss_kib.saturating_sub(before.rss_kib);
    // The budget, plus a chunk per process on its way to its client (6 MiB) and what the
    // allocator keeps of the 72 MiB evicted meanwhile.
    let rss_budget_kib = (BUDGET + 16 * MIB) / 1024;
    assert!(
        grown <= rss_budget_kib,
        "the output flood grew the server by {grown} KiB (budget {rss_budget_kib} KiB)"
    );
    assert!(after.threads <= before.threads + 4, "{after} vs {before}");
    assert!(
        metric(&server, "exec_server_process_retained_output_bytes", "").await <= BUDGET as f64
    );
    for cause in ["session_cap", "global_budget"] {
        assert!(
            metric(
                &server,
                "exec_server_process_output_evicted_bytes_total",
                &format!(r#"cause="{cause}""#)
            )
            .await
                > 0.0,
            "nothing was evicted for {cause}"
        );
    }

    // The quiet session's output is all there, without a gap.
    let read = quiet
        .call("process/read", json!({"processId": "mine", "afterSeq": 0}))
        .await;
    let chunks = read["chunks"].as_array().unwrap();
    let seqs: Vec<u64> = chunks.iter().map(|c| c["seq"].as_u64().unwrap()).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "the quiet session lost output");
    let bytes: usize = chunks.iter().map(|c| b64decode(&c["chunk"]).len()).sum();
    assert_eq!(bytes as u64, MIB / 2);

    // When the abusers' sessions end, what they retained leaves the budget; the quiet
    // session's output (its bytes and 96 bytes per chunk) is what remains.
    drop(abusers);
    let quiet_charge = (MIB / 2 + 96 * chunks.len() as u64) as f64;
    super::eventually("the ended sessions' output leaves the budget", || async {
        metric(&server, "exec_server_process_retained_output_bytes", "").await == quiet_charge
    })
    .await;
}

/// With the per-process retention lowered to 16 KiB, 96 processes that each wrote 1 MiB
/// retain 1.5 MiB between them — and that is what the server must hold. Before, each
/// retained chunk was a slice of a 256 KiB read buffer and kept all of it alive, and each
/// process kept its current read buffer too: the same flood held tens of MiB.
#[tokio::test]
async fn retained_chunks_hold_only_their_own_bytes() {
    const RETAINED: u64 = 16 * 1024;
    const PROCESSES: usize = 96;
    let server = server(
        None,
        &[
            (
                "EXEC_SERVER_PROCESS__RETAINED_OUTPUT_BYTES",
                &RETAINED.to_string(),
            ),
            // Notifications waiting for the client are the connection's, not retained.
            ("EXEC_SERVER_CONNECTION__OUTBOUND_QUEUE_MESSAGES", "16"),
        ],
    )
    .await;
    let pid = pid(&server);
    let victim = server.connect_initialized().await;
    let victim = Victim::start(victim, "environment/status", json!({}));
    let mut abuser = server.connect_initialized().await;
    let ids = start_writers(&mut abuser, "w", PROCESSES, MIB).await;
    let before = ServerResources::of(pid);
    release_and_collect(&mut abuser, &ids, MIB).await;
    let after = ServerResources::of(pid);
    let report = victim.finish().await;
    eprintln!("victim during the output: {report}");
    eprintln!("server with every process running: {before}; after their output: {after}");

    let retained_kib = PROCESSES as u64 * RETAINED / 1024;
    let grown = after.rss_kib.saturating_sub(before.rss_kib);
    // What is retained, plus the allocator's and the runtime's slack.
    let rss_budget_kib = retained_kib + 8 * 1024;
    assert!(
        grown <= rss_budget_kib,
        "retaining {retained_kib} KiB grew the server by {grown} KiB (budget {rss_budget_kib} KiB)"
    );
}

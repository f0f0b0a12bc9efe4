//! Searches: each running search holds a thread of the server, and a search whose client
//! does not read its `search/match` notifications waits for room with its thread. Sessions
//! that start as many such searches as their quota allows must not take the server's
//! threads from a victim that reads metadata and starts a process.

use std::path::Path;

use serde_json::json;

use super::blocking_fs::{
    assert_threads_bounded, flood, victim_is_served, Target, ThreadWatch, CONFIG,
};

/// Sessions of the abuser; each starts `search.max_concurrent_searches` (8) searches.
const ABUSIVE_SESSIONS: usize = 10;

/// A tree where every search finds far more matches than the connection can buffer.
fn haystack(root: &Path) {
    let line = "needle in a haystack\n".repeat(500);
    for i in 0..200 {
        std::fs::write(root.join(format!("file-{i:03}.txt")), &line).unwrap();
    }
}

#[tokio::test]
async fn searches_nobody_reads_hold_no_more_than_their_threads() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    haystack(&root);
    std::fs::write(root.join("probe.txt"), "probe").unwrap();
    let target = Target::start(&format!("{CONFIG}\n[search]\nmax_searches_total = 8\n")).await;
    let threads = ThreadWatch::start(target.pid());

    // The abusers never read: their searches wait for room in the connection.
    let mut abusers = target.sessions(ABUSIVE_SESSIONS).await;
    let path = format!("file://{}", root.display());
    flood(&mut abusers, 8, |n| {
        (
            "search/start",
            json!({"searchId": format!("s{n}"), "path": path, "pattern": "needle",
                   "maxResults": 100_000}),
        )
    })
    .await;
    let probe = json!({"path": format!("file://{}", root.join("probe.txt").display())});
    victim_is_served(&target, "unread searches", ("fs/getMetadata", probe)).await;
    assert_threads_bounded(threads.peak().await, "unread searches");
    let metrics = target.metrics().await;
    assert!(
        metrics.contains("exec_server_fair_slots_running{pool=\"search\"} 8\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("exec_server_quota_in_use{quota=\"searches\"} 80\n"),
        "{metrics}"
    );
}

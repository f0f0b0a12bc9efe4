//! Sandbox helpers: sessions whose sandboxed writes go to a FIFO nobody reads, while a
//! victim session keeps making sandboxed requests. The helper slots
//! (`sandbox.max_concurrent_helpers`, 16) are shared by the server, and the abusers open
//! enough sessions that their per-session shares add up to all of them. A helper that
//! waited for the FIFO's reader until the helper time-out (a minute here) would keep the
//! victim waiting that long; a helper waits for a reader only `PEER_WAIT_IN_SLOT` (2 s),
//! then the next session in turn gets its slot.

use serde_json::json;

use super::blocking_fs::{
    assert_threads_bounded, flood, full_fifo, metric, next_error, victim_is_served, Target,
    ThreadWatch, CONFIG, IN_FLIGHT,
};
use crate::sandbox::{default_policy, landlock_available, Tree};
use crate::util::b64;

/// Sessions of the abuser: 8 × 2 helpers each (`sandbox.max_helpers_per_session` in
/// [`CONFIG`]) hold all 16 helper slots, with 62 more writes queued behind in each.
const ABUSIVE_SESSIONS: usize = 8;

/// The helper time-out: far longer than the test waits for any answer.
const HELPER_TIMEOUT_MS: u64 = 60_000;

#[tokio::test]
async fn sandboxed_writes_to_a_fifo_leave_the_victim_served() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let _reader = full_fifo(&tree.t.join("allowed/fifo"));
    std::fs::write(tree.t.join("allowed/probe.txt"), "probe").unwrap();
    let policy = default_policy(&tree);
    let target = Target::start(&format!(
        "{CONFIG}helper_timeout_ms = {HELPER_TIMEOUT_MS}\n"
    ))
    .await;
    let threads = ThreadWatch::start(target.pid());

    let mut abusers = target.sessions(ABUSIVE_SESSIONS).await;
    let fifo = tree.path("allowed/fifo");
    let source = tree.path("allowed/probe.txt");
    // Every other request copies a file into the FIFO: the helper's copy waits the same.
    flood(&mut abusers, IN_FLIGHT, |n| match n % 2 {
        0 => (
            "fs/writeFile",
            json!({"path": fifo, "dataBase64": b64("x"), "sandbox": policy}),
        ),
        _ => (
            "fs/copy",
            json!({"sourcePath": source, "destinationPath": fifo, "recursive": false,
                   "sandbox": policy}),
        ),
    })
    .await;
    let probe = json!({"path": tree.path("allowed/probe.txt"), "sandbox": policy});
    victim_is_served(&target, "sandboxed FIFO writes", ("fs/getMetadata", probe)).await;
    assert_threads_bounded(threads.peak().await, "sandboxed FIFO writes");

    // Writes and copies alike end when the reader has taken nothing for 2 s.
    for _ in 0..2 {
        let error = next_error(&mut abusers[0]).await;
        assert_eq!(error["code"], -32603, "{error}");
        let message = error["message"].as_str().unwrap();
        let reason = message
            .strip_prefix("fs/writeFile: ")
            .or_else(|| message.strip_prefix("fs/copy: "))
            .unwrap_or(message);
        assert_eq!(
            reason,
            "the reader of the FIFO or device did not take the data within 2000 ms \
             (a write that holds a shared fs slot waits no longer for its reader)"
        );
    }
    let metrics = target.metrics().await;
    let limit = metric(
        &metrics,
        "exec_server_fair_slots_limit{pool=\"fs_helpers\"}",
    );
    assert_eq!(limit, 16, "{metrics}");
    // No helper ran into its time-out: each gave up on the reader itself.
    let timeouts = metric(
        &metrics,
        "exec_server_fair_slots_timeouts_total{pool=\"fs_helpers\"}",
    );
    assert_eq!(timeouts, 0, "{metrics}");
}

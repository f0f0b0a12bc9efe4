//! Sandbox helpers: sessions whose sandboxed writes to a FIFO nobody reads keep their fs
//! helpers alive until the helper time-out, while a victim session keeps making sandboxed
//! requests. The helper slots (`sandbox.max_concurrent_helpers`, 16) are shared by the
//! server: without a per-session cap and turns by session, the abusers' queue of hundreds
//! would hold the victim's every request for several helper time-outs.

use serde_json::json;

use super::blocking_fs::{
    assert_threads_bounded, flood, full_fifo, metric, next_error, victim_is_served, Target,
    ThreadWatch, CONFIG, IN_FLIGHT,
};
use crate::sandbox::{default_policy, landlock_available, Tree};
use crate::util::b64;

/// Sessions of the abuser: 4 × 64 sandboxed writes queue 15 rounds of helpers deep.
const ABUSIVE_SESSIONS: usize = 4;

#[tokio::test]
async fn sandboxed_writes_to_a_fifo_leave_the_victim_served() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let _reader = full_fifo(&tree.t.join("allowed/fifo"));
    std::fs::write(tree.t.join("allowed/probe.txt"), "probe").unwrap();
    let policy = default_policy(&tree);
    let target = Target::start(&format!("{CONFIG}helper_timeout_ms = 3000\n")).await;
    let threads = ThreadWatch::start(target.pid());

    let mut abusers = target.sessions(ABUSIVE_SESSIONS).await;
    let fifo = tree.path("allowed/fifo");
    flood(&mut abusers, IN_FLIGHT, |_| {
        (
            "fs/writeFile",
            json!({"path": fifo, "dataBase64": b64("x"), "sandbox": policy}),
        )
    })
    .await;
    let probe = json!({"path": tree.path("allowed/probe.txt"), "sandbox": policy});
    victim_is_served(&target, "sandboxed FIFO writes", ("fs/getMetadata", probe)).await;
    assert_threads_bounded(threads.peak().await, "sandboxed FIFO writes");

    let error = next_error(&mut abusers[0]).await;
    assert_eq!(error["code"], -32603, "{error}");
    assert_eq!(
        error["message"],
        "fs sandbox helper timed out after 3000 ms"
    );
    let metrics = target.metrics().await;
    let limit = metric(
        &metrics,
        "exec_server_fair_slots_limit{pool=\"fs_helpers\"}",
    );
    assert_eq!(limit, 16, "{metrics}");
    let timeouts = metric(
        &metrics,
        "exec_server_fair_slots_timeouts_total{pool=\"fs_helpers\"}",
    );
    assert!(timeouts > 0, "{metrics}");
}

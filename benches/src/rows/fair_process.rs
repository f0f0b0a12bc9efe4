//! Fair share: a victim's round trips while a neighbour (another session) floods the
//! server, against the same victim with no neighbour, on the same server in the same run.
//! The target is the issue's: the victim's p99 under 100 ms.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::stats::median_p99;
use crate::report::{Row, Unit};
use crate::target::WsProcess;
use crate::wire::{self, Rpc};
use crate::Budget;

/// The target for a victim's 99th percentile.
const VICTIM_P99_MICROS: f64 = 100_000.0;
/// Starts a process-flooding neighbour keeps in flight: `dispatch.max_in_flight`.
const FLOOD_DEPTH: usize = 64;
/// Processes of an output-flooding neighbour: each writes without end.
const OUTPUT_WRITERS: usize = 8;

/// A neighbour running on its own connection until stopped.
struct Neighbour {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Neighbour {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.expect("the neighbour panicked");
    }
}

/// A session that keeps `FLOOD_DEPTH` starts of `/bin/true` in flight, one batch after
/// another: the spawner always has its work queued.
async fn process_flood(url: &str) -> Neighbour {
    let mut ws = wire::ws_connect(url).await;
    wire::handshake(&mut ws).await;
    let (stop, mut stopped) = oneshot::channel();
    let task = tokio::spawn(async move {
        let mut next = 0u64;
        loop {
            let first = next;
            for _ in 0..FLOOD_DEPTH {
                let start = json!({"id": next as i64 + 1, "method": "process/start", "params":
                    {"processId": format!("flood-{next}"), "argv": ["/bin/true"], "cwd": "file:///",
                     "env": {}, "tty": false}});
                ws.send_text(start.to_string()).await;
                next += 1;
            }
            let mut answered = 0;
            while answered < FLOOD_DEPTH {
                let text = ws.recv_text().await;
                let message: serde_json::Value = serde_json::from_str(&text).expect("JSON");
                if message["id"].as_i64().is_some_and(|id| id > first as i64) {
                    answered += 1;
                }
            }
            if stopped.try_recv().is_ok() {
                return;
            }
        }
    });
    Neighbour { stop, task }
}

/// A session that starts `OUTPUT_WRITERS` processes writing without end and goes away:
/// detached, nothing holds their output back, and the server records and evicts as fast
/// as they write.
async fn output_flood(url: &str) -> Neighbour {
    let mut ws = wire::ws_connect(url).await;
    wire::handshake(&mut ws).await;
    for i in 0..OUTPUT_WRITERS {
        let params = json!({"processId": format!("writer-{i}"),
            "argv": ["head", "-c", "1099511627776", "/dev/zero"], "cwd": "file:///", "env": {},
            "tty": false});
        wire::call(&mut ws, i as i64 + 1, "process/start", params).await;
    }
    drop(ws);
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(async move {
        let _ = stopped.await;
    });
    Neighbour { stop, task }
}

/// `count` sequential `process/start`s of `/bin/true`, each timed until its response.
async fn spawn_samples(conn: &mut impl Rpc, prefix: &str, count: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(count);
    for i in 0..count {
        let id = 10_000_000 + i as i64;
        let start = json!({"id": id, "method": "process/start", "params":
            {"processId": format!("{prefix}-{i}"), "argv": ["/bin/true"], "cwd": "file:///",
             "env": {}, "tty": false}});
        let started = Instant::now();
        let reply = wire::round_trip(conn, &start.to_string(), id).await;
        samples.push(started.elapsed());
        assert!(
            reply.get("error").is_none(),
            "victim's start failed: {reply}"
        );
    }
    samples
}

fn row(
    key: &'static str,
    what: &'static str,
    flooded: &mut [Duration],
    quiet: &mut [Duration],
) -> Row {
    let (median, p99) = median_p99(flooded);
    let (floor, _) = median_p99(quiet);
    Row {
        key,
        what,
        unit: Unit::Micros,
        median,
        p99: Some(p99),
        floor: Some(floor),
        target: "p99 ≤ 100 ms",
        met: p99 <= VICTIM_P99_MICROS,
        peer: None,
    }
}

/// The victim's `environment/status` and `process/start` while a neighbour floods
/// `process/start`, against both with no neighbour.
pub async fn process_flood_rows(budget: Budget) -> Vec<Row> {
    let server = WsProcess::exec_server(&[]).await;
    let mut victim = wire::ws_connect(&server.url).await;
    wire::handshake(&mut victim).await;
    let statuses = budget.round_trips / 4;
    let spawns = budget.round_trips / 20;
    let mut quiet_status = super::rtt::rpc_samples(&mut victim, statuses).await;
    let mut quiet_spawn = spawn_samples(&mut victim, "quiet", spawns).await;

    let neighbour = process_flood(&server.url).await;
    let mut flooded_status = super::rtt::rpc_samples(&mut victim, statuses).await;
    let mut flooded_spawn = spawn_samples(&mut victim, "flooded", spawns).await;
    neighbour.stop().await;
    vec![
        row(
            "fair_proc",
            "victim's environment/status while a neighbour floods process/start",
            &mut flooded_status,
            &mut quiet_status,
        ),
        row(
            "fair_spawn",
            "victim's process/start while a neighbour floods process/start",
            &mut flooded_spawn,
            &mut quiet_spawn,
        ),
    ]
}

/// The victim's `environment/status` while a detached neighbour's processes write without
/// end, against the same with no neighbour.
pub async fn output_flood_row(budget: Budget) -> Row {
    let server = WsProcess::exec_server(&[]).await;
    let mut victim = wire::ws_connect(&server.url).await;
    wire::handshake(&mut victim).await;
    let statuses = budget.round_trips / 4;
    let mut quiet = super::rtt::rpc_samples(&mut victim, statuses).await;
    let neighbour = output_flood(&server.url).await;
    // Let the writers fill the budget, so eviction is part of what is measured.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut flooded = super::rtt::rpc_samples(&mut victim, statuses).await;
    neighbour.stop().await;
    row(
        "fair_output",
        "victim's environment/status while a neighbour's processes write without end",
        &mut flooded,
        &mut quiet,
    )
}

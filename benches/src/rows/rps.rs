//! Throughput with 1, 8 and 64 concurrent connections, each doing sequential requests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::report::{Row, Unit};
use crate::target::WsProcess;
use crate::wire;
use crate::Budget;

async fn requests_per_second(
    url: &str,
    handshake: bool,
    connections: usize,
    budget: Budget,
) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..connections {
        let mut ws = wire::ws_connect(url).await;
        if handshake {
            wire::handshake(&mut ws).await;
        }
        clients.push(ws);
    }
    let start = Instant::now();
    let deadline = start + budget.rps_window;
    let mut tasks = Vec::new();
    for mut ws in clients {
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            let mut id = 1i64;
            while Instant::now() < deadline {
                let text = format!(r#"{{"id":{id},"method":"environment/status"}}"#);
                wire::round_trip(&mut ws, &text, id).await;
                done.fetch_add(1, Ordering::Relaxed);
                id += 1;
            }
        }));
    }
    for task in tasks {
        task.await.expect("client task");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

pub async fn rps_ws(budget: Budget) -> Vec<Row> {
    let mut rows = Vec::new();
    for (key, what, connections) in [
        ("rps_ws_1", "requests/s, 1 websocket connection", 1),
        ("rps_ws_8", "requests/s, 8 websocket connections", 8),
        ("rps_ws_64", "requests/s, 64 websocket connections", 64),
    ] {
        let floor = WsProcess::echo_floor().await;
        let floor_rps = requests_per_second(&floor.url, false, connections, budget).await;
        drop(floor);
        let server = WsProcess::exec_server(&[]).await;
        let rps = requests_per_second(&server.url, true, connections, budget).await;
        rows.push(Row {
            key,
            what,
            unit: Unit::PerSecond,
            median: rps,
            p99: None,
            floor: Some(floor_rps),
            target: "≥ 0.6× floor",
            met: rps >= 0.6 * floor_rps,
        });
    }
    rows
}

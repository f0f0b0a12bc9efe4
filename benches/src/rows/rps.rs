//! Throughput and tail latency with 1, 8, 64 and 512 concurrent connections, each doing
//! sequential requests, against the echo floor and codex.

use std::time::{Duration, Instant};

use crate::report::{Row, Unit};
use crate::target::WsProcess;
use crate::wire;
use crate::Budget;

/// Requests per second and the p99 round trip in µs over all connections.
pub(crate) async fn requests_per_second(
    url: &str,
    handshake: bool,
    connections: usize,
    budget: Budget,
) -> (f64, f64) {
    crate::rows::memory::raise_fd_limit();
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
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut id = 1i64;
            while Instant::now() < deadline {
                let text = format!(r#"{{"id":{id},"method":"environment/status"}}"#);
                let sent = Instant::now();
                wire::round_trip(&mut ws, &text, id).await;
                latencies.push(sent.elapsed());
                id += 1;
            }
            latencies
        }));
    }
    let mut all: Vec<Duration> = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("client task"));
    }
    let rate = all.len() as f64 / start.elapsed().as_secs_f64();
    let (_, p99) = super::stats::median_p99(&mut all);
    (rate, p99)
}

/// The connection counts of the scaling curve, with their row keys.
pub const CONNECTIONS: [(&str, &str, usize); 4] = [
    ("rps_ws_1", "requests/s, 1 websocket connection", 1),
    ("rps_ws_8", "requests/s, 8 websocket connections", 8),
    ("rps_ws_64", "requests/s, 64 websocket connections", 64),
    ("rps_ws_512", "requests/s, 512 websocket connections", 512),
];

pub async fn rps_ws(budget: Budget, wanted: impl Fn(&str) -> bool) -> Vec<Row> {
    let mut rows = Vec::new();
    for (key, what, connections) in CONNECTIONS {
        if !wanted(key) {
            continue;
        }
        let floor = WsProcess::echo_floor().await;
        let (floor_rps, _) = requests_per_second(&floor.url, false, connections, budget).await;
        drop(floor);
        let server = WsProcess::exec_server(&[]).await;
        let (rps, p99) = requests_per_second(&server.url, true, connections, budget).await;
        drop(server);
        let peer = crate::peer::measure(key, move |codex| async move {
            requests_per_second(&codex.url, true, connections, budget)
                .await
                .0
        })
        .await;
        rows.push(Row {
            key,
            what,
            unit: Unit::PerSecond,
            median: rps,
            // The p99 is a latency; the table shows it in the row's unit column as µs.
            p99: Some(p99),
            floor: Some(floor_rps),
            target: "≥ 0.6× floor",
            met: rps >= 0.6 * floor_rps,
            peer,
        });
    }
    rows
}

//! Sequential round trips: `environment/status` and `fs/getMetadata` against a bare echo
//! of the same bytes, and against codex with the same client.

use std::time::{Duration, Instant};

use super::stats::median_p99;
use crate::report::{Row, Unit};
use crate::target::{StdioProcess, WsProcess};
use crate::wire;
use crate::Budget;

fn status_request(id: i64) -> String {
    format!(r#"{{"id":{id},"method":"environment/status"}}"#)
}

/// Times `count` sequential round trips after a warm-up of a tenth as many, which warms
/// caches and the runtime and is not recorded.
async fn samples(count: usize, mut round_trip: impl AsyncFnMut(i64)) -> Vec<Duration> {
    let warm_up = count / 10;
    let mut samples = Vec::with_capacity(count);
    for id in 1..=(count + warm_up) as i64 {
        let start = Instant::now();
        round_trip(id).await;
        if id as usize > warm_up {
            samples.push(start.elapsed());
        }
    }
    samples
}

/// Round trips of `request(id)` on a new connection to `url` (initialized unless it is
/// the echo floor).
async fn ws_samples(
    url: &str,
    handshake: bool,
    count: usize,
    request: fn(i64) -> String,
) -> Vec<Duration> {
    let mut ws = wire::ws_connect(url).await;
    if handshake {
        wire::handshake(&mut ws).await;
    }
    samples(count, async |id| {
        wire::round_trip(&mut ws, &request(id), id).await;
    })
    .await
}

/// Round trips of `environment/status` on an initialized connection of any kind.
pub(crate) async fn rpc_samples(conn: &mut impl wire::Rpc, count: usize) -> Vec<Duration> {
    samples(count, async |id| {
        wire::round_trip(conn, &status_request(id), id).await;
    })
    .await
}

/// Median and p99 of `request` against the echo floor, exec-server, and codex's median.
async fn ws_row_numbers(
    key: &str,
    count: usize,
    request: fn(i64) -> String,
) -> (f64, f64, f64, Option<f64>) {
    let floor = WsProcess::echo_floor().await;
    let (floor_median, _) = median_p99(&mut ws_samples(&floor.url, false, count, request).await);
    drop(floor);
    let server = WsProcess::exec_server(&[]).await;
    let (median, p99) = median_p99(&mut ws_samples(&server.url, true, count, request).await);
    drop(server);
    let peer = crate::peer::measure(key, move |codex| async move {
        median_p99(&mut ws_samples(&codex.url, true, count, request).await).0
    })
    .await;
    (median, p99, floor_median, peer)
}

pub async fn rtt_ws(budget: Budget) -> Row {
    let (median, p99, floor, peer) =
        ws_row_numbers("rtt_ws", budget.round_trips, status_request).await;
    Row {
        key: "rtt_ws",
        what: "environment/status round trip over websocket",
        unit: Unit::Micros,
        median,
        p99: Some(p99),
        floor: Some(floor),
        target: "≤ 1.5× floor",
        met: median <= 1.5 * floor,
        peer,
    }
}

/// The least one more WebSocket hop adds to a round trip: the echo floor reached through
/// a bare forwarder (what the rendezvous is to a relay stream) against the echo floor
/// reached directly. `rtt_relay_*` pay this hop on top of their own work.
pub async fn rtt_ws_hop(budget: Budget) -> Row {
    let echo = WsProcess::echo_floor().await;
    let forward = WsProcess::forward_floor(&echo.url).await;
    let count = budget.round_trips;
    let mut direct = Vec::with_capacity(count);
    let mut hop = Vec::with_capacity(count);
    // Interleaved in blocks, so both see the same machine.
    for _ in 0..10 {
        direct.extend(ws_samples(&echo.url, false, count / 10, status_request).await);
        hop.extend(ws_samples(&forward.url, false, count / 10, status_request).await);
    }
    let (floor, _) = median_p99(&mut direct);
    let (median, p99) = median_p99(&mut hop);
    Row {
        key: "rtt_ws_hop",
        what: "echo round trip through one bare websocket forwarder vs direct",
        unit: Unit::Micros,
        median,
        p99: Some(p99),
        floor: Some(floor),
        target: "(reported)",
        met: true,
        peer: None,
    }
}

/// Bytes/s of binary messages echoed back over `url`, sent while the echoes are read (the
/// socket buffers bound what is in flight).
async fn echo_rate(url: &str, total: usize) -> f64 {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    const MESSAGE: usize = 64 * 1024;
    let ws = wire::ws_connect(url).await;
    let (mut tx, mut rx) = ws.split();
    let messages = total / MESSAGE;
    let payload = tokio_tungstenite::tungstenite::Bytes::from(vec![7u8; MESSAGE]);
    let started = Instant::now();
    let send = async {
        for _ in 0..messages {
            tx.send(Message::Binary(payload.clone()))
                .await
                .expect("send");
        }
        tx
    };
    let receive = async {
        let mut received = 0;
        while received < messages * MESSAGE {
            match rx.next().await.expect("open").expect("message") {
                Message::Binary(data) => received += data.len(),
                _ => continue,
            }
        }
    };
    let (_tx, ()) = tokio::join!(send, receive);
    (messages * MESSAGE) as f64 / started.elapsed().as_secs_f64()
}

/// Throughput through one bare forwarding hop against the echo floor directly: what one
/// more WebSocket hop costs in bytes/s on this machine, the floor under `relay_out_*`.
pub async fn tput_ws_hop() -> Row {
    let echo = WsProcess::echo_floor().await;
    let forward = WsProcess::forward_floor(&echo.url).await;
    let total = 64 << 20;
    let mut direct = Vec::new();
    let mut hop = Vec::new();
    for _ in 0..3 {
        direct.push(echo_rate(&echo.url, total).await);
        hop.push(echo_rate(&forward.url, total).await);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Row {
        key: "tput_ws_hop",
        what: "64 MiB echoed through one bare websocket forwarder vs direct",
        unit: Unit::BytesPerSecond,
        median: median(&mut hop),
        p99: None,
        floor: Some(median(&mut direct)),
        target: "(reported)",
        met: true,
        peer: None,
    }
}

/// The file every `fs/getMetadata` round trip asks about: the benchmark binary itself,
/// which exists for as long as the run.
fn metadata_request(id: i64) -> String {
    static URI: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let uri = URI.get_or_init(|| {
        let me = std::env::current_exe().expect("own path");
        format!("file://{}", me.display())
    });
    format!(r#"{{"id":{id},"method":"fs/getMetadata","params":{{"path":"{uri}"}}}}"#)
}

/// The small request of the requirement: one `fs/getMetadata` (a blocking `stat` on the
/// server) per round trip.
pub async fn rtt_meta(budget: Budget) -> Row {
    let (median, p99, floor, peer) =
        ws_row_numbers("rtt_meta", budget.round_trips, metadata_request).await;
    Row {
        key: "rtt_meta",
        what: "fs/getMetadata round trip over websocket",
        unit: Unit::Micros,
        median,
        p99: Some(p99),
        floor: Some(floor),
        target: "≤ 1.2× floor, ≤ 0.8× codex",
        met: median <= 1.2 * floor && peer.is_none_or(|p| median <= 0.8 * p),
        peer,
    }
}

async fn line_samples(p: &mut StdioProcess, count: usize) -> Vec<Duration> {
    samples(count, async |id| {
        wire::line_send(p, &status_request(id)).await;
        wire::line_recv(p).await;
    })
    .await
}

pub async fn rtt_stdio(budget: Budget) -> Row {
    let mut floor = StdioProcess::echo_floor();
    let (floor_median, _) = median_p99(&mut line_samples(&mut floor, budget.round_trips).await);
    drop(floor);
    let mut server = StdioProcess::exec_server();
    wire::line_handshake(&mut server).await;
    let (median, p99) = median_p99(&mut line_samples(&mut server, budget.round_trips).await);
    Row {
        key: "rtt_stdio",
        what: "environment/status round trip over stdio",
        unit: Unit::Micros,
        median,
        p99: Some(p99),
        floor: Some(floor_median),
        target: "≤ 1.5× floor",
        met: median <= 1.5 * floor_median,
        peer: None,
    }
}

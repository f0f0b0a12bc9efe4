//! Every row group, run in order. Each row measures exec-server and its floor back to back.

mod audit;
mod fair_fs;
mod fair_process;
mod fs;
mod http;
mod memory;
mod process;
mod proxy;
mod registry;
mod relay;
mod rps;
mod rtt;
mod stats;

use crate::report::Row;
use crate::Budget;

/// The relay rows; asking for any runs the per-suite rows of both suites (one rendezvous and
/// executor per suite), and the stream-count rows that are wanted.
const RELAY_ROWS: [&str; 9] = [
    "relay_connect_ik",
    "rtt_relay_ik",
    "relay_out_ik",
    "relay_connect_hybrid",
    "rtt_relay_hybrid",
    "relay_out_hybrid",
    "relay_rps_1",
    "relay_rps_16",
    "relay_rps_128",
];

/// Runs every row `wanted` accepts and returns them in table order. The relay rows need
/// `rtt_ws`, `pipe_out` and the bare hop (`rtt_ws_hop`, `tput_ws_hop`) for their floors and
/// targets, so those run whenever a relay row is wanted.
pub async fn run_all(budget: Budget, wanted: impl Fn(&str) -> bool) -> Vec<Row> {
    let relay = RELAY_ROWS.iter().any(|k| wanted(k));
    let mut rows = Vec::new();
    let mut rtt_ws_median = 0.0;
    if wanted("rtt_ws") || relay {
        let row = rtt::rtt_ws(budget).await;
        rtt_ws_median = row.median;
        rows.push(row);
    }
    if wanted("rtt_meta") {
        rows.push(rtt::rtt_meta(budget).await);
    }
    if wanted("rtt_stdio") {
        rows.push(rtt::rtt_stdio(budget).await);
    }
    let mut hop_rtt = 0.0;
    if wanted("rtt_ws_hop") || relay {
        let row = rtt::rtt_ws_hop(budget).await;
        hop_rtt = row.median;
        rows.push(row);
    }
    let mut hop_share = 0.0;
    if wanted("tput_ws_hop") || relay {
        let row = rtt::tput_ws_hop().await;
        hop_share = row.median / row.floor.unwrap_or(f64::INFINITY);
        rows.push(row);
    }
    rows.extend(rps::rps_ws(budget, &wanted).await);
    if wanted("spawn") {
        rows.push(process::spawn(budget).await);
    }
    if wanted("spawn_8") {
        rows.push(process::spawn_8(budget).await);
    }
    if wanted("sandbox_spawn") {
        rows.push(process::sandbox_spawn(budget).await);
    }
    if wanted("audit_rtt_meta") || wanted("audit_spawn") {
        rows.extend(audit::audit(budget).await);
    }
    let mut pipe_out_rate = 0.0;
    if wanted("pipe_out") || relay {
        let row = process::pipe_out().await;
        pipe_out_rate = row.median;
        rows.push(row);
    }
    if wanted("pty_out") {
        rows.push(process::pty_out().await);
    }
    if wanted("read_file") {
        rows.push(fs::read_file().await);
    }
    if wanted("read_block") {
        rows.push(fs::read_block().await);
    }
    if wanted("sandbox_write") {
        rows.push(fs::sandbox_write(budget).await);
    }
    if wanted("sandbox_read") {
        rows.push(fs::sandbox_read(budget).await);
    }
    if wanted("sandbox_read_fresh") {
        rows.push(fs::sandbox_read_fresh(budget).await);
    }
    if wanted("http_request") {
        rows.push(http::http_request().await);
    }
    if wanted("http_stream") {
        rows.push(http::http_stream().await);
    }
    if wanted("proxy_out") {
        rows.push(proxy::proxy_out().await);
    }
    if wanted("victim_alone") || wanted("victim_flood") {
        rows.extend(fair_fs::fs_victim(budget).await);
    }
    if relay {
        let floors = relay::LocalFloors {
            rtt_ws: rtt_ws_median,
            pipe_out: pipe_out_rate,
            hop_rtt,
            hop_share,
            ws_connect: relay::local_connect(budget).await,
        };
        rows.extend(relay::relay_rows(budget, floors, &wanted).await);
    }
    if [
        "reg_memory",
        "conn_memory",
        "conn_us_mem",
        "reg_redis",
        "reg_redis_2",
        "conn_redis",
        "conn_redis_2",
        "conn_us_redis",
    ]
    .iter()
    .any(|k| wanted(k))
    {
        rows.extend(registry::registry_rows(budget).await);
    }
    if wanted("handshake_ik") || wanted("handshake_hybrid") {
        rows.extend(relay::handshake_rows(budget));
    }
    if wanted("fair_proc") || wanted("fair_spawn") {
        rows.extend(fair_process::process_flood_rows(budget).await);
    }
    if wanted("fair_output") {
        rows.push(fair_process::output_flood_row(budget).await);
    }
    if wanted("rss_idle") {
        rows.push(memory::rss_idle().await);
    }
    rows.extend(memory::rss_per_conn(&wanted).await);
    if wanted("rss_per_proc") {
        rows.push(process::rss_per_proc(budget).await);
    }
    rows
}

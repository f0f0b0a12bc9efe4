//! Every row group, run in order. Each row measures exec-server and its floor back to back.

mod fs;
mod memory;
mod process;
mod relay;
mod rps;
mod rtt;
mod stats;

use crate::report::Row;
use crate::Budget;

/// Runs every row and returns them in table order.
pub async fn run_all(budget: Budget) -> Vec<Row> {
    let mut rows = Vec::new();
    let rtt_ws = rtt::rtt_ws(budget).await;
    let rtt_ws_median = rtt_ws.median;
    rows.push(rtt_ws);
    rows.push(rtt::rtt_stdio(budget).await);
    rows.extend(rps::rps_ws(budget).await);
    rows.push(process::spawn(budget).await);
    let pipe_out = process::pipe_out().await;
    let pipe_out_rate = pipe_out.median;
    rows.push(pipe_out);
    rows.push(process::pty_out().await);
    rows.push(fs::read_file().await);
    rows.extend(relay::relay_rows(budget, rtt_ws_median, pipe_out_rate).await);
    rows.push(memory::rss_idle().await);
    rows.push(memory::rss_per_conn(budget).await);
    rows.push(process::rss_per_proc(budget).await);
    rows
}

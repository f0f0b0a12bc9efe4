//! Every row group, run in order. Each row measures exec-server and its floor back to back.

mod memory;
mod rps;
mod rtt;
mod stats;

use crate::report::Row;
use crate::Budget;

/// Runs every row and returns them in table order.
pub async fn run_all(budget: Budget) -> Vec<Row> {
    let mut rows = Vec::new();
    rows.push(rtt::rtt_ws(budget).await);
    rows.push(rtt::rtt_stdio(budget).await);
    rows.extend(rps::rps_ws(budget).await);
    rows.push(memory::rss_idle().await);
    rows.push(memory::rss_per_conn(budget).await);
    rows
}

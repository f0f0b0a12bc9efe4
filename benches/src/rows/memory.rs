//! Memory: the server's resident set at rest and per idle connection.

use std::time::Duration;

use crate::report::{Row, Unit};
use crate::target::{rss_kib, WsProcess};
use crate::wire;
use crate::Budget;

/// Lets the server settle (allocator, lazily started threads) before reading its RSS.
pub async fn settled_rss(pid: u32) -> f64 {
    tokio::time::sleep(Duration::from_millis(300)).await;
    rss_kib(pid)
}

pub async fn rss_idle() -> Row {
    let server = WsProcess::exec_server(&[]).await;
    let kib = settled_rss(server.pid()).await;
    Row {
        key: "rss_idle",
        what: "server RSS after start",
        unit: Unit::KiB,
        median: kib,
        p99: None,
        floor: None,
        target: "≤ 16 MiB",
        met: kib <= 16.0 * 1024.0,
    }
}

pub async fn rss_per_conn(budget: Budget) -> Row {
    raise_fd_limit();
    let server = WsProcess::exec_server(&[]).await;
    let before = settled_rss(server.pid()).await;
    let mut connections = Vec::with_capacity(budget.memory_units);
    for _ in 0..budget.memory_units {
        let mut ws = wire::ws_connect(&server.url).await;
        wire::handshake(&mut ws).await;
        connections.push(ws);
    }
    let after = settled_rss(server.pid()).await;
    let per_conn = (after - before) / budget.memory_units as f64;
    Row {
        key: "rss_per_conn",
        what: "extra RSS per idle initialized websocket connection (1,000)",
        unit: Unit::KiB,
        median: per_conn,
        p99: None,
        floor: None,
        target: "≤ 64 KiB",
        met: per_conn <= 64.0,
    }
}

/// Many connections need more descriptors than the usual soft limit of 1,024.
pub fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

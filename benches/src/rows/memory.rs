//! Memory: the server's resident set at rest, per idle connection at 100, 1,000 and 10,000
//! connections, and after they all closed again.

use std::time::Duration;

use crate::report::{Row, Unit};
use crate::target::{rss_kib, WsProcess};
use crate::wire;

/// Lets the server settle (allocator, lazily started threads) before reading its RSS.
pub async fn settled_rss(pid: u32) -> f64 {
    tokio::time::sleep(Duration::from_millis(300)).await;
    rss_kib(pid)
}

pub async fn rss_idle() -> Row {
    let server = WsProcess::exec_server(&[]).await;
    let kib = settled_rss(server.pid()).await;
    drop(server);
    let peer = crate::peer::measure(
        "rss_idle",
        |codex| async move { settled_rss(codex.pid()).await },
    )
    .await;
    Row {
        key: "rss_idle",
        what: "server RSS after start",
        unit: Unit::KiB,
        median: kib,
        p99: None,
        floor: None,
        target: "≤ 16 MiB",
        met: kib <= 16.0 * 1024.0,
        peer,
    }
}

/// The idle-connection counts of the scaling curve, with their row keys.
pub const CONNECTIONS: [(&str, &str, usize); 3] = [
    (
        "rss_conn_100",
        "extra RSS per idle initialized websocket connection (100)",
        100,
    ),
    (
        "rss_per_conn",
        "extra RSS per idle initialized websocket connection (1,000)",
        1_000,
    ),
    (
        "rss_conn_10k",
        "extra RSS per idle initialized websocket connection (10,000)",
        10_000,
    ),
];

/// Enough connections for the largest row, with the usual headroom.
const MAX_CONNECTIONS: &str = "20000";
/// A closed connection's session is kept for a resume this long; short here, so that
/// `rss_closed` sees the memory of connections and sessions both given back.
const DETACHED_TTL_MS: &str = "200";

/// What opening `count` idle connections to `server` costs: the RSS before (after one
/// connection came and went, so lazily made machinery is in the baseline), the extra
/// KiB per connection, and the RSS once they all closed again.
async fn per_connection(server: &WsProcess, count: usize) -> (f64, f64, f64) {
    let pid = server.pid();
    drop(wire::ws_connect(&server.url).await);
    let before = settled_rss(pid).await;
    let mut connections = Vec::with_capacity(count);
    for _ in 0..count {
        let mut ws = wire::ws_connect(&server.url).await;
        wire::handshake(&mut ws).await;
        connections.push(ws);
    }
    let during = settled_rss(pid).await;
    drop(connections);
    // Closing 10,000 connections and expiring their sessions takes the server a moment.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let after = settled_rss(pid).await;
    (before, (during - before) / count as f64, after)
}

/// `rss_conn_100`, `rss_per_conn`, `rss_conn_10k` and, after the largest, `rss_closed`.
pub async fn rss_per_conn(wanted: impl Fn(&str) -> bool) -> Vec<Row> {
    raise_fd_limit();
    let mut rows = Vec::new();
    for (key, what, count) in CONNECTIONS {
        let closed_row_wanted = count == 10_000 && wanted("rss_closed");
        if !wanted(key) && !closed_row_wanted {
            continue;
        }
        let server = WsProcess::exec_server_with_env(
            &[],
            &[
                ("EXEC_SERVER_LISTENER__MAX_CONNECTIONS", MAX_CONNECTIONS),
                ("EXEC_SERVER_SESSION__DETACHED_TTL_MS", DETACHED_TTL_MS),
            ],
        )
        .await;
        let (before, per_conn, after) = per_connection(&server, count).await;
        drop(server);
        let peer = crate::peer::measure(key, move |codex| async move {
            per_connection(&codex, count).await.1
        })
        .await;
        rows.push(Row {
            key,
            what,
            unit: Unit::KiB,
            median: per_conn,
            p99: None,
            floor: None,
            target: "≤ 16 KiB",
            met: per_conn <= 16.0,
            peer,
        });
        if count == 10_000 {
            rows.push(Row {
                key: "rss_closed",
                what: "server RSS once the 10,000 connections and sessions ended (floor: before)",
                unit: Unit::KiB,
                median: after,
                p99: None,
                floor: Some(before),
                target: "≤ 1.1× floor",
                met: after <= 1.1 * before,
                peer: None,
            });
        }
    }
    rows
}

/// Descriptors the server is given for the scaling rows when it may have them: its
/// descriptor budget lets connections (charged to no session) take only what the live
/// sessions' guarantees leave, at least half of the limit, so 10,000 connections with
/// their 10,000 sessions need a limit above 20,000 plus the reserve.
const WANTED_FD_LIMIT: libc::rlim_t = 65_536;

/// Many connections need more descriptors than the usual soft limit of 1,024: the limit
/// is raised to [`WANTED_FD_LIMIT`] where that is allowed, else to the hard limit.
pub fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return;
        }
        let wanted = libc::rlimit {
            rlim_cur: WANTED_FD_LIMIT.max(limit.rlim_cur),
            rlim_max: WANTED_FD_LIMIT.max(limit.rlim_max),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) == 0 {
            return;
        }
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

//! Fair share of the blocking file work: a victim's small `fs/getMetadata` round trips
//! alone, and again while a neighbour floods the server with blocking file operations
//! from four sessions — copies into a FIFO nobody reads (each holds a blocking thread
//! until its deadline), writes to that FIFO (waiting without a thread), and back-to-back
//! 64 KiB reads — all in the same run, against the same server.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::report::{Row, Unit};
use crate::target::WsProcess;
use crate::wire::{self, Rpc};

/// Requests each neighbour session keeps in flight (`dispatch.max_in_flight`).
const IN_FLIGHT: usize = 64;

/// The target for the victim under a flood.
const TARGET_P99: Duration = Duration::from_millis(100);

pub async fn fs_victim(budget: crate::Budget) -> Vec<Row> {
    let dir = std::env::temp_dir().join(format!("exec-server-bench-fair-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("probe.txt"), b"probe").expect("probe file");
    std::fs::write(dir.join("block.bin"), vec![7u8; 64 * 1024]).expect("read file");
    let fifo = dir.join("fifo");
    let _fifo_ends = full_fifo(&fifo);

    let server = WsProcess::exec_server(&[]).await;
    let mut victim = wire::ws_connect(&server.url).await;
    wire::handshake(&mut victim).await;
    let probe = json!({"path": format!("file://{}/probe.txt", dir.display())});
    let runs = (budget.round_trips / 10).max(100);
    let mut alone = probe_round_trips(&mut victim, &probe, runs, 0).await;

    let uri = |name: &str| format!("file://{}/{name}", dir.display());
    let floods: [(&str, Value); 4] = [
        (
            "fs/copy",
            json!({"sourcePath": uri("probe.txt"), "destinationPath": uri("fifo"), "recursive": false}),
        ),
        (
            "fs/writeFile",
            json!({"path": uri("fifo"), "dataBase64": "eA=="}),
        ),
        ("fs/readFile", json!({"path": uri("block.bin")})),
        ("fs/readFile", json!({"path": uri("block.bin")})),
    ];
    let mut neighbour: Vec<JoinHandle<()>> = Vec::new();
    for (method, params) in floods {
        let mut ws = wire::ws_connect(&server.url).await;
        wire::handshake(&mut ws).await;
        neighbour.push(tokio::spawn(keep_flooding(ws, method, params)));
    }
    // Let the floods fill their sessions' shares before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut flooded = probe_round_trips(&mut victim, &probe, runs, 1_000_000).await;
    for task in neighbour {
        task.abort();
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);

    let (alone_median, alone_p99) = super::stats::median_p99(&mut alone);
    let (median, p99) = super::stats::median_p99(&mut flooded);
    vec![
        Row {
            key: "victim_alone",
            what: "victim fs/getMetadata round trip, no neighbour",
            unit: Unit::Micros,
            median: alone_median,
            p99: Some(alone_p99),
            floor: None,
            target: "(reference)",
            met: true,
            peer: None,
        },
        Row {
            key: "victim_flood",
            what: "the same while a neighbour floods blocking fs operations",
            unit: Unit::Micros,
            median,
            p99: Some(p99),
            floor: Some(alone_median),
            target: "p99 ≤ 100 ms",
            met: p99 <= TARGET_P99.as_secs_f64() * 1e6,
            peer: None,
        },
    ]
}

/// `runs` sequential `fs/getMetadata` round trips, ids from `first_id`.
async fn probe_round_trips(
    ws: &mut wire::Ws,
    probe: &Value,
    runs: usize,
    first_id: i64,
) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(runs);
    for i in 0..runs as i64 {
        let started = Instant::now();
        wire::call(ws, first_id + i, "fs/getMetadata", probe.clone()).await;
        samples.push(started.elapsed());
    }
    samples
}

/// Keeps [`IN_FLIGHT`] requests of `method` outstanding: every answer is replaced by a
/// new request, until the task is aborted.
async fn keep_flooding(mut ws: wire::Ws, method: &str, params: Value) {
    let request = |id: usize| json!({"id": id, "method": method, "params": params}).to_string();
    let mut id = 1;
    while id <= IN_FLIGHT {
        ws.send_text(request(id)).await;
        id += 1;
    }
    loop {
        let _answer = ws.recv_text().await;
        ws.send_text(request(id)).await;
        id += 1;
    }
}

/// A FIFO at `path` whose buffer is full, and the descriptor that keeps it so: it holds
/// both ends and never reads, so every write into the FIFO must wait.
fn full_fifo(path: &Path) -> OwnedFd {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: `name` is a valid NUL-terminated path for both calls.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
    // SAFETY: as above; the descriptor is owned by the returned value.
    let fd = unsafe {
        libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    assert!(fd >= 0, "open the FIFO");
    // SAFETY: `fd` was just opened and nothing else owns it.
    let fifo = unsafe { OwnedFd::from_raw_fd(fd) };
    let chunk = [0u8; 4096];
    // SAFETY: `fifo` is open and `chunk` is valid for its length.
    while unsafe { libc::write(fifo.as_raw_fd(), chunk.as_ptr().cast(), chunk.len()) } > 0 {}
    fifo
}

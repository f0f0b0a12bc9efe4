//! Files: `fs/readFile` throughput against reading the file directly.

use std::time::Instant;

use crate::report::{Row, Unit};
use crate::target::WsProcess;
use crate::wire;

pub async fn read_file() -> Row {
    let bytes = 64usize << 20;
    let dir = std::env::temp_dir().join(format!("exec-server-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("blob.bin");
    std::fs::write(&path, vec![7u8; bytes]).expect("write the file");

    // Both read from the page cache: the write above left the file there.
    let started = Instant::now();
    let direct = std::fs::read(&path).expect("read").len();
    let floor = direct as f64 / started.elapsed().as_secs_f64();

    let server = WsProcess::exec_server(&[]).await;
    let mut ws = wire::ws_connect(&server.url).await;
    wire::handshake(&mut ws).await;
    let uri = format!("file://{}", path.display());
    let started = Instant::now();
    let served = wire::read_file_len(&mut ws, 1, &uri).await;
    let rate = served as f64 / started.elapsed().as_secs_f64();
    assert_eq!(served, bytes);
    let _ = std::fs::remove_dir_all(&dir);
    Row {
        key: "read_file",
        what: "fs/readFile of 64 MiB over websocket, decoded",
        unit: Unit::BytesPerSecond,
        median: rate,
        p99: None,
        floor: Some(floor),
        target: "≥ 0.4× floor",
        met: rate >= 0.4 * floor,
    }
}

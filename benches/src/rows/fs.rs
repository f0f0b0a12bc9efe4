//! Files: `fs/readFile` throughput against reading the file directly, and the cost of the
//! sandbox on small reads and writes against the same request without one.

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

    let uri = format!("file://{}", path.display());
    let server = WsProcess::exec_server(&[]).await;
    let rate = served_read_file(&server.url, uri.clone(), bytes).await;
    drop(server);
    let peer = crate::peer::measure("read_file", move |codex| async move {
        served_read_file(&codex.url, uri, bytes).await
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    Row {
        key: "read_file",
        what: "fs/readFile of 64 MiB over websocket, decoded",
        unit: Unit::BytesPerSecond,
        median: rate,
        p99: None,
        floor: Some(floor),
        target: "≥ 0.3× floor",
        met: rate >= 0.3 * floor,
        peer,
    }
}

/// Bytes/s of one `fs/readFile` of `uri` (`bytes` long) answered and decoded.
async fn served_read_file(url: &str, uri: String, bytes: usize) -> f64 {
    let mut ws = wire::ws_connect(url).await;
    wire::handshake(&mut ws).await;
    let started = Instant::now();
    let served = wire::read_file_len(&mut ws, 1, &uri).await;
    let rate = served as f64 / started.elapsed().as_secs_f64();
    assert_eq!(served, bytes);
    rate
}

/// Which sandboxed request a row times, and in which helper.
struct SandboxedCase {
    key: &'static str,
    what: &'static str,
    method: &'static str,
    /// `sandbox.fs_helper_idle_ms`: `None` keeps the default (helpers kept per session and
    /// policy), `Some("0")` gives every request its own helper.
    helper_idle_ms: Option<&'static str>,
}

/// A small `fs/writeFile` under a restricting sandbox (helper, Landlock, seccomp) against
/// the same write without one, same server, interleaved.
pub async fn sandbox_write(budget: crate::Budget) -> Row {
    sandboxed_round_trip(
        budget,
        SandboxedCase {
            key: "sandbox_write",
            what: "sandboxed fs/writeFile (kept helper + Landlock + seccomp) vs unsandboxed",
            method: "fs/writeFile",
            helper_idle_ms: None,
        },
    )
    .await
}

/// A small `fs/readFile` under a restricting sandbox (helper, Landlock, seccomp, checked
/// exact open) against the same read without one, same server, interleaved.
pub async fn sandbox_read(budget: crate::Budget) -> Row {
    sandboxed_round_trip(
        budget,
        SandboxedCase {
            key: "sandbox_read",
            what: "sandboxed fs/readFile of 8 bytes (kept helper + Landlock + seccomp) vs unsandboxed",
            method: "fs/readFile",
            helper_idle_ms: None,
        },
    )
    .await
}

/// `sandbox_read` with a new helper for every request (`sandbox.fs_helper_idle_ms = 0`):
/// what keeping helpers saves.
pub async fn sandbox_read_fresh(budget: crate::Budget) -> Row {
    sandboxed_round_trip(
        budget,
        SandboxedCase {
            key: "sandbox_read_fresh",
            what: "sandbox_read with a new helper per request (fs_helper_idle_ms = 0)",
            method: "fs/readFile",
            helper_idle_ms: Some("0"),
        },
    )
    .await
}

async fn sandboxed_round_trip(budget: crate::Budget, case: SandboxedCase) -> Row {
    use serde_json::json;

    let dir = std::env::temp_dir().join(format!(
        "exec-server-bench-{}-{}",
        case.key,
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("small.txt"), b"payload\n").expect("write the file");
    let target = format!("file://{}/small.txt", dir.display());
    let sandbox = json!({"permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
        {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
        {"path": {"type": "path", "path": format!("file://{}", dir.display())}, "access": "write"}
    ]}}});
    let env: Vec<(&str, &str)> = case
        .helper_idle_ms
        .map(|ms| ("EXEC_SERVER_SANDBOX__FS_HELPER_IDLE_MS", ms))
        .into_iter()
        .collect();
    let server = WsProcess::exec_server_with_env(&[], &env).await;
    let mut ws = wire::ws_connect(&server.url).await;
    wire::handshake(&mut ws).await;
    let runs = budget.round_trips / 20;
    let mut plain = Vec::with_capacity(runs);
    let mut sandboxed = Vec::with_capacity(runs);
    for i in 0..=runs as i64 {
        for (samples, sandbox) in [(&mut plain, json!(null)), (&mut sandboxed, sandbox.clone())] {
            let params = match case.method {
                "fs/writeFile" => {
                    json!({"path": target, "dataBase64": "cGF5bG9hZAo=", "sandbox": sandbox})
                }
                _ => json!({"path": target, "sandbox": sandbox}),
            };
            let started = Instant::now();
            let result = wire::call(&mut ws, 2 * i + 10, case.method, params).await;
            // The first round warms both paths up.
            if i > 0 {
                samples.push(started.elapsed());
            }
            if case.method == "fs/readFile" {
                assert_eq!(result["dataBase64"], "cGF5bG9hZAo=", "{result}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (median, p99) = super::stats::median_p99(&mut sandboxed);
    let (floor, _) = super::stats::median_p99(&mut plain);
    let kept = case.helper_idle_ms.is_none();
    Row {
        key: case.key,
        what: case.what,
        unit: Unit::Micros,
        median,
        p99: Some(p99),
        floor: Some(floor),
        target: if kept {
            "≤ 1.5× unsandboxed"
        } else {
            "(reported)"
        },
        met: !kept || median <= 1.5 * floor,
        peer: None,
    }
}

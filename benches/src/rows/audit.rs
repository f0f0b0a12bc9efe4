//! The audit trail's cost: `fs/getMetadata` round trips and `process/start` of
//! `/bin/true` with the trail on (file backend, `batch`, reads recorded too) against the
//! same server with it off, samples interleaved so both see the same machine.

use std::time::{Duration, Instant};

use super::stats::median_p99;
use crate::report::{Row, Unit};
use crate::target::WsProcess;
use crate::wire;
use crate::Budget;

/// The configuration of the audited server: every request recorded at `metadata`, reads
/// included, into a file under `dir`.
fn audited_config(dir: &std::path::Path) -> std::path::PathBuf {
    let config = dir.join("audit.toml");
    let toml = format!(
        "[audit]\nenabled = true\nlevels = {{ read = \"metadata\" }}\n[[audit.backends]]\ntype = \"file\"\npath = {:?}\nmode = \"batch\"\n",
        dir.join("audit.jsonl").to_str().expect("a UTF-8 temporary directory")
    );
    std::fs::write(&config, toml).expect("audit config");
    config
}

/// A server without the trail and one with it, both initialized.
async fn pair(dir: &std::path::Path) -> ((WsProcess, wire::Ws), (WsProcess, wire::Ws)) {
    let config = audited_config(dir);
    let plain = WsProcess::exec_server(&[]).await;
    let audited = WsProcess::exec_server(&["--config", config.to_str().expect("UTF-8 path")]).await;
    let mut plain_ws = wire::ws_connect(&plain.url).await;
    let mut audited_ws = wire::ws_connect(&audited.url).await;
    wire::handshake(&mut plain_ws).await;
    wire::handshake(&mut audited_ws).await;
    ((plain, plain_ws), (audited, audited_ws))
}

/// One `fs/getMetadata` of the benchmark binary, the request `rtt_meta` times (its path
/// found once, so the client's own work stays out of both sides).
fn metadata_request(id: i64) -> String {
    static URI: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let uri = URI.get_or_init(|| {
        let me = std::env::current_exe().expect("own path");
        format!("file://{}", me.display())
    });
    format!(r#"{{"id":{id},"method":"fs/getMetadata","params":{{"path":"{uri}"}}}}"#)
}

fn row(key: &'static str, what: &'static str, on: &mut [Duration], off: &mut [Duration]) -> Row {
    let (median, p99) = median_p99(on);
    let (floor, _) = median_p99(off);
    Row {
        key,
        what,
        unit: Unit::Micros,
        median,
        p99: Some(p99),
        floor: Some(floor),
        target: "≤ 1.1× audit off",
        met: median <= 1.1 * floor,
        peer: None,
    }
}

/// `audit_rtt_meta` and `audit_spawn`.
pub async fn audit(budget: Budget) -> Vec<Row> {
    let dir = std::env::temp_dir().join(format!("exec-server-bench-audit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ((plain, mut plain_ws), (audited, mut audited_ws)) = pair(&dir).await;
    let count = budget.round_trips;
    let (mut off, mut on) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for id in 1..=(count + count / 10) as i64 {
        let request = metadata_request(id);
        let started = Instant::now();
        wire::round_trip(&mut plain_ws, &request, id).await;
        let plain_time = started.elapsed();
        let started = Instant::now();
        wire::round_trip(&mut audited_ws, &request, id).await;
        if id as usize > count / 10 {
            off.push(plain_time);
            on.push(started.elapsed());
        }
    }
    let meta = row(
        "audit_rtt_meta",
        "fs/getMetadata round trip, audit on vs off",
        &mut on,
        &mut off,
    );
    let runs = budget.round_trips / 10;
    let (mut off, mut on) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for i in 0..=runs {
        let started = Instant::now();
        wire::run_process(&mut plain_ws, &format!("p{i}"), &["/bin/true"], false).await;
        let plain_time = started.elapsed();
        let started = Instant::now();
        wire::run_process(&mut audited_ws, &format!("a{i}"), &["/bin/true"], false).await;
        if i > 0 {
            off.push(plain_time);
            on.push(started.elapsed());
        }
    }
    let spawn = row(
        "audit_spawn",
        "process/start of /bin/true until closed, audit on vs off",
        &mut on,
        &mut off,
    );
    drop((plain_ws, audited_ws, plain, audited));
    let _ = std::fs::remove_dir_all(&dir);
    vec![meta, spawn]
}

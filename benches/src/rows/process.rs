//! Processes: spawn latency, output throughput over pipes and a terminal, memory per process.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::stats::median_p99;
use crate::report::{Row, Unit};
use crate::target::{rss_kib, WsProcess};
use crate::wire;
use crate::Budget;

/// `head -c <bytes> /dev/zero` as an argv.
fn head_argv(bytes: u64) -> Vec<String> {
    vec![
        "head".into(),
        "-c".into(),
        bytes.to_string(),
        "/dev/zero".into(),
    ]
}

/// The floor of `spawn`: `posix_spawn` + `waitpid` of `/bin/true`.
fn posix_spawn_true() -> Duration {
    let program = CString::new("/bin/true").expect("no NUL");
    let argv = [program.as_ptr(), std::ptr::null()];
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let started = Instant::now();
    let mut pid = 0;
    // SAFETY: valid C strings and null-terminated arrays; default attributes and actions.
    let rc = unsafe {
        libc::posix_spawn(
            &mut pid,
            program.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            argv.as_ptr().cast(),
            envp.as_ptr().cast(),
        )
    };
    assert_eq!(rc, 0, "posix_spawn failed");
    let mut status = 0;
    // SAFETY: waits for the child just created.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    started.elapsed()
}

pub async fn spawn(budget: Budget) -> Row {
    let server = WsProcess::exec_server(&[]).await;
    let mut ws = wire::ws_connect(&server.url).await;
    wire::handshake(&mut ws).await;
    // Warm both paths, then interleave samples so both see the same machine state.
    wire::run_process(&mut ws, "warm", &["/bin/true"], false).await;
    posix_spawn_true();
    let runs = budget.round_trips / 10;
    let mut served = Vec::with_capacity(runs);
    let mut raw = Vec::with_capacity(runs);
    for i in 0..runs {
        let started = Instant::now();
        wire::run_process(&mut ws, &format!("t{i}"), &["/bin/true"], false).await;
        served.push(started.elapsed());
        raw.push(posix_spawn_true());
    }
    drop(ws);
    drop(server);
    let (median, p99) = median_p99(&mut served);
    let (floor, _) = median_p99(&mut raw);
    let peer = crate::peer::measure("spawn", move |codex| async move {
        let mut ws = wire::ws_connect(&codex.url).await;
        wire::handshake(&mut ws).await;
        wire::run_process(&mut ws, "warm", &["/bin/true"], false).await;
        let mut samples = Vec::with_capacity(runs);
        for i in 0..runs {
            let started = Instant::now();
            wire::run_process(&mut ws, &format!("t{i}"), &["/bin/true"], false).await;
            samples.push(started.elapsed());
        }
        median_p99(&mut samples).0
    })
    .await;
    Row {
        key: "spawn",
        what: "process/start of /bin/true until process/closed (websocket)",
        unit: Unit::Micros,
        median,
        p99: Some(p99),
        floor: Some(floor),
        target: "≤ 1.3× floor",
        met: median <= 1.3 * floor,
        peer,
    }
}

/// Concurrent starts: [`SPAWN_LANES`] clients each starting `/bin/true` and waiting for
/// it to close, over and over, against as many threads each doing `posix_spawn` +
/// `waitpid` over and over.
const SPAWN_LANES: usize = 8;

/// Processes per second of [`SPAWN_LANES`] raw spawn loops during `window`.
fn raw_spawn_rate(window: Duration) -> f64 {
    let started = Instant::now();
    let deadline = started + window;
    let lanes: Vec<_> = (0..SPAWN_LANES)
        .map(|_| {
            std::thread::spawn(move || {
                let mut done = 0u64;
                while Instant::now() < deadline {
                    posix_spawn_true();
                    done += 1;
                }
                done
            })
        })
        .collect();
    let total: u64 = lanes.into_iter().map(|t| t.join().expect("lane")).sum();
    total as f64 / started.elapsed().as_secs_f64()
}

/// Processes per second of [`SPAWN_LANES`] connections to `url` starting `/bin/true`.
async fn served_spawn_rate(url: &str, window: Duration) -> f64 {
    let mut clients = Vec::with_capacity(SPAWN_LANES);
    for lane in 0..SPAWN_LANES {
        let mut ws = wire::ws_connect(url).await;
        wire::handshake(&mut ws).await;
        wire::run_process(&mut ws, &format!("warm{lane}"), &["/bin/true"], false).await;
        clients.push(ws);
    }
    let started = Instant::now();
    let deadline = started + window;
    let lanes: Vec<_> = clients
        .into_iter()
        .map(|mut ws| {
            tokio::spawn(async move {
                let mut done = 0u64;
                while Instant::now() < deadline {
                    wire::run_process(&mut ws, &format!("c{done}"), &["/bin/true"], false).await;
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut total = 0;
    for lane in lanes {
        total += lane.await.expect("lane");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

pub async fn spawn_8(budget: Budget) -> Row {
    let window = budget.rps_window;
    let floor = tokio::task::spawn_blocking(move || raw_spawn_rate(window))
        .await
        .expect("raw spawns");
    let server = WsProcess::exec_server(&[]).await;
    let rate = served_spawn_rate(&server.url, window).await;
    drop(server);
    let peer = crate::peer::measure("spawn_8", move |codex| async move {
        served_spawn_rate(&codex.url, window).await
    })
    .await;
    Row {
        key: "spawn_8",
        what: "processes/s, 8 connections each starting /bin/true until closed",
        unit: Unit::PerSecond,
        median: rate,
        p99: None,
        floor: Some(floor),
        target: "≥ 0.85× floor",
        met: rate >= 0.85 * floor,
        peer,
    }
}

/// A sandboxed `process/start` of `/bin/true` (launcher, namespaces, Landlock, seccomp)
/// against the unsandboxed start, same server, interleaved. The exit-output grace of
/// sandboxed processes is set to 0 so that the row measures the confinement, not the wait.
pub async fn sandbox_spawn(budget: Budget) -> Row {
    let dir = std::env::temp_dir().join(format!("exec-server-bench-spawn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sandbox = wire::confined_sandbox(&dir);
    let server =
        WsProcess::exec_server_with_env(&[], &[("EXEC_SERVER_SANDBOX__EXIT_OUTPUT_GRACE_MS", "0")])
            .await;
    let mut ws = wire::ws_connect(&server.url).await;
    wire::handshake(&mut ws).await;
    let runs = budget.round_trips / 20;
    let mut plain = Vec::with_capacity(runs);
    let mut sandboxed = Vec::with_capacity(runs);
    // The first round warms both paths up.
    for i in 0..=runs {
        let started = Instant::now();
        wire::run_process(&mut ws, &format!("p{i}"), &["/bin/true"], false).await;
        let plain_time = started.elapsed();
        let started = Instant::now();
        wire::run_sandboxed_process(&mut ws, &format!("s{i}"), &["/bin/true"], &sandbox).await;
        if i > 0 {
            plain.push(plain_time);
            sandboxed.push(started.elapsed());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (median, p99) = median_p99(&mut sandboxed);
    let (floor, _) = median_p99(&mut plain);
    Row {
        key: "sandbox_spawn",
        what: "sandboxed process/start of /bin/true until closed vs unsandboxed",
        unit: Unit::Micros,
        median,
        p99: Some(p99),
        floor: Some(floor),
        target: "(reported)",
        met: true,
        peer: None,
    }
}

/// Reads `reader` to its end (a terminal master ends with EIO) and returns the byte count.
fn drain(mut reader: impl Read) -> u64 {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        match reader.read(&mut buf) {
            Ok(0) | Err(_) => return total,
            Ok(n) => total += n as u64,
        }
    }
}

/// Bytes/s of reading `head -c <bytes>` through a pipe, directly.
fn direct_pipe(bytes: u64) -> f64 {
    let argv = head_argv(bytes);
    let started = Instant::now();
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn head");
    let total = drain(child.stdout.take().expect("stdout"));
    child.wait().expect("wait");
    assert_eq!(total, bytes);
    total as f64 / started.elapsed().as_secs_f64()
}

/// Bytes/s of reading `head -c <bytes>` through a new pseudo-terminal, directly.
fn direct_pty(bytes: u64) -> f64 {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors into the given ints; no name, termios or size.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty failed");
    // SAFETY: both descriptors were just created and are owned here alone.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let argv = head_argv(bytes);
    let started = Instant::now();
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::from(slave))
        .spawn()
        .expect("spawn head");
    // The parent's copy of the slave was moved into the command and is closed now, so the
    // master reports EIO once the child is done.
    let total = drain(std::fs::File::from(master));
    child.wait().expect("wait");
    total as f64 / started.elapsed().as_secs_f64()
}

/// Bytes/s of the same command's output delivered as decoded bytes to a websocket client.
async fn served_output(url: &str, bytes: u64, tty: bool) -> f64 {
    let mut ws = wire::ws_connect(url).await;
    wire::handshake(&mut ws).await;
    let argv = head_argv(bytes);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let started = Instant::now();
    let total = wire::run_process(&mut ws, "out", &argv, tty).await;
    assert_eq!(total, bytes, "every byte delivered");
    total as f64 / started.elapsed().as_secs_f64()
}

pub async fn pipe_out() -> Row {
    let bytes = 256 << 20;
    let floor = direct_pipe(bytes);
    let server = WsProcess::exec_server(&[]).await;
    let rate = served_output(&server.url, bytes, false).await;
    drop(server);
    let peer = crate::peer::measure("pipe_out", move |codex| async move {
        served_output(&codex.url, bytes, false).await
    })
    .await;
    Row {
        key: "pipe_out",
        what: "256 MiB of head -c over a pipe, decoded by a websocket client",
        unit: Unit::BytesPerSecond,
        median: rate,
        p99: None,
        floor: Some(floor),
        target: "≥ 0.5× floor",
        met: rate >= 0.5 * floor,
        peer,
    }
}

pub async fn pty_out() -> Row {
    let bytes = 64 << 20;
    let floor = direct_pty(bytes);
    let server = WsProcess::exec_server(&[]).await;
    let rate = served_output(&server.url, bytes, true).await;
    Row {
        key: "pty_out",
        what: "64 MiB of head -c through a PTY, decoded by a websocket client",
        unit: Unit::BytesPerSecond,
        median: rate,
        p99: None,
        floor: Some(floor),
        target: "≥ 0.9× floor",
        met: rate >= 0.9 * floor,
        peer: None,
    }
}

pub async fn rss_per_proc(budget: Budget) -> Row {
    crate::rows::memory::raise_fd_limit();
    // One session holds them all: lift its process quota above the row's count.
    let quota = (budget.memory_units + 16).to_string();
    let server = WsProcess::exec_server_with_env(
        &[],
        &[("EXEC_SERVER_PROCESS__MAX_PROCESSES_PER_SESSION", &quota)],
    )
    .await;
    let mut ws = wire::ws_connect(&server.url).await;
    wire::handshake(&mut ws).await;
    // One process first, so lazily created machinery (spawner thread, stacks) is counted
    // in the baseline, not spread over the per-process figure.
    start_sleeper(&mut ws, "first", 0).await;
    let before = crate::rows::memory::settled_rss(server.pid()).await;
    for i in 1..=budget.memory_units {
        start_sleeper(&mut ws, &format!("s{i}"), i as i64).await;
    }
    let after = crate::rows::memory::settled_rss(server.pid()).await;
    let per_proc = (after - before) / budget.memory_units as f64;
    let _ = rss_kib(server.pid());
    Row {
        key: "rss_per_proc",
        what: "extra server RSS per running sleep process (1,000)",
        unit: Unit::KiB,
        median: per_proc,
        p99: None,
        floor: None,
        target: "≤ 64 KiB",
        met: per_proc <= 64.0,
        peer: None,
    }
}

async fn start_sleeper(ws: &mut wire::Ws, process_id: &str, id: i64) {
    let params = json!({"processId": process_id, "argv": ["sleep", "600"], "cwd": "file:///", "env": {}, "tty": false});
    wire::call(ws, 1_000_000 + id, "process/start", params).await;
}

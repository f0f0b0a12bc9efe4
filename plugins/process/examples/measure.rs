//! Measures spawn latency and output throughput of a real `exec-server` over WebSocket,
//! each next to its baseline in the same run:
//!
//! * `/bin/true` from `process/start` to `process/closed`, against `posix_spawn` + `waitpid`;
//! * `head -c 268435456 /dev/zero` delivered as decoded bytes to the client, against reading
//!   the same command's pipe directly.
//!
//! ```text
//! cargo build --release --bin exec-server
//! cargo run --release -p exec-server-process --example measure [-- path/to/exec-server [runs]]
//! ```

use std::ffi::CString;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const OUTPUT_BYTES: u64 = 268_435_456;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

struct Client {
    socket: Socket,
    next_id: u64,
}

impl Client {
    async fn send(&mut self, message: Value) {
        self.socket
            .send(Message::Text(message.to_string().into()))
            .await
            .unwrap();
    }

    async fn request(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"id": id, "method": method, "params": params}))
            .await;
        id
    }

    async fn next(&mut self) -> Value {
        loop {
            match self.socket.next().await.expect("connection open").unwrap() {
                Message::Text(text) => return serde_json::from_str(&text).unwrap(),
                Message::Binary(bytes) => return serde_json::from_slice(&bytes).unwrap(),
                _ => continue,
            }
        }
    }

    /// Starts `argv` and returns the decoded output byte count once the process closed.
    async fn run(&mut self, id: &str, argv: &[&str]) -> u64 {
        let params = json!({"processId": id, "argv": argv, "cwd": "/", "env": {}, "tty": false});
        self.request("process/start", params).await;
        let mut bytes = 0;
        loop {
            let message = self.next().await;
            if let Some(error) = message.get("error") {
                panic!("{error}");
            }
            let method = message["method"].as_str().unwrap_or_default();
            if message["params"]["processId"] != id {
                continue;
            }
            match method {
                "process/output" => {
                    let chunk = message["params"]["chunk"].as_str().unwrap();
                    bytes += base64::engine::general_purpose::STANDARD
                        .decode(chunk)
                        .unwrap()
                        .len() as u64;
                }
                "process/closed" => return bytes,
                _ => {}
            }
        }
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn posix_spawn_true() -> Duration {
    let program = CString::new("/bin/true").unwrap();
    let argv = [program.as_ptr(), std::ptr::null()];
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let started = Instant::now();
    let mut pid = 0;
    // SAFETY: valid C strings and null-terminated arrays; default attributes.
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
    assert_eq!(rc, 0);
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    started.elapsed()
}

fn direct_pipe_read() -> (u64, Duration) {
    let started = Instant::now();
    let mut child = Command::new("head")
        .args(["-c", &OUTPUT_BYTES.to_string(), "/dev/zero"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        let n = stdout.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    child.wait().unwrap();
    (total, started.elapsed())
}

/// CPU time (user + system) `pid` has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / per_second)
}

fn mib_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / elapsed.as_secs_f64()
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let binary = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/exec-server")
    });
    let runs: usize = args.next().map_or(200, |n| n.parse().unwrap());

    let mut server = Command::new(&binary)
        .args(["--listen", "ws://127.0.0.1:0"])
        .stdout(Stdio::piped())
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let (socket, _) = tokio_tungstenite::connect_async(line.trim()).await.unwrap();
    let mut client = Client { socket, next_id: 0 };
    let id = client
        .request("initialize", json!({"clientName": "measure"}))
        .await;
    while client.next().await["id"] != id {}
    client
        .send(json!({"method": "initialized", "params": {}}))
        .await;

    // Warm up both paths, then interleave the samples so both see the same machine state.
    client.run("warm", &["/bin/true"]).await;
    posix_spawn_true();
    let mut served = Vec::with_capacity(runs);
    let mut raw = Vec::with_capacity(runs);
    for i in 0..runs {
        let started = Instant::now();
        client.run(&format!("t{i}"), &["/bin/true"]).await;
        served.push(started.elapsed());
        raw.push(posix_spawn_true());
    }
    println!(
        "spawn /bin/true, median of {runs}: exec-server start->closed over ws {:?}; posix_spawn+waitpid {:?}",
        median(served),
        median(raw)
    );

    let size = OUTPUT_BYTES.to_string();
    let cpu_before = cpu_time(server.id());
    let started = Instant::now();
    let bytes = client
        .run("head", &["head", "-c", &size, "/dev/zero"])
        .await;
    let served = started.elapsed();
    let server_cpu = cpu_time(server.id()) - cpu_before;
    assert_eq!(bytes, OUTPUT_BYTES);
    let (direct_bytes, direct) = direct_pipe_read();
    assert_eq!(direct_bytes, OUTPUT_BYTES);
    println!(
        "output of {} MiB: exec-server over ws (decoded) {:.0} MiB/s in {:?} (server CPU {:?}); direct pipe read {:.0} MiB/s in {:?}",
        OUTPUT_BYTES >> 20,
        mib_per_s(bytes, served),
        served,
        server_cpu,
        mib_per_s(direct_bytes, direct),
        direct
    );
    let _ = server.kill();
    let _ = server.wait();
}

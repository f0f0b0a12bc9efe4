//! Noisy neighbours: one client abuses the server (processes, output, blocking file
//! operations, …) while a victim on another connection keeps making small requests. The
//! victim's requests must all be answered promptly, and the server's memory, threads and
//! descriptors must stay within the configured budgets. Each module is one abuse.
//!
//! The shared pieces live here: [`Victim`] (a second client measuring its round trips),
//! [`ServerResources`] (what the server process holds, read from `/proc`), [`server`] (the
//! real binary under a chosen descriptor limit and configuration) and [`metric`].

#![allow(dead_code)]

mod output;
mod processes;

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::process::Command;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::util::{http_body, server_bin, Client, WsServer, STEP_TIMEOUT};
use crate::websocket::prometheus_value;

/// A client that keeps making one small request after another until stopped, recording
/// how long each took. Every request must be answered: an error or a missing answer
/// fails the test.
pub struct Victim {
    stop: CancellationToken,
    task: JoinHandle<(Vec<Duration>, Client)>,
}

/// What the victim saw.
#[derive(Debug)]
pub struct VictimReport {
    pub requests: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Victim {
    /// Starts the victim on its own initialized connection. `method`/`params` is the small
    /// request it repeats (e.g. `environment/status`, or `fs/getMetadata` of a file).
    pub fn start(client: Client, method: &'static str, params: serde_json::Value) -> Self {
        Self::start_with(client, method, move |_| params.clone())
    }

    /// Like [`Victim::start`], with the params of the `n`th request (from 0) made by
    /// `params(n)`: for requests that must differ, such as `process/start` ids.
    pub fn start_with(
        mut client: Client,
        method: &'static str,
        mut params: impl FnMut(u64) -> serde_json::Value + Send + 'static,
    ) -> Self {
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut n = 0;
            while !stopped.is_cancelled() {
                let request = client.request(method, params(n));
                n += 1;
                let started = Instant::now();
                let answer = tokio::time::timeout(STEP_TIMEOUT, request)
                    .await
                    .unwrap_or_else(|_| {
                        panic!("the victim's {method} got no answer in {STEP_TIMEOUT:?}")
                    });
                if let Err(error) = answer {
                    panic!("the victim's {method} failed: {error}");
                }
                samples.push(started.elapsed());
                // A request every 5 ms: a steady probe, not a second flood.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (samples, client)
        });
        Self { stop, task }
    }

    /// Stops the victim and summarises its round trips.
    pub async fn finish(self) -> VictimReport {
        self.finish_with_client().await.0
    }

    /// Stops the victim; returns the summary of its round trips and its client, for
    /// checks after the abuse.
    pub async fn finish_with_client(self) -> (VictimReport, Client) {
        self.stop.cancel();
        let (mut samples, client) = self.task.await.expect("the victim panicked");
        assert!(!samples.is_empty(), "the victim made no request");
        samples.sort();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        let report = VictimReport {
            requests: samples.len(),
            p50: at(0.50),
            p99: at(0.99),
            max: *samples.last().unwrap(),
        };
        (report, client)
    }
}

/// A victim request that touches nothing: `environment/status`.
pub fn status_probe() -> (&'static str, serde_json::Value) {
    ("environment/status", json!({}))
}

/// What the server process holds, read from `/proc/<pid>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerResources {
    pub rss_kib: u64,
    pub threads: u64,
    pub fds: u64,
}

impl ServerResources {
    pub fn of(pid: u32) -> Self {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        };
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count() as u64;
        Self {
            rss_kib: field("VmRSS:"),
            threads: field("Threads:"),
            fds,
        }
    }
}

impl std::fmt::Display for VictimReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests, p50 {:?}, p99 {:?}, max {:?}",
            self.requests, self.p50, self.p99, self.max
        )
    }
}

impl std::fmt::Display for ServerResources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {} KiB, {} threads, {} descriptors",
            self.rss_kib, self.threads, self.fds
        )
    }
}

/// `exec-server --listen ws://127.0.0.1:0` with `RLIMIT_NOFILE` set to `nofile` (soft and
/// hard, so the server cannot raise it) when given, and `env` added to its environment
/// (configuration overrides such as `EXEC_SERVER_PROCESS__MAX_PROCESSES_PER_SESSION`).
pub async fn server(nofile: Option<u64>, env: &[(&str, &str)]) -> WsServer {
    let mut cmd = Command::new("sh");
    let limit = nofile.map_or(String::new(), |n| format!("ulimit -n {n} && "));
    cmd.arg("-c")
        .arg(format!("{limit}exec \"$0\" --listen ws://127.0.0.1:0"))
        .arg(server_bin())
        .envs(env.iter().copied())
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    WsServer::start_with(cmd).await
}

/// The server's pid (the `sh` of [`server`] executed it).
pub fn pid(server: &WsServer) -> u32 {
    server.child.id().expect("the server runs")
}

/// The value of one series (`name{labels}`, or `name` alone when `labels` is empty) in the
/// server's `/metrics`; 0 when the series does not exist (yet).
pub async fn metric(server: &WsServer, name: &str, labels: &str) -> f64 {
    let (status, body) = http_body(&server.http_base(), "/metrics", "").await;
    assert_eq!(status, 200, "{body}");
    let series = if labels.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{labels}}}")
    };
    prometheus_value(&body, &series).unwrap_or(0.0)
}

/// Whether `/metrics` answers 200 now; false also when the connection is refused or reset
/// (an accepted connection the descriptor budget has no room for is closed at once).
pub async fn metrics_reachable(server: &WsServer) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let base = server.http_base();
    let addr = base.trim_start_matches("http://");
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut response = Vec::new();
    let read = tokio::time::timeout(STEP_TIMEOUT, stream.read_to_end(&mut response)).await;
    matches!(read, Ok(Ok(_))) && response.starts_with(b"HTTP/1.1 200")
}

/// Waits until `condition` holds, checking every 20 ms; fails with `what` after
/// [`STEP_TIMEOUT`].
pub async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    mut condition: impl FnMut() -> F,
) {
    let deadline = Instant::now() + STEP_TIMEOUT;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `process/start` params of a pipe-mode process running `sh -c <script>`.
pub fn shell(process_id: &str, script: &str) -> serde_json::Value {
    json!({
        "processId": process_id,
        "argv": ["sh", "-c", script],
        "cwd": "/",
        "env": {"PATH": "/usr/bin:/bin"},
        "tty": false,
    })
}

mod blocking_fs;
mod sandbox_helpers;
mod searches;

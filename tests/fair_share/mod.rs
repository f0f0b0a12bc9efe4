//! Noisy neighbours: one client abuses the server (processes, output, blocking file
//! operations, …) while a victim on another connection keeps making small requests. The
//! victim's requests must all be answered promptly, and the server's memory, threads and
//! descriptors must stay within the configured budgets. Each module is one abuse.
//!
//! The shared pieces live here: [`Victim`] (a second client measuring its round trips) and
//! [`ServerResources`] (what the server process holds, read from `/proc`).

#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::util::{Client, STEP_TIMEOUT};

/// A client that keeps making one small request after another until stopped, recording
/// how long each took. Every request must be answered: an error or a missing answer
/// fails the test.
pub struct Victim {
    stop: CancellationToken,
    task: JoinHandle<Vec<Duration>>,
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
    pub fn start(mut client: Client, method: &'static str, params: serde_json::Value) -> Self {
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            while !stopped.is_cancelled() {
                let started = Instant::now();
                let answer =
                    tokio::time::timeout(STEP_TIMEOUT, client.request(method, params.clone()))
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
            samples
        });
        Self { stop, task }
    }

    /// Stops the victim and summarises its round trips.
    pub async fn finish(self) -> VictimReport {
        self.stop.cancel();
        let mut samples = self.task.await.expect("the victim panicked");
        assert!(!samples.is_empty(), "the victim made no request");
        samples.sort();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        VictimReport {
            requests: samples.len(),
            p50: at(0.50),
            p99: at(0.99),
            max: *samples.last().unwrap(),
        }
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

mod blocking_fs;
mod sandbox_helpers;
mod searches;

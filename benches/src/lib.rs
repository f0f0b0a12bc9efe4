//! The exec-server benchmark harness and soak test, as a library shared by two binaries.
//!
//! `exec-server-bench` (`src/main.rs`) measures exec-server and, in the same run, the
//! machine's own floor for the same work (a bare echo server, a raw pipe, a raw spawn) and,
//! where codex is installed, the same rows against `codex exec-server`; then prints one
//! table (or one JSON object keyed by row). `exec-server-soak` (`src/bin/soak.rs`,
//! `scripts/soak.sh`) runs a mixed workload against one server for minutes and fails when
//! its resources grow without bound, a request errs or output is lost.
//!
//! * [`chart`] — the scaling rows as an SVG chart (`--svg PATH`).
//! * [`report`] — rows, the table and the JSON output.
//! * [`floors`] — the bare servers floors are measured against (the bench re-executed).
//! * [`peer`] — finding codex, whose `exec-server` the peer rows run against.
//! * [`target`] — starting the exec-server binary (server, executor, rendezvous) and reading
//!   its memory use.
//! * [`wire`] — a minimal JSON-RPC client over WebSocket, relay and stdio.
//! * [`rows`] — one module per group of rows.
//! * [`soak`] — the soak test: workload, resource monitor, growth rule.

pub mod chart;
pub mod floors;
pub mod peer;
pub mod report;
pub mod rows;
pub mod soak;
pub mod target;
pub mod wire;

use std::time::Duration;

/// How much work each row does.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Sequential round trips per latency row.
    pub round_trips: usize,
    /// How long each throughput row runs.
    pub rps_window: Duration,
    /// Connections / processes for the per-unit memory rows.
    pub memory_units: usize,
}

impl Budget {
    pub fn new(quick: bool) -> Self {
        if quick {
            Self {
                round_trips: 2_000,
                rps_window: Duration::from_millis(1_500),
                memory_units: 1_000,
            }
        } else {
            Self {
                round_trips: 20_000,
                rps_window: Duration::from_secs(5),
                memory_units: 1_000,
            }
        }
    }
}

//! The exec-server benchmark harness.
//!
//! `cargo run --release -p exec-server-bench -- [--quick] [--json] [--no-codex] [--svg PATH] [--only ROW,…]`
//! measures exec-server and, in the same run, the machine's own floor for the same work (a
//! bare echo server, a raw pipe, a raw spawn) and, where codex is installed, the same rows
//! against `codex exec-server`; then prints one table (or one JSON object keyed by row).
//!
//! * [`chart`] — the scaling rows as an SVG chart (`--svg PATH`).
//! * [`report`] — rows, the table and the JSON output.
//! * [`floors`] — the bare servers floors are measured against (this binary re-executed).
//! * [`peer`] — finding codex, whose `exec-server` the peer rows run against.
//! * [`target`] — starting the exec-server binary and reading its memory use.
//! * [`wire`] — a minimal JSON-RPC client over WebSocket and stdio.
//! * [`rows`] — one module per group of rows.

mod chart;
mod floors;
mod peer;
mod report;
mod rows;
mod target;
mod wire;

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
    fn new(quick: bool) -> Self {
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(code) = floors::dispatch(&args) {
        std::process::exit(code);
    }
    let quick = args.iter().any(|a| a == "--quick");
    let json = args.iter().any(|a| a == "--json");
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("usage: exec-server-bench [--quick] [--json] [--no-codex] [--svg PATH] [--only ROW[,ROW…]]");
        return;
    }
    peer::init(!args.iter().any(|a| a == "--no-codex"));
    // `--only read_file,spawn` runs just those rows (for profiling one path).
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|list| list.split(',').map(str::to_owned).collect());
    let wanted = |key: &str| {
        only.as_ref()
            .is_none_or(|keys| keys.iter().any(|k| k == key))
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let budget = Budget::new(quick);
    let rows = runtime.block_on(rows::run_all(budget, wanted));
    if let Some(path) = args
        .iter()
        .position(|a| a == "--svg")
        .and_then(|i| args.get(i + 1))
    {
        let svg = chart::scaling_svg(&rows, &target::machine_summary());
        std::fs::write(path, svg).expect("write the SVG chart");
    }
    if json {
        println!("{}", report::to_json(&rows));
    } else {
        print!("{}", report::table(&rows, &target::machine_summary()));
    }
}

//! The exec-server benchmark harness (the library's crate docs describe the modules).
//!
//! `cargo run --release -p exec-server-bench -- [--quick] [--json] [--no-codex] [--svg PATH] [--only ROW,…]`
//! measures exec-server and, in the same run, the machine's own floor for the same work (a
//! bare echo server, a raw pipe, a raw spawn) and, where codex is installed, the same rows
//! against `codex exec-server`; then prints one table (or one JSON object keyed by row).

use exec_server_bench::{chart, floors, peer, report, rows, target, Budget};

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

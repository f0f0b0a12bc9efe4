//! `exec-server-soak [--minutes M] [--ws-clients N] [--relay-clients N] [--sample-secs S]`:
//! the soak test of the `exec_server_bench::soak` module (run it with `scripts/soak.sh
//! MINUTES`). Exit status 0 when it passed, 1 when it failed, 130 when interrupted, 2 for
//! bad arguments.

use std::time::Duration;

use exec_server_bench::soak::{self, Options, RUN_MARKER};

const USAGE: &str =
    "usage: exec-server-soak [--minutes M] [--ws-clients N] [--relay-clients N] [--sample-secs S]";

fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        duration: Duration::from_secs(120),
        ws_clients: 3,
        relay_clients: 2,
        sample_every: Duration::from_secs(2),
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("{flag} needs a number\n{USAGE}"))
        };
        match flag.as_str() {
            "--minutes" => options.duration = Duration::from_secs_f64(value()? * 60.0),
            "--ws-clients" => options.ws_clients = value()? as usize,
            "--relay-clients" => options.relay_clients = value()? as usize,
            "--sample-secs" => options.sample_every = Duration::from_secs_f64(value()?.max(0.5)),
            _ => return Err(USAGE.into()),
        }
    }
    Ok(options)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    // Before any thread starts: the servers inherit the marker, the workload passes it on.
    if std::env::var_os(RUN_MARKER).is_none() {
        std::env::set_var(RUN_MARKER, format!("soak-{}", std::process::id()));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let outcome = runtime.block_on(soak::run(options));
    runtime.shutdown_timeout(Duration::from_secs(1));
    if outcome.interrupted {
        eprintln!("soak: interrupted");
        std::process::exit(130);
    }
    if outcome.failures.is_empty() {
        println!("soak: PASSED");
        return;
    }
    println!("soak: FAILED");
    for failure in &outcome.failures {
        println!("  - {failure}");
    }
    std::process::exit(1);
}

//! The relay: round trips and output throughput through a real `exec-server rendezvous`,
//! against the local websocket measured in the same run; and the Noise handshake of each
//! suite, codex's hybrid one against the classic one measured in the same run.

use std::process::Stdio;
use std::time::{Duration, Instant};

use exec_server_relay_core::harness::{
    connect_relay, RelayConnectArgs, RelayConnection, RelayError,
};
use exec_server_relay_core::noise::{HybridIkSuite, IkSuite, NoiseIdentity, NoiseSuite};
use exec_server_relay_core::registry::SecretString;
use exec_server_rendezvous::signing::token_digest;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::rtt::rpc_samples;
use super::stats::median_p99;
use crate::report::{Row, Unit};
use crate::target::server_binary;
use crate::wire;
use crate::Budget;

const EXECUTOR_TOKEN: &str = "bench-executor-token";
const HARNESS_TOKEN: &str = "bench-harness-token";
const ENVIRONMENT: &str = "env-bench";

/// A rendezvous service and one executor registered with it.
struct RelayPair {
    url: String,
    _rendezvous: Child,
    _executor: Child,
    _config: std::path::PathBuf,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl RelayPair {
    async fn start() -> Self {
        let config =
            std::env::temp_dir().join(format!("exec-server-bench-rdv-{}.toml", std::process::id()));
        std::fs::write(
            &config,
            format!(
                "[[rendezvous.tokens]]\nname = \"executors\"\nsha256 = \"{}\"\nrole = \"executor\"\nenvironments = [\"env-*\"]\n\n[[rendezvous.tokens]]\nname = \"harnesses\"\nsha256 = \"{}\"\nrole = \"harness\"\n",
                hex(&token_digest(EXECUTOR_TOKEN)),
                hex(&token_digest(HARNESS_TOKEN)),
            ),
        )
        .expect("write rendezvous config");
        let mut rendezvous = Command::new(server_binary())
            .arg("rendezvous")
            .arg("--config")
            .arg(&config)
            .args(["--listen", "http://127.0.0.1:0"])
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn rendezvous");
        let mut line = String::new();
        BufReader::new(rendezvous.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .await
            .expect("rendezvous URL");
        let url = line.trim().to_owned();
        let executor = Command::new(server_binary())
            .args(["--remote", &url, "--environment-id", ENVIRONMENT])
            .env("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn executor");
        Self {
            url,
            _rendezvous: rendezvous,
            _executor: executor,
            _config: config,
        }
    }

    /// A relay stream, retrying while the executor is still registering.
    async fn connect(&self) -> RelayConnection {
        let args = RelayConnectArgs::new(&self.url, ENVIRONMENT, SecretString::new(HARNESS_TOKEN));
        for _ in 0..200 {
            match connect_relay(args.clone()).await {
                Ok(connection) => return connection,
                Err(RelayError::Registry(e)) if matches!(e.status(), Some(404 | 503)) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("relay connect failed: {e}"),
            }
        }
        panic!("the executor never became reachable");
    }
}

impl Drop for RelayPair {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self._config);
    }
}

/// `rtt_relay` (floor: the `rtt_ws` median of this run) and `relay_out` (floor: the
/// `pipe_out` rate of this run).
pub async fn relay_rows(budget: Budget, rtt_ws: f64, pipe_out: f64) -> Vec<Row> {
    let pair = RelayPair::start().await;
    let mut stream = pair.connect().await;
    wire::handshake(&mut stream).await;
    let (median, p99) = median_p99(&mut rpc_samples(&mut stream, budget.round_trips / 4).await);

    let bytes: u64 = 256 << 20;
    let argv = ["head", "-c", &bytes.to_string(), "/dev/zero"].map(str::to_owned);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let started = Instant::now();
    let total = wire::run_process(&mut stream, "out", &argv, false).await;
    assert_eq!(total, bytes, "every byte delivered");
    let rate = total as f64 / started.elapsed().as_secs_f64();
    vec![
        Row {
            key: "rtt_relay",
            what: "environment/status round trip through exec-server rendezvous",
            unit: Unit::Micros,
            median,
            p99: Some(p99),
            floor: Some(rtt_ws),
            target: "≤ floor + 150 µs",
            met: median <= rtt_ws + 150.0,
        },
        Row {
            key: "relay_out",
            what: "pipe_out (256 MiB) through the relay",
            unit: Unit::BytesPerSecond,
            median: rate,
            p99: None,
            floor: Some(pipe_out),
            target: "≥ 0.7× floor",
            met: rate >= 0.7 * pipe_out,
        },
    ]
}

/// One whole handshake of `suite` between two fresh per-stream states (keys fixed): msg1
/// written and read, msg2 written and read, both sides split into record ciphers — what an
/// executor and a harness spend on a new stream, without the network.
fn handshake_once(
    suite: &'static dyn NoiseSuite,
    executor: &NoiseIdentity,
    harness: &NoiseIdentity,
    buf: &mut [u8],
    payload: &mut [u8],
) -> Duration {
    let authorization = [b'a'; 45];
    let started = Instant::now();
    let p = suite.prologue(
        ENVIRONMENT,
        "reg-bench",
        "7b0cd8a6-5f1e-4f59-9d8c-2f5b0c1e9a77",
    );
    let mut initiator = suite
        .initiator(harness, &executor.public(), &p)
        .expect("initiator");
    let mut responder = suite.responder(executor, &p).expect("responder");
    let n = initiator.write_message(&authorization, buf).expect("msg1");
    responder
        .read_message(&buf[..n], payload)
        .expect("read msg1");
    let n = responder.write_message(&[], buf).expect("msg2");
    initiator
        .read_message(&buf[..n], payload)
        .expect("read msg2");
    let ciphers = (
        initiator.into_transport().expect("split"),
        responder.into_transport().expect("split"),
    );
    let elapsed = started.elapsed();
    drop(ciphers);
    elapsed
}

fn handshake_samples(suite: &'static dyn NoiseSuite, count: usize) -> (f64, f64) {
    let executor = NoiseIdentity::generate_for(suite);
    let harness = NoiseIdentity::generate_for(suite);
    let mut buf = vec![0u8; 65_535];
    let mut payload = vec![0u8; 65_535];
    let mut samples: Vec<Duration> = (0..count)
        .map(|_| handshake_once(suite, &executor, &harness, &mut buf, &mut payload))
        .collect();
    median_p99(&mut samples)
}

/// `handshake_ik` (the classic suite, no floor) and `handshake_hybrid` (codex's hybrid
/// X25519 + ML-KEM-768 suite; floor: `handshake_ik` of this run).
pub fn handshake_rows(budget: Budget) -> Vec<Row> {
    let count = (budget.round_trips / 4).max(50);
    let (classic, classic_p99) = handshake_samples(&IkSuite, count);
    let (hybrid, hybrid_p99) = handshake_samples(&HybridIkSuite, count);
    vec![
        Row {
            key: "handshake_ik",
            what: "classic IK handshake (X25519), both ends, in process",
            unit: Unit::Micros,
            median: classic,
            p99: Some(classic_p99),
            floor: None,
            target: "≤ 2 ms",
            met: classic <= 2_000.0,
        },
        Row {
            key: "handshake_hybrid",
            what: "codex hybridIK handshake (X25519+ML-KEM-768), both ends",
            unit: Unit::Micros,
            median: hybrid,
            p99: Some(hybrid_p99),
            floor: Some(classic),
            target: "≤ floor + 2 ms",
            met: hybrid <= classic + 2_000.0,
        },
    ]
}

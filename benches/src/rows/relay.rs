//! The relay, in each Noise suite: connect time, round trips and output throughput
//! through a real `exec-server rendezvous` against the local websocket measured in the
//! same run, requests/s with 1, 16 and 128 streams; and the Noise handshake of each suite,
//! codex's hybrid one against the classic one measured in the same run.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use exec_server_relay_core::harness::{RelayConnectArgs, RelayConnection};
use exec_server_relay_core::noise::{HybridIkSuite, IkSuite, NoiseIdentity, NoiseSuite};
use exec_server_relay_core::registry::SecretString;
use tokio::process::{Child, Command};

use super::rtt::rpc_samples;
use super::stats::median_p99;
use crate::report::{Row, Unit};
use crate::target::{server_binary, Rendezvous, EXECUTOR_TOKEN, HARNESS_TOKEN};
use crate::wire;
use crate::Budget;

const ENVIRONMENT: &str = "env-bench";

/// A rendezvous service and one executor registered with it.
struct RelayPair {
    rendezvous: Rendezvous,
    suite: &'static dyn NoiseSuite,
    _executor: Child,
}

/// The suites the relay rows run in, with their row-key suffix.
const SUITES: [(&str, &dyn NoiseSuite); 2] = [("ik", &IkSuite), ("hybrid", &HybridIkSuite)];

/// Streams of the relay scaling rows; the executor allows a few more than the largest.
const STREAMS: [(&str, usize); 3] = [
    ("relay_rps_1", 1),
    ("relay_rps_16", 16),
    ("relay_rps_128", 128),
];
const MAX_STREAMS: &str = "160";

impl RelayPair {
    /// A rendezvous and an executor registered with `suite`.
    async fn start(suite: &'static dyn NoiseSuite) -> Self {
        let rendezvous = Rendezvous::start(suite.security_profile()).await;
        let executor = Command::new(server_binary())
            .args(["--remote", &rendezvous.url, "--environment-id", ENVIRONMENT])
            .env("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN)
            .env(
                "EXEC_SERVER_RELAY__SECURITY_PROFILE",
                suite.security_profile(),
            )
            .env("EXEC_SERVER_RELAY__MAX_STREAMS", MAX_STREAMS)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn executor");
        Self {
            rendezvous,
            suite,
            _executor: executor,
        }
    }

    /// A relay stream keyed for this pair's suite, retrying while the executor is still
    /// registering.
    async fn connect(&self) -> RelayConnection {
        self.connect_to(ENVIRONMENT).await
    }

    /// A relay stream to the executor registered as `environment` with this rendezvous.
    async fn connect_to(&self, environment: &str) -> RelayConnection {
        let mut args = RelayConnectArgs::new(
            &self.rendezvous.url,
            environment,
            SecretString::new(HARNESS_TOKEN),
        );
        args.identity = Some(Arc::new(NoiseIdentity::generate_for(self.suite)));
        wire::relay_connect(args)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Requests per second and p99 (µs) of `streams` relay streams each doing sequential
/// `environment/status` round trips for `window`.
async fn relay_requests_per_second(
    pair: &RelayPair,
    streams: usize,
    window: Duration,
) -> (f64, f64) {
    let mut clients = Vec::with_capacity(streams);
    for _ in 0..streams {
        let mut stream = pair.connect().await;
        wire::handshake(&mut stream).await;
        clients.push(stream);
    }
    let started = Instant::now();
    let deadline = started + window;
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut id = 1i64;
                while Instant::now() < deadline {
                    let text = format!(r#"{{"id":{id},"method":"environment/status"}}"#);
                    let sent = Instant::now();
                    wire::round_trip(&mut stream, &text, id).await;
                    latencies.push(sent.elapsed());
                    id += 1;
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("stream task"));
    }
    let rate = all.len() as f64 / started.elapsed().as_secs_f64();
    (rate, median_p99(&mut all).1)
}

/// What the relay rows are compared with, measured earlier in the same run.
#[derive(Debug, Clone, Copy)]
pub struct LocalFloors {
    /// `rtt_ws` median, µs.
    pub rtt_ws: f64,
    /// `pipe_out` rate: process output delivered over a local websocket, bytes/s.
    pub pipe_out: f64,
    /// `rtt_ws_hop` median: an echo round trip through one bare websocket forwarder, µs.
    pub hop_rtt: f64,
    /// `tput_ws_hop`: the share of a direct websocket's throughput one bare hop keeps.
    pub hop_share: f64,
    /// Time to open and initialize a local websocket connection, µs.
    pub ws_connect: f64,
}

/// Median µs of opening and initializing a local websocket connection to exec-server,
/// the floor of the relay's connect rows.
pub async fn local_connect(budget: Budget) -> f64 {
    let server = crate::target::WsProcess::exec_server(&[]).await;
    let mut samples = Vec::new();
    for _ in 0..connect_count(budget) {
        let started = Instant::now();
        let mut ws = wire::ws_connect(&server.url).await;
        wire::handshake(&mut ws).await;
        samples.push(started.elapsed());
    }
    median_p99(&mut samples).0
}

/// Connects timed per suite (each one costs registry requests, which are rate limited).
fn connect_count(budget: Budget) -> usize {
    (budget.round_trips / 200).clamp(20, 100)
}

/// Per suite: `relay_connect_*` (a whole new stream: registry, rendezvous, Noise, then
/// `initialize`; floor: a local websocket connect + `initialize`), `rtt_relay_*` (floor:
/// the `rtt_ws` median of this run; target: the bare hop's round trip + 25 µs),
/// `relay_out_*` (floor: the `pipe_out` rate of this run; target: 0.8 × the share the bare
/// hop keeps × the floor), in the hybrid suite with codex's executor behind the same
/// rendezvous as the peer; then, in the default suite, requests/s with 1, 16 and 128
/// streams against the same over local websockets.
pub async fn relay_rows(
    budget: Budget,
    floors: LocalFloors,
    wanted: impl Fn(&str) -> bool,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for (suffix, suite) in SUITES {
        let pair = RelayPair::start(suite).await;
        let mut stream = pair.connect().await;
        wire::handshake(&mut stream).await;

        let mut connects = Vec::new();
        for _ in 0..connect_count(budget) {
            let started = Instant::now();
            let mut other = pair.connect().await;
            wire::handshake(&mut other).await;
            connects.push(started.elapsed());
        }
        let (connect, connect_p99) = median_p99(&mut connects);
        rows.push(Row {
            key: leak(format!("relay_connect_{suffix}")),
            what: leak(format!(
                "new relay stream ({suffix}) until initialized: registry, Noise, initialize"
            )),
            unit: Unit::Micros,
            median: connect,
            p99: Some(connect_p99),
            floor: Some(floors.ws_connect),
            target: "(reported)",
            met: true,
            peer: None,
        });

        let (median, p99) = median_p99(&mut rpc_samples(&mut stream, budget.round_trips / 4).await);
        rows.push(Row {
            key: leak(format!("rtt_relay_{suffix}")),
            what: leak(format!(
                "environment/status round trip through the relay ({suffix})"
            )),
            unit: Unit::Micros,
            median,
            p99: Some(p99),
            floor: Some(floors.rtt_ws),
            target: "≤ rtt_ws_hop + 25 µs",
            met: median <= floors.hop_rtt + 25.0,
            peer: None,
        });

        let rate = output_rate(&mut stream).await;
        rows.push(Row {
            key: leak(format!("relay_out_{suffix}")),
            what: leak(format!(
                "pipe_out (256 MiB) through the relay ({suffix}) vs local websocket"
            )),
            unit: Unit::BytesPerSecond,
            median: rate,
            p99: None,
            floor: Some(floors.pipe_out),
            target: "≥ 0.8× hop × floor",
            met: rate >= 0.8 * floors.hop_share * floors.pipe_out,
            peer: None,
        });
        drop(stream);
        if suite.name() == HybridIkSuite.name() {
            let (rtt, out) = codex_executor_peer(&pair, budget).await;
            let len = rows.len();
            rows[len - 2].peer = rtt;
            rows[len - 1].peer = out;
        }

        if suite.name() != exec_server_relay_core::noise::DEFAULT_SUITE.name() {
            continue;
        }
        for (key, streams) in STREAMS {
            if !wanted(key) {
                continue;
            }
            let (rate, p99) = relay_requests_per_second(&pair, streams, budget.rps_window).await;
            let local = crate::target::WsProcess::exec_server(&[]).await;
            let (local_rate, _) =
                super::rps::requests_per_second(&local.url, true, streams, budget).await;
            rows.push(Row {
                key,
                what: leak(format!(
                    "requests/s, {streams} relay stream(s) ({suffix}) vs local websockets"
                )),
                unit: Unit::PerSecond,
                median: rate,
                p99: Some(p99),
                floor: Some(local_rate),
                target: "≥ 0.8× floor",
                met: rate >= 0.8 * local_rate,
                peer: None,
            });
        }
    }
    rows
}

/// The environment codex's executor registers as beside ours.
const CODEX_ENVIRONMENT: &str = "env-bench-codex";

/// The codex peer of `rtt_relay_hybrid` and `relay_out_hybrid`: codex 0.171.0's executor
/// (`codex exec-server --remote`, hybrid suite) registered with the same rendezvous and
/// driven by the same harness code; each `None` without codex or when it failed
/// (reported). A codex stream has no flow control: when the harness reads its output more
/// slowly than codex writes it for longer than the rendezvous queues for a harness, frames
/// are dropped and the stream ends with `sequence_error`.
async fn codex_executor_peer(pair: &RelayPair, budget: Budget) -> (Option<f64>, Option<f64>) {
    let Some(bin) = crate::peer::codex() else {
        return (None, None);
    };
    let _codex = crate::target::CodexExecutor::start(
        bin,
        &pair.rendezvous.url,
        CODEX_ENVIRONMENT,
        EXECUTOR_TOKEN,
    )
    .await;
    let rtt = reported("rtt", async {
        let mut stream = pair.connect_to(CODEX_ENVIRONMENT).await;
        wire::handshake(&mut stream).await;
        median_p99(&mut rpc_samples(&mut stream, budget.round_trips / 4).await).0
    })
    .await;
    let out = reported("output", async {
        let mut stream = pair.connect_to(CODEX_ENVIRONMENT).await;
        wire::handshake(&mut stream).await;
        output_rate(&mut stream).await
    })
    .await;
    (rtt, out)
}

/// Bytes/s of 256 MiB of `head -c` output through `stream`, every byte checked to arrive.
async fn output_rate(stream: &mut RelayConnection) -> f64 {
    let bytes: u64 = 256 << 20;
    let argv = ["head", "-c", &bytes.to_string(), "/dev/zero"].map(str::to_owned);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let started = Instant::now();
    let total = wire::run_process(stream, "out", &argv, false).await;
    assert_eq!(total, bytes, "every byte delivered");
    total as f64 / started.elapsed().as_secs_f64()
}

/// `measure`'s value, or `None` (reported) when it panicked.
async fn reported(what: &str, measure: impl std::future::Future<Output = f64>) -> Option<f64> {
    use futures_util::FutureExt;
    let caught = std::panic::AssertUnwindSafe(measure).catch_unwind().await;
    if caught.is_err() {
        eprintln!(
            "relay rows: the codex executor's {what} measurement failed; its column stays empty"
        );
    }
    caught.ok()
}

/// Row keys and texts made at run time live as long as the run.
fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
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
            peer: None,
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
            peer: None,
        },
    ]
}

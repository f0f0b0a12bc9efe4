//! The registry of `exec-server rendezvous` on each store: `register` and `connect` calls
//! per second on one node with the memory store (the floor), one node on Redis and two
//! nodes sharing one Redis, and the latency one `connect` gains from the Redis store.
//! Redis rows need `redis-server` on the machine and are left out without it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use exec_server_relay_core::noise::{NoiseIdentity, NoisePublicKey};
use exec_server_relay_core::registry::{BaseUrl, RegistryClient, SecretString};
use exec_server_rendezvous::signing::token_digest;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::stats::median_p99;
use crate::report::{Row, Unit};
use crate::target::server_binary;
use crate::Budget;

const EXECUTOR_TOKEN: &str = "bench-executor-token";
const HARNESS_TOKEN: &str = "bench-harness-token";
/// Calls in flight at once in the throughput rows.
const CONCURRENCY: usize = 32;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A `redis-server` on a unix socket in a temporary directory.
struct Redis {
    _child: Child,
    dir: PathBuf,
}

impl Redis {
    async fn start() -> Option<Self> {
        let dir =
            std::env::temp_dir().join(format!("exec-server-bench-redis-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let socket = dir.join("redis.sock");
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(&socket)
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .ok()?;
        for _ in 0..200 {
            if tokio::net::UnixStream::connect(&socket).await.is_ok() {
                return Some(Self { _child: child, dir });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    fn url(&self) -> String {
        format!("unix://{}", self.dir.join("redis.sock").display())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One `exec-server rendezvous` node with limits high enough not to refuse the benchmark.
struct Node {
    url: String,
    _child: Child,
}

async fn start_node(config: &Path, store: &str) -> Node {
    let mut child = Command::new(server_binary())
        .arg("rendezvous")
        .arg("--config")
        .arg(config)
        .args(["--listen", "http://127.0.0.1:0", "--store", store])
        .env("RUST_LOG", "error")
        .env(
            "EXEC_SERVER_RENDEZVOUS_SIGNING_KEY",
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn rendezvous");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .await
        .expect("rendezvous URL");
    Node {
        url: line.trim().to_owned(),
        _child: child,
    }
}

fn write_config() -> PathBuf {
    let config = std::env::temp_dir().join(format!(
        "exec-server-bench-registry-{}.toml",
        std::process::id()
    ));
    std::fs::write(
        &config,
        format!(
            "[rendezvous]\nmax_environments = 100000000\nmax_environments_per_tenant = 100000000\n\
             rate_limit_per_ip_per_sec = 100000000\nrate_limit_per_ip_burst = 100000000\n\
             rate_limit_per_tenant_per_sec = 100000000\nrate_limit_per_tenant_burst = 100000000\n\n\
             [[rendezvous.tokens]]\nname = \"executors\"\nsha256 = \"{}\"\nrole = \"executor\"\n\n\
             [[rendezvous.tokens]]\nname = \"harnesses\"\nsha256 = \"{}\"\nrole = \"harness\"\n",
            hex(&token_digest(EXECUTOR_TOKEN)),
            hex(&token_digest(HARNESS_TOKEN)),
        ),
    )
    .expect("write rendezvous config");
    config
}

fn client(url: &str, token: &str) -> RegistryClient {
    RegistryClient::new(
        BaseUrl::parse(url, false).expect("node URL"),
        SecretString::new(token),
        Duration::from_secs(10),
        false,
    )
}

/// Calls per second of `call` over `window`, `CONCURRENCY` at a time, spread over the
/// nodes in turn; each worker has its own client (with `token`) and connection.
async fn rate<F, Fut>(nodes: &[String], window: Duration, token: &str, call: F) -> f64
where
    F: Fn(Arc<RegistryClient>, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let call = Arc::new(call);
    let counter = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..CONCURRENCY {
        let (call, counter) = (Arc::clone(&call), Arc::clone(&counter));
        let registry = Arc::new(client(&nodes[worker % nodes.len()], token));
        workers.push(tokio::spawn(async move {
            while started.elapsed() < window {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                call(Arc::clone(&registry), n).await;
            }
        }));
    }
    for worker in workers {
        worker.await.expect("worker");
    }
    counter.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// An environment registered and attached (its executor socket held open), so `connect`
/// answers a whole bundle.
async fn attached_environment(
    node: &str,
    environment: &str,
    key: &NoisePublicKey,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    let registration = client(node, EXECUTOR_TOKEN)
        .register(environment, key, None)
        .await
        .expect("register");
    let (socket, _) = tokio_tungstenite::connect_async(&registration.url)
        .await
        .expect("executor socket");
    // Until the attach is recorded: connect answers 200.
    let harness = client(node, HARNESS_TOKEN);
    for _ in 0..200 {
        if harness.connect(environment, key).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    socket
}

/// The rows of one deployment: registrations/s, connects/s, and connect latency.
async fn measure(nodes: &[String], budget: Budget, tag: &str) -> (f64, f64, (f64, f64)) {
    let key = NoiseIdentity::generate().public();
    let tag = tag.to_owned();
    let register_key = key.clone();
    let registrations = rate(
        nodes,
        budget.rps_window,
        EXECUTOR_TOKEN,
        move |registry, n| {
            let (key, tag) = (register_key.clone(), tag.clone());
            async move {
                registry
                    .register(&format!("env-{tag}-{n}"), &key, None)
                    .await
                    .expect("register");
            }
        },
    )
    .await;
    let environment = format!("env-connect-{}", nodes.len());
    let _executor = attached_environment(&nodes[0], &environment, &key).await;
    let connect_key = key.clone();
    let env = environment.clone();
    let connects = rate(
        nodes,
        budget.rps_window,
        HARNESS_TOKEN,
        move |registry, _| {
            let (key, env) = (connect_key.clone(), env.clone());
            async move {
                registry.connect(&env, &key).await.expect("connect");
            }
        },
    )
    .await;
    let harness = client(&nodes[0], HARNESS_TOKEN);
    let mut samples = Vec::new();
    for _ in 0..(budget.round_trips / 10).max(100) {
        let started = Instant::now();
        harness.connect(&environment, &key).await.expect("connect");
        samples.push(started.elapsed());
    }
    (registrations, connects, median_p99(&mut samples))
}

/// `reg_*`, `conn_*` and `conn_us_*` rows; the memory store's are the
/// floors of the Redis ones.
pub async fn registry_rows(budget: Budget) -> Vec<Row> {
    let config = write_config();
    let memory_node = start_node(&config, "memory").await;
    let (reg_memory, conn_memory, (lat_memory, lat_memory_p99)) =
        measure(std::slice::from_ref(&memory_node.url), budget, "memory").await;
    drop(memory_node);
    let mut rows = vec![
        Row {
            key: "reg_memory",
            what: "register calls, one node, memory store",
            unit: Unit::PerSecond,
            median: reg_memory,
            p99: None,
            floor: None,
            target: "≥ 1000/s",
            met: reg_memory >= 1_000.0,
            peer: None,
        },
        Row {
            key: "conn_memory",
            what: "connect calls, one node, memory store",
            unit: Unit::PerSecond,
            median: conn_memory,
            p99: None,
            floor: None,
            target: "≥ 1000/s",
            met: conn_memory >= 1_000.0,
            peer: None,
        },
        Row {
            key: "conn_us_mem",
            what: "one connect call, one node, memory store",
            unit: Unit::Micros,
            median: lat_memory,
            p99: Some(lat_memory_p99),
            floor: None,
            target: "≤ 2 ms",
            met: lat_memory <= 2_000.0,
            peer: None,
        },
    ];
    let Some(redis) = Redis::start().await else {
        eprintln!("registry rows on Redis left out: redis-server is not installed");
        let _ = std::fs::remove_file(&config);
        return rows;
    };
    let one = start_node(&config, &redis.url()).await;
    let (reg_one, conn_one, (lat_redis, lat_redis_p99)) =
        measure(std::slice::from_ref(&one.url), budget, "redis1").await;
    let two = start_node(&config, &redis.url()).await;
    let (reg_two, conn_two, _) =
        measure(&[one.url.clone(), two.url.clone()], budget, "redis2").await;
    let _ = std::fs::remove_file(&config);
    rows.extend([
        Row {
            key: "reg_redis",
            what: "register calls, one node, Redis store",
            unit: Unit::PerSecond,
            median: reg_one,
            p99: None,
            floor: Some(reg_memory),
            target: "≥ 0.5× floor",
            met: reg_one >= 0.5 * reg_memory,
            peer: None,
        },
        Row {
            key: "reg_redis_2",
            what: "register calls, two nodes, one Redis",
            unit: Unit::PerSecond,
            median: reg_two,
            p99: None,
            floor: Some(reg_memory),
            target: "≥ 0.5× floor",
            met: reg_two >= 0.5 * reg_memory,
            peer: None,
        },
        Row {
            key: "conn_redis",
            what: "connect calls, one node, Redis store",
            unit: Unit::PerSecond,
            median: conn_one,
            p99: None,
            floor: Some(conn_memory),
            target: "≥ 0.5× floor",
            met: conn_one >= 0.5 * conn_memory,
            peer: None,
        },
        Row {
            key: "conn_redis_2",
            what: "connect calls, two nodes, one Redis",
            unit: Unit::PerSecond,
            median: conn_two,
            p99: None,
            floor: Some(conn_memory),
            target: "≥ 0.5× floor",
            met: conn_two >= 0.5 * conn_memory,
            peer: None,
        },
        Row {
            key: "conn_us_redis",
            what: "one connect call, one node, Redis store",
            unit: Unit::Micros,
            median: lat_redis,
            p99: Some(lat_redis_p99),
            floor: Some(lat_memory),
            target: "≤ floor + 500 µs",
            met: lat_redis <= lat_memory + 500.0,
            peer: None,
        },
    ]);
    rows
}

//! Several rendezvous nodes sharing one registry in Redis (`rendezvous.store`): every node
//! answers registry calls, `connect` sends harnesses to the node holding the executor
//! socket, a node killed with SIGKILL hands its executors to the others, and an
//! unreachable Redis makes the nodes answer 503 until it is back.
//!
//! Each test starts its own `redis-server` on a unix socket in a temporary directory. When
//! `redis-server` is not installed the tests print `SKIP: …` and pass, unless
//! `EXEC_SERVER_REQUIRE_REDIS_TESTS=1` (set by `.ci/run`), which makes them fail.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exec_server_relay_core::noise::NoiseIdentity;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use super::fixtures::*;
use crate::util::{http_body, http_get, STEP_TIMEOUT};

/// A `redis-server` of one test, on a unix socket in its own directory.
struct RedisServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// A running server, or `None` (after printing why) when `redis-server` is missing
    /// and the tests are not required.
    async fn start(test: &str) -> Option<Self> {
        let installed = std::process::Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            let required = std::env::var("EXEC_SERVER_REQUIRE_REDIS_TESTS").as_deref() == Ok("1");
            assert!(
                !required,
                "{test}: redis-server is not installed (apt-get install redis-server)"
            );
            println!("SKIP: {test}: redis-server is not installed");
            return None;
        }
        let mut server = Self {
            child: None,
            dir: tempfile::tempdir().unwrap(),
        };
        server.launch().await;
        Some(server)
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// `rendezvous.store` for this server.
    fn store_url(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// Starts the server (again) on the same socket and data directory; the append-only
    /// file brings back what it held.
    async fn launch(&mut self) {
        let _ = std::fs::remove_file(self.socket());
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(self.socket())
            .args(["--unixsocketperm", "700", "--dir"])
            .arg(self.dir.path())
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        while !self.answers_ping().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "redis-server did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn answers_ping(&self) -> bool {
        let Ok(mut socket) = tokio::net::UnixStream::connect(self.socket()).await else {
            return false;
        };
        if socket.write_all(b"PING\r\n").await.is_err() {
            return false;
        }
        let mut reply = [0u8; 7];
        socket.read_exact(&mut reply).await.is_ok() && &reply == b"+PONG\r\n"
    }

    /// SIGKILL: Redis becomes unreachable at once.
    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
    }

    /// `redis-cli` against this server; its output, trimmed.
    fn cli(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("redis-cli")
            .arg("-s")
            .arg(self.socket())
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The public URL of the node holding `environment`'s executor socket.
    fn owner(&self, environment: &str) -> String {
        self.cli(&[
            "HGET",
            &format!("exec-server:rendezvous:env:{environment}"),
            "owner",
        ])
    }
}

/// `[rendezvous]` settings of a node of the deployment on `redis`.
fn node_settings(redis: &RedisServer, extra: &str) -> String {
    format!(
        "store = \"{}\"\nnode_lease_secs = 3\n{extra}",
        redis.store_url()
    )
}

/// A TCP load balancer in front of the nodes: each connection goes to the next node in
/// turn that accepts it, so a dead node is skipped; a drained node gets no new connections
/// and loses the ones it has.
struct Balancer {
    url: String,
    nodes: Arc<Mutex<Vec<String>>>,
    drained: Arc<Mutex<Vec<String>>>,
    /// Every proxied connection: the node it went to, and its task.
    connections: Arc<Mutex<Vec<(String, tokio::task::AbortHandle)>>>,
}

async fn start_balancer() -> Balancer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let balancer = Balancer {
        url: format!("http://{}", listener.local_addr().unwrap()),
        nodes: Arc::default(),
        drained: Arc::default(),
        connections: Arc::default(),
    };
    let next = Arc::new(AtomicUsize::new(0));
    let (nodes, drained, connections) = (
        Arc::clone(&balancer.nodes),
        Arc::clone(&balancer.drained),
        Arc::clone(&balancer.connections),
    );
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let addrs: Vec<String> = {
                let drained = drained.lock().unwrap();
                let nodes = nodes.lock().unwrap();
                nodes
                    .iter()
                    .filter(|n| !drained.contains(n))
                    .cloned()
                    .collect()
            };
            let first = next.fetch_add(1, Ordering::Relaxed);
            let connections2 = Arc::clone(&connections);
            tokio::spawn(async move {
                for i in 0..addrs.len() {
                    let addr = &addrs[(first + i) % addrs.len()];
                    if let Ok(mut upstream) = tokio::net::TcpStream::connect(addr).await {
                        let task = tokio::spawn(async move {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                        });
                        connections2
                            .lock()
                            .unwrap()
                            .push((addr.clone(), task.abort_handle()));
                        return;
                    }
                }
            });
        }
    });
    balancer
}

impl Balancer {
    fn add(&self, node: &Rendezvous) {
        self.nodes.lock().unwrap().push(address(node));
    }

    /// `node` gets no new connections, and the ones through the balancer are cut.
    fn drain(&self, node: &Rendezvous) {
        let addr = address(node);
        self.drained.lock().unwrap().push(addr.clone());
        for (to, task) in self.connections.lock().unwrap().iter() {
            if *to == addr {
                task.abort();
            }
        }
    }
}

fn address(node: &Rendezvous) -> String {
    node.direct.trim_start_matches("http://").to_owned()
}

/// Three nodes behind a balancer, and an executor of `environment` that reconnects fast.
async fn three_nodes_behind_a_balancer(
    redis: &RedisServer,
    environment: &str,
) -> (Balancer, Vec<Rendezvous>, Executor) {
    let balancer = start_balancer().await;
    let settings = node_settings(redis, "");
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let node = start_rendezvous_node(Some(&balancer.url), &settings).await;
        balancer.add(&node);
        nodes.push(node);
    }
    let executor = start_executor_with(
        &balancer.url,
        environment,
        "[relay]\nreconnect_initial_backoff_ms = 100\nreconnect_max_backoff_ms = 500\n",
    );
    (balancer, nodes, executor)
}

/// Starts a process printing `line-0` … `line-{lines-1}`, one every 10 ms, and waits for
/// its first output.
async fn start_counting(client: &mut RelayClient, lines: usize) {
    client
        .call(
            "process/start",
            json!({
                "processId": "counting",
                "argv": ["/bin/sh", "-c", format!("i=0; while [ $i -lt {lines} ]; do echo line-$i; i=$((i+1)); sleep 0.01; done")],
                "cwd": "file:///tmp",
                "env": {"PATH": "/usr/bin:/bin"},
                "tty": false,
            }),
        )
        .await;
    let first = client.next().await;
    assert_eq!(first["method"], "process/output", "{first}");
    client.pending.push(first);
}

/// Reads the counting process to its end: every line once, in order, and exit code 0.
async fn assert_counted(client: &mut RelayClient, lines: usize) {
    let (stdout, exit_code) = collect_process(client, "counting").await;
    let expected: String = (0..lines).map(|i| format!("line-{i}\n")).collect();
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        expected,
        "every byte arrives once, in order"
    );
    assert_eq!(exit_code, Some(0));
}

/// The node whose own URL is `owner`.
fn node_at(nodes: &[Rendezvous], owner: &str) -> usize {
    nodes
        .iter()
        .position(|n| n.direct == owner)
        .unwrap_or_else(|| panic!("the owner {owner} is one of the nodes, by its own URL"))
}

/// Waits until another node than `old` holds `environment`'s executor; returns it.
async fn until_moved(redis: &RedisServer, environment: &str, old: &str) -> String {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        let owner = redis.owner(environment);
        if owner != old {
            return owner;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the executor never moved off {old}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `node`'s `/readyz` answers `want`.
async fn until_ready(node: &Rendezvous, want: u16) {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        let (status, _) = http_get(&node.direct, "/readyz", "").await;
        if status == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz of {} stayed {status}, not {want}",
            node.direct
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn register_on_one_node_connect_through_another_and_run_a_command() {
    let Some(redis) = RedisServer::start("register_on_one_node_connect_through_another").await
    else {
        return;
    };
    let settings = node_settings(&redis, "");
    let a = start_rendezvous_node(None, &settings).await;
    let mut b = start_rendezvous_node(None, &settings).await;
    let _executor = start_executor(&a.url, "env-multi");
    // B answers connect for the environment A holds, with a URL on A.
    let bundle = harness_bundle(&b.url, "env-multi").await;
    let a_ws = a.direct.replacen("http://", "ws://", 1);
    assert!(bundle.url.starts_with(&a_ws), "{} is on A", bundle.url);
    assert_eq!(redis.owner("env-multi"), a.url);
    // The same harness URL on B is refused, naming A.
    let on_b = bundle
        .url
        .replacen(&a_ws, &b.direct.replacen("http://", "ws://", 1), 1);
    let refused = tokio_tungstenite::connect_async(&on_b).await.unwrap_err();
    let tokio_tungstenite::tungstenite::Error::Http(response) = refused else {
        panic!("the upgrade on B was refused with a status: {refused}");
    };
    assert_eq!(response.status().as_u16(), 421);
    let body = String::from_utf8(response.body().clone().unwrap_or_default()).unwrap();
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "wrong_node");
    assert_eq!(body["error"]["node_url"], a.url.as_str());
    // A harness that asks B runs a command on the executor held by A.
    let mut client = RelayClient::open(harness_args(&b.url, "env-multi")).await;
    let started = client
        .call(
            "process/start",
            json!({
                "processId": "multi-proc",
                "argv": ["/bin/sh", "-c", "printf 'through-two-nodes\\n'"],
                "cwd": "file:///tmp",
                "env": {"PATH": "/usr/bin:/bin"},
                "tty": false,
            }),
        )
        .await;
    assert_eq!(started["processId"], "multi-proc");
    let (stdout, exit_code) = collect_process(&mut client, "multi-proc").await;
    assert_eq!(String::from_utf8(stdout).unwrap(), "through-two-nodes\n");
    assert_eq!(exit_code, Some(0));
    // A node restarted loses nothing the store holds: B, killed and started again,
    // still answers for the environment.
    b.child.kill().await.unwrap();
    let b2 = start_rendezvous_node(None, &settings).await;
    let again = harness_bundle(&b2.url, "env-multi").await;
    assert!(again.url.starts_with(&a_ws), "{}", again.url);
    assert_eq!(
        again.executor_registration_id,
        bundle.executor_registration_id
    );
}

/// Reads `process/output` until `process/closed`: stdout and the exit code.
async fn collect_process(client: &mut RelayClient, process: &str) -> (Vec<u8>, Option<i64>) {
    let mut stdout = Vec::new();
    let mut exit_code = None;
    loop {
        let event = if client.pending.is_empty() {
            client.next().await
        } else {
            client.pending.remove(0)
        };
        if event["params"]["processId"] != process {
            continue;
        }
        match event["method"].as_str().unwrap_or_default() {
            "process/output" if event["params"]["stream"] == "stdout" => {
                stdout.extend(crate::util::b64decode(&event["params"]["chunk"]));
            }
            "process/exited" => exit_code = event["params"]["exitCode"].as_i64(),
            "process/closed" => return (stdout, exit_code),
            _ => {}
        }
    }
}

#[tokio::test]
async fn a_node_killed_mid_session_hands_its_executor_to_another_and_the_stream_resumes() {
    let Some(redis) = RedisServer::start("a_node_killed_mid_session").await else {
        return;
    };
    let (balancer, mut nodes, _executor) =
        three_nodes_behind_a_balancer(&redis, "env-failover").await;
    let mut client = RelayClient::open(harness_args(&balancer.url, "env-failover")).await;
    let lines = 300;
    start_counting(&mut client, lines).await;
    // Output flows; then the node holding the executor socket is killed.
    let owner = redis.owner("env-failover");
    let held = node_at(&nodes, &owner);
    nodes[held].child.kill().await.unwrap();
    assert_counted(&mut client, lines).await;
    let new_owner = redis.owner("env-failover");
    assert_ne!(new_owner, owner, "another node holds the executor now");
    node_at(&nodes, &new_owner);
    // The same stream goes on.
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
}

#[tokio::test]
async fn an_executor_that_moves_off_a_live_node_takes_its_harnesses_along() {
    let Some(redis) = RedisServer::start("an_executor_that_moves_off_a_live_node").await else {
        return;
    };
    let (balancer, mut nodes, _executor) = three_nodes_behind_a_balancer(&redis, "env-move").await;
    let mut client = RelayClient::open(harness_args(&balancer.url, "env-move")).await;
    let lines = 300;
    start_counting(&mut client, lines).await;
    // The executor's connection to its node is cut; the node itself lives on, with the
    // harness socket still open to it.
    let owner = redis.owner("env-move");
    let old = node_at(&nodes, &owner);
    balancer.drain(&nodes[old]);
    let new_owner = until_moved(&redis, "env-move", &owner).await;
    assert_counted(&mut client, lines).await;
    assert_eq!(
        client.call("environment/status", json!({})).await["status"],
        "ready"
    );
    assert_eq!(redis.owner("env-move"), new_owner);
    assert!(
        nodes[old].child.try_wait().unwrap().is_none(),
        "the old node still runs"
    );
}

#[tokio::test]
async fn concurrent_registrations_on_two_nodes_never_pass_the_shared_limit() {
    let Some(redis) = RedisServer::start("concurrent_registrations_on_two_nodes").await else {
        return;
    };
    let settings = node_settings(
        &redis,
        "max_environments = 50\nrate_limit_per_ip_burst = 1000\nrate_limit_per_tenant_burst = 1000",
    );
    let a = start_rendezvous_node(None, &settings).await;
    let b = start_rendezvous_node(None, &settings).await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..200 {
        let url = if i % 2 == 0 {
            a.url.clone()
        } else {
            b.url.clone()
        };
        calls.spawn(async move {
            let key = NoiseIdentity::generate().public();
            let registry = registry_as(&url, EXECUTOR_TOKEN);
            match registry.register(&format!("env-cap-{i}"), &key, None).await {
                Ok(_) => 200,
                Err(e) => e.status().unwrap_or(0),
            }
        });
    }
    let mut statuses = Vec::new();
    while let Some(status) = calls.join_next().await {
        statuses.push(status.unwrap());
    }
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let full = statuses.iter().filter(|s| **s == 503).count();
    assert_eq!((ok, full), (50, 150), "{statuses:?}");
    assert_eq!(
        redis.cli(&["GET", "exec-server:rendezvous:count:environments"]),
        "50"
    );
}

#[tokio::test]
async fn an_unreachable_redis_makes_nodes_unready_and_they_recover_without_a_restart() {
    let Some(mut redis) = RedisServer::start("an_unreachable_redis").await else {
        return;
    };
    let settings = node_settings(&redis, "");
    let a = start_rendezvous_node(None, &settings).await;
    let b = start_rendezvous_node(None, &settings).await;
    until_ready(&a, 200).await;
    until_ready(&b, 200).await;
    let key = NoiseIdentity::generate().public();
    let on_a = registry_as(&a.url, EXECUTOR_TOKEN);
    let first = on_a.register("env-outage", &key, None).await.unwrap();

    redis.kill().await;
    until_ready(&a, 503).await;
    until_ready(&b, 503).await;
    let on_b = registry_as(&b.url, EXECUTOR_TOKEN);
    let refused = on_b.register("env-outage", &key, None).await.unwrap_err();
    assert_eq!(refused.status(), Some(503));
    assert!(
        refused.to_string().contains("store_unavailable"),
        "{refused}"
    );
    let harness_key = NoiseIdentity::generate().public();
    let connect = registry_as(&a.url, HARNESS_TOKEN)
        .connect("env-outage", &harness_key)
        .await
        .unwrap_err();
    assert_eq!(connect.status(), Some(503));
    // The failures are counted, the calls timed.
    let bearer = format!("Authorization: Bearer {EXECUTOR_TOKEN}\r\n");
    let (status, metrics) = http_body(&b.direct, "/metrics", &bearer).await;
    assert_eq!(status, 200);
    let errors = metric(&metrics, "exec_server_rendezvous_store_errors_total");
    assert!(errors >= 1.0, "{metrics}");
    assert!(
        metric(
            &metrics,
            "exec_server_rendezvous_store_duration_seconds_count"
        ) >= 1.0,
        "{metrics}"
    );
    let (status, _) = http_get(&b.direct, "/metrics", "").await;
    assert_eq!(status, 401, "metrics need a token");

    // Redis comes back with what it held: both nodes recover, nothing restarted.
    redis.launch().await;
    until_ready(&a, 200).await;
    until_ready(&b, 200).await;
    let again = on_b.register("env-outage", &key, None).await.unwrap();
    assert_eq!(
        again.executor_registration_id,
        first.executor_registration_id
    );
    // The registration survived: connect finds it (no executor yet), not 404.
    let waiting = registry_as(&b.url, HARNESS_TOKEN)
        .connect("env-outage", &harness_key)
        .await
        .unwrap_err();
    assert_eq!(waiting.status(), Some(503));
    assert!(
        waiting.to_string().contains("executor_unavailable"),
        "{waiting}"
    );
    let other = NoiseIdentity::generate().public();
    on_a.register("env-after", &other, None).await.unwrap();
}

/// The value of the series `name` (without labels beyond the store's) in `/metrics`.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_dead_nodes_environments_are_released_when_its_lease_runs_out() {
    let Some(redis) = RedisServer::start("a_dead_nodes_environments_are_released").await else {
        return;
    };
    // Short registration TTL and grace, so the release is seen within the step timeout.
    let settings = node_settings(&redis, "grace_secs = 1\nregistration_ttl_secs = 2");
    let mut a = start_rendezvous_node(None, &settings).await;
    let b = start_rendezvous_node(None, &settings).await;
    let mut executor = start_executor(&a.url, "env-orphan");
    harness_bundle(&b.url, "env-orphan").await;
    assert_eq!(redis.owner("env-orphan"), a.url);
    assert_eq!(
        redis.cli(&["GET", "exec-server:rendezvous:count:environments"]),
        "1"
    );
    // A dies first, so nobody reports the detach; then its executor, which could only
    // have come back to A (its URL is A's): nobody takes the environment over.
    a.child.kill().await.unwrap();
    executor.kill().await.unwrap();
    let harness = registry_as(&b.url, HARNESS_TOKEN);
    let key = NoiseIdentity::generate().public();
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    let mut seen = Vec::new();
    loop {
        let status = match harness.connect("env-orphan", &key).await {
            Ok(_) => 200,
            Err(e) => e.status().unwrap_or(0),
        };
        if seen.last() != Some(&status) {
            seen.push(status);
        }
        if status == 404 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dead node's environment was never released: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Held while A's lease ran, then (past the grace) unavailable, then deleted with its
    // capacity given back.
    assert_eq!(seen.first(), Some(&200), "{seen:?}");
    assert!(seen.iter().all(|s| [200, 503, 404].contains(s)), "{seen:?}");
    assert_eq!(
        redis.cli(&["GET", "exec-server:rendezvous:count:environments"]),
        "0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_follows_connect_to_the_node_holding_the_executor_before_and_after_a_node_dies() {
    let test = "codex_follows_connect_to_the_node_holding_the_executor";
    let Some(codex) = crate::codex::codex_bin(test) else {
        return;
    };
    let Some(redis) = RedisServer::start(test).await else {
        return;
    };
    let (balancer, mut nodes, _executor) =
        three_nodes_behind_a_balancer(&redis, "env-codex-nodes").await;
    harness_bundle(&balancer.url, "env-codex-nodes").await;
    let home = crate::codex::CodexHome::new();
    let work = tempfile::tempdir().unwrap();
    let work_dir = std::fs::canonicalize(work.path()).unwrap();
    let run_codex = |marker: &'static str| {
        let (home, codex, work_dir, registry) = (&home, &codex, &work_dir, balancer.url.clone());
        async move {
            let model =
                crate::codex::fake_model::FakeModel::start(&format!("printf ok > {marker}")).await;
            home.use_model(&model.base_url);
            let mut cmd = home.exec_turn(codex, work_dir);
            cmd.env("CODEX_EXEC_SERVER_NOISE_REGISTRY_URL", &registry)
                .env("CODEX_EXEC_SERVER_NOISE_ENVIRONMENT_ID", "env-codex-nodes")
                .env("CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN", HARNESS_TOKEN);
            let output = tokio::time::timeout(Duration::from_secs(180), cmd.output())
                .await
                .expect("codex exec finishes")
                .unwrap();
            let context = format!(
                "stdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(output.status.success(), "codex exec failed\n{context}");
            assert_eq!(
                std::fs::read_to_string(work_dir.join(marker)).unwrap_or_default(),
                "ok",
                "{context}"
            );
        }
    };
    // codex asks whichever node the balancer picks and follows the URL to the owner.
    run_codex("before.txt").await;
    let owner = redis.owner("env-codex-nodes");
    let held = node_at(&nodes, &owner);
    nodes[held].child.kill().await.unwrap();
    // The executor moves; codex reaches it on its new node.
    until_moved(&redis, "env-codex-nodes", &owner).await;
    run_codex("after.txt").await;
    assert_ne!(redis.owner("env-codex-nodes"), owner);
}

#[tokio::test]
async fn a_node_on_a_shared_store_needs_the_deployments_signing_key() {
    let config = crate::util::config_file(&format!(
        "[rendezvous]\nstore = \"unix:///nonexistent/redis.sock\"\n\n[[rendezvous.tokens]]\nname = \"executors\"\nsha256 = \"{}\"\nrole = \"executor\"\n",
        sha256_hex(EXECUTOR_TOKEN)
    ));
    let out = crate::util::server_command(&["rendezvous", "--config", config.to_str().unwrap()])
        .stderr(Stdio::piped())
        .env_remove("EXEC_SERVER_RENDEZVOUS_SIGNING_KEY")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("EXEC_SERVER_RENDEZVOUS_SIGNING_KEY"),
        "{stderr}"
    );
}

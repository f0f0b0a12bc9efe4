//! The Redis [`RendezvousStore`] (`rendezvous.store = "redis://…"`): several nodes share
//! one registry (RELAY §8.10). Any node answers `register`, `connect` and `validate`;
//! an executor socket may land on any node, which then holds the environment — its
//! public URL is recorded as the environment's owner, and `connect` sends harnesses
//! there. Each node renews a lease on the executor sockets it holds; when a node dies,
//! its lease runs out and its environments count as detached from then on, so their
//! executors take them over elsewhere, or their registrations expire as usual.
//!
//! Every change is one Lua script (`lua/`), atomic in Redis, and every deadline is
//! computed from the Redis server's clock. What stays with each node: the tokens (every
//! node has the same `[rendezvous]` table, [`crate::tokens`]), and the harness-socket
//! limits, which count the sockets of the node that holds them — all of an environment's
//! harness sockets are on its owner node.

mod metrics;
pub(crate) mod scripts;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::http::StatusCode;
use exec_server_relay_core::noise::NoisePublicKey;
use exec_server_relay_core::proto;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};
use tokio::time::Instant;

use crate::capacity::{Capacity, Gauge};
use crate::config::RendezvousConfig;
use crate::signing::registration_id;
use crate::store::{
    Connectable, Ended, Epoch, HarnessLease, Held, Lost, RegisterRefusal, RendezvousStore,
    StoreUnavailable, TenantId, TokenGrant, UpgradeRefusal,
};
use crate::store_url::redacted_url;
use crate::tokens::{effective_config, Tokens};
use scripts::{ended, ended_at, Scripts};

/// Every key of the store starts with this.
const KEY_PREFIX: &str = "exec-server:rendezvous:";
/// Longest wait for one answer of Redis; a slower store counts as unreachable.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for a connection to Redis.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Registrations one sweep deletes at most (the next sweep takes the rest).
const SWEEP_BATCH: usize = 256;
/// Environments renewed by one heartbeat script.
const HEARTBEAT_BATCH: usize = 256;

/// The registry of a deployment of several nodes, in Redis.
pub struct RedisStore {
    tokens: Tokens,
    /// Tenants and their limits; the harness-socket gauges of this node.
    capacity: Capacity,
    client: redis::Client,
    /// Connected on first use, so a node starts (not ready) while Redis is down; the
    /// manager reconnects by itself afterwards.
    connection: tokio::sync::Mutex<Connection>,
    /// This node's public URL, recorded as the owner of the executor sockets it holds.
    node: String,
    grace_ms: u64,
    ttl_ms: u64,
    attach_ms: u64,
    lease: Duration,
    scripts: Scripts,
    /// Harness socket places per environment held by this node.
    socket_places: Mutex<HashMap<String, Arc<Gauge>>>,
    /// Unix seconds of the last failure logged: an outage is logged once a second, not
    /// once a request.
    last_failure_logged: AtomicU64,
}

impl RedisStore {
    /// The store at `url` for `config`, as the node whose public URL is `node`. Nothing
    /// is connected yet.
    pub fn new(config: &RendezvousConfig, url: &str, node: String) -> Result<Self, String> {
        let config = &effective_config(config);
        let capacity = Capacity::new(config);
        let tokens = Tokens::new(config, &capacity)?;
        let client = redis::Client::open(url).map_err(|e| {
            format!(
                "rendezvous.store `{}` is not a Redis URL ({:?})",
                redacted_url(url),
                e.kind()
            )
        })?;
        metrics::register();
        Ok(Self {
            tokens,
            capacity,
            client,
            connection: tokio::sync::Mutex::new(Connection::default()),
            node,
            grace_ms: config.grace_secs * 1000,
            ttl_ms: config.registration_ttl_secs * 1000,
            attach_ms: config.attach_timeout_secs * 1000,
            lease: Duration::from_secs(config.node_lease_secs),
            scripts: Scripts::new(),
            socket_places: Mutex::new(HashMap::new()),
            last_failure_logged: AtomicU64::new(0),
        })
    }

    async fn connection(&self) -> Result<ConnectionManager, String> {
        let mut slot = self.connection.lock().await;
        if let Some(manager) = slot.manager.as_ref() {
            return Ok(manager.clone());
        }
        if slot
            .failed_at
            .is_some_and(|at| at.elapsed() < RECONNECT_PAUSE)
        {
            return Err("Redis is unreachable".to_owned());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(CONNECT_TIMEOUT)
            .set_response_timeout(CALL_TIMEOUT)
            .set_number_of_retries(1)
            .set_max_delay(500);
        let connected = tokio::time::timeout(
            CONNECT_TIMEOUT * 2,
            ConnectionManager::new_with_config(self.client.clone(), config),
        )
        .await
        .map_err(|_| "connecting timed out".to_owned())
        .and_then(|made| made.map_err(|e| describe(&e)));
        match connected {
            Ok(manager) => {
                slot.manager = Some(manager.clone());
                Ok(manager)
            }
            Err(problem) => {
                slot.failed_at = Some(std::time::Instant::now());
                Err(problem)
            }
        }
    }

    /// Runs `script` with the common arguments and then `args`; every call is timed, and
    /// a failure is counted and answered as [`StoreUnavailable`].
    async fn run(&self, script: &Script, args: &[&str]) -> Result<Value, StoreUnavailable> {
        let started = std::time::Instant::now();
        let result = async {
            let mut connection = self.connection().await?;
            let mut invocation = script.prepare_invoke();
            invocation
                .arg(KEY_PREFIX)
                .arg(self.grace_ms)
                .arg(self.ttl_ms)
                .arg(self.attach_ms)
                .arg(self.lease.as_millis() as u64);
            for arg in args {
                invocation.arg(*arg);
            }
            tokio::time::timeout(
                CALL_TIMEOUT,
                invocation.invoke_async::<Value>(&mut connection),
            )
            .await
            .map_err(|_| "the call timed out".to_owned())?
            .map_err(|e| describe(&e))
        }
        .await;
        metrics::observe(started.elapsed(), result.is_err());
        result.map_err(|problem| {
            self.log_failure(&problem);
            StoreUnavailable
        })
    }

    fn log_failure(&self, problem: &str) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if self.last_failure_logged.swap(now, Ordering::Relaxed) != now {
            tracing::warn!(
                problem,
                "the rendezvous store (Redis) is unavailable; registry calls are answered 503"
            );
        }
    }

    fn tenant_of(&self, name: &str) -> Result<TenantId, StoreUnavailable> {
        self.capacity.tenant_by_name(name).ok_or_else(|| {
            tracing::warn!(
                tenant = name,
                "the store names a tenant this node's rendezvous.tokens do not have; every node needs the same tokens"
            );
            StoreUnavailable
        })
    }

    /// The harness socket places of `environment` on this node.
    fn socket_places(&self, environment: &str) -> Arc<Gauge> {
        let mut places = self.socket_places.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(gauge) = places.get(environment) {
            return Arc::clone(gauge);
        }
        if places.len() >= 1_024 {
            // Forget the environments no socket holds a place of.
            places.retain(|_, gauge| Arc::strong_count(gauge) > 1);
        }
        let gauge = self.capacity.environment_sockets(environment);
        places.insert(environment.to_owned(), Arc::clone(&gauge));
        gauge
    }
}

/// The connection to Redis, or when the last attempt to make one failed.
#[derive(Default)]
struct Connection {
    manager: Option<ConnectionManager>,
    failed_at: Option<std::time::Instant>,
}

/// After a failed attempt to connect, calls fail at once for this long instead of each
/// waiting for its own attempt.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// A Redis error in words, without the URL (which may hold a password).
fn describe(error: &redis::RedisError) -> String {
    if error.is_io_error() || error.is_connection_refusal() || error.is_connection_dropped() {
        "Redis is unreachable".to_owned()
    } else if error.is_timeout() {
        "Redis did not answer in time".to_owned()
    } else {
        format!("Redis answered an error ({:?})", error.kind())
    }
}

#[async_trait]
impl RendezvousStore for RedisStore {
    async fn authenticate(&self, digest: &[u8; 32]) -> Option<TokenGrant> {
        self.tokens.authenticate(digest)
    }

    fn tenant_count(&self) -> usize {
        self.capacity.tenant_count()
    }

    async fn register(
        &self,
        environment: &str,
        key: NoisePublicKey,
        name: Option<String>,
        tenant: TenantId,
        _now: Instant,
        ended_out: &mut Vec<Ended>,
    ) -> Result<String, RegisterRefusal> {
        let reg = registration_id(environment, &key);
        let key_json = key.to_json().to_string();
        let tenant_name = self.capacity.tenant_name(tenant).to_owned();
        let (tenant_max, tenant_refusal) = self.capacity.tenant_environment_limit(tenant);
        let (max, service_refusal) = self.capacity.service_environment_limit();
        let reply = self
            .run(
                &self.scripts.register,
                &[
                    environment,
                    &reg,
                    &key_json,
                    &tenant_name,
                    &max.to_string(),
                    &tenant_max.to_string(),
                ],
            )
            .await
            .map_err(|_| RegisterRefusal::StoreUnavailable)?;
        ended_out.extend(ended_at(&reply, 2));
        let registered = scripts::register_reply(&reply, tenant_refusal, service_refusal);
        if registered.is_ok() {
            tracing::info!(
                environment = %proto::truncate_for_log(environment),
                registration = %reg,
                tenant = tenant_name,
                name = ?name,
                "executor registered"
            );
        }
        registered
    }

    async fn connectable(
        &self,
        environment: &str,
        _now: Instant,
        ended_out: &mut Vec<Ended>,
    ) -> Connectable {
        let Ok(reply) = self.run(&self.scripts.connect, &[environment]).await else {
            return Connectable::StoreUnavailable;
        };
        ended_out.extend(ended_at(&reply, 4));
        scripts::connect_reply(&reply, &self.node)
    }

    async fn current_registration(
        &self,
        environment: &str,
        _now: Instant,
        ended_out: &mut Vec<Ended>,
    ) -> Result<Option<String>, StoreUnavailable> {
        let reply = self.run(&self.scripts.current, &[environment]).await?;
        ended_out.extend(ended_at(&reply, 1));
        Ok(scripts::current_reply(&reply))
    }

    async fn admit_executor(
        &self,
        environment: &str,
        reg: &str,
        _now: Instant,
        ended_out: &mut Vec<Ended>,
    ) -> Result<Epoch, StatusCode> {
        let reply = self
            .run(&self.scripts.admit_executor, &[environment, reg])
            .await
            .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
        ended_out.extend(ended_at(&reply, 2));
        scripts::admit_executor_reply(&reply)
    }

    async fn admit_harness(
        &self,
        environment: &str,
        reg: &str,
        _now: Instant,
        ended_out: &mut Vec<Ended>,
    ) -> Result<(Epoch, HarnessLease), UpgradeRefusal> {
        let reply = self
            .run(&self.scripts.admit_harness, &[environment, reg, &self.node])
            .await
            .map_err(|_| UpgradeRefusal::Status(StatusCode::SERVICE_UNAVAILABLE))?;
        ended_out.extend(ended_at(&reply, 3));
        let (epoch, owner) = scripts::admit_harness_reply(&reply)?;
        let owner = self
            .tenant_of(&owner)
            .map_err(|_| UpgradeRefusal::Status(StatusCode::SERVICE_UNAVAILABLE))?;
        let slot = self
            .capacity
            .lease_harness_socket(&self.socket_places(environment), owner)
            .map_err(UpgradeRefusal::Capacity)?;
        Ok((epoch, HarnessLease::new(slot)))
    }

    async fn executor_attached(
        &self,
        environment: &str,
        reg: &str,
        _now: Instant,
    ) -> Result<Option<Epoch>, StoreUnavailable> {
        let reply = self
            .run(&self.scripts.attached, &[environment, reg, &self.node])
            .await?;
        Ok(scripts::attached_reply(&reply))
    }

    async fn executor_detached(
        &self,
        environment: &str,
        epoch: Epoch,
        left_for_good: bool,
        _now: Instant,
        ended_out: &mut Vec<Ended>,
    ) {
        let epoch = epoch.to_string();
        let left = if left_for_good { "1" } else { "0" };
        // When the store is unreachable, the lease this node no longer renews runs out
        // instead, and the environment counts as detached from then on.
        if let Ok(reply) = self
            .run(
                &self.scripts.detached,
                &[environment, &epoch, left, &self.node],
            )
            .await
        {
            for end in ended(&reply) {
                log_ended(&end);
                ended_out.push(end);
            }
        }
    }

    async fn sweep(&self, _now: Instant, ended_out: &mut Vec<Ended>) {
        if let Ok(reply) = self
            .run(&self.scripts.sweep, &[&SWEEP_BATCH.to_string()])
            .await
        {
            for end in ended(&reply) {
                log_ended(&end);
                ended_out.push(end);
            }
        }
    }

    fn heartbeat_every(&self) -> Option<Duration> {
        // Three beats per lease: one lost beat does not cost the node its environments.
        Some(self.lease / 3)
    }

    async fn heartbeat(&self, held: &[Held]) -> Result<Vec<Lost>, StoreUnavailable> {
        let mut lost = Vec::new();
        for batch in held.chunks(HEARTBEAT_BATCH) {
            let epochs: Vec<String> = batch.iter().map(|h| h.epoch.to_string()).collect();
            let mut args: Vec<&str> = vec![&self.node];
            for (h, epoch) in batch.iter().zip(&epochs) {
                args.push(&h.environment);
                args.push(epoch);
                args.push(if h.executor { "1" } else { "0" });
            }
            let reply = self.run(&self.scripts.heartbeat, &args).await?;
            lost.extend(scripts::heartbeat_reply(&reply, batch));
        }
        Ok(lost)
    }

    async fn ready(&self) -> bool {
        let started = std::time::Instant::now();
        let answered = async {
            let mut connection = self.connection().await?;
            tokio::time::timeout(
                CALL_TIMEOUT,
                redis::cmd("PING").query_async::<String>(&mut connection),
            )
            .await
            .map_err(|_| "the call timed out".to_owned())?
            .map_err(|e| describe(&e))
        }
        .await;
        metrics::observe(started.elapsed(), answered.is_err());
        if let Err(problem) = &answered {
            self.log_failure(problem);
        }
        answered.is_ok()
    }
}

fn log_ended(end: &Ended) {
    tracing::info!(
        reason = end.why.reason(),
        environment = %proto::truncate_for_log(&end.environment),
        "registration deleted; its capacity is free"
    );
}

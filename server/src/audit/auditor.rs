//! The [`Auditor`]: the policy and the backends of one server, and how events reach them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use exec_server_config::ConfigSource;
use exec_server_proto::RpcError;
use serde_json::{Map, Value};
use sha2::Digest as _;

use super::backend;
use super::config::{AuditConfig, Mode};
use super::event::{Event, Level, Who};
use super::policy::Policy;
use super::queue::{BackendQueue, Pending};

/// The audit trail of one server. Disabled, every call returns at once.
pub struct Auditor {
    active: Option<Active>,
}

struct Active {
    policy: Policy,
    backends: Vec<BackendQueue>,
    /// Numbers every event in the order it was queued, so a reader sees any gap.
    seq: AtomicU64,
    /// Held while an event takes its number and joins every queue, so each backend
    /// receives events in `seq` order.
    order: Mutex<()>,
    /// Levels of request events by method, resolved once.
    request_levels: Mutex<HashMap<String, Level>>,
}

impl std::fmt::Debug for Auditor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auditor")
            .field("enabled", &self.active.is_some())
            .finish()
    }
}

impl Auditor {
    /// A trail that records nothing.
    pub fn disabled() -> Arc<Self> {
        Arc::new(Self { active: None })
    }

    /// Opens every backend of `config`; one that cannot be opened stops the server (the
    /// error says why, naming the key).
    pub fn open(config: &AuditConfig, source: &ConfigSource) -> Result<Arc<Self>, String> {
        if !config.enabled {
            return Ok(Self::disabled());
        }
        let mut backends = Vec::new();
        for (index, entry) in config.backends.iter().enumerate() {
            let key = format!("audit.backends[{index}]");
            let kind = backend::backend(&entry.kind).ok_or_else(|| {
                format!(
                    "invalid config: {key}.type `{}` is not a backend of this binary (known: {})",
                    entry.kind,
                    backend::kinds().join(", ")
                )
            })?;
            let writer = (kind.open)(entry, source)
                .map_err(|e| format!("{key}: the audit backend cannot start: {e}"))?;
            let same_kind = config.backends[..index]
                .iter()
                .filter(|b| b.kind == entry.kind)
                .count();
            let name = match same_kind {
                0 => entry.kind.clone(),
                n => format!("{}#{}", entry.kind, n + 1),
            };
            backends.push(BackendQueue::start(name, entry, writer));
        }
        Ok(Arc::new(Self {
            active: Some(Active {
                policy: Policy::new(config),
                backends,
                seq: AtomicU64::new(1),
                order: Mutex::new(()),
                request_levels: Mutex::new(HashMap::new()),
            }),
        }))
    }

    /// True when the trail records anything at all.
    pub fn is_enabled(&self) -> bool {
        self.active.is_some()
    }

    /// The level events of `kind` are recorded at.
    pub fn level(&self, kind: &str) -> Level {
        self.active
            .as_ref()
            .map_or(Level::None, |active| active.policy.level(kind))
    }

    /// The level `method`'s request events are recorded at.
    pub(crate) fn request_level(&self, method: &str, changes: bool) -> Level {
        let Some(active) = &self.active else {
            return Level::None;
        };
        let mut cache = active
            .request_levels
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(level) = cache.get(method) {
            return *level;
        }
        let level = active.policy.request_level(method, changes);
        cache.insert(method.to_owned(), level);
        level
    }

    /// True when the reads of `paths` are inside the workspace and not recorded.
    pub(crate) fn inside_workspace(&self, paths: &[std::path::PathBuf]) -> bool {
        self.active
            .as_ref()
            .is_some_and(|active| active.policy.inside_workspace(paths))
    }

    /// True when a backend is in `blocking` mode: changing requests wait for their
    /// `received` event.
    pub(crate) fn has_blocking_backend(&self) -> bool {
        self.active.as_ref().is_some_and(|active| {
            active
                .backends
                .iter()
                .any(|backend| backend.mode == Mode::Blocking)
        })
    }

    /// Records `event` (whose level the caller has checked). Waits, for every `blocking`
    /// backend, until it is written; `Err` names a blocking backend that did not write it.
    pub async fn record(&self, event: Event) -> Result<(), Unwritten> {
        let waits = self.queue(event);
        let mut failed = None;
        for (name, pending) in waits {
            let written = match pending {
                Some(pending) => pending.written().await,
                None => false,
            };
            if !written && failed.is_none() {
                failed = Some(name);
            }
        }
        match failed {
            Some(backend) => Err(Unwritten { backend }),
            None => Ok(()),
        }
    }

    /// Records `event` without waiting for any backend (events with no request to hold:
    /// a process's exit, a session's expiry). A `blocking` backend still writes it.
    pub fn record_now(&self, event: Event) {
        let waits = self.queue(event);
        if waits.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for (_, pending) in waits {
                    if let Some(pending) = pending {
                        pending.written().await;
                    }
                }
            });
        }
    }

    /// Numbers `event` and queues it on every backend; returns what blocking backends
    /// give to wait on.
    fn queue(&self, mut event: Event) -> Vec<(String, Option<Pending>)> {
        let Some(active) = &self.active else {
            return Vec::new();
        };
        super::bound::bound_details(&mut event.details);
        let _order = active.order.lock().unwrap_or_else(|p| p.into_inner());
        let seq = active.seq.fetch_add(1, Ordering::Relaxed);
        let line: Arc<str> = Arc::from(event.encode(seq));
        let mut waits = Vec::new();
        for backend in &active.backends {
            match backend.push(&line) {
                Ok(Some(pending)) => waits.push((backend.name.clone(), Some(pending))),
                Ok(None) => {}
                Err(()) if backend.mode == Mode::Blocking => {
                    waits.push((backend.name.clone(), None));
                }
                Err(()) => {}
            }
        }
        waits
    }

    /// Records `config.loaded`: the hash of the effective configuration (secrets
    /// redacted, so a secret is neither written nor guessable from the hash).
    pub fn config_loaded(&self, effective: &Value, file: Option<&std::path::Path>) {
        let level = self.level("config.loaded");
        if level == Level::None {
            return;
        }
        let text = serde_json::to_vec(effective).unwrap_or_default();
        let hash = sha2::Sha256::digest(&text);
        let mut details = Map::new();
        details.insert(
            "configSha256".into(),
            Value::String(hash.iter().map(|b| format!("{b:02x}")).collect()),
        );
        if let Some(file) = file {
            details.insert("configFile".into(), super::event::path_value(file));
        }
        details.insert("version".into(), env!("CARGO_PKG_VERSION").into());
        self.record_now(Event::new(
            "config.loaded",
            level,
            Arc::new(Who::server()),
            details,
        ));
    }

    /// Waits until every backend has written and flushed what was queued before now
    /// (`timeout` at most for each): at shutdown, so the last events are not lost.
    pub async fn flush(&self, timeout: std::time::Duration) {
        let Some(active) = &self.active else { return };
        for backend in &active.backends {
            if !backend.flush(timeout).await {
                tracing::warn!(backend = %backend.name, "audit events still queued at shutdown may be lost");
            }
        }
    }
}

/// A `blocking` backend did not write an event.
#[derive(Debug, Clone)]
pub struct Unwritten {
    pub backend: String,
}

impl Unwritten {
    /// The refusal of a request that would change the machine unrecorded.
    pub fn refusal(&self, method: &str) -> RpcError {
        RpcError::internal(format!(
            "`{method}` refused: the audit trail cannot record it (audit backend `{}` is not writing); requests that change the machine are refused until it recovers",
            self.backend
        ))
    }
}

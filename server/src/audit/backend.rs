//! Audit backends: where written events go. `file` is built in ([`super::file`]); a crate
//! linked into the binary registers more (`webhook`) with `inventory::submit!`.
//!
//! ```ignore
//! inventory::submit! { AuditBackend { kind: "syslog", open: open_syslog } }
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use exec_server_config::ConfigSource;

use super::config::BackendConfig;

/// Writes batches of events. Each line is one event's JSON, without its newline.
#[async_trait]
pub trait AuditWriter: Send + 'static {
    /// Writes `lines` in order; `Ok` once they are as durable as the backend's settings
    /// promise (the file's `fsync`, the webhook's 2xx answer). A failed batch is retried
    /// whole, so a writer that can write part of a batch must not keep the part.
    async fn write(&mut self, lines: &[Arc<str>]) -> Result<(), String>;

    /// Called when the queue is idle and at shutdown: write back what is buffered.
    async fn flush(&mut self) -> Result<(), String> {
        Ok(())
    }

    /// How long a `batch` backend lets a batch wait for more events before writing it
    /// (`None`: write what is queued at once).
    fn linger(&self) -> Option<Duration> {
        None
    }
}

/// Opens a backend from its `[[audit.backends]]` entry at start-up. An `Err` stops the
/// server: a trail that cannot be written is refused before any request is served.
pub type OpenBackend = fn(&BackendConfig, &ConfigSource) -> Result<Box<dyn AuditWriter>, String>;

/// A kind of backend, registered with `inventory::submit!`.
#[derive(Debug)]
pub struct AuditBackend {
    /// The `type` of its `[[audit.backends]]` entries.
    pub kind: &'static str,
    pub open: OpenBackend,
}

crate::inventory::collect!(AuditBackend);

/// The backend registered for `kind`.
pub(crate) fn backend(kind: &str) -> Option<&'static AuditBackend> {
    crate::inventory::iter::<AuditBackend>
        .into_iter()
        .find(|backend| backend.kind == kind)
}

/// Every registered kind, for the error naming an unknown one.
pub(crate) fn kinds() -> Vec<&'static str> {
    let mut kinds: Vec<_> = crate::inventory::iter::<AuditBackend>
        .into_iter()
        .map(|backend| backend.kind)
        .collect();
    kinds.sort_unstable();
    kinds
}

//! The `[audit]` table's types (its checks and registration: `audit_config`): whether the trail is on, what it records at which level, and where
//! it goes (`[[audit.backends]]`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::event::Level;

/// The configuration table.
pub const TABLE: &str = "audit";

/// `[audit]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// Off by default; on, at least one backend must be configured.
    pub enabled: bool,
    /// The level of every event kind `levels` does not name.
    pub level: Level,
    /// Levels by event kind (`process.exited`), by its first part (`process`), for the
    /// request events of one method (`request:fs/readFile`) or family (`request:fs`), of
    /// every changing method (`request`) or every read-only one (`read`, off unless set).
    /// The most specific key wins.
    pub levels: BTreeMap<String, Level>,
    /// Methods whose request events are recorded: names (`fs/writeFile`), families
    /// (`fs/*`), or `*`. Read-only methods are recorded only when named here (or through
    /// `*`) and when `request:<method>` is not `none`.
    pub methods: Vec<String>,
    /// Methods never recorded, even when `methods` names them.
    pub exclude_methods: Vec<String>,
    /// Reads of files below these directories are not recorded (when `levels.read` records
    /// reads at all): the sessions' workspace.
    pub workspace_roots: Vec<PathBuf>,
    /// Where events go.
    pub backends: Vec<BackendConfig>,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            level: Level::Metadata,
            levels: BTreeMap::new(),
            methods: vec!["*".to_owned()],
            exclude_methods: Vec::new(),
            workspace_roots: Vec::new(),
            backends: Vec::new(),
        }
    }
}

/// How a backend and the requests that emit events wait for each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A request waits until its events are written; while the backend cannot write, the
    /// methods that change the machine are refused.
    Blocking,
    /// Best effort: events are queued; a full queue drops (counted and logged).
    Batch,
}

/// When the file backend calls `fsync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fsync {
    /// After every batch written, before the events count as written.
    Always,
    /// At most every `fsync_interval_ms`, and at rotation and shutdown.
    Interval,
    /// Never: the kernel writes back when it will.
    Never,
}

/// One `[[audit.backends]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackendConfig {
    /// `file`, `webhook`, or the kind of a backend a linked crate registers.
    #[serde(rename = "type")]
    pub kind: String,
    pub mode: Mode,
    /// Events queued for the backend at most; beyond it `batch` drops and `blocking` waits.
    pub buffer_events: usize,
    /// Events written (or posted) together at most.
    pub max_batch_events: usize,
    /// How long a `blocking` request waits for its event before it is refused.
    pub write_timeout_ms: u64,
    /// Attempts after a failed write before the batch counts as lost.
    pub retries: u32,
    /// Wait before the first retry; doubled for each further one.
    pub retry_backoff_ms: u64,
    /// `file`: the JSON-lines file.
    pub path: Option<PathBuf>,
    /// `file`: the size at which the file is rotated (`<path>.1`, `<path>.2`, …).
    pub max_file_bytes: u64,
    /// `file`: rotated files kept.
    pub max_files: u32,
    /// `file`: when to `fsync`.
    pub fsync: Fsync,
    /// `file` with `fsync = "interval"`.
    pub fsync_interval_ms: u64,
    /// `webhook`: the `http://` or `https://` URL batches are posted to. Printed (and
    /// hashed into `config.loaded`) without user information, query and fragment.
    #[serde(serialize_with = "serialize_url")]
    pub url: Option<String>,
    /// `webhook`: a file holding a bearer token sent as `Authorization` (owner-only).
    pub token_file: Option<PathBuf>,
    /// `webhook`: extra trust anchors for `https`; unset: `relay.ca_file`, else the
    /// system's roots.
    pub ca_file: Option<PathBuf>,
    /// `webhook`: how long one post may take.
    pub request_timeout_ms: u64,
    /// `webhook`: in `batch` mode, how long events wait for more before they are posted.
    pub flush_interval_ms: u64,
}

impl Default for BackendConfig {
    fn default() -> Self {
        Self {
            kind: String::new(),
            mode: Mode::Batch,
            buffer_events: 65_536,
            max_batch_events: 512,
            write_timeout_ms: 5_000,
            retries: 3,
            retry_backoff_ms: 200,
            path: None,
            max_file_bytes: 100 * 1024 * 1024,
            max_files: 10,
            fsync: Fsync::Interval,
            fsync_interval_ms: 1_000,
            url: None,
            token_file: None,
            ca_file: None,
            request_timeout_ms: 10_000,
            flush_interval_ms: 1_000,
        }
    }
}

/// A URL as the configuration is printed: without the credentials it may carry.
fn serialize_url<S: serde::Serializer>(url: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match url {
        Some(url) => s.serialize_some(&super::bound::without_url_credentials(url)),
        None => s.serialize_none(),
    }
}

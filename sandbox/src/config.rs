//! The `[sandbox]` configuration table (SANDBOX.md §6.3), registered as a configuration
//! section so that it is decoded and validated at start-up (an invalid value stops the
//! server) and printed by `exec-server config`.
//!
//! The `fs` and `process` plugins read the table through their shared
//! [`crate::SandboxRuntime`], which also logs the probe (§6.2). The sandbox has no switch:
//! a request's `sandbox` member decides whether it is confined, and `enforcement` how
//! strictly. The server's own hardening (§5.8) is not configurable either: `main` applies it
//! before configuration exists (`exec_server_core::hygiene`).

use std::path::PathBuf;

use exec_server_core::config::{ConfigError, ConfigSource};
use exec_server_core::ConfigSection;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::narrow::ProcessNarrowing;
use crate::policy::Enforcement;

/// The table's name.
pub const TABLE: &str = "sandbox";

/// Largest accepted `fs_helper_idle_ms`: an hour.
const MAX_FS_HELPER_IDLE_MS: u64 = 3_600_000;

/// Smallest accepted `helper_max_response_bytes`.
const MIN_RESPONSE_BYTES: u64 = 1024 * 1024;

/// Effective `[sandbox]` settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxConfig {
    /// `require` fails closed when a layer cannot be applied; `best-effort` applies what
    /// works (§6.1).
    pub enforcement: Enforcement,
    /// Wall-clock limit of one fs helper, and of the launcher's set-up phase.
    pub helper_timeout_ms: u64,
    /// Cap on the fs helper's stdout.
    pub helper_max_response_bytes: u64,
    /// fs helpers running at once per server (§3.2).
    pub max_concurrent_helpers: usize,
    /// fs helpers one session runs at once; its further requests wait for their turn.
    pub max_helpers_per_session: usize,
    /// How long an fs helper that answered waits for the next request of its session under
    /// the same policy; 0: one helper per request. Only for the server's own binary.
    pub fs_helper_idle_ms: u64,
    /// The binary spawned for helpers; `None`: `/proc/self/exe`.
    pub helper_executable: Option<PathBuf>,
    pub process_narrowing: ProcessNarrowing,
    /// How long output may still arrive after a sandboxed process exits.
    pub exit_output_grace_ms: u64,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            enforcement: Enforcement::Require,
            helper_timeout_ms: 30_000,
            helper_max_response_bytes: 805_306_368,
            max_concurrent_helpers: 16,
            max_helpers_per_session: 4,
            fs_helper_idle_ms: 10_000,
            helper_executable: None,
            process_narrowing: ProcessNarrowing::MountNamespace,
            exit_output_grace_ms: 20,
        }
    }
}

/// The table as written, before validation: enumerations are strings so that a wrong
/// value gets the `must be …` message of §6.3 rather than a decoder error.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct SandboxTable {
    enforcement: String,
    helper_timeout_ms: u64,
    helper_max_response_bytes: u64,
    max_concurrent_helpers: usize,
    max_helpers_per_session: usize,
    fs_helper_idle_ms: u64,
    helper_executable: Option<PathBuf>,
    process_narrowing: String,
    exit_output_grace_ms: u64,
    /// Removed: accepted only to be refused with a message that says so.
    server_non_dumpable: Option<serde::de::IgnoredAny>,
}

impl Default for SandboxTable {
    fn default() -> Self {
        let d = SandboxConfig::default();
        Self {
            enforcement: "require".to_owned(),
            helper_timeout_ms: d.helper_timeout_ms,
            helper_max_response_bytes: d.helper_max_response_bytes,
            max_concurrent_helpers: d.max_concurrent_helpers,
            max_helpers_per_session: d.max_helpers_per_session,
            fs_helper_idle_ms: d.fs_helper_idle_ms,
            helper_executable: None,
            process_narrowing: "mount-namespace".to_owned(),
            exit_output_grace_ms: d.exit_output_grace_ms,
            server_non_dumpable: None,
        }
    }
}

impl SandboxConfig {
    /// Decodes and validates the `[sandbox]` table of `source`.
    pub fn from_source(source: &ConfigSource) -> Result<Self, ConfigError> {
        let table: SandboxTable = source.section(TABLE)?;
        let key = |name: &str| format!("{TABLE}.{name}");
        if table.server_non_dumpable.is_some() {
            return Err(source.invalid(
                &key("server_non_dumpable"),
                "was removed: the server is always non-dumpable and this can no longer be switched off; delete the key",
            ));
        }
        let enforcement = match table.enforcement.as_str() {
            "require" => Enforcement::Require,
            "best-effort" => Enforcement::BestEffort,
            other => {
                return Err(source.invalid(
                    &key("enforcement"),
                    format!(r#"must be "require" or "best-effort", got "{other}""#),
                ))
            }
        };
        let process_narrowing = match table.process_narrowing.as_str() {
            "mount-namespace" => ProcessNarrowing::MountNamespace,
            "skip" => ProcessNarrowing::Skip,
            other => {
                return Err(source.invalid(
                    &key("process_narrowing"),
                    format!(r#"must be "mount-namespace" or "skip", got "{other}""#),
                ))
            }
        };
        if table.helper_timeout_ms == 0 {
            return Err(source.invalid(&key("helper_timeout_ms"), "must be at least 1, got 0"));
        }
        if table.helper_max_response_bytes < MIN_RESPONSE_BYTES {
            return Err(source.invalid(
                &key("helper_max_response_bytes"),
                format!(
                    "must be at least {MIN_RESPONSE_BYTES}, got {}",
                    table.helper_max_response_bytes
                ),
            ));
        }
        if table.max_concurrent_helpers == 0 {
            return Err(source.invalid(&key("max_concurrent_helpers"), "must be at least 1, got 0"));
        }
        if table.max_helpers_per_session == 0 {
            return Err(
                source.invalid(&key("max_helpers_per_session"), "must be at least 1, got 0")
            );
        }
        if table.fs_helper_idle_ms > MAX_FS_HELPER_IDLE_MS {
            return Err(source.invalid(
                &key("fs_helper_idle_ms"),
                format!(
                    "must be at most {MAX_FS_HELPER_IDLE_MS}, got {}",
                    table.fs_helper_idle_ms
                ),
            ));
        }
        if let Some(path) = table
            .helper_executable
            .as_ref()
            .filter(|p| !p.is_absolute())
        {
            return Err(source.invalid(
                &key("helper_executable"),
                format!(
                    "must be an absolute path, got {:?}",
                    path.display().to_string()
                ),
            ));
        }
        Ok(Self {
            enforcement,
            helper_timeout_ms: table.helper_timeout_ms,
            helper_max_response_bytes: table.helper_max_response_bytes,
            max_concurrent_helpers: table.max_concurrent_helpers,
            max_helpers_per_session: table.max_helpers_per_session,
            fs_helper_idle_ms: table.fs_helper_idle_ms,
            helper_executable: table.helper_executable,
            process_narrowing,
            exit_output_grace_ms: table.exit_output_grace_ms,
        })
    }
}

/// The section's `decode` function: the effective table, validated.
fn effective_section(source: &ConfigSource, _table: &str) -> Result<Value, ConfigError> {
    let config = SandboxConfig::from_source(source)?;
    Ok(serde_json::to_value(config).expect("the sandbox table serialises"))
}

exec_server_core::inventory::submit! {
    ConfigSection {
        name: TABLE,
        summary: "sandbox settings for fs helpers and sandboxed processes",
        decode: effective_section,
        switched_by: "a request is confined when its `sandbox` member asks for it; `sandbox.enforcement` chooses between \"require\" and \"best-effort\"",
    }
}

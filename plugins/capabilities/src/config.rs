//! The `[capabilities]` table: how much discovery may read.

use exec_server_core::config::{ConfigError, ConfigSource};
use exec_server_core::CheckedSection;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CapabilitiesConfig {
    /// Roots one `capabilityRoots/discoverV1` may name.
    pub max_roots: usize,
    /// Largest file returned (manifest, MCP or apps config, skill, skill metadata); a
    /// larger one is left out with a warning.
    pub max_file_bytes: u64,
    /// File contents one request returns in all; past it files are left out with a
    /// warning.
    pub max_total_bytes: u64,
    /// Directory entries one scanned tree may have before the scan stops with a warning.
    pub max_entries: usize,
    /// Directory levels a scan descends.
    pub max_depth: usize,
}

impl Default for CapabilitiesConfig {
    fn default() -> Self {
        Self {
            max_roots: 256,
            max_file_bytes: 1024 * 1024,
            max_total_bytes: 32 * 1024 * 1024,
            max_entries: 50_000,
            max_depth: 64,
        }
    }
}

impl CheckedSection for CapabilitiesConfig {
    fn check(&self, source: &ConfigSource, table: &str) -> Result<(), ConfigError> {
        source.require_positive(
            table,
            &[
                ("max_roots", self.max_roots as u64),
                ("max_file_bytes", self.max_file_bytes),
                ("max_total_bytes", self.max_total_bytes),
                ("max_entries", self.max_entries as u64),
                ("max_depth", self.max_depth as u64),
            ],
        )
    }
}

//! The plugin's `[fs]` config table (PROTOCOL §7): every limit the `fs/*` methods enforce.

use exec_server_core::config::{ConfigError, ConfigSource};
use exec_server_core::CheckedSection;
use serde::{Deserialize, Serialize};

/// Effective `[fs]` settings; a missing key takes its default, an unknown key is a
/// start-up error.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct FsConfig {
    /// Largest file `fs/readFile` returns (§5.5).
    pub max_read_file_bytes: u64,
    /// Most entries `fs/readDirectory` lists (§5.10).
    pub max_directory_entries: usize,
    /// Largest `maxDepth` an `fs/walk` may ask for (§5.11).
    pub walk_max_depth: usize,
    /// Largest `maxDirectories` an `fs/walk` may ask for.
    pub walk_max_directories: usize,
    /// Largest `maxEntries` an `fs/walk` may ask for.
    pub walk_max_entries: usize,
    /// Bytes of paths and messages one `fs/walk` answer may carry.
    pub walk_response_budget_bytes: usize,
    /// Read and replace handles one connection may hold open (§5.14).
    pub max_open_handles: usize,
    /// Largest `len` of one `fs/readBlock` (§5.15).
    pub max_read_block_bytes: usize,
    /// Largest decoded `chunk` of one `fs/writeBlock`.
    pub max_write_block_bytes: usize,
    /// Kernel watches one session may hold for `fs/watchMissing` and `fs/watch`.
    pub max_watches_per_session: usize,
    /// Kernel watches all sessions together may hold (at most half the user's
    /// `max_user_watches`); shared out so that each live session keeps its part.
    pub max_watches_total: usize,
    /// How long `fs/watch` gathers changes after the first before sending them.
    pub watch_debounce_ms: u64,
    /// Deadline of one in-process operation, from the moment it gets a blocking slot.
    pub operation_timeout_ms: u64,
    /// Blocking operations one session runs at once; more wait for their turn.
    pub max_blocking_per_session: usize,
    /// Blocking operations all sessions together run at once.
    pub max_blocking_total: usize,
}

/// Largest accepted `fs.max_blocking_total`: every slot can become a thread of the server
/// (one stuck in the kernel stays), so the bound is a thread budget, not a queue length.
pub const MAX_BLOCKING_TOTAL_LIMIT: usize = 256;

impl Default for FsConfig {
    fn default() -> Self {
        Self {
            max_read_file_bytes: 512 * 1024 * 1024,
            max_directory_entries: 50_000,
            walk_max_depth: 64,
            walk_max_directories: 10_000,
            walk_max_entries: 50_000,
            walk_response_budget_bytes: 4 * 1024 * 1024,
            max_open_handles: 128,
            max_read_block_bytes: 1024 * 1024,
            max_write_block_bytes: 1024 * 1024,
            max_watches_per_session: 256,
            max_watches_total: 8192,
            watch_debounce_ms: 50,
            operation_timeout_ms: 60_000,
            max_blocking_per_session: 8,
            max_blocking_total: 64,
        }
    }
}

impl CheckedSection for FsConfig {
    /// Every limit must be at least 1: a zero would make its method unusable. The blocking
    /// pool must leave the runtime threads for everything else.
    fn check(&self, source: &ConfigSource, table: &str) -> Result<(), ConfigError> {
        if self.max_blocking_total > MAX_BLOCKING_TOTAL_LIMIT {
            return Err(source.invalid(
                &format!("{table}.max_blocking_total"),
                format!(
                    "must be at most {MAX_BLOCKING_TOTAL_LIMIT}, got {}",
                    self.max_blocking_total
                ),
            ));
        }
        source.require_positive(
            table,
            &[
                ("max_read_file_bytes", self.max_read_file_bytes),
                ("max_directory_entries", self.max_directory_entries as u64),
                ("walk_max_directories", self.walk_max_directories as u64),
                ("walk_max_entries", self.walk_max_entries as u64),
                (
                    "walk_response_budget_bytes",
                    self.walk_response_budget_bytes as u64,
                ),
                ("max_open_handles", self.max_open_handles as u64),
                ("max_read_block_bytes", self.max_read_block_bytes as u64),
                ("max_write_block_bytes", self.max_write_block_bytes as u64),
                (
                    "max_watches_per_session",
                    self.max_watches_per_session as u64,
                ),
                ("max_watches_total", self.max_watches_total as u64),
                ("operation_timeout_ms", self.operation_timeout_ms),
                (
                    "max_blocking_per_session",
                    self.max_blocking_per_session as u64,
                ),
                ("max_blocking_total", self.max_blocking_total as u64),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use exec_server_core::config::ConfigSource;

    use super::*;

    #[test]
    fn defaults_are_the_documented_values() {
        let config: FsConfig = ConfigSource::from_toml_str("").section("fs").unwrap();
        assert_eq!(config.max_read_file_bytes, 536_870_912);
        assert_eq!(config.max_directory_entries, 50_000);
        assert_eq!(config.walk_max_depth, 64);
        assert_eq!(config.walk_max_directories, 10_000);
        assert_eq!(config.walk_max_entries, 50_000);
        assert_eq!(config.walk_response_budget_bytes, 4_194_304);
        assert_eq!(config.max_open_handles, 128);
        assert_eq!(config.max_read_block_bytes, 1_048_576);
        assert_eq!(config.max_write_block_bytes, 1_048_576);
        assert_eq!(config.max_watches_per_session, 256);
        assert_eq!(config.watch_debounce_ms, 50);
        assert_eq!(config.operation_timeout_ms, 60_000);
        assert_eq!(config.max_blocking_per_session, 8);
        assert_eq!(config.max_blocking_total, 64);
    }

    #[test]
    fn keys_override_and_typos_are_refused() {
        let source = ConfigSource::from_toml_str("[fs]\nmax_open_handles = 2\n");
        let config: FsConfig = source.section("fs").unwrap();
        assert_eq!(config.max_open_handles, 2);
        assert_eq!(config.walk_max_depth, 64);
        let typo = ConfigSource::from_toml_str("[fs]\nmax_open_handle = 2\n");
        let error = typo.section::<FsConfig>("fs").unwrap_err();
        assert!(error.0.contains("max_open_handle"), "{}", error.0);
    }

    #[test]
    fn zero_limits_are_refused() {
        let source = ConfigSource::from_toml_str("[fs]\nmax_read_block_bytes = 0\n");
        let error = exec_server_core::plugin::load_checked::<FsConfig>(&source, "fs").unwrap_err();
        assert!(
            error.0.starts_with(
                "invalid config: fs.max_read_block_bytes must be greater than zero, got 0"
            ),
            "{}",
            error.0
        );
        let pool = ConfigSource::from_toml_str("[fs]\nmax_blocking_total = 257\n");
        let error = exec_server_core::plugin::load_checked::<FsConfig>(&pool, "fs").unwrap_err();
        assert!(
            error
                .0
                .starts_with("invalid config: fs.max_blocking_total must be at most 256, got 257"),
            "{}",
            error.0
        );
        // maxDepth 0 is a valid request, so walk_max_depth may be 0.
        let depth = ConfigSource::from_toml_str("[fs]\nwalk_max_depth = 0\n");
        assert!(exec_server_core::plugin::load_checked::<FsConfig>(&depth, "fs").is_ok());
    }
}

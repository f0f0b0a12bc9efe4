//! The plugin's `[fs]` config table (PROTOCOL §7): every limit the `fs/*` methods enforce.

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
    /// Read handles one connection may hold open (§5.14).
    pub max_open_handles: usize,
    /// Largest `len` of one `fs/readBlock` (§5.15).
    pub max_read_block_bytes: usize,
}

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
        }
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
}

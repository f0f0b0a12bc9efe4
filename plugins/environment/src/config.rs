//! The `[environment]` table.

use std::path::PathBuf;

use exec_server_core::config::{ConfigError, ConfigSource};
use exec_server_core::CheckedSection;
use serde::{Deserialize, Serialize};

use crate::config_read::DEFAULT_SYSTEM_DIR;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvironmentConfig {
    /// Where `environmentConfig/read` finds codex's system layers (`config.toml`,
    /// `managed_config.toml`, `requirements.toml`).
    pub codex_system_dir: PathBuf,
    /// Largest codex configuration file `environmentConfig/read` reads; a larger one
    /// fails the request.
    pub config_max_file_bytes: u64,
    /// Codex configuration files one `environmentConfig/read` reads in all (every layer
    /// together); past it the request fails.
    pub config_max_total_bytes: u64,
}

impl Default for EnvironmentConfig {
    fn default() -> Self {
        Self {
            codex_system_dir: PathBuf::from(DEFAULT_SYSTEM_DIR),
            config_max_file_bytes: 4 * 1024 * 1024,
            config_max_total_bytes: 8 * 1024 * 1024,
        }
    }
}

impl CheckedSection for EnvironmentConfig {
    fn check(&self, source: &ConfigSource, table: &str) -> Result<(), ConfigError> {
        source.require_positive(
            table,
            &[
                ("config_max_file_bytes", self.config_max_file_bytes),
                ("config_max_total_bytes", self.config_max_total_bytes),
            ],
        )?;
        if !self.codex_system_dir.is_absolute() {
            return Err(source.invalid(
                &format!("{table}.codex_system_dir"),
                format!("must be an absolute path, got {:?}", self.codex_system_dir),
            ));
        }
        Ok(())
    }
}

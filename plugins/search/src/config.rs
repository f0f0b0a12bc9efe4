//! The plugin's `[search]` config table: the limits every search runs within.

use exec_server_core::config::{ConfigError, ConfigSource};
use exec_server_core::CheckedSection;
use serde::{Deserialize, Serialize};

/// Effective `[search]` settings; a missing key takes its default, an unknown key is a
/// start-up error.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchConfig {
    /// `maxResults` of a `search/start` that sends none.
    pub max_results_default: u64,
    /// Largest `maxResults` a `search/start` may ask for.
    pub max_results_limit: u64,
    /// Searches one session may run at once.
    pub max_concurrent_searches: usize,
    /// Searches all sessions together run at once (each holds a thread); further ones
    /// wait for their turn, round-robin by session.
    pub max_searches_total: usize,
    /// Longest `line` of a `search/match`, in bytes; longer lines are cut.
    pub max_line_bytes: usize,
    /// Files larger than this are not searched.
    pub max_file_bytes: u64,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            max_results_default: 1_000,
            max_results_limit: 100_000,
            max_concurrent_searches: 8,
            max_searches_total: 32,
            max_line_bytes: 4_096,
            max_file_bytes: 64 * 1024 * 1024,
        }
    }
}

impl CheckedSection for SearchConfig {
    /// Every limit must be at least 1, and the default may not exceed the limit.
    fn check(&self, source: &ConfigSource, table: &str) -> Result<(), ConfigError> {
        source.require_positive(
            table,
            &[
                ("max_results_default", self.max_results_default),
                ("max_results_limit", self.max_results_limit),
                (
                    "max_concurrent_searches",
                    self.max_concurrent_searches as u64,
                ),
                ("max_searches_total", self.max_searches_total as u64),
                ("max_line_bytes", self.max_line_bytes as u64),
                ("max_file_bytes", self.max_file_bytes),
            ],
        )?;
        if self.max_results_default > self.max_results_limit {
            return Err(source.invalid(
                &format!("{table}.max_results_default"),
                format!(
                    "must not exceed {table}.max_results_limit ({}), got {}",
                    self.max_results_limit, self.max_results_default
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use exec_server_core::config::ConfigSource;
    use exec_server_core::plugin::load_checked;

    use super::*;

    #[test]
    fn defaults_are_the_documented_values() {
        let config: SearchConfig =
            load_checked(&ConfigSource::from_toml_str(""), "search").unwrap();
        assert_eq!(config.max_results_default, 1_000);
        assert_eq!(config.max_results_limit, 100_000);
        assert_eq!(config.max_concurrent_searches, 8);
        assert_eq!(config.max_searches_total, 32);
        assert_eq!(config.max_line_bytes, 4_096);
        assert_eq!(config.max_file_bytes, 67_108_864);
    }

    #[test]
    fn keys_override_and_typos_are_refused() {
        let source = ConfigSource::from_toml_str("[search]\nmax_line_bytes = 10\n");
        let config: SearchConfig = load_checked(&source, "search").unwrap();
        assert_eq!(config.max_line_bytes, 10);
        let typo = ConfigSource::from_toml_str("[search]\nmax_line_byte = 10\n");
        let error = load_checked::<SearchConfig>(&typo, "search").unwrap_err();
        assert!(error.0.contains("max_line_byte"), "{}", error.0);
    }

    #[test]
    fn unusable_limits_are_refused() {
        let zero = ConfigSource::from_toml_str("[search]\nmax_concurrent_searches = 0\n");
        let error = load_checked::<SearchConfig>(&zero, "search").unwrap_err();
        assert!(
            error.0.starts_with(
                "invalid config: search.max_concurrent_searches must be greater than zero, got 0"
            ),
            "{}",
            error.0
        );
        let inverted = ConfigSource::from_toml_str(
            "[search]\nmax_results_default = 20\nmax_results_limit = 10\n",
        );
        let error = load_checked::<SearchConfig>(&inverted, "search").unwrap_err();
        assert!(
            error.0.starts_with(
                "invalid config: search.max_results_default must not exceed search.max_results_limit (10), got 20"
            ),
            "{}",
            error.0
        );
    }
}

//! The `[descriptors]` table: its checks, its registration, and setting the descriptor
//! ledger ([`crate::descriptors`]) up from it at start-up. Kept apart from the ledger, which
//! sessions use, so that the ledger depends on nothing of the plugin machinery.

use exec_server_config::{ConfigError, ConfigSource};

use crate::config_section::ConfigSection;
use crate::descriptors::DescriptorConfig;
use crate::plugin::CheckedSection;

/// The configuration table.
pub const TABLE: &str = "descriptors";

impl CheckedSection for DescriptorConfig {
    fn check(&self, source: &ConfigSource, table: &str) -> Result<(), ConfigError> {
        source.require_positive(
            table,
            &[("session_max_percent", self.session_max_percent as u64)],
        )?;
        if self.session_max_percent > 100 {
            return Err(source.invalid(
                crate::descriptors::MAX_PERCENT_KEY,
                format!("must be at most 100, got {}", self.session_max_percent),
            ));
        }
        Ok(())
    }
}

crate::inventory::submit! {
    ConfigSection {
        name: TABLE,
        summary: "the file-descriptor budget shared by sessions and connections",
        decode: crate::plugin::checked_section::<DescriptorConfig>,
        switched_by: "the budget always applies; `descriptors.session_max_percent = 100` and `descriptors.session_guarantee = 0` leave only the limit itself",
    }
}

/// Sets the ledger up from `[descriptors]` under the current soft `RLIMIT_NOFILE`. Call
/// once the limit is raised, before any listener or plugin runs.
pub fn configure(source: &ConfigSource) -> Result<(), ConfigError> {
    let config: DescriptorConfig = crate::plugin::load_checked(source, TABLE)?;
    crate::descriptors::set_config(&config);
    Ok(())
}

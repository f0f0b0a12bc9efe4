//! The `[audit]` table's checks and its registration as a configuration section; the
//! table's types are in [`crate::audit::config`], which depends on nothing of the plugin
//! machinery.

use exec_server_config::{ConfigError, ConfigSource};

use crate::audit::config::{AuditConfig, BackendConfig, TABLE};
use crate::config_section::ConfigSection;
use crate::plugin::CheckedSection;

impl CheckedSection for AuditConfig {
    fn check(&self, source: &ConfigSource, table: &str) -> Result<(), ConfigError> {
        if self.enabled && self.backends.is_empty() {
            return Err(source.invalid(
                "audit.enabled",
                "needs at least one [[audit.backends]] entry",
            ));
        }
        for pattern in self.methods.iter().chain(&self.exclude_methods) {
            if pattern.is_empty() || (pattern.contains('*') && !valid_wildcard(pattern)) {
                return Err(source.invalid(
                    "audit.methods",
                    format!("has `{pattern}`: use a method name, `family/*` or `*`"),
                ));
            }
        }
        for (index, backend) in self.backends.iter().enumerate() {
            check_backend(backend, source, &format!("{table}.backends[{index}]"))?;
        }
        Ok(())
    }
}

fn valid_wildcard(pattern: &str) -> bool {
    pattern == "*" || pattern.strip_suffix("/*").is_some_and(|f| !f.contains('*'))
}

/// The checks of one `[[audit.backends]]` entry (`key`: `audit.backends[<n>]`).
/// The checks of one `[[audit.backends]]` entry (`key`: `audit.backends[<n>]`).
fn check_backend(
    backend: &BackendConfig,
    source: &ConfigSource,
    key: &str,
) -> Result<(), ConfigError> {
    let positive = [
        ("buffer_events", backend.buffer_events as u64),
        ("max_batch_events", backend.max_batch_events as u64),
        ("write_timeout_ms", backend.write_timeout_ms),
        ("max_file_bytes", backend.max_file_bytes),
        ("request_timeout_ms", backend.request_timeout_ms),
        ("flush_interval_ms", backend.flush_interval_ms),
        ("fsync_interval_ms", backend.fsync_interval_ms),
    ];
    for (name, value) in positive {
        if value == 0 {
            return Err(
                source.invalid(&format!("{key}.{name}"), "must be greater than zero, got 0")
            );
        }
    }
    let needs = |present: bool, name: &str| {
        if present {
            Ok(())
        } else {
            Err(source.invalid(
                &format!("{key}.{name}"),
                format!("is required for a `{}` backend", backend.kind),
            ))
        }
    };
    match backend.kind.as_str() {
        "file" => needs(backend.path.is_some(), "path"),
        "webhook" => needs(backend.url.is_some(), "url"),
        _ => Ok(()),
    }
}

crate::inventory::submit! {
    ConfigSection {
        name: TABLE,
        summary: "the audit trail: what is recorded, at which level, and its backends",
        decode: crate::plugin::checked_section::<AuditConfig>,
        switched_by: "the audit trail runs when `audit.enabled = true`",
    }
}

//! The `[http]` table: what `http/request` may reach and how much it may hold.
//!
//! The defaults follow codex 0.171.0, which lets an authenticated client reach any `http`
//! or `https` URL the executor can, loopback and private addresses included (the
//! executor's own services, a cloud metadata endpoint): `http/request` is a server-side
//! request made on the client's behalf by design. An operator narrows it here.

use std::path::PathBuf;

use exec_server_core::config::{ConfigError, ConfigSource};
use exec_server_core::CheckedSection;
use serde::{Deserialize, Serialize};

/// Effective `[http]` settings; a missing key takes its default, an unknown key is a
/// start-up error.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Schemes a request (and every redirect hop) may use: `http`, `https` or both.
    pub allowed_schemes: Vec<String>,
    /// Whether loopback addresses (`127.0.0.0/8`, `::1`, and `0.0.0.0`/`::`, which reach
    /// them) may be reached.
    pub allow_loopback: bool,
    /// Whether other non-public addresses (RFC 1918, link-local and cloud metadata,
    /// carrier-grade NAT, unique-local IPv6, documentation and reserved ranges) may be
    /// reached.
    pub allow_private: bool,
    /// Host names (exact, or `*.example.com` for its subdomains) and IP literals a request
    /// may reach; empty: any host.
    pub allowed_hosts: Vec<String>,
    /// Extra trust anchors for `https`, besides the system's roots; unset: `relay.ca_file`.
    pub ca_file: Option<PathBuf>,
    /// Largest body a buffered (not streamed) response may have.
    pub max_buffered_body_bytes: u64,
    /// Streamed responses one connection may have running at once.
    pub max_streams_per_connection: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            allowed_schemes: vec!["http".to_owned(), "https".to_owned()],
            allow_loopback: true,
            allow_private: true,
            allowed_hosts: Vec::new(),
            ca_file: None,
            max_buffered_body_bytes: 32 * 1024 * 1024,
            max_streams_per_connection: 64,
        }
    }
}

impl HttpConfig {
    /// Whether the operator narrowed the targets: then the executor's `HTTP_PROXY` and
    /// the like are not used, since a proxy would reach what the table refuses.
    pub fn restricts_targets(&self) -> bool {
        !self.allow_loopback || !self.allow_private || !self.allowed_hosts.is_empty()
    }
}

impl CheckedSection for HttpConfig {
    fn check(&self, source: &ConfigSource, table: &str) -> Result<(), ConfigError> {
        source.require_positive(
            table,
            &[
                ("max_buffered_body_bytes", self.max_buffered_body_bytes),
                (
                    "max_streams_per_connection",
                    self.max_streams_per_connection as u64,
                ),
            ],
        )?;
        for scheme in &self.allowed_schemes {
            if scheme != "http" && scheme != "https" {
                return Err(source.invalid(
                    &format!("{table}.allowed_schemes"),
                    format!("may hold only \"http\" and \"https\", got {scheme:?}"),
                ));
            }
        }
        for host in &self.allowed_hosts {
            let name = host.strip_prefix("*.").unwrap_or(host);
            if name.is_empty()
                || name.contains(['/', ':', '*']) && name.parse::<std::net::IpAddr>().is_err()
            {
                return Err(source.invalid(
                    &format!("{table}.allowed_hosts"),
                    format!("holds host names, `*.` suffixes and IP literals, got {host:?}"),
                ));
            }
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
    fn defaults_follow_codex() {
        let config: HttpConfig = load_checked(&ConfigSource::from_toml_str(""), "http").unwrap();
        assert_eq!(config, HttpConfig::default());
        assert!(!config.restricts_targets());
        assert_eq!(config.max_buffered_body_bytes, 33_554_432);
    }

    #[test]
    fn unusable_values_are_refused() {
        for (toml, key) in [
            ("allowed_schemes = [\"ftp\"]", "http.allowed_schemes"),
            ("allowed_hosts = [\"a/b\"]", "http.allowed_hosts"),
            (
                "max_streams_per_connection = 0",
                "http.max_streams_per_connection",
            ),
            ("allow_loopbak = false", "allow_loopbak"),
        ] {
            let source = ConfigSource::from_toml_str(&format!("[http]\n{toml}\n"));
            let error = load_checked::<HttpConfig>(&source, "http").unwrap_err();
            assert!(error.0.contains(key), "{toml}: {}", error.0);
        }
        let narrowed =
            ConfigSource::from_toml_str("[http]\nallowed_hosts = [\"*.example.com\", \"::1\"]\n");
        let config = load_checked::<HttpConfig>(&narrowed, "http").unwrap();
        assert!(config.restricts_targets());
    }
}

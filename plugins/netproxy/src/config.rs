//! `process/start.networkProxy` (CODEX-NETWORK.md §3.1): the wire types, decoded with
//! serde's own error texts, and the validation errors the spec names.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// `networkProxy`: codex's `RemoteNetworkProxyLaunchConfig`. Unknown members (such as
/// `policyContext`) are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkProxyLaunchConfig {
    pub proxy: ProxyConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_metadata: Option<NetworkProxyAuditMetadata>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    /// Present only when allowlist misses go to the client (§3.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_decision_timeout_ms: Option<u64>,
}

/// `networkProxy.proxy`. The field order is the spec's missing-field order: serde reports
/// the first missing required field in declaration order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyConfig {
    pub enabled: bool,
    pub enable_socks5: bool,
    pub enable_socks5_udp: bool,
    pub allow_upstream_proxy: bool,
    pub dangerously_allow_all_unix_sockets: bool,
    pub mode: NetworkMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domains: Option<BTreeMap<String, DomainPermission>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_sockets: Option<BTreeMap<String, UnixSocketPermission>>,
    pub allow_local_binding: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transparent_tcp: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_masking: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_providers: Option<BTreeMap<String, CredentialProviderConfig>>,
}

/// `limited` allows only GET/HEAD/OPTIONS and no CONNECT; `full` allows everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    Limited,
    Full,
}

/// A `domains` value. The variant order gives serde's ``expected one of `none`, `allow`,
/// `deny` `` text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DomainPermission {
    None,
    Allow,
    Deny,
}

/// A `unixSockets` value (macOS only; on Linux only a warning is logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnixSocketPermission {
    Allow,
    Deny,
}

/// `auditMetadata`: all members optional strings; the struct name is part of serde's
/// ``expected struct NetworkProxyAuditMetadata`` text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkProxyAuditMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_account_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub originator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_type: Option<String>,
}

/// A custom credential provider (§4). Unlike the rest of the wire types it refuses
/// unknown keys, because codex does and the spec shows that error text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialProviderConfig {
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub patterns: Vec<String>,
    #[serde(default)]
    pub url_prefixes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_prefix_from_env: Option<String>,
    #[serde(default)]
    pub auth: Vec<CredentialAuth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// How a brokered credential is put back into a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CredentialAuth {
    Bearer,
    Token,
    Basic,
    Header,
}

/// Why a `networkProxy` was refused; every variant is a -32602 with `to_string()` as its
/// message. The texts live here and nowhere else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// serde's own text (missing field, unknown variant, invalid type).
    Decode(String),
    Disabled,
    ZeroDecisionTimeout,
    TransparentTcpWithoutSocks5,
    /// For the process plugin: `transparentTcp` without a managed sandbox.
    TransparentTcpWithoutManagedSandbox,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Decode(text) => f.write_str(text),
            Self::Disabled => f.write_str(
                "invalid network proxy config: executor-local network proxy launch requires an enabled proxy",
            ),
            Self::ZeroDecisionTimeout => {
                f.write_str("network policy decision callback timeout must be nonzero")
            }
            Self::TransparentTcpWithoutSocks5 => f.write_str(
                "invalid network proxy config: transparent_tcp requires an enabled managed SOCKS5 proxy",
            ),
            Self::TransparentTcpWithoutManagedSandbox => {
                f.write_str("transparent TCP requires a managed Linux sandbox")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl NetworkProxyLaunchConfig {
    /// Decodes and validates `process/start.networkProxy`.
    pub fn from_value(value: serde_json::Value) -> Result<Self, ConfigError> {
        let config: Self =
            serde_json::from_value(value).map_err(|e| ConfigError::Decode(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// The value checks of §3.1 (the sandbox-dependent one is the caller's).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.proxy.enabled {
            return Err(ConfigError::Disabled);
        }
        if self.proxy.transparent_tcp == Some(true) && !self.proxy.enable_socks5 {
            return Err(ConfigError::TransparentTcpWithoutSocks5);
        }
        if self.policy_decision_timeout_ms == Some(0) {
            return Err(ConfigError::ZeroDecisionTimeout);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

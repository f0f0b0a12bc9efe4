//! `environment/info` and `environment/status` (PROTOCOL §6, CODEX-0169 §2.2).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct ShellInfo {
    pub name: String,
    pub path: String,
}

/// The capability flags of codex 0.171.0, by wire name, in the order it writes them
/// (0.169.0's fifteen and `networkProxyTransparentTcp`, CODEX-0171 §2.1).
pub mod capability {
    pub const NETWORK_PROXY_LAUNCH: &str = "networkProxyLaunch";
    pub const NETWORK_PROXY_REVIEW_DOMAINS: &str = "networkProxyReviewDomains";
    pub const NETWORK_PROXY_TRANSPARENT_TCP: &str = "networkProxyTransparentTcp";
    pub const CREDENTIAL_MASKING: &str = "credentialMasking";
    pub const CREDENTIAL_MASKING_CUSTOM_PROVIDERS: &str = "credentialMaskingCustomProviders";
    pub const CAPABILITY_DISCOVERY_SANDBOX: &str = "capabilityDiscoverySandbox";
    pub const FS_WATCH_MISSING: &str = "fsWatchMissing";
    pub const CAPABILITY_DISCOVERY_V2: &str = "capabilityDiscoveryV2";
    pub const ENVIRONMENT_CONFIG_READ: &str = "environmentConfigRead";
    pub const HTTP_HEADER_ENV_VARS: &str = "httpHeaderEnvVars";
    pub const SANDBOXED_FILE_STREAMING: &str = "sandboxedFileStreaming";
    pub const FILE_WRITE_STREAMING: &str = "fileWriteStreaming";
    pub const SHELL_SNAPSHOT_V2: &str = "shellSnapshotV2";
    pub const WINDOWS_MXC: &str = "windowsMxc";
    pub const LINUX_ROOT_WRITE_PRESERVES_DEVICES: &str = "linuxRootWritePreservesDevices";
    pub const LINUX_APPROVED_ROOT_WRITE_PRESERVES_RESTRICTIONS: &str =
        "linuxApprovedRootWritePreservesRestrictions";

    /// Every flag, in wire order.
    pub const ALL: [&str; 16] = [
        NETWORK_PROXY_LAUNCH,
        NETWORK_PROXY_REVIEW_DOMAINS,
        NETWORK_PROXY_TRANSPARENT_TCP,
        CREDENTIAL_MASKING,
        CREDENTIAL_MASKING_CUSTOM_PROVIDERS,
        CAPABILITY_DISCOVERY_SANDBOX,
        FS_WATCH_MISSING,
        CAPABILITY_DISCOVERY_V2,
        ENVIRONMENT_CONFIG_READ,
        HTTP_HEADER_ENV_VARS,
        SANDBOXED_FILE_STREAMING,
        FILE_WRITE_STREAMING,
        SHELL_SNAPSHOT_V2,
        WINDOWS_MXC,
        LINUX_ROOT_WRITE_PRESERVES_DEVICES,
        LINUX_APPROVED_ROOT_WRITE_PRESERVES_RESTRICTIONS,
    ];
}

/// What a client may use. Each flag is `true` only when the plugin providing the feature
/// is installed and every method it needs is enabled; a missing member decodes as `false`,
/// as clients must treat it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Capabilities {
    pub network_proxy_launch: bool,
    pub network_proxy_review_domains: bool,
    pub network_proxy_transparent_tcp: bool,
    pub credential_masking: bool,
    pub credential_masking_custom_providers: bool,
    pub capability_discovery_sandbox: bool,
    pub fs_watch_missing: bool,
    pub capability_discovery_v2: bool,
    pub environment_config_read: bool,
    pub http_header_env_vars: bool,
    pub sandboxed_file_streaming: bool,
    pub file_write_streaming: bool,
    pub shell_snapshot_v2: bool,
    pub windows_mxc: bool,
    pub linux_root_write_preserves_devices: bool,
    pub linux_approved_root_write_preserves_restrictions: bool,
}

impl Capabilities {
    /// The field of the flag named `name` on the wire, if it is one of [`capability::ALL`].
    fn flag_mut(&mut self, name: &str) -> Option<&mut bool> {
        use capability::*;
        Some(match name {
            NETWORK_PROXY_LAUNCH => &mut self.network_proxy_launch,
            NETWORK_PROXY_REVIEW_DOMAINS => &mut self.network_proxy_review_domains,
            NETWORK_PROXY_TRANSPARENT_TCP => &mut self.network_proxy_transparent_tcp,
            CREDENTIAL_MASKING => &mut self.credential_masking,
            CREDENTIAL_MASKING_CUSTOM_PROVIDERS => &mut self.credential_masking_custom_providers,
            CAPABILITY_DISCOVERY_SANDBOX => &mut self.capability_discovery_sandbox,
            FS_WATCH_MISSING => &mut self.fs_watch_missing,
            CAPABILITY_DISCOVERY_V2 => &mut self.capability_discovery_v2,
            ENVIRONMENT_CONFIG_READ => &mut self.environment_config_read,
            HTTP_HEADER_ENV_VARS => &mut self.http_header_env_vars,
            SANDBOXED_FILE_STREAMING => &mut self.sandboxed_file_streaming,
            FILE_WRITE_STREAMING => &mut self.file_write_streaming,
            SHELL_SNAPSHOT_V2 => &mut self.shell_snapshot_v2,
            WINDOWS_MXC => &mut self.windows_mxc,
            LINUX_ROOT_WRITE_PRESERVES_DEVICES => &mut self.linux_root_write_preserves_devices,
            LINUX_APPROVED_ROOT_WRITE_PRESERVES_RESTRICTIONS => {
                &mut self.linux_approved_root_write_preserves_restrictions
            }
            _ => return None,
        })
    }

    /// Whether `name` is a capability flag this protocol version knows.
    pub fn is_known(name: &str) -> bool {
        capability::ALL.contains(&name)
    }

    /// Turns the flag named `name` on; `false` when no flag has that name.
    pub fn enable(&mut self, name: &str) -> bool {
        match self.flag_mut(name) {
            Some(flag) => {
                *flag = true;
                true
            }
            None => false,
        }
    }
}

/// The `environment/info` result, which `initialize` also carries as `environmentInfo`.
/// Members are written in the order codex 0.169.0 writes them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentInfo {
    pub shell: ShellInfo,
    /// The executor's release, for version-gated client behaviour; readers default to
    /// `0.0.0`.
    #[serde(default = "unknown_version")]
    pub executor_version: String,
    /// An opaque build identity (`sha256:` + 64 hex digits); a lookup key, not a checksum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// `null` when the working directory cannot be determined.
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_home_dir: Option<String>,
    /// Rust's `std::env::consts::OS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform_os: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prepend_path_dirs: Vec<String>,
    /// Sent even when empty, as codex 0.169.0 does.
    #[serde(default)]
    pub temporary_directories: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_dir: Option<String>,
    #[serde(default)]
    pub capabilities: Capabilities,
}

fn unknown_version() -> String {
    "0.0.0".into()
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct EnvironmentStatus {
    pub status: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_has_a_field_in_wire_order() {
        let mut all = Capabilities::default();
        for name in capability::ALL {
            assert!(all.enable(name), "{name}");
        }
        assert!(!all.enable("noSuchFlag"));
        let text = serde_json::to_string(&all).unwrap();
        let expected: Vec<String> = capability::ALL
            .iter()
            .map(|name| format!("\"{name}\":true"))
            .collect();
        assert_eq!(text, format!("{{{}}}", expected.join(",")));
    }
}

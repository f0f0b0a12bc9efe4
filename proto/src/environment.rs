//! `environment/info` and `environment/status` (PROTOCOL §6).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct ShellInfo {
    pub name: String,
    pub path: String,
}

/// What reference clients may use; every member is `false` on exec-server (§6.1). A
/// missing member decodes as `false`, as clients must treat it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Capabilities {
    pub network_proxy_launch: bool,
    pub capability_discovery_sandbox: bool,
    pub environment_config_read: bool,
    pub http_header_env_vars: bool,
    pub sandboxed_file_streaming: bool,
    pub shell_snapshot_v2: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentInfo {
    pub shell: ShellInfo,
    /// `null` when the working directory cannot be determined.
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub temporary_directories: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_dir: Option<String>,
    pub capabilities: Capabilities,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct EnvironmentStatus {
    pub status: String,
}

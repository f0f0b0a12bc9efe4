//! The discovery messages on the wire (CODEX-0169 §2.6, §2.7, in the shapes codex 0.169.0
//! answers with) and the texts of their warnings and errors.

use exec_server_core::proto::path::to_file_uri;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const DISCOVER_V1: &str = "capabilityRoots/discoverV1";
pub const DISCOVER_V2: &str = "capabilities/discoverV2";
/// The family label of gating errors (codex's).
pub const FAMILY_LABEL: &str = "capability discovery";

/// Where a plugin manifest may be, relative to the plugin's root, in lookup order.
pub const MANIFEST_PATHS: [&str; 3] = [
    ".codex-plugin/plugin.json",
    ".claude-plugin/plugin.json",
    ".cursor-plugin/plugin.json",
];
pub const MCP_CONFIG: &str = ".mcp.json";
pub const APPS_CONFIG: &str = ".app.json";
pub const SKILL_FILE: &str = "SKILL.md";
/// A skill's optional metadata, relative to its directory.
pub const SKILL_METADATA: &str = "agents/openai.yaml";

pub const SIZE_LIMIT_REACHED: &str = "capability discovery size limit reached";
pub const CACHE_TRAVERSAL_LIMIT_REACHED: &str = "plugin cache traversal limit reached";
pub const LOCATIONS_INCOMPLETE: &str =
    "some capability locations could not be resolved; discovery may be incomplete";
pub const METADATA_INCOMPLETE: &str =
    "some capability metadata could not be loaded; discovery may be incomplete";

pub fn root_uninspectable(path: &std::path::Path, reason: &str) -> String {
    format!(
        "failed to inspect capability root {}: {reason}",
        to_file_uri(path)
    )
}

pub fn root_not_a_directory(path: &std::path::Path) -> String {
    format!("capability root {} is not a directory", to_file_uri(path))
}

pub fn path_unscannable(path: &std::path::Path, reason: &str) -> String {
    format!(
        "failed to scan capability path {}: {reason}",
        to_file_uri(path)
    )
}

pub fn file_unreadable(path: &std::path::Path, reason: &str) -> String {
    format!(
        "failed to read capability file {}: {reason}",
        to_file_uri(path)
    )
}

/// `capabilityRoots/discoverV1` params. The type names are codex's: serde quotes them in
/// its errors (``expected struct WireCapabilityRootDiscoverRequest``).
#[derive(Debug, Deserialize)]
pub struct DiscoverV1Params {
    pub roots: Vec<WireCapabilityRootDiscoverRequest>,
}

#[derive(Debug, Deserialize)]
pub struct WireCapabilityRootDiscoverRequest {
    pub id: String,
    pub path: String,
    #[serde(default)]
    pub sandbox: Option<Value>,
}

#[derive(Debug, Serialize)]
pub struct DiscoverV1Result {
    pub roots: Vec<RootDiscovery>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TextFile {
    pub path: String,
    pub contents: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginFiles {
    pub manifest: TextFile,
    pub mcp_config: Option<TextFile>,
    pub apps_config: Option<TextFile>,
}

#[derive(Debug, Serialize)]
pub struct RootSkill {
    pub instructions: TextFile,
    pub metadata: Option<TextFile>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RootDiscovery {
    pub id: String,
    pub path: String,
    pub plugin: Option<PluginFiles>,
    pub skills: Vec<RootSkill>,
    pub namespace_manifests: Vec<TextFile>,
    pub warnings: Vec<String>,
    pub error: Option<String>,
}

/// `capabilities/discoverV2` params; unknown members are ignored.
#[derive(Debug, Deserialize)]
pub struct DiscoverV2Params {
    pub cwd: String,
    #[serde(default)]
    pub sandbox: Option<Value>,
}

#[derive(Debug, Default, Serialize)]
pub struct DiscoverV2Result {
    pub plugins: Vec<ExecutorPlugin>,
    pub skills: Vec<ExecutorSkill>,
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorPlugin {
    /// `<name>@<marketplace>`.
    pub id: String,
    pub display_name: String,
    pub remote_plugin_id: Option<String>,
    pub version: String,
    pub root: String,
    pub files: PluginFiles,
    pub skills: Vec<ExecutorSkill>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DiscoveryRoot {
    pub id: &'static str,
    pub path: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorSkill {
    pub name: String,
    pub description: String,
    pub short_description: Option<String>,
    /// `SKILL.md`.
    pub path: String,
    /// Which location it was found in; absent for a plugin's skills.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery_root: Option<DiscoveryRoot>,
    /// Not read by this server (always `null`).
    pub dependencies: Option<Value>,
    /// Not read by this server (always `null`).
    pub policy: Option<Value>,
}

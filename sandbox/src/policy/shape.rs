//! The wire shapes of the `sandbox` member (SANDBOX.md §2.2–§2.6), decoded without
//! interpretation: paths stay strings (their errors depend on the request, §2.7) and
//! special kinds stay names (unknown kinds are kept and ignored later, §2.4.5).
//!
//! Casing follows §2.2: the outer object is camelCase, everything inside `permissions`,
//! `additionalPermissions`, `fileSystemSandboxPolicy` and `sandboxPolicy` is snake_case with
//! snake_case tags, except the kebab-case variants of the legacy policy. Unknown members are
//! ignored everywhere; `null` is the same as an absent optional member.

use exec_server_proto::RpcError;
use serde::de::{DeserializeOwned, Deserializer};
use serde::Deserialize;
use serde_json::Value;

/// One decoded `sandbox` object (§2.3).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SandboxShape {
    pub form: Form,
    pub cwd: Option<String>,
    pub workspace_roots: Vec<String>,
}

/// Which of the two shapes the object uses.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Form {
    /// `permissions`, tagged (§2.4.1).
    Tagged(TaggedProfile),
    /// `permissions` without `type` (§2.4.6).
    Untagged(UntaggedProfile),
    /// `sandboxPolicy` and its companions (§2.5, §2.6).
    Legacy(Box<LegacyForm>),
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum TaggedProfile {
    Managed {
        file_system: FileSystem,
        #[serde(default, deserialize_with = "null_as_default")]
        network: NetworkMode,
    },
    Disabled,
    External {
        // Decoded only to refuse a malformed value; nothing is enforced.
        #[serde(default, deserialize_with = "null_as_default")]
        #[allow(dead_code)]
        network: NetworkMode,
    },
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum NetworkMode {
    #[default]
    Restricted,
    Enabled,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum FileSystem {
    Restricted {
        #[serde(default, deserialize_with = "null_as_default")]
        entries: Vec<Entry>,
        #[serde(default)]
        glob_scan_max_depth: Option<u32>,
    },
    Unrestricted,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct Entry {
    pub path: EntryPath,
    pub access: Access,
    // Decoded only to refuse values other than `skip`.
    #[serde(default)]
    #[allow(dead_code)]
    pub missing_path_behavior: Option<MissingPathBehavior>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Access {
    Read,
    Write,
    #[serde(alias = "none")]
    Deny,
}

/// `"skip"` is the only behaviour (§2.4.3); decoding refuses any other value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MissingPathBehavior {
    Skip,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum EntryPath {
    Path { path: String },
    GlobPattern { pattern: String },
    Special { value: Special },
}

/// A symbolic location (§2.4.5); `kind` is kept as sent so unknown kinds can be reported.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct Special {
    pub kind: String,
    #[serde(default)]
    pub subpath: Option<String>,
}

/// The pre-tagged profile (§2.4.6), also the grammar of `additionalPermissions`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(crate) struct UntaggedProfile {
    #[serde(default)]
    pub network: Option<NetworkToggle>,
    #[serde(default)]
    pub file_system: Option<UntaggedFileSystem>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(crate) struct NetworkToggle {
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// Canonical (`entries`) and legacy (`read`/`write` lists) members; both may be given.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(crate) struct UntaggedFileSystem {
    #[serde(default, deserialize_with = "null_as_default")]
    pub entries: Vec<Entry>,
    #[serde(default)]
    pub glob_scan_max_depth: Option<u32>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub read: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub write: Vec<String>,
}

/// `sandboxPolicy` with its companions; `cwd` is `sandboxPolicyCwd`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LegacyForm {
    pub policy: LegacyPolicy,
    pub policy_cwd: Option<String>,
    pub file_system_policy: Option<FileSystemPolicy>,
    pub additional: Option<UntaggedProfile>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub(crate) enum LegacyPolicy {
    DangerFullAccess,
    ReadOnly {
        #[serde(default, deserialize_with = "network_access")]
        network_access: NetworkMode,
        #[serde(default)]
        access: Option<ReadAccess>,
    },
    WorkspaceWrite {
        #[serde(default, deserialize_with = "null_as_default")]
        writable_roots: Vec<String>,
        #[serde(default, deserialize_with = "network_access")]
        network_access: NetworkMode,
        #[serde(default, deserialize_with = "null_as_default")]
        exclude_tmpdir_env_var: bool,
        #[serde(default, deserialize_with = "null_as_default")]
        exclude_slash_tmp: bool,
        #[serde(default)]
        read_only_access: Option<ReadAccess>,
    },
    ExternalSandbox {
        // Decoded only to refuse a malformed value; nothing is enforced.
        #[serde(default, deserialize_with = "network_access")]
        #[allow(dead_code)]
        network_access: NetworkMode,
    },
}

/// The older read-restriction object (§2.5).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub(crate) enum ReadAccess {
    FullAccess,
    Restricted {
        #[serde(default = "default_true", deserialize_with = "null_as_true")]
        include_platform_defaults: bool,
        #[serde(default, deserialize_with = "null_as_default")]
        readable_roots: Vec<String>,
    },
}

/// The legacy `fileSystemSandboxPolicy` (§2.6).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct FileSystemPolicy {
    pub kind: FileSystemPolicyKind,
    #[serde(default, deserialize_with = "null_as_default")]
    pub entries: Vec<Entry>,
    #[serde(default)]
    pub glob_scan_max_depth: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FileSystemPolicyKind {
    Restricted,
    Unrestricted,
    #[serde(rename = "external-sandbox")]
    ExternalSandbox,
}

/// The outer object's members (camelCase); the two shapes stay raw until one is chosen.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a sandbox object")]
struct Outer {
    #[serde(default)]
    permissions: Option<Value>,
    #[serde(default)]
    sandbox_policy: Option<Value>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    workspace_roots: Vec<String>,
    #[serde(default)]
    sandbox_policy_cwd: Option<String>,
    #[serde(default)]
    file_system_sandbox_policy: Option<Value>,
    #[serde(default)]
    additional_permissions: Option<Value>,
    // Accepted for their type and ignored on Linux (§2.3).
    #[serde(default)]
    #[allow(dead_code)]
    windows_sandbox_level: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    windows_sandbox_private_desktop: Option<bool>,
    #[serde(default)]
    #[allow(dead_code)]
    windows_sandbox_proxy_settings_mode: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    use_legacy_landlock: Option<bool>,
}

/// camelCase spellings of snake_case policy members, refused rather than ignored because
/// ignoring them would silently drop part of a restriction (§2.2).
const CAMEL_SPELLINGS: &[(&str, &str)] = &[
    ("fileSystem", "file_system"),
    ("globScanMaxDepth", "glob_scan_max_depth"),
    ("missingPathBehavior", "missing_path_behavior"),
    ("writableRoots", "writable_roots"),
    ("networkAccess", "network_access"),
    ("excludeTmpdirEnvVar", "exclude_tmpdir_env_var"),
    ("excludeSlashTmp", "exclude_slash_tmp"),
    ("readOnlyAccess", "read_only_access"),
    ("includePlatformDefaults", "include_platform_defaults"),
    ("readableRoots", "readable_roots"),
];

/// Decodes a `sandbox` object. Every error here is a shape error (-32602).
pub(crate) fn decode(sandbox: &Value) -> Result<SandboxShape, RpcError> {
    let outer: Outer = from_value(sandbox)?;
    let form = match (outer.permissions, outer.sandbox_policy) {
        (Some(permissions), None) => {
            reject_camel_case(&permissions)?;
            if permissions.get("type").is_some_and(|t| !t.is_null()) {
                Form::Tagged(from_value(&permissions)?)
            } else {
                Form::Untagged(from_value(&permissions)?)
            }
        }
        (None, Some(policy)) => {
            for member in [
                Some(&policy),
                outer.file_system_sandbox_policy.as_ref(),
                outer.additional_permissions.as_ref(),
            ]
            .into_iter()
            .flatten()
            {
                reject_camel_case(member)?;
            }
            Form::Legacy(Box::new(LegacyForm {
                policy: from_value(&policy)?,
                policy_cwd: outer.sandbox_policy_cwd,
                file_system_policy: outer
                    .file_system_sandbox_policy
                    .as_ref()
                    .map(from_value)
                    .transpose()?,
                additional: outer
                    .additional_permissions
                    .as_ref()
                    .map(from_value)
                    .transpose()?,
            }))
        }
        _ => return Err(RpcError::sandbox_needs_one_shape()),
    };
    Ok(SandboxShape {
        form,
        cwd: outer.cwd,
        workspace_roots: outer.workspace_roots,
    })
}

/// Walks every member name at every depth of `value`.
fn reject_camel_case(value: &Value) -> Result<(), RpcError> {
    match value {
        Value::Object(members) => {
            for (name, member) in members {
                if let Some((camel, snake)) = CAMEL_SPELLINGS.iter().find(|(c, _)| c == name) {
                    return Err(RpcError::sandbox_member_casing(camel, snake));
                }
                reject_camel_case(member)?;
            }
            Ok(())
        }
        Value::Array(items) => items.iter().try_for_each(reject_camel_case),
        _ => Ok(()),
    }
}

fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, RpcError> {
    T::deserialize(value).map_err(|e| RpcError::invalid_params(e.to_string()))
}

fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

fn default_true() -> bool {
    true
}

fn null_as_true<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(deserializer)?.unwrap_or(true))
}

/// `network_access` as a bool or as `"restricted"`/`"enabled"`, in every variant (§2.5).
fn network_access<'de, D: Deserializer<'de>>(deserializer: D) -> Result<NetworkMode, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Flag(bool),
        Mode(NetworkMode),
    }
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(NetworkMode::Restricted),
        Some(value) => match Either::deserialize(&value) {
            Ok(Either::Flag(true) | Either::Mode(NetworkMode::Enabled)) => Ok(NetworkMode::Enabled),
            Ok(Either::Flag(false) | Either::Mode(NetworkMode::Restricted)) => {
                Ok(NetworkMode::Restricted)
            }
            Err(_) => Err(serde::de::Error::custom(format!(
                "invalid network_access {value}, expected a bool, `restricted` or `enabled`"
            ))),
        },
    }
}

#[cfg(test)]
#[path = "shape_tests.rs"]
mod tests;

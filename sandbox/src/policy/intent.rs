//! What a decoded `sandbox` asks for, before any path is looked at (SANDBOX.md §2.8 steps
//! 1–4): nothing at all, an unrestricted file system, or a list of access grants; plus the
//! network mode. Legacy policies are expanded into grants here.

use exec_server_proto::RpcError;

use super::shape::{
    Access, Entry, EntryPath, FileSystem, FileSystemPolicyKind, Form, LegacyForm, LegacyPolicy,
    NetworkMode, ReadAccess, Special, TaggedProfile, UntaggedProfile,
};

/// The request's intent.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Intent {
    /// `disabled`, `external`, `danger-full-access`, `external-sandbox`: enforce nothing.
    Nothing,
    /// Enforce `file_system` (`None`: unrestricted) and `network`.
    Enforce {
        file_system: Option<Grants>,
        network: NetworkMode,
    },
}

/// A restricted file system's grants.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Grants {
    pub grants: Vec<Grant>,
    pub glob_scan_max_depth: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Grant {
    pub target: GrantTarget,
    pub access: Access,
}

/// Where a grant applies; paths are still wire strings (their errors depend on the request).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum GrantTarget {
    Path(String),
    /// Deny only.
    Glob(String),
    Special(Special),
    /// The sandbox's working directory, when one is known (legacy expansion).
    Cwd,
}

/// Builds the intent of a decoded `sandbox` form; errors are shape errors (-32602).
pub(crate) fn intent_of(form: &Form) -> Result<Intent, RpcError> {
    match form {
        Form::Tagged(TaggedProfile::Disabled | TaggedProfile::External { .. }) => {
            Ok(Intent::Nothing)
        }
        Form::Tagged(TaggedProfile::Managed {
            file_system,
            network,
        }) => Ok(Intent::Enforce {
            file_system: match file_system {
                FileSystem::Unrestricted => None,
                FileSystem::Restricted {
                    entries,
                    glob_scan_max_depth,
                } => Some(Grants {
                    grants: grants_of(entries)?,
                    glob_scan_max_depth: checked_depth(*glob_scan_max_depth)?,
                }),
            },
            network: *network,
        }),
        Form::Untagged(profile) => Ok(Intent::Enforce {
            file_system: Some(untagged_grants(profile)?),
            network: untagged_network(profile),
        }),
        Form::Legacy(legacy) => legacy_intent(legacy),
    }
}

fn legacy_intent(legacy: &LegacyForm) -> Result<Intent, RpcError> {
    let (mut grants, mut network) = match &legacy.policy {
        LegacyPolicy::DangerFullAccess | LegacyPolicy::ExternalSandbox { .. } => {
            return Ok(Intent::Nothing)
        }
        LegacyPolicy::ReadOnly {
            network_access,
            access,
        } => (read_grants(access.as_ref()), *network_access),
        LegacyPolicy::WorkspaceWrite {
            writable_roots,
            network_access,
            exclude_tmpdir_env_var,
            exclude_slash_tmp,
            read_only_access,
        } => {
            let mut grants = read_grants(read_only_access.as_ref());
            grants.push(grant(GrantTarget::Cwd, Access::Write));
            grants.extend(
                writable_roots
                    .iter()
                    .map(|root| grant(GrantTarget::Path(root.clone()), Access::Write)),
            );
            if !exclude_slash_tmp {
                grants.push(grant(special("slash_tmp"), Access::Write));
            }
            if !exclude_tmpdir_env_var {
                grants.push(grant(special("tmpdir"), Access::Write));
            }
            (grants, *network_access)
        }
    };
    let mut glob_scan_max_depth = None;
    if let Some(additional) = &legacy.additional {
        let extra = untagged_grants(additional)?;
        grants.extend(extra.grants);
        glob_scan_max_depth = extra.glob_scan_max_depth;
        if untagged_network(additional) == NetworkMode::Enabled {
            network = NetworkMode::Enabled;
        }
    }
    let file_system = match &legacy.file_system_policy {
        None => Some(Grants {
            grants,
            glob_scan_max_depth,
        }),
        Some(policy) => match policy.kind {
            FileSystemPolicyKind::Unrestricted | FileSystemPolicyKind::ExternalSandbox => None,
            FileSystemPolicyKind::Restricted => Some(Grants {
                grants: grants_of(&policy.entries)?,
                glob_scan_max_depth: checked_depth(policy.glob_scan_max_depth)?,
            }),
        },
    };
    Ok(Intent::Enforce {
        file_system,
        network,
    })
}

/// `access` / `read_only_access` (§2.5): everything, or the listed roots and the cwd.
fn read_grants(access: Option<&ReadAccess>) -> Vec<Grant> {
    match access {
        None | Some(ReadAccess::FullAccess) => vec![grant(special("root"), Access::Read)],
        Some(ReadAccess::Restricted {
            include_platform_defaults,
            readable_roots,
        }) => {
            let mut grants: Vec<Grant> = readable_roots
                .iter()
                .map(|root| grant(GrantTarget::Path(root.clone()), Access::Read))
                .collect();
            grants.push(grant(GrantTarget::Cwd, Access::Read));
            if *include_platform_defaults {
                grants.push(grant(special("minimal"), Access::Read));
            }
            grants
        }
    }
}

fn untagged_grants(profile: &UntaggedProfile) -> Result<Grants, RpcError> {
    let Some(file_system) = &profile.file_system else {
        return Ok(Grants {
            grants: Vec::new(),
            glob_scan_max_depth: None,
        });
    };
    let mut grants = grants_of(&file_system.entries)?;
    for (paths, access) in [
        (&file_system.read, Access::Read),
        (&file_system.write, Access::Write),
    ] {
        grants.extend(
            paths
                .iter()
                .map(|path| grant(GrantTarget::Path(path.clone()), access)),
        );
    }
    Ok(Grants {
        grants,
        glob_scan_max_depth: checked_depth(file_system.glob_scan_max_depth)?,
    })
}

fn untagged_network(profile: &UntaggedProfile) -> NetworkMode {
    match profile.network.as_ref().and_then(|n| n.enabled) {
        Some(true) => NetworkMode::Enabled,
        _ => NetworkMode::Restricted,
    }
}

fn grants_of(entries: &[Entry]) -> Result<Vec<Grant>, RpcError> {
    entries
        .iter()
        .map(|entry| {
            let target = match &entry.path {
                EntryPath::Path { path } => GrantTarget::Path(path.clone()),
                EntryPath::GlobPattern { pattern } => {
                    if entry.access != Access::Deny {
                        return Err(RpcError::glob_pattern_requires_deny());
                    }
                    GrantTarget::Glob(pattern.clone())
                }
                EntryPath::Special { value } => GrantTarget::Special(value.clone()),
            };
            Ok(grant(target, entry.access))
        })
        .collect()
}

fn checked_depth(depth: Option<u32>) -> Result<Option<u32>, RpcError> {
    match depth {
        Some(0) => Err(RpcError::invalid_params(
            "invalid value: glob_scan_max_depth must be at least 1",
        )),
        other => Ok(other),
    }
}

fn grant(target: GrantTarget, access: Access) -> Grant {
    Grant { target, access }
}

fn special(kind: &str) -> GrantTarget {
    GrantTarget::Special(Special {
        kind: kind.to_owned(),
        subpath: None,
    })
}

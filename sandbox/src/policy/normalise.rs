//! The normalisation algorithm (SANDBOX.md §2.8): shape, intent, expansion, classification,
//! computed carve-outs (§2.9), server additions (§2.10) and the decision (step 9).

use std::path::{Path, PathBuf};

use exec_server_proto::{RpcError, StartErrorKind};
use serde_json::Value;

use super::carve_outs::computed_carve_outs;
use super::classify::classify;
use super::expand::{existing_minimal_paths, parse_member, Expansion, PathMember};
use super::intent::{intent_of, Grant, GrantTarget, Intent};
use super::resolve::canonicalise;
use super::shape::{self, Access, Form, NetworkMode, SandboxShape, Special};
use super::{
    AccessKind, Network, PolicyContext, PolicyOutcome, PolicyTarget, Readable, SandboxDecision,
    SandboxPolicy, DEFAULT_GLOB_SCAN_MAX_DEPTH,
};

/// Normalises one non-null `sandbox` object for `ctx` (shape errors -32602, policy errors
/// with the request's code, §2.7).
pub fn normalise(sandbox: &Value, ctx: &PolicyContext) -> Result<PolicyOutcome, RpcError> {
    let shape = shape::decode(sandbox)?;
    let (grants, network) = match intent_of(&shape.form)? {
        Intent::Nothing => return Ok(outcome(SandboxDecision::Unsandboxed, Vec::new())),
        Intent::Enforce {
            file_system: None,
            network,
        } => {
            // An unrestricted file system leaves only the network to enforce (§2.8 step 2).
            if ctx.target == PolicyTarget::Fs || network == NetworkMode::Enabled {
                return Ok(outcome(SandboxDecision::Unsandboxed, Vec::new()));
            }
            let root_write = Grant {
                target: GrantTarget::Special(Special {
                    kind: "root".to_owned(),
                    subpath: None,
                }),
                access: Access::Write,
            };
            (
                super::intent::Grants {
                    grants: vec![root_write],
                    glob_scan_max_depth: None,
                },
                network,
            )
        }
        Intent::Enforce {
            file_system: Some(grants),
            network,
        } => (grants, network),
    };

    let expansion = expansion_for(&shape, ctx)?;
    let expanded = expansion.expand(&grants.grants)?;
    let classified = classify(&expanded.rules, &expanded.globs);

    let mut read_only = classified.read_only;
    read_only.extend(computed_carve_outs(&classified.writable));
    let mut policy = SandboxPolicy {
        readable: classified.readable,
        writable: classified.writable,
        read_only,
        denied_paths: classified.denied_paths,
        denied_globs: expanded.globs,
        network: match (&ctx.target, network) {
            // The fs helper never needs the network (§2.8).
            (PolicyTarget::Fs, _) | (_, NetworkMode::Restricted) => Network::Restricted,
            (PolicyTarget::Process { .. }, NetworkMode::Enabled) => Network::Enabled,
        },
        full_disk_write: classified.full_disk_write,
        glob_scan_max_depth: grants
            .glob_scan_max_depth
            .unwrap_or(DEFAULT_GLOB_SCAN_MAX_DEPTH),
    };
    add_server_additions(&mut policy, ctx)?;
    sort_and_dedup(&mut policy);

    let unsandboxed = match ctx.target {
        PolicyTarget::Fs => policy.full_disk_write,
        PolicyTarget::Process { .. } => policy.full_disk_write && network == NetworkMode::Enabled,
    };
    let decision = if unsandboxed {
        SandboxDecision::Unsandboxed
    } else {
        SandboxDecision::Enforce(policy)
    };
    Ok(outcome(decision, expanded.ignored_deny_kinds))
}

/// §2.8 step 3: the working directory and the project roots.
fn expansion_for(shape: &SandboxShape, ctx: &PolicyContext) -> Result<Expansion, RpcError> {
    let request = ctx.request();
    let legacy_cwd = match &shape.form {
        Form::Legacy(legacy) => legacy.policy_cwd.as_deref(),
        Form::Tagged(_) | Form::Untagged(_) => None,
    };
    let cwd = match shape.cwd.as_deref().or(legacy_cwd) {
        Some(value) => Some(parse_member(value, PathMember::Permission, request)?),
        None => match &ctx.target {
            PolicyTarget::Process { cwd } => Some(cwd.clone()),
            PolicyTarget::Fs => None,
        },
    };
    let mut project_roots = shape
        .workspace_roots
        .iter()
        .map(|root| parse_member(root, PathMember::WorkspaceRoot, request))
        .collect::<Result<Vec<_>, _>>()?;
    if project_roots.is_empty() {
        project_roots.extend(cwd.clone());
    }
    Ok(Expansion {
        request,
        cwd,
        project_roots,
        tmpdir: ctx.tmpdir.clone(),
    })
}

/// §2.10: the helper's directory (and for processes `minimal` and `/proc`) when reads are
/// restricted; the server's secret files always denied.
fn add_server_additions(policy: &mut SandboxPolicy, ctx: &PolicyContext) -> Result<(), RpcError> {
    // `/` is a root only when a read entry below a denied path keeps reads from being
    // `All` (see `classify`): reads are not restricted then either.
    let restricted = match &policy.readable {
        Readable::All => false,
        Readable::Roots(roots) => !roots.iter().any(|root| root == Path::new("/")),
    };
    if restricted {
        let helper = ctx
            .helper_executable
            .as_ref()
            .map_err(|reason| match ctx.target {
                PolicyTarget::Fs => RpcError::fs_sandbox_prepare(reason),
                PolicyTarget::Process { .. } => RpcError::process_sandbox_prepare(reason)
                    .with_start_error_kind(StartErrorKind::SandboxPreparation),
            })?;
        let mut additions: Vec<PathBuf> = canonicalise(helper)
            .parent()
            .map(Path::to_path_buf)
            .into_iter()
            .collect();
        if let PolicyTarget::Process { .. } = ctx.target {
            additions.extend(existing_minimal_paths());
            additions.push(canonicalise(Path::new("/proc")));
        }
        // An addition only makes a path readable. Where the policy lets it be written, it
        // is readable already, and a read root there would be the longer rule: it would take
        // the write access away.
        additions.retain(|path| !policy.allows(path, AccessKind::Write));
        if let Readable::Roots(roots) = &mut policy.readable {
            roots.extend(additions);
        }
    }
    policy
        .denied_paths
        .extend(ctx.secret_files.iter().map(|p| canonicalise(p)));
    policy.denied_globs.extend(ctx.secret_globs.iter().cloned());
    Ok(())
}

fn sort_and_dedup(policy: &mut SandboxPolicy) {
    fn tidy(paths: &mut Vec<PathBuf>) {
        paths.sort();
        paths.dedup();
    }
    if let Readable::Roots(roots) = &mut policy.readable {
        tidy(roots);
    }
    tidy(&mut policy.writable);
    tidy(&mut policy.read_only);
    tidy(&mut policy.denied_paths);
    policy.denied_globs.sort();
    policy.denied_globs.dedup();
}

fn outcome(decision: SandboxDecision, ignored_deny_kinds: Vec<String>) -> PolicyOutcome {
    PolicyOutcome {
        decision,
        ignored_deny_kinds,
    }
}

#[cfg(test)]
#[path = "normalise_tests.rs"]
mod tests;

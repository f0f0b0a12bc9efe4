//! `capabilityRoots/discoverV1` (CODEX-0169 §2.6): for each requested root, the plugin it
//! declares, its skills and the plugin manifests inside it. Each root is read under its
//! own `sandbox` and fails on its own: a root-local problem is that root's `error`, and the
//! others still succeed.

use std::path::PathBuf;
use std::sync::Arc;

use exec_server_core::proto::path::{parse_path, to_file_uri};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use exec_server_sandbox::policy::SandboxDecision;

use crate::scan::{json_len, manifests, skill_files, skill_metadata_path, AnswerBudget, Reader};
use crate::source::{Kind, Source};
use crate::wire::{
    path_unscannable, root_not_a_directory, root_uninspectable, DiscoverV1Params, DiscoverV1Result,
    RootDiscovery, RootSkill, SIZE_LIMIT_REACHED,
};
use crate::Discovery;

pub(crate) async fn handle(
    discovery: Arc<Discovery>,
    cx: Call,
    params: DiscoverV1Params,
) -> Result<DiscoverV1Result, RpcError> {
    let max = discovery.config.max_roots;
    if params.roots.len() > max {
        return Err(RpcError::invalid_params(format!(
            "at most {max} capability roots may be discovered per request"
        )));
    }
    // Every path and sandbox shape is checked before anything is read.
    let mut prepared = Vec::new();
    for root in params.roots {
        let path = parse_path(&root.path).map_err(|e| e.into_rpc(&root.path))?;
        let decision = discovery.sandbox.decide_fs(root.sandbox.as_ref(), None)?;
        prepared.push((root.id, path, decision));
    }
    if prepared
        .iter()
        .any(|(_, _, decision)| decision.needs_enforcement())
    {
        discovery.sandbox.end_helpers_with(cx.session());
    }
    // The answer: what the roots read (the budget), and each root's id and path again
    // (the path twice where the root's error names it).
    let echoed: u64 = prepared
        .iter()
        .map(|(id, path, _)| json_len(id) + 2 * json_len(&to_file_uri(path)) + ROOT_OVERHEAD)
        .sum();
    let answer = discovery.config.max_total_bytes.saturating_add(echoed);
    let budget = AnswerBudget::reserved(&cx, &discovery.config, answer).await?;
    let mut roots = Vec::new();
    for (id, path, decision) in prepared {
        let root = Root { id, path, decision };
        roots.push(discover_root(&discovery, cx.session().id(), &budget, root).await);
    }
    Ok(DiscoverV1Result { roots })
}

/// JSON of one root's answer besides its id, path and files (keys, brackets, `null`s, the
/// text of an error around the path).
const ROOT_OVERHEAD: u64 = 256;

/// One requested root, checked.
struct Root {
    id: String,
    path: PathBuf,
    decision: SandboxDecision,
}

async fn discover_root(
    discovery: &Discovery,
    session: &str,
    budget: &AnswerBudget,
    Root { id, path, decision }: Root,
) -> RootDiscovery {
    let mut found = RootDiscovery {
        id,
        path: to_file_uri(&path),
        plugin: None,
        skills: Vec::new(),
        namespace_manifests: Vec::new(),
        warnings: Vec::new(),
        error: None,
    };
    let source = match decision {
        SandboxDecision::Unsandboxed => Source::Direct {
            threads: &discovery.threads,
            session,
        },
        SandboxDecision::Enforce(policy) => Source::Confined {
            runtime: &discovery.sandbox,
            policy,
            session,
        },
    };
    match source.kind(&path).await {
        Ok(Kind::Directory) => {}
        Ok(_) => {
            found.error = Some(root_not_a_directory(&path));
            return found;
        }
        Err(reason) => {
            found.error = Some(root_uninspectable(&path, &reason));
            return found;
        }
    }
    let listing = match source.walk(&path, &discovery.config).await {
        Ok(listing) => listing,
        Err(reason) => {
            found.error = Some(root_uninspectable(&path, &reason));
            return found;
        }
    };
    let mut reader = Reader::new(&source, &discovery.config, budget);
    for (dir, reason) in &listing.errors {
        reader.warn(path_unscannable(dir, reason));
    }
    if listing.truncated {
        reader.warn(SIZE_LIMIT_REACHED.to_owned());
    }
    found.plugin = reader.plugin_at(&path, &listing).await;
    for skill in skill_files(&listing, &path) {
        let Some(instructions) = reader.text_file(skill).await else {
            continue;
        };
        let metadata = reader.optional(&skill_metadata_path(skill), &listing).await;
        found.skills.push(RootSkill {
            instructions,
            metadata,
        });
    }
    for manifest in manifests(&listing, &path) {
        if let Some(file) = reader.text_file(manifest).await {
            found.namespace_manifests.push(file);
        }
    }
    found.warnings = reader.warnings;
    found
}

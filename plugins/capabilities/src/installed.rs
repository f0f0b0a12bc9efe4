//! `capabilities/discoverV2` (CODEX-0169 §2.7): what is installed for codex on this host —
//! the plugins in `$CODEX_HOME/plugins/cache/<marketplace>/<plugin>/<version>/` (the
//! highest version of each) with their skills, and the skills in `$CODEX_HOME/skills`
//! (`codex-home-skills`) and `~/.agents/skills` (`user-agent-skills`), each described by
//! its `SKILL.md` front matter. Everything is read under the request's `sandbox`.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use exec_server_core::proto::path::{parse_path, to_file_uri};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use exec_server_sandbox::policy::SandboxDecision;

use crate::frontmatter;
use crate::scan::{json_len, skill_files, AnswerBudget, Reader};
use crate::source::{Kind, Listing, Source};
use crate::wire::{
    DiscoverV2Params, DiscoverV2Result, DiscoveryRoot, ExecutorPlugin, ExecutorSkill,
    CACHE_TRAVERSAL_LIMIT_REACHED, LOCATIONS_INCOMPLETE, MANIFEST_PATHS, METADATA_INCOMPLETE,
};
use crate::Discovery;

pub(crate) async fn handle(
    discovery: Arc<Discovery>,
    cx: Call,
    params: DiscoverV2Params,
) -> Result<DiscoverV2Result, RpcError> {
    parse_path(&params.cwd).map_err(|e| e.into_rpc(&params.cwd))?;
    let source = match discovery.sandbox.decide_fs(params.sandbox.as_ref(), None)? {
        SandboxDecision::Unsandboxed => Source::Direct {
            threads: &discovery.threads,
            session: cx.session().id(),
        },
        SandboxDecision::Enforce(policy) => {
            discovery.sandbox.end_helpers_with(cx.session());
            Source::Confined {
                runtime: &discovery.sandbox,
                policy,
                session: cx.session().id(),
            }
        }
    };
    // File contents and warnings within the budget; the names and paths of plugins and
    // skills come from listings, each of which keeps at most as many bytes of paths.
    let answer = discovery.config.max_total_bytes.saturating_mul(2);
    let budget = AnswerBudget::reserved(&cx, &discovery.config, answer).await?;
    let mut reader = Reader::new(&source, &discovery.config, &budget);
    let mut result = DiscoverV2Result::default();
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from);
    let codex_home = std::env::var_os("CODEX_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".codex")));
    if let Some(codex_home) = &codex_home {
        result.plugins = plugins(&mut reader, &codex_home.join("plugins/cache")).await;
    }
    let locations = [
        ("codex-home-skills", codex_home.map(|h| h.join("skills"))),
        ("user-agent-skills", home.map(|h| h.join(".agents/skills"))),
    ];
    for (id, dir) in locations {
        let Some(dir) = dir else { continue };
        let Some(listing) = listing_of(&mut reader, &dir, LOCATIONS_INCOMPLETE).await else {
            continue;
        };
        let root = DiscoveryRoot {
            id,
            path: to_file_uri(&dir),
        };
        for skill in skill_files(&listing, &dir) {
            if let Some(mut skill) = describe_skill(&mut reader, skill, None).await {
                // Each skill names its discovery root again.
                if reader.charge(json_len(root.id) + json_len(&root.path)) {
                    skill.discovery_root = Some(root.clone());
                    result.skills.push(skill);
                }
            }
        }
    }
    result.warnings = reader.warnings;
    Ok(result)
}

/// The listing of `dir` if it is a directory; scan problems become `incomplete`.
async fn listing_of(reader: &mut Reader<'_>, dir: &Path, incomplete: &str) -> Option<Listing> {
    match reader.source.kind(dir).await {
        Ok(Kind::Directory) => {}
        _ => return None,
    }
    match reader.source.walk(dir, reader.config).await {
        Ok(listing) => {
            if !listing.errors.is_empty() {
                reader.warn(incomplete.to_owned());
            }
            Some(listing)
        }
        Err(_) => {
            reader.warn(incomplete.to_owned());
            None
        }
    }
}

async fn plugins(reader: &mut Reader<'_>, cache: &Path) -> Vec<ExecutorPlugin> {
    let Some(listing) = listing_of(reader, cache, LOCATIONS_INCOMPLETE).await else {
        return Vec::new();
    };
    if listing.truncated {
        reader.warn(CACHE_TRAVERSAL_LIMIT_REACHED.to_owned());
    }
    // (marketplace, plugin) → its version directories that hold a manifest.
    let mut installed: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for file in &listing.files {
        let Ok(relative) = file.strip_prefix(cache) else {
            continue;
        };
        let parts: Vec<&str> = relative.iter().filter_map(|p| p.to_str()).collect();
        if parts.len() == 5
            && MANIFEST_PATHS.contains(&format!("{}/{}", parts[3], parts[4]).as_str())
        {
            installed
                .entry((parts[0].to_owned(), parts[1].to_owned()))
                .or_default()
                .push(parts[2].to_owned());
        }
    }
    let mut plugins = Vec::new();
    for ((marketplace, plugin_dir), mut versions) in installed {
        versions.sort_by(|a, b| compare_versions(a, b));
        versions.dedup();
        let Some(version_dir) = versions.pop() else {
            continue;
        };
        let root = cache
            .join(&marketplace)
            .join(&plugin_dir)
            .join(&version_dir);
        let Some(files) = reader.plugin_at(&root, &listing).await else {
            reader.warn(METADATA_INCOMPLETE.to_owned());
            continue;
        };
        let manifest: serde_json::Value =
            serde_json::from_str(&files.manifest.contents).unwrap_or_default();
        let name = manifest["name"].as_str().unwrap_or(&plugin_dir).to_owned();
        let display_name = manifest["interface"]["displayName"]
            .as_str()
            .unwrap_or(&name)
            .to_owned();
        let version = manifest["version"]
            .as_str()
            .unwrap_or(&version_dir)
            .to_owned();
        let root_uri = to_file_uri(&root);
        // The manifest was charged once as a file; its name, display name and version
        // are copied into the plugin's fields (and its name into every skill's).
        let copied = 2 * json_len(&name) + json_len(&display_name) + json_len(&version);
        if !reader.charge(copied + json_len(&marketplace) + json_len(&root_uri)) {
            continue;
        }
        let mut skills = Vec::new();
        for skill in skill_files(&listing, &root) {
            if let Some(skill) = describe_skill(reader, skill, Some(&name)).await {
                skills.push(skill);
            }
        }
        plugins.push(ExecutorPlugin {
            id: format!("{name}@{marketplace}"),
            display_name,
            remote_plugin_id: None,
            version,
            root: root_uri,
            files,
            skills,
        });
    }
    plugins
}

/// A skill from its `SKILL.md`: `name` (else its directory's name), `description` and
/// `metadata.short-description` from the front matter; a plugin's skills are named
/// `<plugin>:<skill>`. A file without front matter is left out with a warning.
async fn describe_skill(
    reader: &mut Reader<'_>,
    path: &Path,
    plugin: Option<&str>,
) -> Option<ExecutorSkill> {
    let file = reader.text_file(path).await?;
    let Some(front) = frontmatter::parse(&file.contents) else {
        reader.warn(METADATA_INCOMPLETE.to_owned());
        return None;
    };
    let directory = path
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let name = front.get("name").unwrap_or(directory);
    let skill = ExecutorSkill {
        name: match plugin {
            Some(plugin) => format!("{plugin}:{name}"),
            None => name.to_owned(),
        },
        description: front.get("description").unwrap_or_default().to_owned(),
        short_description: front.get("metadata.short-description").map(str::to_owned),
        path: file.path,
        discovery_root: None,
        dependencies: None,
        policy: None,
    };
    // Its file was charged as read; what the answer holds of it is charged again, the
    // plugin's name it carries included.
    let fields = json_len(&skill.name)
        + json_len(&skill.description)
        + skill.short_description.as_deref().map_or(0, json_len)
        + json_len(&skill.path);
    reader.charge(fields).then_some(skill)
}

/// Dotted versions compared part by part, numerically where both parts are numbers.
fn compare_versions(a: &str, b: &str) -> Ordering {
    let mut left = a.split('.');
    let mut right = b.split('.');
    loop {
        match (left.next(), right.next()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let order = match (x.parse::<u64>(), y.parse::<u64>()) {
                    (Ok(x), Ok(y)) => x.cmp(&y),
                    _ => x.cmp(y),
                };
                if order != Ordering::Equal {
                    return order;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::compare_versions;
    use std::cmp::Ordering;

    #[test]
    fn versions_compare_numerically() {
        assert_eq!(compare_versions("1.10.0", "1.9.3"), Ordering::Greater);
        assert_eq!(compare_versions("0.9.0", "1.0.0"), Ordering::Less);
        assert_eq!(compare_versions("1.0", "1.0.1"), Ordering::Less);
    }
}

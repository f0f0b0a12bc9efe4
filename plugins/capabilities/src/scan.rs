//! What one scanned tree holds: a plugin declared at its root, its `SKILL.md` files with
//! their metadata, and the plugin manifests met anywhere in it — read within the
//! request's size budget.

use std::path::{Path, PathBuf};

use exec_server_core::proto::path::to_file_uri;

use crate::config::CapabilitiesConfig;
use crate::source::{Listing, Source};
use crate::wire::{
    file_unreadable, PluginFiles, TextFile, APPS_CONFIG, MANIFEST_PATHS, MCP_CONFIG,
    SIZE_LIMIT_REACHED, SKILL_FILE, SKILL_METADATA,
};

/// Reads files for one request: each at most `max_file_bytes`, all together at most
/// `max_total_bytes`. What does not fit is left out with a warning.
pub(crate) struct Reader<'a> {
    pub(crate) source: &'a Source<'a>,
    pub(crate) config: &'a CapabilitiesConfig,
    pub(crate) remaining: u64,
    pub(crate) warnings: Vec<String>,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(source: &'a Source<'a>, config: &'a CapabilitiesConfig) -> Self {
        Self {
            source,
            config,
            remaining: config.max_total_bytes,
            warnings: Vec::new(),
        }
    }

    pub(crate) fn warn(&mut self, warning: String) {
        if !self.warnings.contains(&warning) {
            self.warnings.push(warning);
        }
    }

    pub(crate) async fn text_file(&mut self, path: &Path) -> Option<TextFile> {
        let limit = self.config.max_file_bytes.min(self.remaining);
        match self.source.read(path, limit).await {
            Ok(Some(contents)) => {
                self.remaining -= contents.len() as u64;
                Some(TextFile {
                    path: to_file_uri(path),
                    contents,
                })
            }
            Ok(None) => {
                self.warn(SIZE_LIMIT_REACHED.to_owned());
                None
            }
            Err(reason) => {
                self.warn(file_unreadable(path, &reason));
                None
            }
        }
    }

    /// The plugin declared by `root` itself, if the listing has one of its manifests.
    pub(crate) async fn plugin_at(
        &mut self,
        root: &Path,
        listing: &Listing,
    ) -> Option<PluginFiles> {
        let manifest_path = MANIFEST_PATHS
            .iter()
            .map(|relative| root.join(relative))
            .find(|path| listing.files.contains(path))?;
        let manifest = self.text_file(&manifest_path).await?;
        let mcp_config = self.optional(&root.join(MCP_CONFIG), listing).await;
        let apps_config = self.optional(&root.join(APPS_CONFIG), listing).await;
        Some(PluginFiles {
            manifest,
            mcp_config,
            apps_config,
        })
    }

    pub(crate) async fn optional(&mut self, path: &Path, listing: &Listing) -> Option<TextFile> {
        if listing.files.contains(path) {
            self.text_file(path).await
        } else {
            None
        }
    }
}

/// The `SKILL.md` files of `listing` below `root`, in path order.
pub(crate) fn skill_files<'l>(
    listing: &'l Listing,
    root: &'l Path,
) -> impl Iterator<Item = &'l PathBuf> {
    listing
        .files
        .iter()
        .filter(move |path| path.starts_with(root))
        .filter(|path| path.file_name().is_some_and(|name| name == SKILL_FILE))
}

/// The metadata file of the skill whose `SKILL.md` is `skill`.
pub(crate) fn skill_metadata_path(skill: &Path) -> PathBuf {
    skill.parent().unwrap_or(skill).join(SKILL_METADATA)
}

/// Plugin manifests anywhere in `listing` below `root`, in path order.
pub(crate) fn manifests<'l>(
    listing: &'l Listing,
    root: &'l Path,
) -> impl Iterator<Item = &'l PathBuf> {
    listing.files.iter().filter(move |path| {
        path.starts_with(root) && MANIFEST_PATHS.iter().any(|m| path.ends_with(m))
    })
}

//! What one scanned tree holds: a plugin declared at its root, its `SKILL.md` files with
//! their metadata, and the plugin manifests met anywhere in it — read within the
//! request's size budget.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use exec_server_core::proto::path::to_file_uri;
use exec_server_core::proto::RpcError;
use exec_server_core::Call;

use crate::config::CapabilitiesConfig;
use crate::source::{Listing, Source};
use crate::wire::{
    file_unreadable, PluginFiles, TextFile, APPS_CONFIG, MANIFEST_PATHS, MCP_CONFIG,
    SIZE_LIMIT_REACHED, SKILL_FILE, SKILL_METADATA,
};

/// What one request's answer may still hold, in bytes of JSON: file contents, the paths
/// that name them and warnings, all together at most `capabilities.max_total_bytes`,
/// across every root of the request. The handler reserves that much of the connection's
/// outbound budget before it reads anything.
#[derive(Debug)]
pub(crate) struct AnswerBudget {
    remaining: AtomicU64,
}

/// JSON around each file of an answer (`{"path":…,"contents":…}` and its place in a list).
const FILE_OVERHEAD: u64 = 64;
/// Room kept past the budget for the one warning that says the budget ran out.
const BUDGET_SLACK: usize = 1024;

impl AnswerBudget {
    /// The budget of one request whose answer is at most `answer` bytes of JSON, once that
    /// much (and [`BUDGET_SLACK`]) is reserved in the connection's outbound budget, before
    /// anything is read.
    pub(crate) async fn reserved(
        cx: &Call,
        config: &CapabilitiesConfig,
        answer: u64,
    ) -> Result<Self, RpcError> {
        let answer = usize::try_from(answer).unwrap_or(usize::MAX);
        if !cx
            .reserve_response_bytes(answer.saturating_add(BUDGET_SLACK))
            .await
        {
            return Err(RpcError::internal("the connection closed"));
        }
        Ok(Self {
            remaining: AtomicU64::new(config.max_total_bytes),
        })
    }

    fn remaining(&self) -> u64 {
        self.remaining.load(Ordering::Relaxed)
    }

    /// Takes `bytes` if they are left.
    fn take(&self, bytes: u64) -> bool {
        self.remaining
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(bytes)
            })
            .is_ok()
    }
}

/// Bytes `text` takes as a JSON string, quotes and escapes included.
pub(crate) fn json_len(text: &str) -> u64 {
    let escaped: usize = text
        .chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum();
    escaped as u64 + 2
}

/// Reads files for one request: each at most `max_file_bytes`, all of the answer within
/// its [`AnswerBudget`]. What does not fit is left out with a warning.
pub(crate) struct Reader<'a> {
    pub(crate) source: &'a Source<'a>,
    pub(crate) config: &'a CapabilitiesConfig,
    budget: &'a AnswerBudget,
    pub(crate) warnings: Vec<String>,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(
        source: &'a Source<'a>,
        config: &'a CapabilitiesConfig,
        budget: &'a AnswerBudget,
    ) -> Self {
        Self {
            source,
            config,
            budget,
            warnings: Vec::new(),
        }
    }

    /// Adds `warning` once; past the budget, only the warning that says so.
    pub(crate) fn warn(&mut self, warning: String) {
        if self.warnings.contains(&warning) {
            return;
        }
        if self.budget.take(json_len(&warning)) {
            self.warnings.push(warning);
        } else if !self.warnings.iter().any(|w| w == SIZE_LIMIT_REACHED) {
            self.warnings.push(SIZE_LIMIT_REACHED.to_owned());
        }
    }

    /// Charges `bytes` of the answer that no file read accounts for (names a plugin's
    /// manifest lends each of its skills, say); false (with the warning) when they do not
    /// fit, and the entry they belong to is left out.
    pub(crate) fn charge(&mut self, bytes: u64) -> bool {
        if self.budget.take(bytes.saturating_add(FILE_OVERHEAD)) {
            return true;
        }
        self.warn(SIZE_LIMIT_REACHED.to_owned());
        false
    }

    pub(crate) async fn text_file(&mut self, path: &Path) -> Option<TextFile> {
        let limit = self.config.max_file_bytes.min(self.budget.remaining());
        match self.source.read(path, limit).await {
            Ok(Some(contents)) => {
                let path = to_file_uri(path);
                let cost = json_len(&path) + json_len(&contents) + FILE_OVERHEAD;
                if !self.budget.take(cost) {
                    self.warn(SIZE_LIMIT_REACHED.to_owned());
                    return None;
                }
                Some(TextFile { path, contents })
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

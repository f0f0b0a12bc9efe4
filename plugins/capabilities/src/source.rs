//! Where discovery reads from: the file system directly, or — when the request's
//! `sandbox` needs enforcement — through the fs helper confined by that policy, one helper
//! per operation, so discovery never reads outside the policy (symlink targets included).
//! Both give the same [`Listing`] of a tree and the same errors.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use exec_server_core::proto::fs::{Metadata, WalkResult};
use exec_server_core::proto::path::{parse_path, to_file_uri};
use exec_server_core::proto::RpcError;
use exec_server_core::SlottedThreads;
use exec_server_sandbox::policy::SandboxPolicy;
use exec_server_sandbox::SandboxRuntime;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::config::CapabilitiesConfig;
use crate::wire::{APPS_CONFIG, MANIFEST_PATHS, MCP_CONFIG, SKILL_FILE, SKILL_METADATA};

/// The regular files of a tree that discovery may answer with ([`wanted`]), what could not
/// be scanned, and whether a limit cut the scan short.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub(crate) files: BTreeSet<PathBuf>,
    /// Directories that could not be read, with the reason.
    pub(crate) errors: Vec<(PathBuf, String)>,
    pub(crate) truncated: bool,
    /// Bytes of the paths in `files` and `errors`.
    held_bytes: u64,
}

/// The most bytes of paths one [`Listing`] keeps: an answer holds no more than the
/// request's content budget anyway, so a tree of many long names costs no more memory.
fn listing_limit(config: &CapabilitiesConfig) -> u64 {
    config.max_total_bytes
}

impl Listing {
    /// Keeps the regular file `path` if discovery may answer with it; past the listing's
    /// limit nothing more is kept and the listing is truncated.
    fn add_file(&mut self, path: PathBuf, limit: u64) {
        if wanted(&path) && self.hold(&path, limit) {
            self.files.insert(path);
        }
    }

    fn add_error(&mut self, dir: PathBuf, reason: String, limit: u64) {
        if self.hold(&dir, limit) {
            self.errors.push((dir, reason));
        }
    }

    fn hold(&mut self, path: &Path, limit: u64) -> bool {
        self.held_bytes += path.as_os_str().len() as u64;
        if self.held_bytes > limit {
            self.truncated = true;
            return false;
        }
        true
    }
}

/// Whether a file may be part of an answer: a plugin manifest, its MCP or apps config, a
/// skill or a skill's metadata.
fn wanted(path: &Path) -> bool {
    MANIFEST_PATHS
        .iter()
        .chain(&[MCP_CONFIG, APPS_CONFIG, SKILL_FILE, SKILL_METADATA])
        .any(|name| path.ends_with(name))
}

/// What a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Directory,
    File,
    Other,
}

pub(crate) enum Source<'a> {
    Direct {
        /// The plugin's share of worker threads, and the requesting session.
        threads: &'a SlottedThreads,
        session: &'a str,
    },
    Confined {
        runtime: &'a SandboxRuntime,
        policy: SandboxPolicy,
        /// The requesting session: its share of the helper slots is used.
        session: &'a str,
    },
}

impl Source<'_> {
    /// What `path` is (symbolic links followed).
    pub(crate) async fn kind(&self, path: &Path) -> Result<Kind, String> {
        match self {
            Source::Direct { .. } => {
                let path = path.to_path_buf();
                self.blocking(move || {
                    let meta = std::fs::metadata(&path).map_err(|e| e.to_string())?;
                    Ok(if meta.is_dir() {
                        Kind::Directory
                    } else if meta.is_file() {
                        Kind::File
                    } else {
                        Kind::Other
                    })
                })
                .await
            }
            Source::Confined { .. } => {
                let meta: Metadata = self
                    .helper(
                        "fs/getMetadata",
                        json!({"path": to_file_uri(path), "followSymlinks": true, "sandbox": null}),
                    )
                    .await?;
                Ok(if meta.is_directory {
                    Kind::Directory
                } else if meta.is_file {
                    Kind::File
                } else {
                    Kind::Other
                })
            }
        }
    }

    /// Every regular file under `root` (symbolic links are not followed), within the
    /// traversal limits.
    pub(crate) async fn walk(
        &self,
        root: &Path,
        config: &CapabilitiesConfig,
    ) -> Result<Listing, String> {
        match self {
            Source::Direct { .. } => {
                let root = root.to_path_buf();
                let config = config.clone();
                self.blocking(move || Ok(walk_direct(&root, &config))).await
            }
            Source::Confined { .. } => {
                let params = json!({
                    "path": to_file_uri(root),
                    "options": {
                        "maxDepth": config.max_depth,
                        "maxDirectories": config.max_entries,
                        "maxEntries": config.max_entries,
                        "followDirectorySymlinks": false,
                        "pruneHiddenDirectories": false,
                    },
                    "sandbox": null,
                });
                let walked: WalkResult = self.helper("fs/walk", params).await?;
                let mut listing = Listing {
                    truncated: walked.truncated,
                    ..Listing::default()
                };
                let limit = listing_limit(config);
                for entry in walked.entries {
                    if entry.kind == exec_server_core::proto::fs::WalkEntryKind::File {
                        if let Ok(path) = parse_path(&entry.path) {
                            listing.add_file(path, limit);
                        }
                    }
                }
                for error in walked.errors {
                    if let Ok(path) = parse_path(&error.path) {
                        listing.add_error(path, error.message, limit);
                    }
                }
                Ok(listing)
            }
        }
    }

    /// The contents of the regular file `path` as UTF-8 (lossily), refused when larger
    /// than `max_bytes` (`Ok(None)`).
    pub(crate) async fn read(&self, path: &Path, max_bytes: u64) -> Result<Option<String>, String> {
        let bytes = match self {
            Source::Direct { .. } => {
                let path = path.to_path_buf();
                self.blocking(move || {
                    use std::io::Read as _;
                    let file = open_regular(&path)?;
                    let mut bytes = Vec::new();
                    file.take(max_bytes + 1)
                        .read_to_end(&mut bytes)
                        .map_err(|e| e.to_string())?;
                    Ok(bytes)
                })
                .await?
            }
            Source::Confined { .. } => {
                let uri = to_file_uri(path);
                let meta: Metadata = self
                    .helper(
                        "fs/getMetadata",
                        json!({"path": uri, "followSymlinks": false, "sandbox": null}),
                    )
                    .await?;
                if meta.size > max_bytes {
                    return Ok(None);
                }
                let read: exec_server_core::proto::fs::ReadFileResult = self
                    .helper(
                        "fs/readFile",
                        json!({"path": uri, "followSymlinks": false, "sandbox": null}),
                    )
                    .await?;
                base64::engine::general_purpose::STANDARD
                    .decode(read.data_base64)
                    .map_err(|e| e.to_string())?
            }
        };
        if bytes.len() as u64 > max_bytes {
            return Ok(None);
        }
        Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// Runs `work` in the requesting session's share of the plugin's worker threads.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let Source::Direct { threads, session } = self else {
            unreachable!("only direct sources read in the server");
        };
        threads
            .run(session, work)
            .await
            .unwrap_or_else(|| Err("discovery task failed".to_owned()))
    }

    async fn helper<T: DeserializeOwned>(
        &self,
        operation: &str,
        params: serde_json::Value,
    ) -> Result<T, String> {
        let Source::Confined {
            runtime,
            policy,
            session,
        } = self
        else {
            unreachable!("only confined sources use the helper");
        };
        let params = serde_json::value::to_raw_value(&params).map_err(|e| e.to_string())?;
        let answer = runtime
            .run_fs_helper(session, operation, params, policy)
            .await
            .map_err(|e: RpcError| e.message)?;
        serde_json::from_str(answer.get()).map_err(|e| e.to_string())
    }
}

/// Opens `path` for reading only if it is a regular file, without following a symbolic
/// link and without waiting on a FIFO: the tree may change between the walk and the read.
pub(crate) fn open_regular(path: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| e.to_string())?;
    let metadata = file.metadata().map_err(|e| e.to_string())?;
    if !metadata.is_file() {
        return Err(format!("path `{}` is not a file", path.display()));
    }
    Ok(file)
}

/// Depth-first walk that never follows a symbolic link and stops after `max_entries`
/// entries, below `max_depth` levels, or once the listing and the directories still to
/// read hold its limit of paths.
fn walk_direct(root: &Path, config: &CapabilitiesConfig) -> Listing {
    let limit = listing_limit(config);
    let mut listing = Listing::default();
    let mut seen = 0usize;
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) => {
                listing.add_error(dir, e.to_string(), limit);
                continue;
            }
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            seen += 1;
            if seen > config.max_entries || listing.held_bytes > limit {
                listing.truncated = true;
                return listing;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                let path = entry.path();
                // Directories waiting to be read hold their paths too.
                if depth + 1 < config.max_depth && listing.hold(&path, limit) {
                    stack.push((path, depth + 1));
                } else {
                    listing.truncated = true;
                }
            } else if kind.is_file() {
                listing.add_file(entry.path(), limit);
            }
        }
    }
    listing
}

//! The walk of `fs/walk`, written once for both places it runs: on the host's paths in the
//! server ([`walk`]) and through checked descriptors in the fs helper (a [`WalkSource`] of
//! `confined`). The order, the limits and the answer are the same in both.

use std::collections::{HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use exec_server_core::proto::error::io_error_text;
use exec_server_core::proto::fs::{
    WalkEntry, WalkEntryKind, WalkError, WalkOptions, WalkResult, WALK_ITEM_OVERHEAD_BYTES,
};
use exec_server_core::proto::path::to_file_uri;
use exec_server_core::proto::RpcError;

use crate::blocking::IoResultExt;

/// Walks from `root` (already validated options). Only a problem with the root itself is
/// the method's error; `budget_bytes` bounds the paths and messages of the answer.
pub(crate) fn walk(
    root: &Path,
    options: &WalkOptions,
    budget_bytes: usize,
) -> Result<WalkResult, RpcError> {
    let Some(start) = ByPath.start(root, options.follow_directory_symlinks)? else {
        return Ok(WalkResult::default());
    };
    Ok(Walker::new(ByPath, options, budget_bytes, root, start).run())
}

/// How a walk reaches the file system: by path in the server, through checked descriptors
/// in the fs helper (`confined::walk`). The walk's order, limits and answer are the same.
pub(crate) trait WalkSource {
    /// A directory waiting in the queue.
    type Queued;
    /// A directory being listed.
    type Listed;

    /// The root to queue and its identity, or `None` when the root is not a directory to
    /// walk (§5.11 step 1). An error is the method's error.
    fn start(&self, root: &Path, follow: bool)
        -> Result<Option<(Self::Queued, PathBuf)>, RpcError>;

    /// Opens a queued directory and reads its names.
    fn list(&self, directory: &Self::Queued) -> io::Result<(Self::Listed, Vec<OsString>)>;

    /// What the entry `name` of a listed directory is (`path` is its reported path).
    fn inspect(
        &self,
        directory: &Self::Listed,
        path: &Path,
        name: &OsStr,
        follow: bool,
    ) -> io::Result<Inspected<Self::Queued>>;

    /// The identity of a directory about to be queued, for cycle detection.
    fn identity(&self, queued: &Self::Queued, path: &Path, follow: bool) -> io::Result<PathBuf>;

    /// Whether the walk may enter the directory; the refusal's message otherwise.
    fn admit(&self, queued: &Self::Queued) -> Result<(), String>;
}

/// One entry as a [`WalkSource`] found it.
pub(crate) enum Inspected<Q> {
    /// Left out without a trace: a link whose target the sandbox hides.
    Hidden,
    Found {
        is_link: bool,
        /// `None` for anything that is neither a directory nor a regular file.
        kind: Option<WalkEntryKind>,
        /// What to queue if the walk descends into it.
        descend: Q,
    },
}

/// The server's walk: paths, links followed by the OS.
struct ByPath;

impl WalkSource for ByPath {
    type Queued = PathBuf;
    type Listed = PathBuf;

    fn start(&self, root: &Path, follow: bool) -> Result<Option<(PathBuf, PathBuf)>, RpcError> {
        if !fs::metadata(root).or_rpc()?.is_dir() {
            return Ok(None);
        }
        if !follow
            && fs::symlink_metadata(root)
                .or_rpc()?
                .file_type()
                .is_symlink()
        {
            return Ok(None);
        }
        let identity = identity(root, follow).or_rpc()?;
        Ok(Some((root.to_path_buf(), identity)))
    }

    fn list(&self, directory: &PathBuf) -> io::Result<(PathBuf, Vec<OsString>)> {
        let names = fs::read_dir(directory)?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect::<io::Result<Vec<_>>>()?;
        Ok((directory.clone(), names))
    }

    fn inspect(
        &self,
        _directory: &PathBuf,
        path: &Path,
        _name: &OsStr,
        _follow: bool,
    ) -> io::Result<Inspected<PathBuf>> {
        let own = fs::symlink_metadata(path)?;
        let target = fs::metadata(path)?;
        Ok(Inspected::Found {
            is_link: own.file_type().is_symlink(),
            kind: kind_of(&target),
            descend: path.to_path_buf(),
        })
    }

    fn identity(&self, queued: &PathBuf, _path: &Path, follow: bool) -> io::Result<PathBuf> {
        identity(queued, follow)
    }

    fn admit(&self, _queued: &PathBuf) -> Result<(), String> {
        Ok(())
    }
}

/// The walk's kind of an entry described by `meta` (links already followed).
pub(crate) fn kind_of(meta: &fs::Metadata) -> Option<WalkEntryKind> {
    if meta.is_dir() {
        Some(WalkEntryKind::Directory)
    } else if meta.is_file() {
        Some(WalkEntryKind::File)
    } else {
        None
    }
}

/// Whether the walk goes on after a step.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

/// The state of one walk: its counters, the queue of directories still to list and the
/// answer so far.
pub(crate) struct Walker<'a, S: WalkSource> {
    source: S,
    options: &'a WalkOptions,
    budget_limit: usize,
    budget_used: usize,
    entry_count: usize,
    directory_count: usize,
    /// Identities of directories already queued, so link cycles are listed once.
    visited: HashSet<PathBuf>,
    /// Each directory with its reported path and depth.
    queue: VecDeque<(S::Queued, PathBuf, usize)>,
    result: WalkResult,
}

impl<'a, S: WalkSource> Walker<'a, S> {
    /// A walk of `root`, whose [`WalkSource::start`] gave `start`.
    pub(crate) fn new(
        source: S,
        options: &'a WalkOptions,
        budget_bytes: usize,
        root: &Path,
        (queued, identity): (S::Queued, PathBuf),
    ) -> Self {
        Self {
            source,
            options,
            budget_limit: budget_bytes,
            budget_used: 0,
            entry_count: 0,
            directory_count: 1,
            visited: HashSet::from([identity]),
            queue: VecDeque::from([(queued, root.to_path_buf(), 0)]),
            result: WalkResult::default(),
        }
    }

    pub(crate) fn run(mut self) -> WalkResult {
        while let Some((queued, directory, depth)) = self.queue.pop_front() {
            let (listed, mut names) = match self.source.list(&queued) {
                Ok(listing) => listing,
                Err(error) => {
                    if self.record_error(&directory, &error) == Flow::Stop {
                        break;
                    }
                    continue;
                }
            };
            names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            if names
                .iter()
                .any(|name| self.visit(&listed, &directory, depth, name) == Flow::Stop)
            {
                break;
            }
        }
        self.result
    }

    /// One name of a listed directory (§5.11 step 4).
    fn visit(&mut self, listed: &S::Listed, directory: &Path, depth: usize, name: &OsStr) -> Flow {
        if self.entry_count == self.options.max_entries {
            self.result.truncated = true;
            return Flow::Stop;
        }
        self.entry_count += 1;

        let path = directory.join(name);
        let follow = self.options.follow_directory_symlinks;
        let (is_link, kind, descend) = match self.source.inspect(listed, &path, name, follow) {
            // Its target's kind is not revealed.
            Ok(Inspected::Hidden) => return Flow::Continue,
            Ok(Inspected::Found {
                is_link,
                kind,
                descend,
            }) => (is_link, kind, descend),
            Err(error) => return self.record_error(&path, &error),
        };
        if is_link && (!follow || kind != Some(WalkEntryKind::Directory)) {
            return Flow::Continue;
        }
        let Some(kind) = kind else {
            return Flow::Continue;
        };
        let uri = to_file_uri(&path);
        if self.charge(uri.len()) == Flow::Stop {
            return Flow::Stop;
        }
        self.result.entries.push(WalkEntry { path: uri, kind });

        if kind != WalkEntryKind::Directory || depth >= self.options.max_depth {
            return Flow::Continue;
        }
        let hidden = name.as_bytes().first() == Some(&b'.');
        if hidden && self.options.prune_hidden_directories.unwrap_or(false) {
            return Flow::Continue;
        }
        let id = match self.source.identity(&descend, &path, follow) {
            Ok(id) => id,
            Err(error) => return self.record_error(&path, &error),
        };
        if !self.visited.insert(id) {
            return Flow::Continue;
        }
        if let Err(denial) = self.source.admit(&descend) {
            return self.record_message(&path, denial);
        }
        if self.directory_count == self.options.max_directories {
            self.result.truncated = true;
        } else {
            self.directory_count += 1;
            self.queue.push_back((descend, path, depth + 1));
        }
        Flow::Continue
    }

    /// Adds an error record if the budget allows (§5.11 step 5).
    fn record_error(&mut self, path: &Path, error: &io::Error) -> Flow {
        self.record_message(path, io_error_text(error))
    }

    fn record_message(&mut self, path: &Path, message: String) -> Flow {
        let path = to_file_uri(path);
        if self.charge(path.len().saturating_add(message.len())) == Flow::Stop {
            return Flow::Stop;
        }
        self.result.errors.push(WalkError { path, message });
        Flow::Continue
    }

    /// Charges one item of `content_bytes` to the response budget.
    fn charge(&mut self, content_bytes: usize) -> Flow {
        let total = self
            .budget_used
            .checked_add(content_bytes.saturating_add(WALK_ITEM_OVERHEAD_BYTES));
        match total {
            Some(total) if total <= self.budget_limit => {
                self.budget_used = total;
                Flow::Continue
            }
            _ => {
                self.result.truncated = true;
                Flow::Stop
            }
        }
    }
}

/// A directory's identity for cycle detection: where it really is when links are
/// followed, else the path it was reached by.
fn identity(path: &Path, follow: bool) -> io::Result<PathBuf> {
    if follow {
        fs::canonicalize(path)
    } else {
        Ok(path.to_path_buf())
    }
}

#[cfg(test)]
#[path = "walk_tests.rs"]
mod tests;

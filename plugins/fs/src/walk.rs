//! `fs/walk` (PROTOCOL §5.11): a breadth-first listing of a tree, in byte order of names,
//! within entry, directory, depth and response-size limits. Problems below the root are
//! collected in `errors` and the walk goes on.

use std::collections::{HashSet, VecDeque};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use exec_server_core::proto::error::io_error_text;
use exec_server_core::proto::fs::{
    WalkEntry, WalkEntryKind, WalkError, WalkOptions, WalkParams, WalkResult,
    WALK_ITEM_OVERHEAD_BYTES,
};
use exec_server_core::proto::path::to_file_uri;
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use exec_server_sandbox::policy::{resolve, AccessKind, SandboxPolicy};
use serde_json::value::RawValue;

use crate::blocking::IoResultExt;
use crate::config::FsConfig;
use crate::paths::{helper_path, host_path};
use crate::routing::{execute, from_wire, to_wire, FsOperation, FsState};

pub(crate) async fn handle(
    config: Arc<FsState>,
    _cx: Call,
    params: WalkParams,
) -> Result<WalkResult, RpcError> {
    let root = host_path(&params.path)?;
    validate(&params.options, &config)?;
    let operation = Walk {
        root,
        options: params.options,
        budget_bytes: config.walk_response_budget_bytes,
    };
    execute(
        &config.sandbox,
        operation,
        params.sandbox.as_ref(),
        params.sandbox_policy.as_ref(),
    )
    .await
}

/// `fs/walk` with validated options.
#[derive(Debug)]
pub(crate) struct Walk {
    pub(crate) root: PathBuf,
    pub(crate) options: WalkOptions,
    /// `fs.walk_response_budget_bytes`.
    pub(crate) budget_bytes: usize,
}

impl FsOperation for Walk {
    type Output = WalkResult;
    const METHOD: &'static str = exec_server_core::proto::fs::WALK;

    fn run(self) -> Result<WalkResult, RpcError> {
        walk(&self.root, &self.options, self.budget_bytes)
    }

    fn run_confined(self, policy: &SandboxPolicy) -> Result<WalkResult, RpcError> {
        walk_confined(&self.root, &self.options, self.budget_bytes, Some(policy))
    }

    fn helper_params(&self) -> serde_json::Value {
        serde_json::json!({
            "path": helper_path(&self.root),
            "options": self.options,
            "sandbox": null,
        })
    }

    fn output_to_wire(output: WalkResult) -> Result<Box<RawValue>, RpcError> {
        to_wire(&output)
    }

    fn output_from_wire(&self, response: &RawValue) -> Result<WalkResult, RpcError> {
        from_wire(response)
    }
}

/// Checks the requested limits against the configured maximums, before the root is
/// touched.
pub(crate) fn validate(options: &WalkOptions, config: &FsConfig) -> Result<(), RpcError> {
    if options.max_directories == 0 || options.max_entries == 0 {
        return Err(RpcError::walk_limits_zero());
    }
    if options.max_depth > config.walk_max_depth
        || options.max_directories > config.walk_max_directories
        || options.max_entries > config.walk_max_entries
    {
        return Err(RpcError::walk_limits_exceed(
            config.walk_max_depth,
            config.walk_max_directories,
            config.walk_max_entries,
        ));
    }
    Ok(())
}

/// Walks from `root` (already validated options). Only a problem with the root itself is
/// the method's error; `budget_bytes` bounds the paths and messages of the answer.
pub(crate) fn walk(
    root: &Path,
    options: &WalkOptions,
    budget_bytes: usize,
) -> Result<WalkResult, RpcError> {
    walk_confined(root, options, budget_bytes, None)
}

/// [`walk`] under a sandbox policy (SANDBOX.md §5.6): a directory the policy does not let
/// us read is listed but not entered, with an `errors` item carrying the denial; a link
/// whose target it hides is left out.
pub(crate) fn walk_confined(
    root: &Path,
    options: &WalkOptions,
    budget_bytes: usize,
    policy: Option<&SandboxPolicy>,
) -> Result<WalkResult, RpcError> {
    let follow = options.follow_directory_symlinks;
    if !fs::metadata(root).or_rpc()?.is_dir() {
        return Ok(WalkResult::default());
    }
    if !follow
        && fs::symlink_metadata(root)
            .or_rpc()?
            .file_type()
            .is_symlink()
    {
        return Ok(WalkResult::default());
    }
    let root_identity = identity(root, follow).or_rpc()?;
    let mut walk = Walker {
        options,
        policy,
        budget_limit: budget_bytes,
        budget_used: 0,
        entry_count: 0,
        directory_count: 1,
        visited: HashSet::from([root_identity]),
        queue: VecDeque::from([(root.to_path_buf(), 0)]),
        result: WalkResult::default(),
    };
    walk.run();
    Ok(walk.result)
}

/// Whether the walk goes on after a step.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

/// The state of one walk: its counters, the queue of directories still to list and the
/// answer so far.
struct Walker<'a> {
    options: &'a WalkOptions,
    /// The sandbox policy inside the fs helper.
    policy: Option<&'a SandboxPolicy>,
    budget_limit: usize,
    budget_used: usize,
    entry_count: usize,
    directory_count: usize,
    /// Identities of directories already queued, so link cycles are listed once.
    visited: HashSet<PathBuf>,
    queue: VecDeque<(PathBuf, usize)>,
    result: WalkResult,
}

impl Walker<'_> {
    fn run(&mut self) {
        while let Some((directory, depth)) = self.queue.pop_front() {
            let names = match sorted_names(&directory) {
                Ok(names) => names,
                Err(error) => {
                    if self.record_error(&directory, &error) == Flow::Stop {
                        return;
                    }
                    continue;
                }
            };
            for name in names {
                if self.visit(&directory, depth, &name) == Flow::Stop {
                    return;
                }
            }
        }
    }

    /// One name of a listed directory (§5.11 step 4).
    fn visit(&mut self, directory: &Path, depth: usize, name: &OsString) -> Flow {
        if self.entry_count == self.options.max_entries {
            self.result.truncated = true;
            return Flow::Stop;
        }
        self.entry_count += 1;

        let path = directory.join(name);
        let (target, is_link) = match fs::symlink_metadata(&path)
            .and_then(|own| Ok((fs::metadata(&path)?, own.file_type().is_symlink())))
        {
            Ok(found) => found,
            Err(error) => return self.record_error(&path, &error),
        };
        let follow = self.options.follow_directory_symlinks;
        if is_link && (!follow || !target.is_dir()) {
            return Flow::Continue;
        }
        if is_link && !self.readable(&path) {
            // Its target's kind is not revealed.
            return Flow::Continue;
        }
        let kind = if target.is_dir() {
            WalkEntryKind::Directory
        } else if target.is_file() {
            WalkEntryKind::File
        } else {
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
        let id = match identity(&path, follow) {
            Ok(id) => id,
            Err(error) => return self.record_error(&path, &error),
        };
        if !self.visited.insert(id) {
            return Flow::Continue;
        }
        if !self.readable(&path) {
            let resolved = resolve(&path, true);
            let denial = RpcError::sandbox_read_denied(&resolved.to_string_lossy());
            return self.record_message(&path, denial.message);
        }
        if self.directory_count == self.options.max_directories {
            self.result.truncated = true;
        } else {
            self.directory_count += 1;
            self.queue.push_back((path, depth + 1));
        }
        Flow::Continue
    }

    /// Whether the policy (if any) lets the walk read what `path` resolves to.
    fn readable(&self, path: &Path) -> bool {
        self.policy
            .is_none_or(|policy| policy.allows(&resolve(path, true), AccessKind::Read))
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

/// The names in `directory`, sorted by byte value.
fn sorted_names(directory: &Path) -> io::Result<Vec<OsString>> {
    let mut names = fs::read_dir(directory)?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<io::Result<Vec<_>>>()?;
    names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(names)
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

//! `fs/readDirectory` (PROTOCOL §5.10): one directory's entries, in the OS's order.

use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use exec_server_core::proto::fs::{DirectoryEntry, ReadDirectoryParams, ReadDirectoryResult};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use exec_server_sandbox::fs_helper::{Need, Target};
use exec_server_sandbox::policy::SandboxPolicy;
use serde_json::json;
use serde_json::value::RawValue;

use crate::blocking::{Deadline, IoResultExt};
use crate::config::FsConfig;
use crate::paths::{helper_path, host_path};
use crate::routing::{execute_params, from_wire, to_wire, FsOperation, FsState};

/// Bytes reserved per entry `fs.max_directory_entries` allows: the longest name (255
/// bytes) with its JSON (`{"fileName":…,"isDirectory":…,"isFile":…}`); at the default
/// limit that is the whole default budget, so one connection lists one directory at a time.
const LISTED_BYTES_PER_ENTRY: usize = 320;

pub(crate) async fn handle(
    config: Arc<FsState>,
    cx: Call,
    params: ReadDirectoryParams,
) -> Result<ReadDirectoryResult, RpcError> {
    // The answer's size is known only once listed: the most it can be is reserved before
    // listing (at most the connection's whole budget), so that a client asking for many
    // large listings and not reading them holds one at a time, not one per request in
    // flight (SECURITY.md, "bytes held for a peer").
    let expected = config
        .max_directory_entries
        .saturating_mul(LISTED_BYTES_PER_ENTRY);
    cx.reserve_response_bytes(expected).await;
    let entries = execute_params::<ReadDirectory>(&config, cx.session(), params).await?;
    Ok(ReadDirectoryResult { entries })
}

/// `fs/readDirectory`.
#[derive(Debug)]
pub(crate) struct ReadDirectory {
    pub(crate) path: PathBuf,
    /// `fs.max_directory_entries`.
    pub(crate) limit: usize,
}

impl FsOperation for ReadDirectory {
    type Params = ReadDirectoryParams;
    type Output = Vec<DirectoryEntry>;
    const METHOD: &'static str = exec_server_core::proto::fs::READ_DIRECTORY;

    fn from_params(params: ReadDirectoryParams, limits: &FsConfig) -> Result<Self, RpcError> {
        Ok(Self {
            path: host_path(&params.path)?,
            limit: limits.max_directory_entries,
        })
    }

    /// The answer reveals the target, so the last link is always followed.
    fn targets(&self) -> Vec<Target> {
        vec![Target {
            path: self.path.clone(),
            follow_last: true,
            need: Need::Read,
        }]
    }

    fn run(self, _deadline: Deadline) -> Result<Vec<DirectoryEntry>, RpcError> {
        read_directory(&self.path, self.limit)
    }

    /// Links whose target the policy hides are left out, like inaccessible links.
    fn run_confined(self, policy: &SandboxPolicy) -> Result<Vec<DirectoryEntry>, RpcError> {
        crate::confined::read_directory(policy, &self.path, self.limit)
    }

    fn helper_params(&self) -> serde_json::Value {
        json!({"path": helper_path(&self.path), "sandbox": null})
    }

    fn output_to_wire(entries: Vec<DirectoryEntry>) -> Result<Box<RawValue>, RpcError> {
        to_wire(&ReadDirectoryResult { entries })
    }

    /// The helper lists up to the default limit; the server's own limit applies here.
    fn output_from_wire(&self, response: &RawValue) -> Result<Vec<DirectoryEntry>, RpcError> {
        let result: ReadDirectoryResult = from_wire(response)?;
        if result.entries.len() > self.limit {
            return Err(RpcError::too_many_directory_entries(
                self.limit + 1,
                self.limit,
            ));
        }
        Ok(result.entries)
    }
}

/// Lists `path`, stopping at the first entry beyond `limit`. Links are reported with
/// their target's type; entries whose type cannot be learnt (dangling links included)
/// are left out.
pub(crate) fn read_directory(path: &Path, limit: usize) -> Result<Vec<DirectoryEntry>, RpcError> {
    let location = uri_location(path);
    let mut entries = Vec::new();
    for (seen, entry) in fs::read_dir(path).or_rpc()?.enumerate() {
        if seen == limit {
            return Err(RpcError::too_many_directory_entries(limit + 1, limit));
        }
        let entry = entry.or_rpc()?;
        let file_type = match entry.file_type() {
            Ok(t) if t.is_symlink() => match fs::metadata(entry.path()) {
                Ok(target) => target.file_type(),
                Err(_) => continue,
            },
            Ok(t) => t,
            Err(_) => continue,
        };
        entries.push(DirectoryEntry::new(
            &location,
            &entry.file_name(),
            file_type.is_dir(),
            file_type.is_file(),
        ));
    }
    Ok(entries)
}

/// `path` in a form a `file:` URI keeps the meaning of: a URI's `..` is resolved
/// lexically, the kernel's through links, so a path with `..` is resolved first.
fn uri_location(path: &Path) -> PathBuf {
    if path.components().any(|c| c == Component::ParentDir) {
        if let Ok(resolved) = fs::canonicalize(path) {
            return resolved;
        }
    }
    path.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(entries: &[DirectoryEntry]) -> Vec<&str> {
        let mut names: Vec<&str> = entries.iter().map(|e| e.file_name.as_str()).collect();
        names.sort_unstable();
        names
    }

    #[test]
    fn links_take_their_targets_type_and_dangling_ones_vanish() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("file"), b"").unwrap();
        std::os::unix::fs::symlink("sub", dir.path().join("to-sub")).unwrap();
        std::os::unix::fs::symlink("missing", dir.path().join("dangling")).unwrap();
        let entries = read_directory(dir.path(), 10).unwrap();
        assert_eq!(names(&entries), ["file", "sub", "to-sub"]);
        let to_sub = entries.iter().find(|e| e.file_name == "to-sub").unwrap();
        assert!(to_sub.is_directory && !to_sub.is_file);
    }

    #[test]
    fn the_entry_limit_counts_one_past_it() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a", "b", "c"] {
            fs::write(dir.path().join(name), b"").unwrap();
        }
        assert_eq!(read_directory(dir.path(), 3).unwrap().len(), 3);
        assert_eq!(
            read_directory(dir.path(), 2).unwrap_err(),
            RpcError::too_many_directory_entries(3, 2)
        );
    }
}

//! `fs/remove` (PROTOCOL §5.12): a link is removed itself, never its target.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use exec_server_core::proto::bytes::Empty;
use exec_server_core::proto::fs::RemoveParams;
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use exec_server_sandbox::fs_helper::{Need, Target};
use exec_server_sandbox::policy::SandboxPolicy;
use serde_json::json;
use serde_json::value::RawValue;

use crate::blocking::{Deadline, IoResultExt};
use crate::config::FsConfig;
use crate::paths::{helper_path, host_path};
use crate::routing::{execute_params, to_wire, FsOperation, FsState};

pub(crate) async fn handle(
    config: Arc<FsState>,
    cx: Call,
    params: RemoveParams,
) -> Result<Empty, RpcError> {
    execute_params::<Remove>(&config, cx.session(), params).await?;
    Ok(Empty {})
}

/// `fs/remove` with its defaults applied.
#[derive(Debug)]
pub(crate) struct Remove {
    pub(crate) path: PathBuf,
    pub(crate) recursive: bool,
    pub(crate) force: bool,
}

impl FsOperation for Remove {
    type Params = RemoveParams;
    type Output = ();
    const METHOD: &'static str = exec_server_core::proto::fs::REMOVE;

    /// `followSymlinks` is accepted and has no effect (§5.4).
    fn from_params(params: RemoveParams, _limits: &FsConfig) -> Result<Self, RpcError> {
        Ok(Self {
            path: host_path(&params.path)?,
            recursive: params.recursive.unwrap_or(true),
            force: params.force.unwrap_or(true),
        })
    }

    /// Links are removed, never followed.
    fn targets(&self) -> Vec<Target> {
        vec![Target {
            path: self.path.clone(),
            follow_last: false,
            need: if self.recursive {
                Need::WriteTreeIfDirectory
            } else {
                Need::Write
            },
        }]
    }

    fn run(self, _deadline: Deadline) -> Result<(), RpcError> {
        remove(&self.path, self.recursive, self.force).or_rpc()
    }

    fn run_confined(self, policy: &SandboxPolicy) -> Result<(), RpcError> {
        crate::confined::remove(policy, &self.path, self.recursive, self.force)
    }

    fn helper_params(&self) -> serde_json::Value {
        json!({
            "path": helper_path(&self.path),
            "recursive": self.recursive,
            "force": self.force,
            "sandbox": null,
        })
    }

    fn output_to_wire((): ()) -> Result<Box<RawValue>, RpcError> {
        to_wire(&Empty {})
    }

    fn output_from_wire(&self, _response: &RawValue) -> Result<(), RpcError> {
        Ok(())
    }
}

/// Removes `path`, examined without following a final link. `force` only turns a missing
/// path into success.
pub(crate) fn remove(path: &Path, recursive: bool, force: bool) -> io::Result<()> {
    let outcome = fs::symlink_metadata(path).and_then(|own| {
        if !own.is_dir() {
            fs::remove_file(path)
        } else if recursive {
            // Does not follow links inside the tree.
            fs::remove_dir_all(path)
        } else {
            fs::remove_dir(path)
        }
    });
    match outcome {
        Err(e) if force && e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn links_go_and_their_targets_stay() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), b"x").unwrap();
        let tree = dir.path().join("tree");
        fs::create_dir(&tree).unwrap();
        symlink(&target, tree.join("inner-link")).unwrap();
        symlink(&target, dir.path().join("link")).unwrap();

        remove(&dir.path().join("link"), true, true).unwrap();
        remove(&tree, true, true).unwrap();
        assert!(!tree.exists());
        assert!(target.join("keep").exists());
    }

    #[test]
    fn missing_paths_and_non_empty_directories() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        remove(&missing, true, true).unwrap();
        let error = remove(&missing, true, false).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);

        fs::write(dir.path().join("f"), b"x").unwrap();
        let error = remove(dir.path(), false, true).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ENOTEMPTY));
        remove(&dir.path().join("f"), false, false).unwrap();
        let empty = dir.path().join("empty");
        fs::create_dir(&empty).unwrap();
        remove(&empty, false, false).unwrap();
        assert!(!empty.exists());
    }
}

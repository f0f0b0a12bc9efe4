//! `fs/createDirectory` (PROTOCOL §5.7).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use exec_server_core::proto::bytes::Empty;
use exec_server_core::proto::fs::CreateDirectoryParams;
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
    params: CreateDirectoryParams,
) -> Result<Empty, RpcError> {
    execute_params::<CreateDirectory>(&config, cx.session(), params).await?;
    Ok(Empty {})
}

/// `fs/createDirectory` with its defaults applied.
#[derive(Debug)]
pub(crate) struct CreateDirectory {
    pub(crate) path: PathBuf,
    pub(crate) recursive: bool,
    pub(crate) follow_symlinks: bool,
}

impl FsOperation for CreateDirectory {
    type Params = CreateDirectoryParams;
    type Output = ();
    const METHOD: &'static str = exec_server_core::proto::fs::CREATE_DIRECTORY;

    fn from_params(params: CreateDirectoryParams, _limits: &FsConfig) -> Result<Self, RpcError> {
        Ok(Self {
            path: host_path(&params.path)?,
            recursive: params.recursive.unwrap_or(true),
            follow_symlinks: params.follow_symlinks.unwrap_or(true),
        })
    }

    fn targets(&self) -> Vec<Target> {
        vec![Target {
            path: self.path.clone(),
            follow_last: self.follow_symlinks,
            need: Need::Write,
        }]
    }

    fn run(self, _deadline: Deadline) -> Result<(), RpcError> {
        create_directory(&self.path, self.recursive, self.follow_symlinks).or_rpc()
    }

    fn run_confined(self, policy: &SandboxPolicy) -> Result<(), RpcError> {
        crate::confined::create_directory(policy, &self.path, self.recursive, self.follow_symlinks)
    }

    fn helper_params(&self) -> serde_json::Value {
        json!({
            "path": helper_path(&self.path),
            "recursive": self.recursive,
            "followSymlinks": self.follow_symlinks,
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

/// `recursive` succeeds on an existing directory; without `follow` a symbolic link in its
/// place counts as an existing non-directory (§5.4).
pub(crate) fn create_directory(path: &Path, recursive: bool, follow: bool) -> io::Result<()> {
    if !recursive {
        return std::fs::create_dir(path);
    }
    if !follow && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(io::Error::from_raw_os_error(libc::EEXIST));
    }
    std::fs::create_dir_all(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recursive_creation_is_idempotent_and_honours_links() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        create_directory(&deep, true, true).unwrap();
        create_directory(&deep, true, true).unwrap();
        assert!(deep.is_dir());

        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&deep, &link).unwrap();
        create_directory(&link, true, true).unwrap();
        let error = create_directory(&link, true, false).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EEXIST));
    }

    #[test]
    fn single_creation_needs_the_parent_and_refuses_existing_paths() {
        let dir = tempfile::tempdir().unwrap();
        let error = create_directory(&dir.path().join("x/y"), false, true).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        let error = create_directory(dir.path(), false, true).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EEXIST));
    }
}

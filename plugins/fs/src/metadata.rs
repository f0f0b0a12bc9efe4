//! `fs/getMetadata` (PROTOCOL §5.8) and `fs/canonicalize` (§5.9).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use exec_server_core::proto::fs::{CanonicalizeParams, GetMetadataParams, Metadata, PathResult};
use exec_server_core::proto::path::parse_path;
use exec_server_core::proto::path::to_file_uri;
use exec_server_core::proto::RpcError;
use exec_server_core::{Call, Session};
use exec_server_sandbox::fs_helper::{Need, Target};
use exec_server_sandbox::policy::SandboxPolicy;
use serde_json::json;
use serde_json::value::RawValue;

use crate::ambiguous_names::SpelledPaths;
use crate::blocking::{BlockingPool, Deadline, IoResultExt};
use crate::cached_lookup::{self, Lookup};
use crate::config::FsConfig;
use crate::describe::describe;
use crate::paths::{helper_path, host_path};
use crate::routing::{execute_params, from_wire, to_wire, FsOperation, FsState};

pub(crate) async fn handle_get_metadata(
    config: Arc<FsState>,
    cx: Call,
    params: GetMetadataParams,
) -> Result<Metadata, RpcError> {
    execute_params::<GetMetadata>(&config, cx.session(), params).await
}

pub(crate) async fn handle_canonicalize(
    config: Arc<FsState>,
    cx: Call,
    params: CanonicalizeParams,
) -> Result<PathResult, RpcError> {
    let canonical = execute_params::<Canonicalize>(&config, cx.session(), params).await?;
    Ok(PathResult {
        path: to_file_uri(&canonical),
    })
}

/// `fs/getMetadata` with its default applied.
#[derive(Debug)]
pub(crate) struct GetMetadata {
    pub(crate) path: PathBuf,
    pub(crate) follow_symlinks: bool,
}

impl FsOperation for GetMetadata {
    type Params = GetMetadataParams;
    type Output = Metadata;
    const METHOD: &'static str = exec_server_core::proto::fs::GET_METADATA;

    fn from_params(params: GetMetadataParams, _limits: &FsConfig) -> Result<Self, RpcError> {
        Ok(Self {
            path: host_path(&params.path)?,
            follow_symlinks: params.follow_symlinks.unwrap_or(true),
        })
    }

    fn targets(&self) -> Vec<Target> {
        vec![Target {
            path: self.path.clone(),
            follow_last: self.follow_symlinks,
            need: Need::Read,
        }]
    }

    fn run(self, _deadline: Deadline) -> Result<Metadata, RpcError> {
        metadata(&self.path, self.follow_symlinks).or_rpc()
    }

    /// Answered here when the kernel has the answer cached on a judged local mount (see
    /// `cached_lookup`): no hand-off to a worker thread. Otherwise as every operation; the
    /// worker also judges the path's mount if that is what kept it from being answered.
    async fn run_in_server(
        self,
        pool: &BlockingPool,
        session: &Session,
        spelled: SpelledPaths,
    ) -> Result<Metadata, RpcError> {
        let mut unjudged = None;
        if spelled.is_empty() {
            match cached_lookup::metadata(&self.path, self.follow_symlinks) {
                Lookup::Answer(answer) => return Ok(answer),
                Lookup::Ask(mount) => unjudged = mount,
            }
        }
        pool.run(session, Self::METHOD, move |deadline| {
            if let Some(mount) = unjudged {
                cached_lookup::judge_mount(mount);
            }
            spelled.check()?;
            self.run(deadline)
        })
        .await
    }

    fn run_confined(self, policy: &SandboxPolicy) -> Result<Metadata, RpcError> {
        crate::confined::get_metadata(policy, &self.path, self.follow_symlinks)
    }

    fn helper_params(&self) -> serde_json::Value {
        json!({"path": helper_path(&self.path), "followSymlinks": self.follow_symlinks, "sandbox": null})
    }

    fn output_to_wire(output: Metadata) -> Result<Box<RawValue>, RpcError> {
        to_wire(&output)
    }

    fn output_from_wire(&self, response: &RawValue) -> Result<Metadata, RpcError> {
        from_wire(response)
    }
}

/// `fs/canonicalize`.
#[derive(Debug)]
pub(crate) struct Canonicalize {
    pub(crate) path: PathBuf,
}

impl FsOperation for Canonicalize {
    type Params = CanonicalizeParams;
    type Output = PathBuf;
    const METHOD: &'static str = exec_server_core::proto::fs::CANONICALIZE;

    fn from_params(params: CanonicalizeParams, _limits: &FsConfig) -> Result<Self, RpcError> {
        Ok(Self {
            path: host_path(&params.path)?,
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

    fn run(self, _deadline: Deadline) -> Result<PathBuf, RpcError> {
        fs::canonicalize(&self.path).or_rpc()
    }

    fn run_confined(self, policy: &SandboxPolicy) -> Result<PathBuf, RpcError> {
        crate::confined::canonicalize(policy, &self.path)
    }

    fn helper_params(&self) -> serde_json::Value {
        json!({"path": helper_path(&self.path), "sandbox": null})
    }

    /// The helper's answer to the server: a URI that names the path byte for byte (a
    /// canonical one would lose a first name such as `C:` to the foreign-OS check).
    fn output_to_wire(output: PathBuf) -> Result<Box<RawValue>, RpcError> {
        to_wire(&PathResult {
            path: to_file_uri(&output),
        })
    }

    fn output_from_wire(&self, response: &RawValue) -> Result<PathBuf, RpcError> {
        let result: PathResult = from_wire(response)?;
        parse_path(&result.path).map_err(|e| RpcError::fs_helper_message(e.reason()))
    }
}

/// With `follow`, every field but `isSymlink` describes the target (a dangling link is
/// *not found*); without it, everything describes the path itself.
pub(crate) fn metadata(path: &Path, follow: bool) -> io::Result<Metadata> {
    let own = fs::symlink_metadata(path)?;
    let is_symlink = own.file_type().is_symlink();
    let described = if follow && is_symlink {
        fs::metadata(path)?
    } else {
        own
    };
    Ok(describe(is_symlink, &described))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_described_by_target_or_by_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::write(&target, b"12345").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("target", &link).unwrap();

        let followed = metadata(&link, true).unwrap();
        assert!(followed.is_file && followed.is_symlink && !followed.is_directory);
        assert_eq!(followed.size, 5);
        let own = metadata(&link, false).unwrap();
        assert!(!own.is_file && own.is_symlink && !own.is_directory);
        assert_eq!(own.size, "target".len() as u64);

        fs::remove_file(&target).unwrap();
        let dangling = metadata(&link, true).unwrap_err();
        assert_eq!(dangling.kind(), io::ErrorKind::NotFound);
        assert!(metadata(&link, false).unwrap().is_symlink);
    }

    #[test]
    fn cached_answers_match_the_worker_threads_for_files_directories_and_links() {
        let Some(dir) = cached_lookup::tests::answerable_tempdir() else {
            return;
        };
        let file = dir.path().join("file");
        std::fs::write(&file, b"12345").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("file", &link).unwrap();
        for (path, follow) in [
            (dir.path(), true),
            (file.as_path(), true),
            (file.as_path(), false),
            (link.as_path(), false),
        ] {
            // Warm the dentry cache the way any earlier lookup would.
            let _ = std::fs::symlink_metadata(path);
            let cached = cached_lookup::tests::answer(path, follow)
                .unwrap_or_else(|| panic!("{} is not answered", path.display()));
            let by_worker = metadata(path, follow).unwrap();
            assert_eq!(cached, by_worker, "{}", path.display());
        }
    }

    /// The fs helper's answer to `fs/canonicalize` reaches the server as the same path:
    /// a first name `C:` or a non-UTF-8 name after `..` survives the hop (a canonical URI
    /// made the first read as a foreign drive, and the server refused it).
    #[test]
    fn canonical_paths_from_the_helper_read_back_exactly() {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        for bytes in [&b"/C:/x"[..], b"/c|", b"/t/link/../\xff", b"/tmp/a b"] {
            let path = PathBuf::from(std::ffi::OsString::from_vec(bytes.to_vec()));
            let wire = Canonicalize::output_to_wire(path.clone()).unwrap();
            let operation = Canonicalize { path: path.clone() };
            let read = operation.output_from_wire(&wire).unwrap();
            assert_eq!(read.as_os_str().as_bytes(), bytes, "{}", wire.get());
        }
    }
}

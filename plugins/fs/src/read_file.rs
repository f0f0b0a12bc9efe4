//! `fs/readFile` (PROTOCOL §5.5): a whole regular file, up to `fs.max_read_file_bytes`.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use exec_server_core::proto::bytes::base64_json;
use exec_server_core::proto::fs::{ReadFileParams, ReadFileResult, READ_FILE};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use exec_server_sandbox::fs_helper::{Need, Target};
use exec_server_sandbox::policy::SandboxPolicy;
use serde_json::json;
use serde_json::value::RawValue;

use crate::blocking::{Deadline, IoResultExt};
use crate::config::FsConfig;
use crate::nonblocking;
use crate::paths::{helper_path, host_path, native};
use crate::payload::Base64Bytes;
use crate::routing::{execute_params, from_wire, to_wire, FsOperation, FsState};

pub(crate) async fn handle(
    config: Arc<FsState>,
    cx: Call,
    params: ReadFileParams,
) -> Result<ReadFileResult<Box<RawValue>>, RpcError> {
    let data = execute_params::<ReadFile>(&config, cx.session(), params).await?;
    // Encoding a large file takes tens of milliseconds: do it off the reactor threads too,
    // so the answer is only copied, never computed, where other connections are served.
    let encode = move |_| Ok(base64_json(&data));
    let data_base64 = config.pool.run(cx.session(), READ_FILE, encode).await?;
    Ok(ReadFileResult { data_base64 })
}

/// `fs/readFile` with its defaults applied.
#[derive(Debug)]
pub(crate) struct ReadFile {
    pub(crate) path: PathBuf,
    pub(crate) follow_symlinks: bool,
    /// `fs.max_read_file_bytes`.
    pub(crate) limit: u64,
}

impl FsOperation for ReadFile {
    type Params = ReadFileParams;
    type Output = Vec<u8>;
    const METHOD: &'static str = READ_FILE;

    fn from_params(params: ReadFileParams, limits: &FsConfig) -> Result<Self, RpcError> {
        Ok(Self {
            path: host_path(&params.path)?,
            follow_symlinks: params.follow_symlinks.unwrap_or(true),
            limit: limits.max_read_file_bytes,
        })
    }

    fn targets(&self) -> Vec<Target> {
        vec![Target {
            path: self.path.clone(),
            follow_last: self.follow_symlinks,
            need: Need::Read,
        }]
    }

    fn run(self, _deadline: Deadline) -> Result<Vec<u8>, RpcError> {
        read_file(&self.path, self.follow_symlinks, self.limit)
    }

    fn run_confined(self, policy: &SandboxPolicy) -> Result<Vec<u8>, RpcError> {
        crate::confined::read_file(policy, &self.path, self.follow_symlinks, self.limit)
    }

    fn helper_params(&self) -> serde_json::Value {
        json!({"path": helper_path(&self.path), "followSymlinks": self.follow_symlinks, "sandbox": null})
    }

    fn output_to_wire(output: Vec<u8>) -> Result<Box<RawValue>, RpcError> {
        to_wire(&ReadFileResult {
            data_base64: Base64Bytes(output),
        })
    }

    /// The helper reads up to the default limit; the server's own limit applies here.
    fn output_from_wire(&self, response: &RawValue) -> Result<Vec<u8>, RpcError> {
        let result: ReadFileResult = from_wire(response)?;
        let data = exec_server_core::proto::bytes::decode_base64(&result.data_base64)
            .map_err(RpcError::fs_helper_message)?;
        if data.len() as u64 > self.limit {
            return Err(RpcError::file_too_large(self.limit));
        }
        Ok(data)
    }
}

/// Reads the file into one buffer sized from its metadata.
pub(crate) fn read_file(path: &Path, follow: bool, limit: u64) -> Result<Vec<u8>, RpcError> {
    read_to_limit(open_regular(path, follow)?, limit)
}

/// Reads an opened regular file into one buffer sized from its metadata.
pub(crate) fn read_to_limit(file: File, limit: u64) -> Result<Vec<u8>, RpcError> {
    let size = file.metadata().or_rpc()?.len();
    if size > limit {
        return Err(RpcError::file_too_large(limit));
    }
    // The file may grow while it is read: never take more than the limit allows.
    let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut data)
        .or_rpc()?;
    if data.len() as u64 > limit {
        return Err(RpcError::file_too_large(limit));
    }
    Ok(data)
}

/// Opens `path` for reading and checks it is a regular file, without ever waiting on a
/// FIFO; `follow == false` refuses a symbolic link as the last component.
pub(crate) fn open_regular(path: &Path, follow: bool) -> Result<File, RpcError> {
    let file = nonblocking::open(path, OpenOptions::new().read(true), follow).map_err(|e| {
        if !follow && nonblocking::is_symlink_refusal(&e, path) {
            RpcError::is_symlink(&native(path))
        } else {
            RpcError::from_io(&e)
        }
    })?;
    ensure_regular(file, path)
}

/// `file` if it is a regular file, switched to blocking I/O; `path` names it in the error.
pub(crate) fn ensure_regular(file: File, path: &Path) -> Result<File, RpcError> {
    if !file.metadata().or_rpc()?.is_file() {
        return Err(RpcError::not_a_file(&native(path)));
    }
    nonblocking::make_blocking(&file).or_rpc()?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_whole_files_within_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"0123456789").unwrap();
        assert_eq!(read_file(&file, true, 10).unwrap(), b"0123456789");
        assert_eq!(
            read_file(&file, true, 9).unwrap_err(),
            RpcError::file_too_large(9)
        );
    }

    #[test]
    fn directories_and_refused_links_are_named_natively() {
        let dir = tempfile::tempdir().unwrap();
        let error = read_file(dir.path(), true, 10).unwrap_err();
        assert_eq!(error, RpcError::not_a_file(&native(dir.path())));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("f", &link).unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let error = read_file(&link, false, 10).unwrap_err();
        assert_eq!(error, RpcError::is_symlink(&native(&link)));
        assert_eq!(read_file(&link, true, 10).unwrap(), b"x");
    }
}

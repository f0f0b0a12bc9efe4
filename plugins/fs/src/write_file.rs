//! `fs/writeFile` (PROTOCOL §5.6): creates or truncates a file and writes the given bytes.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use exec_server_core::proto::bytes::{decode_base64, Empty};
use exec_server_core::proto::fs::WriteFileParams;
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use exec_server_sandbox::policy::SandboxPolicy;
use serde_json::json;
use serde_json::value::RawValue;

use crate::blocking::IoResultExt;
use crate::nonblocking;
use crate::paths::{helper_path, host_path, native};
use crate::routing::{execute, to_wire, FsOperation, FsState};

pub(crate) async fn handle(
    config: Arc<FsState>,
    _cx: Call,
    params: WriteFileParams,
) -> Result<Empty, RpcError> {
    let path = host_path(&params.path)?;
    // Decoded late (not as -32602) like the reference, but before anything is touched.
    let data = decode_base64(&params.data_base64).map_err(RpcError::write_file_bad_base64)?;
    // The text is not needed while the write runs.
    drop(params.data_base64);
    let operation = WriteFile {
        path,
        data,
        follow_symlinks: params.follow_symlinks.unwrap_or(true),
    };
    execute(
        &config.sandbox,
        operation,
        params.sandbox.as_ref(),
        params.sandbox_policy.as_ref(),
    )
    .await?;
    Ok(Empty {})
}

/// `fs/writeFile` with its data decoded and its defaults applied.
#[derive(Debug)]
pub(crate) struct WriteFile {
    pub(crate) path: PathBuf,
    pub(crate) data: Vec<u8>,
    pub(crate) follow_symlinks: bool,
}

impl FsOperation for WriteFile {
    type Output = ();
    const METHOD: &'static str = exec_server_core::proto::fs::WRITE_FILE;

    fn run(self) -> Result<(), RpcError> {
        write_file(&self.path, &self.data, self.follow_symlinks)
    }

    fn run_confined(self, policy: &SandboxPolicy) -> Result<(), RpcError> {
        crate::confined::write_file(policy, &self.path, &self.data, self.follow_symlinks)
    }

    fn helper_params(&self) -> serde_json::Value {
        json!({
            "path": helper_path(&self.path),
            "dataBase64": exec_server_core::proto::bytes::Base64(&self.data),
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

/// New files get mode 0666 minus the umask; existing ones keep their mode. Opening never
/// waits on a FIFO without a reader (that fails with `ENXIO` instead).
pub(crate) fn write_file(path: &Path, data: &[u8], follow: bool) -> Result<(), RpcError> {
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    let mut file = nonblocking::open(path, &mut options, follow).map_err(|e| {
        if !follow && nonblocking::is_symlink_refusal(&e, path) {
            RpcError::is_symlink(&native(path))
        } else {
            RpcError::from_io(&e)
        }
    })?;
    nonblocking::make_blocking(&file).or_rpc()?;
    file.write_all(data).or_rpc()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn truncates_existing_files_and_keeps_their_mode() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"a long original text").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        write_file(&file, b"new", true).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn follows_dangling_links_unless_told_not_to() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("target", &link).unwrap();
        let error = write_file(&link, b"x", false).unwrap_err();
        assert_eq!(error, RpcError::is_symlink(&native(&link)));
        assert!(!dir.path().join("target").exists());
        write_file(&link, b"x", true).unwrap();
        assert_eq!(std::fs::read(dir.path().join("target")).unwrap(), b"x");
    }
}

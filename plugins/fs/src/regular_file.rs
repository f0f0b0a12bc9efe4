//! Reading regular files whole: opened without ever waiting on a FIFO, checked to be a
//! regular file, read into one buffer sized from the metadata and never past a limit.
//! Shared by `fs/readFile` (in the server and in the fs helper) and read handles.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::Path;

use exec_server_core::proto::RpcError;

use crate::blocking::IoResultExt;
use crate::nonblocking;
use crate::paths::native;

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

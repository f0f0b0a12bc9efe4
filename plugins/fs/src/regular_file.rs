//! Reading regular files whole: opened without ever waiting on a FIFO, checked to be a
//! regular file, read in chunks and never past a limit. Shared by `fs/readFile` (in the
//! server and in the fs helper) and read handles.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::Path;

use exec_server_core::proto::RpcError;

use crate::blocking::IoResultExt;
use crate::nonblocking;
use crate::paths::native;

/// Largest piece [`read_in_chunks`] reads at once: a multiple of three (whole base64
/// groups) that stays in the CPU's cache between the read and the encoding.
const CHUNK_BYTES: usize = 3 * 64 * 1024;
/// Smallest buffer [`read_in_chunks`] reads into.
const MIN_CHUNK_BYTES: usize = 8 * 1024;

/// The size the file's metadata gives, refused above `limit`. Only a hint for what
/// [`read_in_chunks`] will deliver: the file may change while it is read.
pub(crate) fn size_within(file: &File, limit: u64) -> Result<u64, RpcError> {
    let size = file.metadata().or_rpc()?.len();
    if size > limit {
        return Err(RpcError::file_too_large(limit));
    }
    Ok(size)
}

/// Reads an opened regular file to its end, handing each piece to `each` with the bytes
/// read so far, so the file is never held whole; refused as soon as more than `limit`
/// bytes came (the file may grow while it is read) or `each` refuses a piece. `size` is
/// what [`size_within`] said of it.
pub(crate) fn read_in_chunks(
    mut file: File,
    size: u64,
    limit: u64,
    mut each: impl FnMut(&[u8], u64) -> Result<(), RpcError>,
) -> Result<(), RpcError> {
    // One byte more than the file's size reads a small file and sees its end at once; a
    // file whose size says nothing (most of /proc says 0) is read in pages at least.
    let hint = size.saturating_add(1);
    let length = usize::try_from(hint).unwrap_or(CHUNK_BYTES);
    let mut buffer = vec![0u8; length.clamp(MIN_CHUNK_BYTES, CHUNK_BYTES)];
    let mut total: u64 = 0;
    loop {
        let n = match file.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(RpcError::from_io(&e)),
        };
        total += n as u64;
        if total > limit {
            return Err(RpcError::file_too_large(limit));
        }
        each(&buffer[..n], total)?;
    }
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

    fn read_file(path: &Path, follow: bool, limit: u64) -> Result<Vec<u8>, RpcError> {
        let mut data = Vec::new();
        let file = open_regular(path, follow)?;
        let size = size_within(&file, limit)?;
        read_in_chunks(file, size, limit, |piece, _| {
            data.extend_from_slice(piece);
            Ok(())
        })?;
        Ok(data)
    }

    /// A file longer than its metadata said (procfs reports 0) is still held to the limit.
    #[test]
    fn the_limit_holds_whatever_the_metadata_said() {
        let status = Path::new("/proc/self/status");
        assert_eq!(std::fs::metadata(status).unwrap().len(), 0);
        assert!(read_file(status, true, 1 << 20)
            .unwrap()
            .starts_with(b"Name:"));
        assert_eq!(
            read_file(status, true, 10).unwrap_err(),
            RpcError::file_too_large(10)
        );
    }

    #[test]
    fn a_file_larger_than_a_chunk_comes_whole_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        let content: Vec<u8> = (0..CHUNK_BYTES * 2 + 7).map(|i| (i % 253) as u8).collect();
        std::fs::write(&file, &content).unwrap();
        assert_eq!(read_file(&file, true, u64::MAX).unwrap(), content);
        let limit = content.len() as u64 - 1;
        assert_eq!(
            read_file(&file, true, limit).unwrap_err(),
            RpcError::file_too_large(limit)
        );
    }

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

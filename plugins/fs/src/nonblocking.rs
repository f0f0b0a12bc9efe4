//! Opening files without waiting: `open(2)` on a FIFO with no peer blocks forever, so every
//! open carries `O_NONBLOCK`; callers check what they got and then switch the descriptor
//! back to blocking I/O.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens `path` with `options` plus `O_NONBLOCK`; with `follow_last == false` a symbolic
/// link as the last component fails with `ELOOP` (`O_NOFOLLOW`).
pub(crate) fn open(path: &Path, options: &mut OpenOptions, follow_last: bool) -> io::Result<File> {
    let mut flags = libc::O_NONBLOCK;
    if !follow_last {
        flags |= libc::O_NOFOLLOW;
    }
    options.custom_flags(flags).open(path)
}

/// Clears `O_NONBLOCK` so reads and writes on devices wait as usual.
pub(crate) fn make_blocking(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is an open descriptor owned by `file`, which outlives both calls;
    // F_GETFL and F_SETFL take no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// True for the error `O_NOFOLLOW` gives when the last component is a symbolic link.
pub(crate) fn is_symlink_refusal(error: &io::Error, path: &Path) -> bool {
    error.raw_os_error() == Some(libc::ELOOP)
        && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileTypeExt;

    use super::*;

    #[test]
    fn fifo_opens_without_waiting_and_symlinks_are_refused_on_request() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c_path` is a valid NUL-terminated string for the duration of the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let file = open(&fifo, OpenOptions::new().read(true), true).unwrap();
        assert!(file.metadata().unwrap().file_type().is_fifo());
        make_blocking(&file).unwrap();

        let target = dir.path().join("target");
        std::fs::write(&target, b"x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let error = open(&link, OpenOptions::new().read(true), false).unwrap_err();
        assert!(is_symlink_refusal(&error, &link));
        assert!(open(&link, OpenOptions::new().read(true), true).is_ok());
    }
}

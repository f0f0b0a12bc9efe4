//! Pseudo-terminal pairs for `tty: true` processes (PROTOCOL §4.2.6).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use exec_server_core::proto::process::TerminalSize;

use crate::sys;

/// A new pseudo-terminal: the server keeps `master`, the child gets `slave`.
#[derive(Debug)]
pub(crate) struct TerminalPair {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

/// Opens a pseudo-terminal of `size`. Both ends are close-on-exec; neither becomes the
/// server's controlling terminal.
pub(crate) fn open(size: TerminalSize) -> io::Result<TerminalPair> {
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: posix_openpt has no memory preconditions.
    let master = sys::cvt(unsafe { libc::posix_openpt(flags) })?;
    // SAFETY: posix_openpt returned a new descriptor that nobody else owns.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    // SAFETY: grantpt/unlockpt act on the master descriptor only.
    unsafe {
        sys::cvt(libc::grantpt(master.as_raw_fd()))?;
        sys::cvt(libc::unlockpt(master.as_raw_fd()))?;
    }
    let slave = open_peer(&master, flags)?;
    sys::set_window_size(master.as_raw_fd(), size)?;
    Ok(TerminalPair {
        master,
        slave: sys::above_stdio(slave)?,
    })
}

/// Opens the slave side: `TIOCGPTPEER` (no path lookup, immune to /dev/pts tricks), or the
/// `ptsname` path on kernels older than 4.13.
fn open_peer(master: &OwnedFd, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: TIOCGPTPEER takes the open flags as its argument and returns a new descriptor.
    let peer = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    if peer >= 0 {
        // SAFETY: the ioctl returned a new descriptor that nobody else owns.
        return Ok(unsafe { OwnedFd::from_raw_fd(peer) });
    }
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: `name` is writable for its full length, which we pass.
    let rc = unsafe { libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    // SAFETY: ptsname_r wrote a NUL-terminated path into `name`.
    let path = unsafe { CStr::from_ptr(name.as_ptr()) };
    // SAFETY: `path` is a valid C string.
    let fd = sys::cvt(unsafe { libc::open(path.as_ptr(), flags) })?;
    // SAFETY: open returned a new descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_a_pair_of_the_requested_size() {
        let pair = open(TerminalSize { rows: 7, cols: 33 }).unwrap();
        let mut size: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ writes one winsize.
        sys::cvt(unsafe { libc::ioctl(pair.slave.as_raw_fd(), libc::TIOCGWINSZ, &mut size) })
            .unwrap();
        assert_eq!((size.ws_row, size.ws_col), (7, 33));
        assert!(pair.slave.as_raw_fd() > 2);
    }
}

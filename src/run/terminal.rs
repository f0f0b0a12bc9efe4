//! The local terminal: raw mode, window size, and what stdin is. Plain termios calls;
//! nothing here needs more than `libc`.

use std::io;
use std::os::fd::RawFd;

/// True when `fd` is a terminal.
pub(crate) fn is_terminal(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor number; any value is allowed.
    unsafe { libc::isatty(fd) == 1 }
}

/// The window size of the terminal on `fd` as (rows, cols), if it is one and the size
/// is known (a fresh pseudo-terminal may report 0 × 0).
pub(crate) fn window_size(fd: RawFd) -> Option<(u16, u16)> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which points to a
    // live, properly aligned `winsize`.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut size as *mut libc::winsize) };
    (rc == 0 && size.ws_row > 0 && size.ws_col > 0).then_some((size.ws_row, size.ws_col))
}

/// True when stdin is `/dev/null`: there is nothing to forward, so the remote command
/// should see end-of-file at once (the protocol cannot close a pipe later).
pub(crate) fn stdin_is_null() -> bool {
    fn rdev_of(stat: &libc::stat) -> Option<libc::dev_t> {
        (stat.st_mode & libc::S_IFMT == libc::S_IFCHR).then_some(stat.st_rdev)
    }
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct; fstat and stat
    // write at most one `stat` through valid pointers, and the path is NUL-terminated.
    unsafe {
        let mut stdin: libc::stat = std::mem::zeroed();
        let mut null: libc::stat = std::mem::zeroed();
        if libc::fstat(0, &mut stdin) != 0 || libc::stat(c"/dev/null".as_ptr(), &mut null) != 0 {
            return false;
        }
        matches!((rdev_of(&stdin), rdev_of(&null)), (Some(a), Some(b)) if a == b)
    }
}

/// The terminal on `fd` in raw mode until dropped: keys reach the remote terminal as
/// bytes (Ctrl-C included, which the remote line discipline turns into SIGINT), and
/// output is passed through untouched.
pub(crate) struct RawMode {
    fd: RawFd,
    original: libc::termios,
}

impl RawMode {
    pub(crate) fn enable(fd: RawFd) -> io::Result<Self> {
        // SAFETY: an all-zero termios is a valid value of this plain C struct; tcgetattr
        // fills it from the descriptor.
        let mut original: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: the pointer is to a live termios.
        if unsafe { libc::tcgetattr(fd, &mut original) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut raw = original;
        // SAFETY: cfmakeraw only modifies the termios it is given.
        unsafe { libc::cfmakeraw(&mut raw) };
        // SAFETY: the pointer is to a live termios.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd, original })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in `enable` on the same descriptor.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.original) };
    }
}

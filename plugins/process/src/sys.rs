//! Safe wrappers over the Linux system calls the server side of the plugin uses: pipes,
//! non-blocking reads and writes, process-group signals, pidfd waits and terminal sizes.
//! (What runs in the keeper and in the child before `execve` lives in [`crate::keeper`].)

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use exec_server_core::proto::process::TerminalSize;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Maps a `-1` return to the calling thread's `errno`.
pub(crate) fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A close-on-exec pipe, both ends blocking: `(read end, write end)`.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sets `O_NONBLOCK` on the server's end of a pipe or terminal.
pub(crate) fn set_nonblocking(fd: &impl AsRawFd) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL only read and write the descriptor's status flags.
    unsafe {
        let flags = cvt(libc::fcntl(fd, libc::F_GETFL))?;
        cvt(libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK))?;
    }
    Ok(())
}

/// Returns `fd` renumbered to 3 or above (close-on-exec), so that `dup2` onto the child's
/// 0, 1 and 2 can never overwrite a descriptor that is still to be duplicated.
pub(crate) fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC creates a new descriptor; `fd` stays valid until dropped.
    let new = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) })?;
    // SAFETY: fcntl succeeded, so `new` is an open descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// `read(2)` into uninitialised memory; returns the number of bytes read.
pub(crate) fn read(fd: RawFd, buf: &mut [MaybeUninit<u8>]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes; read never writes more.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `write(2)`; returns the number of bytes written.
pub(crate) fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for reads of `buf.len()` bytes.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Sends `signal` to the process group `pgid`. `Ok(false)` when the group no longer exists.
pub(crate) fn signal_group(pgid: libc::pid_t, signal: libc::c_int) -> io::Result<bool> {
    debug_assert!(
        pgid > 0,
        "never signal every process with a non-positive id"
    );
    if pgid <= 0 {
        return Ok(false);
    }
    // SAFETY: kill has no memory effects; a negative id addresses one process group.
    match cvt(unsafe { libc::kill(-pgid, signal) }) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Sends `signal` to the process behind `pidfd`. `Ok(false)` when it has exited.
pub(crate) fn pidfd_signal(pidfd: &impl AsRawFd, signal: libc::c_int) -> io::Result<bool> {
    // SAFETY: pidfd_send_signal with a null siginfo and no flags has no memory effects; a
    // pidfd names one process for good, so pid reuse cannot misdirect the signal.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESRCH) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Blocks until `fd` is readable (a pidfd: the process exited).
pub(crate) fn wait_readable(fd: &impl AsRawFd) -> io::Result<()> {
    loop {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, -1) } >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Collects the exit status behind a pidfd without blocking: `Ok(None)` while the process
/// runs, `Ok(Some(code))` once it has been reaped, with `code` per PROTOCOL §4.11.
pub(crate) fn try_wait(pidfd: &OwnedFd) -> io::Result<Option<i32>> {
    wait_pidfd(pidfd, libc::WNOHANG)
}

/// Waits for the process behind a pidfd to exit and reaps it.
pub(crate) fn wait_blocking(pidfd: &OwnedFd) -> io::Result<i32> {
    loop {
        match wait_pidfd(pidfd, 0) {
            Ok(Some(code)) => return Ok(code),
            Ok(None) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

fn wait_pidfd(pidfd: &OwnedFd, flags: libc::c_int) -> io::Result<Option<i32>> {
    let mut info = MaybeUninit::<libc::siginfo_t>::zeroed();
    // SAFETY: `info` is a valid siginfo_t buffer; P_PIDFD takes the descriptor as the id.
    cvt(unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            info.as_mut_ptr(),
            libc::WEXITED | flags,
        )
    })?;
    // SAFETY: waitid succeeded and zero-initialised memory is a valid siginfo_t.
    let info = unsafe { info.assume_init() };
    // SAFETY: after a successful waitid the pid/status union members are the valid ones.
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    Ok(Some(match info.si_code {
        libc::CLD_EXITED => status,
        libc::CLD_KILLED | libc::CLD_DUMPED => 128 + status,
        _ => -1,
    }))
}

/// Registers an owned descriptor with the tokio reactor. On failure the descriptor is
/// handed back with the error.
pub(crate) fn register(
    fd: OwnedFd,
    interest: Interest,
) -> Result<AsyncFd<OwnedFd>, (OwnedFd, io::Error)> {
    // SAFETY: an `OwnedFd` is open, owned by the `AsyncFd` from now on, and always returns
    // the same descriptor, which is what registration requires.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts())
}

/// Sets a terminal's size; the kernel sends SIGWINCH to its foreground process group.
pub(crate) fn set_window_size(fd: RawFd, size: TerminalSize) -> io::Result<()> {
    let winsize = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer we pass.
    cvt(unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &winsize) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn above_stdio_never_returns_a_stdio_number() {
        let (r, w) = pipe().unwrap();
        assert!(above_stdio(r).unwrap().as_raw_fd() > 2);
        assert!(above_stdio(w).unwrap().as_raw_fd() > 2);
    }

    #[test]
    fn nonblocking_read_of_an_empty_pipe_would_block() {
        let (r, w) = pipe().unwrap();
        set_nonblocking(&r).unwrap();
        let mut buf = [MaybeUninit::uninit(); 8];
        let err = read(r.as_raw_fd(), &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(write(w.as_raw_fd(), b"hi").unwrap(), 2);
        assert_eq!(read(r.as_raw_fd(), &mut buf).unwrap(), 2);
        drop(w);
        assert_eq!(read(r.as_raw_fd(), &mut buf).unwrap(), 0);
    }
}

//! The PID namespace of a sandboxed process (SANDBOX.md §5.8, §8.3): the launcher **L**,
//! having entered the new namespaces, forks the namespace's init **I** (pid 1 there). I
//! mounts a fresh `/proc`, confines itself, reports, and forks the target **T**; then it
//! reaps every orphan of the namespace, sends T's wait status to L, and exits once nothing
//! is left, which the kernel turns into the end of every process of the namespace.
//!
//! L waits for that status and exits with it (128 + n for a signal), so the server sees the
//! target's exit as the launcher's; I lives on, re-parented to the process keeper, while
//! background descendants run. Both keep every signal blocked: a signal to the process
//! group reaches the target, and the keeper's SIGKILL of I ends the whole namespace.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use exec_server_proto::RpcError;

use super::{
    exec_error, reset_signal_dispositions, unblock_all_signals, write_line, Confinement, ExecArgs,
    Failure, LaunchLine, ProcView, EXIT_EXEC_FAILED, EXIT_SETUP_FAILED,
};
use crate::narrow;

/// Forks the init; L then waits for the target's status and exits with it, I becomes the
/// init. Never returns.
pub(super) fn run(
    control: &OwnedFd,
    confinement: &Confinement<'_>,
    exec: &ExecArgs,
    program: &Path,
) -> ! {
    let (status_read, status_write) = match pipe() {
        Ok(pipe) => pipe,
        Err(e) => fail_setup(control, RpcError::spawn_os_error(&e)),
    };
    // SAFETY: the launcher is single-threaded, so the child may do anything the parent
    // could; both sides only use what they own.
    match unsafe { libc::fork() } {
        -1 => fail_setup(
            control,
            RpcError::spawn_os_error(&io::Error::last_os_error()),
        ),
        0 => {
            drop(status_read);
            init(control, confinement, exec, program, status_write)
        }
        init_pid => {
            drop(status_write);
            supervise(control, status_read, init_pid)
        }
    }
}

/// Reports a set-up failure before the target exists and exits 125.
fn fail_setup(control: &OwnedFd, error: RpcError) -> ! {
    let _ = write_line(control, &LaunchLine::Error(error.into()));
    std::process::exit(EXIT_SETUP_FAILED)
}

/// L: lets go of the control socket and of the target's streams (or the server would wait
/// for them), then exits with the target's status as the init reports it.
fn supervise(control: &OwnedFd, status: OwnedFd, init_pid: libc::pid_t) -> ! {
    close_raw(control.as_raw_fd());
    for fd in 0..3 {
        close_raw(fd);
    }
    let mut bytes = [0u8; 4];
    let code = match read_full(&status, &mut bytes) {
        Ok(true) => exit_code(i32::from_ne_bytes(bytes)),
        // The init died without a report: its own status is the answer.
        _ => {
            let mut wait_status = 0;
            // SAFETY: waits for our own child, writing one int.
            let reaped = unsafe { libc::waitpid(init_pid, &mut wait_status, 0) };
            if reaped == init_pid {
                exit_code(wait_status)
            } else {
                EXIT_SETUP_FAILED
            }
        }
    };
    std::process::exit(code)
}

/// I: pid 1 of the new namespace.
fn init(
    control: &OwnedFd,
    confinement: &Confinement<'_>,
    exec: &ExecArgs,
    program: &Path,
    status: OwnedFd,
) -> ! {
    let proc = match narrow::mount_fresh_proc() {
        Ok(()) => ProcView::Private,
        // Landlock's ptrace scope still keeps other processes' secrets unreadable.
        Err(_) => ProcView::Shared,
    };
    let report = match confinement.apply(proc) {
        Ok(report) => report,
        Err(Failure::Setup(error) | Failure::Exec(error)) => fail_setup(control, error),
        Err(Failure::Silent) => std::process::exit(EXIT_SETUP_FAILED),
    };
    if write_line(control, &LaunchLine::Ok(report)).is_err() {
        std::process::exit(EXIT_SETUP_FAILED);
    }
    let target = match start_target(exec) {
        Ok(pid) => pid,
        Err(error) => {
            let error = exec_error(&error, program, Some(confinement.policy));
            let _ = write_line(control, &LaunchLine::Error(error.into()));
            std::process::exit(EXIT_EXEC_FAILED)
        }
    };
    // The target runs: the control socket's end-of-file tells the server so, and the
    // target's streams must close when the target's holders do, not when the init exits.
    close_raw(control.as_raw_fd());
    for fd in 0..3 {
        close_raw(fd);
    }
    let mut status = Some(status);
    loop {
        let mut wait_status = 0;
        // SAFETY: waits for any child, writing one int.
        let pid = unsafe { libc::waitpid(-1, &mut wait_status, 0) };
        if pid == target {
            if let Some(status) = status.take() {
                let _ = write_full(&status, &wait_status.to_ne_bytes());
            }
        } else if pid < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                // ECHILD: nothing is left in the namespace.
                std::process::exit(0);
            }
        }
    }
}

/// Forks the target with a close-on-exec error pipe: end-of-file means `execve` succeeded;
/// four bytes are the `errno` of the failed `execve`.
fn start_target(exec: &ExecArgs) -> io::Result<libc::pid_t> {
    let (error_read, error_write) = pipe()?;
    // SAFETY: the init is single-threaded (see `run`).
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            drop(error_read);
            reset_signal_dispositions();
            unblock_all_signals();
            let error = exec.exec();
            let errno = error.raw_os_error().unwrap_or(libc::EINVAL);
            let _ = write_full(&error_write, &errno.to_ne_bytes());
            // SAFETY: ends this child without running the parent's exit handlers.
            unsafe { libc::_exit(EXIT_EXEC_FAILED) }
        }
        pid => {
            drop(error_write);
            let mut bytes = [0u8; 4];
            match read_full(&error_read, &mut bytes) {
                Ok(false) => Ok(pid),
                Ok(true) => {
                    // SAFETY: reaps our own child, which exits right after its report.
                    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
                    Err(io::Error::from_raw_os_error(i32::from_ne_bytes(bytes)))
                }
                Err(e) => Err(e),
            }
        }
    }
}

/// An exit code from a wait status: the status, or 128 + the signal (PROTOCOL §4.11).
fn exit_code(wait_status: i32) -> i32 {
    if libc::WIFEXITED(wait_status) {
        libc::WEXITSTATUS(wait_status)
    } else if libc::WIFSIGNALED(wait_status) {
        128 + libc::WTERMSIG(wait_status)
    } else {
        EXIT_SETUP_FAILED
    }
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds: [RawFd; 2] = [-1; 2];
    // SAFETY: `fds` has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Closes a descriptor an `OwnedFd` may still name; only for paths that never return, so
/// that handle is never used or dropped again.
fn close_raw(fd: RawFd) {
    // SAFETY: see above; closing has no other effect.
    unsafe { libc::close(fd) };
}

/// Fills `buf`: `Ok(true)` when full, `Ok(false)` at end-of-file before any byte.
fn read_full(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: reads into a live buffer of the stated length.
        let n = unsafe { libc::read(fd.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len()) };
        match n {
            0 if filled == 0 => return Ok(false),
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n if n > 0 => filled += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(true)
}

fn write_full(fd: &OwnedFd, bytes: &[u8]) -> io::Result<()> {
    let mut written = 0;
    while written < bytes.len() {
        let rest = &bytes[written..];
        // SAFETY: writes from a live buffer of the stated length.
        let n = unsafe { libc::write(fd.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
            continue;
        }
        written += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_protocol() {
        assert_eq!(exit_code(0), 0);
        assert_eq!(exit_code(127 << 8), 127);
        assert_eq!(exit_code(libc::SIGKILL), 137);
        assert_eq!(exit_code(libc::SIGSYS), 159);
    }
}

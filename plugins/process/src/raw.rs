//! Raw Linux system calls for code that runs in the server's memory without being one of its
//! threads: the process keeper and the target child between `clone` and `execve`
//! (see [`crate::keeper`]).
//!
//! Such code shares the spawner thread's thread-local storage, so it must not call libc
//! wrappers: they store `errno` there (the spawner thread may be using it at that very
//! moment) and some take locks. These functions enter the kernel directly with inline
//! assembly and return the kernel's answer unchanged: a non-negative result, or `-errno`.
//! Nothing here allocates, locks, panics or touches thread-local storage.

use std::ffi::CStr;

/// Signals are numbered 1..=64 on Linux.
pub(crate) const LAST_SIGNAL: i32 = 64;
/// `sizeof(sigset_t)` as the kernel sees it (64 signals).
pub(crate) const KERNEL_SIGSET_BYTES: usize = 8;
/// The kernel's `sigset_t`: one bit per signal, bit `n - 1` for signal `n`.
pub(crate) type KernelSigset = u64;

/// The kernel's signal set containing exactly `signals`.
pub(crate) const fn sigset(signals: &[i32]) -> KernelSigset {
    let mut set = 0u64;
    let mut i = 0;
    while i < signals.len() {
        set |= 1u64 << (signals[i] - 1);
        i += 1;
    }
    set
}

#[cfg(target_arch = "x86_64")]
mod arch {
    use std::arch::asm;

    /// # Safety
    ///
    /// The caller upholds the contract of system call `n` for these arguments.
    #[inline(always)]
    pub(crate) unsafe fn syscall6(n: i64, a: [usize; 6]) -> isize {
        let ret: isize;
        // SAFETY: `syscall` clobbers only rax (the result), rcx and r11; the caller
        // vouches for the arguments.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") n as isize => ret,
                in("rdi") a[0],
                in("rsi") a[1],
                in("rdx") a[2],
                in("r10") a[3],
                in("r8") a[4],
                in("r9") a[5],
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret
    }

    /// `clone(flags, stack_top)`; the child runs `entry(arg)` on `stack_top` and exits with
    /// its return value. Returns the child's pid (or `-errno`) in the parent.
    ///
    /// # Safety
    ///
    /// `stack_top` is the 16-byte aligned top of memory nobody else uses while the child
    /// runs; `entry` and `arg` are valid for the child. Without `CLONE_VFORK` the caller's
    /// frame may be gone before the child is done, so everything the child uses must live
    /// elsewhere.
    #[inline(always)]
    pub(crate) unsafe fn clone_on_stack(
        flags: usize,
        stack_top: *mut u8,
        entry: extern "C" fn(*mut libc::c_void) -> libc::c_int,
        arg: *mut libc::c_void,
    ) -> isize {
        let ret: isize;
        // SAFETY: in the parent the sequence is a plain `syscall`. The child starts with the
        // parent's registers except rax (0) and rsp (`stack_top`): it clears the frame
        // pointer, calls `entry(arg)` from the callee-saved r12/r13, and exits with
        // the result without ever returning into the parent's frames.
        unsafe {
            asm!(
                "syscall",
                "test rax, rax",
                "jnz 2f",
                "xor ebp, ebp",
                "mov rdi, r13",
                "call r12",
                "mov edi, eax",
                "mov eax, {exit}",
                "syscall",
                "ud2",
                "2:",
                exit = const libc::SYS_exit,
                inlateout("rax") libc::SYS_clone as isize => ret,
                in("rdi") flags,
                in("rsi") stack_top,
                in("rdx") 0usize,
                in("r10") 0usize,
                in("r8") 0usize,
                in("r12") entry,
                in("r13") arg,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret
    }
}

#[cfg(target_arch = "aarch64")]
mod arch {
    use std::arch::asm;

    /// # Safety
    ///
    /// The caller upholds the contract of system call `n` for these arguments.
    #[inline(always)]
    pub(crate) unsafe fn syscall6(n: i64, a: [usize; 6]) -> isize {
        let ret: isize;
        // SAFETY: `svc 0` clobbers only x0 (the result); the caller vouches for the
        // arguments.
        unsafe {
            asm!(
                "svc 0",
                in("x8") n,
                inlateout("x0") a[0] => ret,
                in("x1") a[1],
                in("x2") a[2],
                in("x3") a[3],
                in("x4") a[4],
                in("x5") a[5],
                options(nostack),
            );
        }
        ret
    }

    /// See the x86_64 version.
    ///
    /// # Safety
    ///
    /// As for x86_64.
    #[inline(always)]
    pub(crate) unsafe fn clone_on_stack(
        flags: usize,
        stack_top: *mut u8,
        entry: extern "C" fn(*mut libc::c_void) -> libc::c_int,
        arg: *mut libc::c_void,
    ) -> isize {
        let ret: isize;
        // SAFETY: in the parent the sequence is a plain `svc 0`. The child starts with the
        // parent's registers except x0 (0) and sp (`stack_top`): it clears the frame
        // pointer, calls `entry(arg)` from the callee-saved x20/x21 and exits with the
        // result without ever returning into the parent's frames.
        unsafe {
            asm!(
                "svc 0",
                "cbnz x0, 2f",
                "mov x29, xzr",
                "mov x0, x21",
                "blr x20",
                "mov x8, #{exit}",
                "svc 0",
                "brk #0",
                "2:",
                exit = const libc::SYS_exit,
                in("x8") libc::SYS_clone,
                inlateout("x0") flags => ret,
                in("x1") stack_top,
                in("x2") 0usize,
                in("x3") 0usize,
                in("x4") 0usize,
                in("x20") entry,
                in("x21") arg,
                lateout("x30") _,
                options(nostack),
            );
        }
        ret
    }
}

pub(crate) use arch::clone_on_stack;

/// # Safety
///
/// As for [`arch::syscall6`].
#[inline(always)]
unsafe fn syscall(n: libc::c_long, a: [usize; 6]) -> isize {
    // SAFETY: forwarded contract.
    unsafe { arch::syscall6(n, a) }
}

/// Integer argument of a system call (sign-extended, as the C ABI passes an `int`).
#[inline(always)]
fn int(value: i32) -> usize {
    value as isize as usize
}

/// `-errno` of a failed call as a positive errno, `0` when the call succeeded.
pub(crate) fn errno_of(ret: isize) -> i32 {
    if ret < 0 {
        i32::try_from(ret.unsigned_abs()).unwrap_or(libc::EINVAL)
    } else {
        0
    }
}

pub(crate) fn getpid() -> i32 {
    // SAFETY: no arguments, no memory effects.
    unsafe { syscall(libc::SYS_getpid, [0; 6]) as i32 }
}

pub(crate) fn getppid() -> i32 {
    // SAFETY: no arguments, no memory effects.
    unsafe { syscall(libc::SYS_getppid, [0; 6]) as i32 }
}

pub(crate) fn setsid() -> isize {
    // SAFETY: no arguments, no memory effects.
    unsafe { syscall(libc::SYS_setsid, [0; 6]) }
}

/// `prctl` with integer arguments only.
pub(crate) fn prctl(option: i32, arg2: usize) -> isize {
    // SAFETY: the options this crate passes take integers, not pointers.
    unsafe { syscall(libc::SYS_prctl, [int(option), arg2, 0, 0, 0, 0]) }
}

/// `prlimit64(0, RLIMIT_NOFILE, limit, NULL)`: sets the calling process's descriptor limit.
pub(crate) fn set_open_file_limit(limit: &libc::rlimit) -> isize {
    // SAFETY: `limit` is a valid rlimit that outlives the call; the old value is not asked.
    unsafe {
        syscall(
            libc::SYS_prlimit64,
            [
                0,
                libc::RLIMIT_NOFILE as usize,
                std::ptr::from_ref(limit) as usize,
                0,
                0,
                0,
            ],
        )
    }
}

/// `ioctl` whose third argument is an integer (`TIOCSCTTY`).
pub(crate) fn ioctl_int(fd: i32, request: libc::c_ulong, arg: usize) -> isize {
    // SAFETY: the requests this crate passes take an integer argument.
    unsafe { syscall(libc::SYS_ioctl, [int(fd), request as usize, arg, 0, 0, 0]) }
}

/// `dup3(old, new, flags)`; `old` must differ from `new`.
pub(crate) fn dup3(old: i32, new: i32, flags: i32) -> isize {
    // SAFETY: descriptor operation without memory effects.
    unsafe { syscall(libc::SYS_dup3, [int(old), int(new), int(flags), 0, 0, 0]) }
}

/// `fcntl` with an integer argument.
pub(crate) fn fcntl_int(fd: i32, cmd: i32, arg: i32) -> isize {
    // SAFETY: the commands this crate passes take an integer argument.
    unsafe { syscall(libc::SYS_fcntl, [int(fd), int(cmd), int(arg), 0, 0, 0]) }
}

pub(crate) fn close(fd: i32) -> isize {
    // SAFETY: descriptor operation without memory effects.
    unsafe { syscall(libc::SYS_close, [int(fd), 0, 0, 0, 0, 0]) }
}

/// `close_range(first, last, flags)` (Linux 5.9+; `-ENOSYS` before).
pub(crate) fn close_range(first: u32, last: u32, flags: u32) -> isize {
    // SAFETY: descriptor operation without memory effects.
    unsafe {
        syscall(
            libc::SYS_close_range,
            [first as usize, last as usize, flags as usize, 0, 0, 0],
        )
    }
}

/// `chdir` of a NUL-terminated path.
///
/// # Safety
///
/// `path` points to a NUL-terminated string.
pub(crate) unsafe fn chdir(path: *const libc::c_char) -> isize {
    // SAFETY: the kernel reads the string the caller vouches for.
    unsafe { syscall(libc::SYS_chdir, [path as usize, 0, 0, 0, 0, 0]) }
}

/// `openat(AT_FDCWD, path, flags)`.
pub(crate) fn open(path: &CStr, flags: i32) -> isize {
    openat(libc::AT_FDCWD, path, flags)
}

/// `openat(dir, path, flags)`.
pub(crate) fn openat(dir: i32, path: &CStr, flags: i32) -> isize {
    // SAFETY: the kernel reads the NUL-terminated string.
    unsafe {
        syscall(
            libc::SYS_openat,
            [int(dir), path.as_ptr() as usize, int(flags), 0, 0, 0],
        )
    }
}

/// `execve`; returns only on failure.
///
/// # Safety
///
/// `path` is a NUL-terminated string; `argv` and `envp` are null-terminated arrays of them.
pub(crate) unsafe fn execve(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> isize {
    // SAFETY: the kernel reads the strings and arrays the caller vouches for.
    unsafe {
        syscall(
            libc::SYS_execve,
            [path as usize, argv as usize, envp as usize, 0, 0, 0],
        )
    }
}

pub(crate) fn read(fd: i32, buf: &mut [u8]) -> isize {
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    unsafe {
        syscall(
            libc::SYS_read,
            [int(fd), buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

pub(crate) fn write(fd: i32, buf: &[u8]) -> isize {
    // SAFETY: the kernel reads at most `buf.len()` bytes from `buf`.
    unsafe {
        syscall(
            libc::SYS_write,
            [int(fd), buf.as_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

/// `getdents64` into `buf`: the number of bytes filled, 0 at the end, or `-errno`.
pub(crate) fn getdents64(fd: i32, buf: &mut [u8]) -> isize {
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    unsafe {
        syscall(
            libc::SYS_getdents64,
            [int(fd), buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

pub(crate) fn kill(pid: i32, signal: i32) -> isize {
    // SAFETY: no memory effects.
    unsafe { syscall(libc::SYS_kill, [int(pid), int(signal), 0, 0, 0, 0]) }
}

/// `wait4(pid, &status, options, NULL)`: the reaped pid (0 with `WNOHANG` when none is
/// ready) and the wait status.
pub(crate) fn wait4(pid: i32, options: i32) -> (isize, i32) {
    let mut status: i32 = 0;
    // SAFETY: the kernel writes one int into `status`; no rusage is requested.
    let ret = unsafe {
        syscall(
            libc::SYS_wait4,
            [
                int(pid),
                std::ptr::addr_of_mut!(status) as usize,
                int(options),
                0,
                0,
                0,
            ],
        )
    };
    (ret, status)
}

/// Sets `signal`'s disposition to `SIG_DFL` without flags (an all-zero kernel `sigaction`),
/// which also works for the signals glibc reserves for itself.
pub(crate) fn reset_disposition(signal: i32) -> isize {
    // The kernel's struct sigaction: handler, flags, restorer, mask (8 bytes).
    let default = [0u64; 4];
    // SAFETY: the kernel reads one kernel `sigaction` from `default`; no old action.
    unsafe {
        syscall(
            libc::SYS_rt_sigaction,
            [
                int(signal),
                default.as_ptr() as usize,
                0,
                KERNEL_SIGSET_BYTES,
                0,
                0,
            ],
        )
    }
}

/// Replaces the calling thread's signal mask.
pub(crate) fn set_signal_mask(mask: KernelSigset) -> isize {
    // SAFETY: the kernel reads one kernel sigset; no old mask.
    unsafe {
        syscall(
            libc::SYS_rt_sigprocmask,
            [
                int(libc::SIG_SETMASK),
                std::ptr::addr_of!(mask) as usize,
                0,
                KERNEL_SIGSET_BYTES,
                0,
                0,
            ],
        )
    }
}

/// Waits for one signal of `set` (which must be blocked) for at most `timeout_ms`: the
/// signal's number, or `-EAGAIN` on time-out, or `-EINTR`.
pub(crate) fn wait_signal(set: KernelSigset, timeout_ms: u64) -> isize {
    let timeout = libc::timespec {
        tv_sec: (timeout_ms / 1000) as libc::time_t,
        tv_nsec: ((timeout_ms % 1000) * 1_000_000) as libc::c_long,
    };
    // SAFETY: the kernel reads the set and the timeout; no siginfo is requested.
    unsafe {
        syscall(
            libc::SYS_rt_sigtimedwait,
            [
                std::ptr::addr_of!(set) as usize,
                0,
                std::ptr::addr_of!(timeout) as usize,
                KERNEL_SIGSET_BYTES,
                0,
                0,
            ],
        )
    }
}

/// `madvise(addr, len, MADV_DONTNEED)`: gives pages back without unmapping them.
///
/// # Safety
///
/// `[addr, addr + len)` is a private anonymous mapping nobody uses meanwhile.
pub(crate) unsafe fn discard_pages(addr: *mut u8, len: usize) -> isize {
    // SAFETY: forwarded contract.
    unsafe {
        syscall(
            libc::SYS_madvise,
            [addr as usize, len, int(libc::MADV_DONTNEED), 0, 0, 0],
        )
    }
}

/// Ends the calling process (it is a thread group of one) with `status`.
pub(crate) fn exit(status: i32) -> ! {
    loop {
        // SAFETY: exit_group never returns.
        unsafe {
            syscall(libc::SYS_exit_group, [int(status), 0, 0, 0, 0, 0]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_match_the_libc_wrappers() {
        // SAFETY: getpid/getppid have no preconditions.
        unsafe {
            assert_eq!(getpid(), libc::getpid());
            assert_eq!(getppid(), libc::getppid());
        }
        assert_eq!(close(-1), -(libc::EBADF as isize));
        assert_eq!(errno_of(close(-1)), libc::EBADF);
        assert_eq!(errno_of(0), 0);
        assert_eq!(kill(i32::MAX, 0), -(libc::ESRCH as isize));
    }

    #[test]
    fn pipes_read_and_write_through_raw_calls() {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for two descriptors.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        assert_eq!(write(fds[1], b"abc"), 3);
        let mut buf = [0u8; 8];
        assert_eq!(read(fds[0], &mut buf), 3);
        assert_eq!(&buf[..3], b"abc");
        let moved = fcntl_int(fds[0], libc::F_DUPFD_CLOEXEC, 100);
        assert!(moved >= 100);
        assert_eq!(dup3(fds[1], moved as i32 + 1, libc::O_CLOEXEC), moved + 1);
        for fd in [fds[0], fds[1], moved as i32, moved as i32 + 1] {
            assert_eq!(close(fd), 0);
        }
    }

    #[test]
    fn signal_sets_and_timed_waits() {
        assert_eq!(sigset(&[1]), 1);
        assert_eq!(sigset(&[libc::SIGCHLD, 64]), (1 << 16) | (1 << 63));
        // A signal nobody sends, blocked on this thread: the wait times out.
        let set = sigset(&[libc::SIGUSR2]);
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        let mut block: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: sigset_t buffers owned here; only this thread's mask changes.
        unsafe {
            libc::sigemptyset(&mut block);
            libc::sigaddset(&mut block, libc::SIGUSR2);
            libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        }
        assert_eq!(wait_signal(set, 1), -(libc::EAGAIN as isize));
        // SAFETY: restores this thread's mask.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }

    #[test]
    fn wait4_reports_no_children_without_any() {
        // A fresh thread has children only if the test harness spawned some; ask for a pid
        // that is certainly not ours.
        let (ret, _) = wait4(i32::MAX, libc::WNOHANG);
        assert_eq!(ret, -(libc::ECHILD as isize));
    }
}

//! Creating managed children: `clone(CLONE_VM | CLONE_VFORK)` from one long-lived spawner
//! thread, with no `fork()` and no `pre_exec` hook.
//!
//! Why this shape:
//!
//! * **No fork.** `fork()` copies the page tables of the whole server (about 100 ms for a
//!   large parent) and runs arbitrary code in a copy of a multi-threaded process. Like
//!   glibc's `posix_spawn`, we `clone` with `CLONE_VM | CLONE_VFORK`: the child borrows the
//!   parent's memory and a small private stack, the parent thread is suspended until the
//!   child has called `execve` or exited, and the cost does not grow with the parent's size.
//! * **Child-side set-up without hooks.** `posix_spawn` cannot make a child a session leader
//!   with a controlling terminal, nor set a parent-death signal. So the child function here
//!   does exactly that work and nothing else, using only async-signal-safe system calls on
//!   data prepared by the parent before `clone` (argv/envp arrays, candidate program paths,
//!   the working directory, descriptors): reset every signal disposition to `SIG_DFL` and
//!   clear the mask, `setsid()`, `TIOCSCTTY` on the terminal, `dup2` the stdio descriptors,
//!   `PR_SET_PDEATHSIG(SIGKILL)` (then re-check the parent, which may already have died),
//!   `chdir`, and `execve` over each candidate path. A failure stores `errno` in memory the
//!   parent reads after `clone` returns and exits with 127.
//! * **One spawner thread.** The kernel delivers the parent-death signal when the *thread*
//!   that created the child ends, not the process. Children are therefore created by one
//!   thread that lives as long as the server (it is never joined and its queue is never
//!   closed), so the signal fires exactly when the server dies. Requests reach it over a
//!   channel; each spawn takes microseconds, so serialising them costs nothing measurable.
//! * **pidfds.** `CLONE_PIDFD` returns a descriptor for the child that the caller waits on
//!   with `waitid(P_PIDFD)` (from a tokio `AsyncFd`), so only children the plugin owns are
//!   ever reaped and pid reuse cannot misdirect a wait. This needs Linux 5.4 or later.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{mpsc, OnceLock};

use tokio::sync::oneshot;

use crate::sys;

/// Size of the child's stack: the child function only makes system calls.
const CHILD_STACK_BYTES: usize = 256 * 1024;
/// Signals are numbered 1..=64 on Linux.
const LAST_SIGNAL: libc::c_int = 64;
/// `sizeof(sigset_t)` as the kernel sees it (64 signals).
const KERNEL_SIGSET_BYTES: libc::size_t = 8;
/// Exit status of a child whose set-up or `execve` failed (as a shell's "not found").
const SPAWN_FAILED_STATUS: libc::c_int = 127;

/// Everything the child needs, prepared by the parent; the child only reads it.
#[derive(Debug)]
pub(crate) struct Command {
    /// Paths to try with `execve`, in order (PROTOCOL §4.2.4 program lookup).
    pub candidates: Vec<CString>,
    /// `argv`, with `arg0` already substituted.
    pub argv: Vec<CString>,
    /// `NAME=VALUE` entries: exactly the child's environment.
    pub envp: Vec<CString>,
    pub cwd: CString,
    pub stdio: ChildStdio,
}

/// The child's ends of its standard streams. All are close-on-exec and numbered ≥ 3 in the
/// parent; the child duplicates them onto 0, 1 and 2.
#[derive(Debug)]
pub(crate) enum ChildStdio {
    Pipes {
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
    },
    /// The slave side of a pseudo-terminal: stdin, stdout, stderr and controlling terminal.
    Terminal { slave: OwnedFd },
}

/// A created child.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub pid: libc::pid_t,
    pub pidfd: OwnedFd,
}

struct Job {
    command: Command,
    reply: oneshot::Sender<io::Result<Spawned>>,
}

/// Handle to the spawner thread.
pub(crate) struct Spawner {
    jobs: mpsc::Sender<Job>,
}

impl Spawner {
    /// The process-wide spawner, started on first use.
    pub(crate) fn global() -> io::Result<&'static Spawner> {
        static SPAWNER: OnceLock<Result<Spawner, String>> = OnceLock::new();
        SPAWNER
            .get_or_init(|| {
                let (tx, rx) = mpsc::channel();
                std::thread::Builder::new()
                    .name("exec-server-spawner".into())
                    .spawn(move || spawner_main(rx))
                    .map(|_| Spawner { jobs: tx })
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| io::Error::other(e.clone()))
    }

    /// Creates the child described by `command`. If the caller stops waiting, the spawner
    /// kills and reaps the child itself.
    pub(crate) async fn spawn(&self, command: Command) -> io::Result<Spawned> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job { command, reply })
            .map_err(|_| io::Error::other("the spawner thread is gone"))?;
        answer
            .await
            .map_err(|_| io::Error::other("the spawner thread is gone"))?
    }
}

fn spawner_main(jobs: mpsc::Receiver<Job>) {
    let stack = ChildStack::new();
    // SAFETY: getpid has no preconditions.
    let server_pid = unsafe { libc::getpid() };
    while let Ok(Job { command, reply }) = jobs.recv() {
        let result = match &stack {
            Ok(stack) => spawn_child(stack, server_pid, &command),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        };
        // Closes the child's ends of its pipes and terminal in the server.
        drop(command);
        if let Err(Ok(orphan)) = reply.send(result) {
            // Nobody will own this child: end it and reap it here.
            let _ = sys::signal_group(orphan.pid, libc::SIGKILL);
            let _ = sys::wait_blocking(&orphan.pidfd);
        }
    }
}

/// The child's stack: one mapping, reused for every spawn (the parent is suspended while the
/// child runs on it), with a guard page at its low end.
struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

impl ChildStack {
    fn new() -> io::Result<Self> {
        // SAFETY: an anonymous private mapping has no preconditions.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHILD_STACK_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `base` is the start of our own page-aligned mapping.
        sys::cvt(unsafe { libc::mprotect(base, page_size(), libc::PROT_NONE) })?;
        Ok(Self {
            base,
            len: CHILD_STACK_BYTES,
        })
    }

    /// The initial stack pointer: stacks grow down on every Linux architecture we support.
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of the mapping; 16-byte aligned because the mapping is
        // page-aligned and its length a multiple of the page size.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

/// What the child function reads. Raw pointers into `Command` and local arrays that the
/// parent keeps alive across `clone`.
struct ChildArgs {
    candidates: *const *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    /// Descriptors to duplicate onto 0, 1 and 2.
    stdio: [RawFd; 3],
    /// The terminal to make controlling, or -1.
    terminal: RawFd,
    /// The server's pid: the child's parent unless the server already died.
    server_pid: libc::pid_t,
    /// `errno` of the failed step, written by the child before it exits.
    error: AtomicI32,
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

fn spawn_child(
    stack: &ChildStack,
    server_pid: libc::pid_t,
    command: &Command,
) -> io::Result<Spawned> {
    let candidates = null_terminated(&command.candidates);
    let argv = null_terminated(&command.argv);
    let envp = null_terminated(&command.envp);
    let (stdio, terminal) = match &command.stdio {
        ChildStdio::Pipes {
            stdin,
            stdout,
            stderr,
        } => (
            [stdin.as_raw_fd(), stdout.as_raw_fd(), stderr.as_raw_fd()],
            -1,
        ),
        ChildStdio::Terminal { slave } => {
            let fd = slave.as_raw_fd();
            ([fd, fd, fd], fd)
        }
    };
    let args = ChildArgs {
        candidates: candidates.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: command.cwd.as_ptr(),
        stdio,
        terminal,
        server_pid,
        error: AtomicI32::new(0),
    };
    let mut pidfd: libc::c_int = -1;
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD;

    // SAFETY: sigset_t is plain data that sigfillset initialises; pthread_sigmask only
    // changes this thread's mask, which we restore below. Blocking everything (as glibc's
    // posix_spawn does) guarantees no signal handler of the server runs in the child while
    // it shares our memory; the child resets dispositions before unblocking.
    let (pid, clone_errno) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut previous);
        // SAFETY: `child_main` only reads `args` (alive until this function returns, and the
        // parent is suspended until the child execs or exits) and runs on `stack`, a
        // dedicated mapping nobody else uses. CLONE_PIDFD stores the pidfd into `pidfd`.
        let pid = libc::clone(
            child_main,
            stack.top(),
            flags,
            std::ptr::addr_of!(args).cast_mut().cast(),
            std::ptr::addr_of_mut!(pidfd),
        );
        let clone_errno = *libc::__errno_location();
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
        (pid, clone_errno)
    };
    if pid < 0 {
        return Err(io::Error::from_raw_os_error(clone_errno));
    }
    // SAFETY: clone succeeded with CLONE_PIDFD, so `pidfd` is a descriptor we now own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    match args.error.load(Ordering::SeqCst) {
        0 => Ok(Spawned { pid, pidfd }),
        errno => {
            let _ = sys::wait_blocking(&pidfd);
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

/// The child, between `clone` and `execve`. Runs on the spawner's stack in the server's
/// memory: it must only make async-signal-safe system calls, never allocate, lock or panic.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points to the `ChildArgs` of `spawn_child`, alive while we run.
    let args = unsafe { &*arg.cast::<ChildArgs>() };
    // SAFETY: see `child_setup_and_exec`.
    let errno = unsafe { child_setup_and_exec(args) };
    args.error.store(errno, Ordering::SeqCst);
    // SAFETY: _exit ends only this child; it runs no atexit handlers of the shared image.
    unsafe { libc::_exit(SPAWN_FAILED_STATUS) }
}

/// Returns the `errno` of the step that failed; does not return if `execve` succeeds.
///
/// # Safety
///
/// Must only run in a freshly cloned child, and every pointer in `args` must be a valid C
/// string or null-terminated array of them.
unsafe fn child_setup_and_exec(args: &ChildArgs) -> libc::c_int {
    let errno = || {
        // SAFETY: reading the calling thread's errno slot.
        unsafe { *libc::__errno_location() }
    };
    // SAFETY: every call below is an async-signal-safe system call wrapper operating on
    // memory that stays valid (the parent is suspended), as the function contract requires.
    unsafe {
        // Signals: the server ignores SIGPIPE and may handle others, and may itself have
        // inherited ignored signals; the program must start with default dispositions and
        // an empty mask. The raw system call also reaches the signals glibc reserves for
        // itself (32, 33): an all-zero kernel `sigaction` is SIG_DFL without flags.
        let default = [0u64; 8];
        for signal in 1..=LAST_SIGNAL {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    signal,
                    default.as_ptr(),
                    std::ptr::null_mut::<libc::c_void>(),
                    KERNEL_SIGSET_BYTES,
                );
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());

        if libc::setsid() < 0 {
            return errno();
        }
        if args.terminal >= 0 && libc::ioctl(args.terminal, libc::TIOCSCTTY, 0) < 0 {
            return errno();
        }
        for (target, source) in args.stdio.iter().enumerate() {
            if libc::dup2(*source, target as libc::c_int) < 0 {
                return errno();
            }
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0 {
            return errno();
        }
        // The server may have died before the signal was armed; then nobody is left to
        // kill us later.
        if libc::getppid() != args.server_pid {
            return libc::ESRCH;
        }
        if libc::chdir(args.cwd) < 0 {
            return errno();
        }
        // execvp's rules: keep trying on "not here" errors, remember EACCES, stop on others.
        let mut result = libc::ENOENT;
        let mut denied = false;
        let mut candidate = args.candidates;
        while !(*candidate).is_null() {
            libc::execve(*candidate, args.argv, args.envp);
            match errno() {
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                other => return other,
            }
            result = errno();
            candidate = candidate.add(1);
        }
        if denied {
            libc::EACCES
        } else {
            result
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn cstrings(items: &[&str]) -> Vec<CString> {
        items.iter().map(|s| CString::new(*s).unwrap()).collect()
    }

    fn run(argv: &[&str], candidates: &[&str], cwd: &str) -> (io::Result<Spawned>, Vec<u8>) {
        let (stdin, _stdin_w) = sys::pipe().unwrap();
        let (out_r, out_w) = sys::pipe().unwrap();
        let (err_r, err_w) = sys::pipe().unwrap();
        drop(err_r);
        let command = Command {
            candidates: cstrings(candidates),
            argv: cstrings(argv),
            envp: cstrings(&["A=1"]),
            cwd: CString::new(cwd).unwrap(),
            stdio: ChildStdio::Pipes {
                stdin: sys::above_stdio(stdin).unwrap(),
                stdout: sys::above_stdio(out_w).unwrap(),
                stderr: sys::above_stdio(err_w).unwrap(),
            },
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let result = rt.block_on(Spawner::global().unwrap().spawn(command));
        let mut out = Vec::new();
        std::fs::File::from(out_r).read_to_end(&mut out).unwrap();
        (result, out)
    }

    #[test]
    fn runs_the_first_candidate_that_exists_in_its_own_session() {
        let (spawned, out) = run(
            &[
                "sh",
                "-c",
                "echo $A $(pwd); ps -o pid=,pgid=,sid= -p $$ 2>/dev/null || true",
            ],
            &["/nonexistent/sh", "/bin/sh"],
            "/tmp",
        );
        let spawned = spawned.unwrap();
        assert_eq!(sys::wait_blocking(&spawned.pidfd).unwrap(), 0);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("1 /tmp\n"), "{text}");
        if let Some(ids) = text.lines().nth(1) {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            let pid = spawned.pid.to_string();
            assert_eq!(ids, [pid.as_str(); 3]);
        }
    }

    #[test]
    fn reports_the_os_error_of_a_missing_program_or_cwd() {
        let (result, _) = run(&["nope"], &["/nonexistent/nope"], "/");
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::ENOENT));
        let (result, _) = run(&["true"], &["/bin/true"], "/nonexistent-dir");
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::ENOENT));
        let (result, _) = run(&["tmp"], &["/tmp"], "/");
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::EACCES));
    }

    #[test]
    fn signals_start_at_their_defaults() {
        // The test harness (like the server) ignores SIGPIPE; the child must not.
        let (spawned, out) = run(
            &["sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"],
            &["/bin/sh"],
            "/",
        );
        assert_eq!(sys::wait_blocking(&spawned.unwrap().pidfd).unwrap(), 0);
        let text = String::from_utf8(out).unwrap();
        for line in text.lines() {
            assert!(line.ends_with("0000000000000000"), "{text}");
        }
    }
}

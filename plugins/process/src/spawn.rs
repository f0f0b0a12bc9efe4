//! Creating managed children without `fork()` and without `pre_exec` hooks: one long-lived
//! spawner thread creates, per process, a [keeper](crate::keeper) that creates the target.
//!
//! Why this shape:
//!
//! * **No fork.** `fork()` copies the page tables of the whole server (about 100 ms for a
//!   large parent) and runs arbitrary code in a copy of a multi-threaded process. Instead we
//!   `clone` with `CLONE_VM`: the keeper borrows the server's memory and a small private
//!   stack, and creates the target with `CLONE_VM | CLONE_VFORK` like glibc's
//!   `posix_spawn`, so the cost does not grow with the server's size. Re-executing our own
//!   binary per process would cost more than the spawn itself.
//! * **Child-side set-up without hooks.** `posix_spawn` cannot make a child a session leader
//!   with a controlling terminal, nor set a parent-death signal. The target's code does
//!   exactly that work and nothing else, with raw system calls on data prepared here before
//!   `clone` (argv/envp arrays, candidate program paths, the working directory, descriptors).
//! * **Containment.** The keeper is a subreaper that outlives the target while descendants
//!   live, kills the whole tree on request ([`KILL_TREE`]) or when the server dies, and
//!   reports the target's start and exit on a status pipe.
//! * **A few long-lived spawner threads.** The kernel delivers the parent-death signal when
//!   the *thread* that created the child ends, not the process. Keepers are therefore
//!   created by [`SPAWNER_THREADS`] threads that live as long as the server (they are never
//!   joined and their queue is never closed), so the signal fires exactly when the server
//!   dies. A spawner waits until its target has called `execve` (the keeper's first
//!   record), which takes as long as the exec itself; with one thread, concurrent starts
//!   would queue behind each other's execs. Requests reach the threads through one queue
//!   where sessions take turns ([`crate::spawn_queue`]). The threads are shared by every
//!   session, and an `execve` can take as long as someone outside the server chooses (a
//!   process holding a write lease on the program makes every open of it wait up to
//!   `/proc/sys/fs/lease-break-time`, 45 s), so a spawner waits [`EXEC_WAIT_IN_SLOT`] at
//!   most and then hands the rest of the wait to the reactor ([`Launch`]).
//! * **pidfds.** `CLONE_PIDFD` returns a descriptor for the keeper, which the server uses to
//!   signal it and to reap it (`waitid(P_PIDFD)`), so pid reuse cannot misdirect either.
//!   This needs Linux 5.4 or later.

use std::ffi::CString;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use exec_server_core::proto::RpcError;
use tokio::io::Interest;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::keeper::{keeper_main, KeeperArgs, Report, KILL_TREE, RECORD_BYTES};
use crate::spawn_queue::{FairQueue, Owner};
use crate::sys;

/// The target's stack: it only makes system calls before `execve`.
const TARGET_STACK_BYTES: usize = 32 * 1024;
/// The keeper's stack: system calls, plus fixed buffers while it kills its tree.
const KEEPER_STACK_BYTES: usize = 64 * 1024;

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

/// A started target and its keeper.
#[derive(Debug)]
pub(crate) struct Spawned {
    /// The target's pid, which is also its process group id.
    pub pid: libc::pid_t,
    pub keeper: Keeper,
    /// The read end of the keeper's status pipe, after the `started` record: the next
    /// record is the target's exit; end-of-file means the keeper died without reporting.
    pub status: OwnedFd,
}

/// A keeper process: the server's child, to be reaped before its stack may be unmapped.
#[derive(Debug)]
pub(crate) struct Keeper {
    pub pid: libc::pid_t,
    pub pidfd: OwnedFd,
    pub stack: KeeperStack,
}

impl Keeper {
    /// Sends [`KILL_TREE`]: the keeper kills its whole tree, reaps it and exits.
    pub(crate) fn kill_tree(&self) {
        let _ = sys::pidfd_signal(&self.pidfd, KILL_TREE);
    }

    /// Waits for the keeper to exit, reaps it and frees its stack. Blocks.
    fn reap_blocking(self) {
        if let Ok(code) = sys::wait_blocking(&self.pidfd) {
            crate::strays::keeper_reaped(self.pid, crate::strays::left_a_tree(code));
            // SAFETY: the keeper has been reaped; nothing runs on its stack any more.
            unsafe { self.stack.release() };
        }
    }
}

impl Spawned {
    /// Ends a start nobody will own: the keeper kills the tree (the target's group first,
    /// while the target is unreaped and its pid cannot have been reused), then it is reaped.
    /// Blocks.
    fn abandon(self) {
        self.keeper.kill_tree();
        self.keeper.reap_blocking();
    }
}

/// Why the spawner created nothing.
#[derive(Debug)]
pub(crate) enum SpawnError {
    /// A step of the spawn failed.
    Os(io::Error),
}

impl SpawnError {
    /// The answer to the `process/start` (PROTOCOL §4.2.3 row 11).
    pub(crate) fn into_rpc(self) -> RpcError {
        match self {
            SpawnError::Os(error) => RpcError::spawn_os_error(&error),
        }
    }

    #[cfg(test)]
    fn raw_os_error(&self) -> Option<i32> {
        match self {
            SpawnError::Os(error) => error.raw_os_error(),
        }
    }
}

struct Job {
    command: Command,
    reply: oneshot::Sender<Outcome>,
    /// Where a start whose `execve` outlasts [`EXEC_WAIT_IN_SLOT`] is finished.
    runtime: Handle,
}

/// What a spawner thread hands back.
enum Outcome {
    Done(Result<Spawned, SpawnError>),
    /// The target had not called `execve` within [`EXEC_WAIT_IN_SLOT`].
    Execing(Launch),
}

/// How long a spawner thread (one of [`SPAWNER_THREADS`], shared by every session) waits
/// for its target's `execve`. An exec takes milliseconds unless something outside the
/// server holds it (a write lease on the program, a slow file system): the rest of that
/// wait costs no thread ([`Launch::finish_in_task`]).
pub(crate) const EXEC_WAIT_IN_SLOT: Duration = Duration::from_secs(2);

/// What the keeper and the target read until the keeper's first record (the contract of
/// [`KeeperArgs`]): its address stays fixed while it moves from the spawner thread to the
/// reactor.
struct LaunchMemory {
    _args: Box<KeeperArgs>,
    _arrays: [Vec<*const libc::c_char>; 3],
    /// Also the child's ends of its pipes or terminal, closed with it.
    _command: Command,
}

// SAFETY: the raw pointers point into `_command` and `_arrays`, which move with them and
// which nobody writes to; only the keeper and the target read through them.
unsafe impl Send for LaunchMemory {}

/// A keeper whose first record has not been read yet.
struct Launch {
    keeper: Keeper,
    status: OwnedFd,
    /// Dropped only after the first record: a launch dropped before it (the runtime shut
    /// down) leaks this rather than free memory a target may still read.
    memory: ManuallyDrop<LaunchMemory>,
}

/// Spawner threads: starts that may be between `clone` and their target's `execve` at
/// once. Each one mostly sleeps on a status pipe, so a few more than the cores of a small
/// machine cost nothing while they let concurrent starts overlap their execs.
pub(crate) const SPAWNER_THREADS: usize = 4;

/// Handle to the spawner threads.
pub(crate) struct Spawner {
    jobs: Arc<FairQueue<Job>>,
}

impl Spawner {
    /// The process-wide spawner, its threads started on first use. Fails only when not even
    /// one thread could be started.
    pub(crate) fn global() -> io::Result<&'static Spawner> {
        static SPAWNER: OnceLock<Result<Spawner, String>> = OnceLock::new();
        SPAWNER
            .get_or_init(|| {
                crate::strays::become_subreaper();
                let jobs = Arc::new(FairQueue::new());
                let mut started = 0;
                let mut failure = None;
                for _ in 0..SPAWNER_THREADS {
                    let queue = Arc::clone(&jobs);
                    match std::thread::Builder::new()
                        .name("exec-server-spawner".into())
                        .spawn(move || spawner_main(&queue))
                    {
                        Ok(_) => started += 1,
                        Err(e) => failure = Some(e.to_string()),
                    }
                }
                match (started, failure) {
                    (0, Some(e)) => Err(e),
                    _ => Ok(Spawner { jobs }),
                }
            })
            .as_ref()
            .map_err(|e| io::Error::other(e.clone()))
    }

    /// Creates the keeper and target described by `command`, in `owner`'s turn (one key
    /// per session). The descriptors it opens were charged to the session's budget by the
    /// start (see `admission`). If the
    /// caller stops waiting, the spawner kills the tree and reaps the keeper itself.
    pub(crate) async fn spawn(
        &self,
        owner: Owner,
        command: Command,
    ) -> Result<Spawned, SpawnError> {
        let (reply, answer) = oneshot::channel();
        let runtime = Handle::current();
        let job = Job {
            command,
            reply,
            runtime: runtime.clone(),
        };
        self.jobs.push(owner, job);
        let gone = || SpawnError::Os(io::Error::other("the spawner thread is gone"));
        match answer.await.map_err(|_| gone())? {
            Outcome::Done(result) => result,
            Outcome::Execing(launch) => {
                launch.finish_in_task(&runtime).await.map_err(|_| gone())?
            }
        }
    }
}

fn spawner_main(jobs: &FairQueue<Job>) {
    // SAFETY: getpid has no preconditions.
    let server_pid = unsafe { libc::getpid() };
    loop {
        let Job {
            command,
            reply,
            runtime,
        } = jobs.pop();
        // The start was cancelled while it waited: nothing to create.
        if reply.is_closed() {
            continue;
        }
        let outcome = match spawn_child(server_pid, command) {
            Err(e) => Outcome::Done(Err(e)),
            Ok(launch) if launch.reported_within(EXEC_WAIT_IN_SLOT) => {
                Outcome::Done(launch.finish())
            }
            Ok(launch) => Outcome::Execing(launch),
        };
        match reply.send(outcome) {
            Err(Outcome::Done(Ok(orphan))) => orphan.abandon(),
            // Nobody waits: the task ends the start once the target has exec'd.
            Err(Outcome::Execing(launch)) => drop(launch.finish_in_task(&runtime)),
            _ => {}
        }
    }
}

impl Launch {
    /// Whether the keeper's first record (or its end) is there within `wait`.
    fn reported_within(&self, wait: Duration) -> bool {
        let until = std::time::Instant::now() + wait;
        loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            let mut poll = libc::pollfd {
                fd: self.status.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
            // SAFETY: one valid pollfd for the duration of the call.
            match unsafe { libc::poll(&mut poll, 1, ms) } {
                ready if ready > 0 => return true,
                // The server's own signals (SIGCHLD) interrupt it: wait for the rest.
                -1 if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
                    && !left.is_zero() => {}
                _ => return false,
            }
        }
    }

    /// Reads the keeper's first record (blocking) and ends the launch with it.
    fn finish(mut self) -> Result<Spawned, SpawnError> {
        let record = read_record(&self.status);
        // SAFETY: the keeper wrote its first record or is gone: it and the target read
        // nothing of ours any more.
        unsafe { ManuallyDrop::drop(&mut self.memory) };
        let Launch { keeper, status, .. } = self;
        match record {
            Ok(Some(Report::Started(target))) => Ok(Spawned {
                pid: target,
                keeper,
                status,
            }),
            Ok(Some(Report::Failed(errno))) => {
                keeper.reap_blocking();
                Err(SpawnError::Os(io::Error::from_raw_os_error(errno)))
            }
            Ok(_) | Err(_) => {
                keeper.kill_tree();
                keeper.reap_blocking();
                Err(SpawnError::Os(io::Error::other(
                    "the process keeper exited before starting the process",
                )))
            }
        }
    }

    /// Waits for the first record on the reactor, in a task of its own that runs to the end
    /// whether or not anybody still waits: the launch's memory must outlive the exec, and a
    /// start nobody takes is killed and reaped.
    fn finish_in_task(self, runtime: &Handle) -> oneshot::Receiver<Result<Spawned, SpawnError>> {
        let (result_tx, result) = oneshot::channel();
        runtime.spawn(async move {
            let Launch {
                keeper,
                status,
                memory,
            } = self;
            let status = match sys::register(status, Interest::READABLE) {
                Ok(registered) => {
                    // An error leaves the blocking read to wait for the record.
                    let _ = registered.readable().await;
                    registered.into_inner()
                }
                Err((status, _)) => status,
            };
            let launch = Launch {
                keeper,
                status,
                memory,
            };
            // The record is there (the read does not wait); reaping a failed keeper may.
            let Ok(result) = tokio::task::spawn_blocking(move || launch.finish()).await else {
                return;
            };
            if let Err(Ok(orphan)) = result_tx.send(result) {
                let _ = tokio::task::spawn_blocking(move || orphan.abandon()).await;
            }
        });
        result
    }
}

/// One mapping holding both stacks, each with a guard page at its low end:
/// `[guard][target stack][guard][keeper stack]`. It lives until the keeper is reaped.
#[derive(Debug)]
pub(crate) struct KeeperStack {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is plain memory; the handle only carries its address to whoever reaps
// the keeper and then unmaps it.
unsafe impl Send for KeeperStack {}
// SAFETY: the handle itself is never used to access the memory.
unsafe impl Sync for KeeperStack {}

/// Stacks of reaped keepers, ready for the next spawns: mapping a fresh one and faulting
/// its pages in costs more than a spawn's own set-up. Bounded, so a burst of processes does
/// not pin its stacks for good.
static SPARE_STACKS: Mutex<Vec<KeeperStack>> = Mutex::new(Vec::new());
const MAX_SPARE_STACKS: usize = 16;

impl KeeperStack {
    /// A spare stack, or a new one.
    fn take() -> io::Result<Self> {
        let spare = SPARE_STACKS.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match spare {
            Some(stack) => Ok(stack),
            None => Self::new(),
        }
    }

    /// Keeps the stack for a later spawn, or unmaps it when enough are spare.
    ///
    /// # Safety
    ///
    /// The keeper never ran on it or has been reaped.
    pub(crate) unsafe fn release(self) {
        let mut spare = SPARE_STACKS.lock().unwrap_or_else(|e| e.into_inner());
        if spare.len() < MAX_SPARE_STACKS {
            spare.push(self);
        } else {
            drop(spare);
            // SAFETY: forwarded contract.
            unsafe { self.unmap() };
        }
    }

    fn new() -> io::Result<Self> {
        let page = page_size();
        let len = page + TARGET_STACK_BYTES + page + KEEPER_STACK_BYTES;
        // SAFETY: an anonymous private mapping has no preconditions.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self { base, len };
        let guards = [0, page + TARGET_STACK_BYTES];
        for offset in guards {
            // SAFETY: a page-aligned page inside our own mapping.
            let rc = unsafe { libc::mprotect(stack.at(offset).cast(), page, libc::PROT_NONE) };
            if rc != 0 {
                let error = io::Error::last_os_error();
                // SAFETY: nothing runs on the stack yet.
                unsafe { stack.unmap() };
                return Err(error);
            }
        }
        Ok(stack)
    }

    fn at(&self, offset: usize) -> *mut u8 {
        // SAFETY: callers pass offsets within (or one past the end of) the mapping.
        unsafe { self.base.cast::<u8>().add(offset) }
    }

    /// The target's stack: its lowest address and length.
    fn target_stack(&self) -> (*mut u8, usize) {
        (self.at(page_size()), TARGET_STACK_BYTES)
    }

    /// The keeper's initial stack pointer: stacks grow down on every Linux architecture we
    /// support, and the end of a page-aligned mapping is 16-byte aligned.
    fn keeper_top(&self) -> *mut libc::c_void {
        self.at(self.len).cast()
    }

    /// Unmaps both stacks.
    ///
    /// # Safety
    ///
    /// The keeper never ran on them or has been reaped.
    unsafe fn unmap(self) {
        // SAFETY: our own mapping, no longer in use (contract).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

fn spawn_child(server_pid: libc::pid_t, command: Command) -> Result<Launch, SpawnError> {
    let stack = KeeperStack::take().map_err(SpawnError::Os)?;
    let pipe = sys::pipe();
    let (status_read, status_write) = match pipe {
        Ok(pipe) => pipe,
        Err(e) => {
            // SAFETY: no keeper runs on it.
            unsafe { stack.release() };
            return Err(SpawnError::Os(e));
        }
    };
    // These and `command` stay alive and unchanged until the keeper's first record.
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
            false,
        ),
        ChildStdio::Terminal { slave } => {
            let fd = slave.as_raw_fd();
            ([fd, fd, fd], true)
        }
    };
    let args = Box::new(KeeperArgs {
        candidates: candidates.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: command.cwd.as_ptr(),
        stdio,
        terminal,
        status: status_write.as_raw_fd(),
        server_pid,
        target_stack: stack.target_stack(),
        open_file_limit: child_open_file_limit(),
    });
    let mut pidfd: libc::c_int = -1;
    let flags = libc::CLONE_VM | libc::CLONE_PIDFD | libc::SIGCHLD;

    // SAFETY: sigset_t is plain data that sigfillset initialises; pthread_sigmask only
    // changes this thread's mask, which we restore below. Blocking everything (as glibc's
    // posix_spawn does) guarantees that no signal handler of the server ever runs in the
    // keeper, which keeps every signal blocked for good.
    // A sweep for strays must not see the keeper before it is recorded.
    let creating = crate::strays::creating();
    let (pid, clone_errno) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut previous);
        // SAFETY: `keeper_main` reads `args` only until its first record, which we wait for
        // below before anything it points to is dropped, and runs on its own stack in a
        // mapping nobody else uses. CLONE_PIDFD stores the pidfd into `pidfd`.
        let pid = libc::clone(
            keeper_main,
            stack.keeper_top(),
            flags,
            std::ptr::addr_of!(*args).cast_mut().cast(),
            std::ptr::addr_of_mut!(pidfd),
        );
        let clone_errno = *libc::__errno_location();
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
        (pid, clone_errno)
    };
    if pid >= 0 {
        crate::strays::keeper_started(pid);
    }
    drop(creating);
    if pid < 0 {
        // SAFETY: no keeper was created.
        unsafe { stack.release() };
        return Err(SpawnError::Os(io::Error::from_raw_os_error(clone_errno)));
    }
    // Only the keeper holds the write end now: end-of-file means it is gone.
    drop(status_write);
    // SAFETY: clone succeeded with CLONE_PIDFD, so `pidfd` is a descriptor we now own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let keeper = Keeper { pid, pidfd, stack };
    // `args`, the arrays and `command` live in the launch until the keeper's first record;
    // after it the keeper reads nothing of ours.
    Ok(Launch {
        keeper,
        status: status_read,
        memory: ManuallyDrop::new(LaunchMemory {
            _args: args,
            _arrays: [candidates, argv, envp],
            _command: command,
        }),
    })
}

/// Reads one whole record from the (blocking) status pipe: `None` at end-of-file or for a
/// record of an unknown kind.
pub(crate) fn read_record(status: &OwnedFd) -> io::Result<Option<Report>> {
    let mut record = [0u8; RECORD_BYTES];
    let mut filled = 0;
    while filled < RECORD_BYTES {
        let buf = &mut record[filled..];
        // SAFETY: reads into a live buffer of the stated length.
        let n = unsafe { libc::read(status.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match n {
            0 => return Ok(None),
            n if n > 0 => filled += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(Report::decode(record))
}

/// The soft descriptor limit children start with: the one the server itself started with,
/// before `exec_server_core::hygiene` raised it to the hard limit for the listeners.
fn child_open_file_limit() -> Option<libc::rlimit> {
    static LIMIT: OnceLock<Option<libc::rlimit>> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let original = exec_server_core::hygiene::original_open_file_limit()?;
        let mut current = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `current` is a valid, writable rlimit.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut current) } != 0 {
            return None;
        }
        (original < current.rlim_cur).then_some(libc::rlimit {
            rlim_cur: original,
            rlim_max: current.rlim_max,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn cstrings(items: &[&str]) -> Vec<CString> {
        items.iter().map(|s| CString::new(*s).unwrap()).collect()
    }

    fn run(
        argv: &[&str],
        candidates: &[&str],
        cwd: &str,
    ) -> (Result<Spawned, SpawnError>, Vec<u8>) {
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
        let result = rt.block_on(Spawner::global().unwrap().spawn(0, command));
        let mut out = Vec::new();
        std::fs::File::from(out_r).read_to_end(&mut out).unwrap();
        (result, out)
    }

    /// The target's exit code from the status pipe; then the keeper is reaped.
    fn finish(spawned: Spawned) -> i32 {
        let code = loop {
            match read_record(&spawned.status).unwrap() {
                Some(Report::Exited(status)) => break crate::keeper::exit_code(status),
                Some(_) => continue,
                None => break -1,
            }
        };
        spawned.keeper.reap_blocking();
        code
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
        let pid = spawned.pid;
        assert_eq!(finish(spawned), 0);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("1 /tmp\n"), "{text}");
        if let Some(ids) = text.lines().nth(1) {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            let pid = pid.to_string();
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
    fn the_keeper_kills_descendants_that_left_the_group_and_reports_the_kill() {
        let (stdin, _stdin_w) = sys::pipe().unwrap();
        let (out_r, out_w) = sys::pipe().unwrap();
        let (err_r, err_w) = sys::pipe().unwrap();
        drop(err_r);
        let script = "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $!; exec sleep 1000";
        let command = Command {
            candidates: cstrings(&["/bin/sh"]),
            argv: cstrings(&["sh", "-c", script]),
            envp: cstrings(&["PATH=/usr/bin:/bin"]),
            cwd: CString::new("/").unwrap(),
            stdio: ChildStdio::Pipes {
                stdin: sys::above_stdio(stdin).unwrap(),
                stdout: sys::above_stdio(out_w).unwrap(),
                stderr: sys::above_stdio(err_w).unwrap(),
            },
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let spawned = rt
            .block_on(Spawner::global().unwrap().spawn(0, command))
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(std::fs::File::from(out_r)),
            &mut line,
        )
        .unwrap();
        let daemon: i32 = line.trim().parse().unwrap();
        assert!(std::path::Path::new(&format!("/proc/{daemon}")).exists());
        spawned.keeper.kill_tree();
        assert_eq!(finish(spawned), 128 + libc::SIGKILL);
        // The keeper reaped the daemon before it exited: nothing by that pid remains (or a
        // new process reused it, which would not be our sleep).
        let cmdline = std::fs::read(format!("/proc/{daemon}/cmdline")).unwrap_or_default();
        assert!(
            !cmdline.starts_with(b"sleep\x001000"),
            "the daemon survived"
        );
    }

    #[test]
    fn signals_start_at_their_defaults() {
        // The test harness (like the server) ignores SIGPIPE; the child must not.
        let (spawned, out) = run(
            &["sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"],
            &["/bin/sh"],
            "/",
        );
        assert_eq!(finish(spawned.unwrap()), 0);
        let text = String::from_utf8(out).unwrap();
        for line in text.lines() {
            assert!(line.ends_with("0000000000000000"), "{text}");
        }
    }
}

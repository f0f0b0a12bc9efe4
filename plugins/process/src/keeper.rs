//! The process keeper: a tiny process that owns one started process and every descendant of
//! it, and kills all of them on request, or when the server dies.
//!
//! A spawner thread creates the keeper with `clone(CLONE_VM | CLONE_PIDFD | SIGCHLD)`: it
//! runs in the server's memory, on its own stack ([`crate::spawn`]), concurrently with the
//! server, for as long as the tree it keeps lives. It
//!
//! 1. leaves the server's session (a signal to the server's group never reaches it), becomes
//!    a child subreaper (every orphan of the tree is re-parented to it), arms
//!    `PR_SET_PDEATHSIG(KILL_TREE)` and checks that the server is still its parent;
//! 2. closes every descriptor it inherited from the server except the target's stdio and the
//!    status pipe, which it renumbers to 3–6;
//! 3. creates the target **T** with `clone(CLONE_VM | CLONE_VFORK)` on a second stack; T
//!    resets its signals, leads a session of its own, takes its terminal, gets its stdio,
//!    arms `PR_SET_PDEATHSIG(SIGKILL)` against the keeper, changes directory and `execve`s
//!    the first candidate that works, or stores its `errno` in the keeper's frame and exits;
//! 4. reports `started(pid)` or `failed(errno)` on the status pipe, then waits for signals:
//!    `SIGCHLD` reaps (T's wait status is reported as `exited(status)`), and when no child is
//!    left after T the keeper exits; [`KILL_TREE`] kills T's group, then every process
//!    re-parented to the keeper, round after round, until nothing is left.
//!
//! Everything after `clone` runs without its own thread-local storage (it shares the
//! spawner thread's), so it only uses [`crate::raw`], its own stack and memory that nobody
//! writes while it runs; it never allocates, locks or panics. The kernel has no list of a
//! process's children here (`CONFIG_PROC_CHILDREN` may be off), so the tree is found by
//! scanning `/proc/<pid>/stat` for the keeper's pid as parent, with fixed buffers.

use std::ffi::{c_void, CStr};

use crate::raw;

/// The signal that makes a keeper kill its tree and exit: SIGRTMIN+2 as glibc numbers it
/// (the kernel's real-time range starts at 32; glibc reserves 32 and 33 and `SIGRTMIN` is
/// 34). `process/signal` never sends it and nothing else in the server uses it.
pub(crate) const KILL_TREE: i32 = 36;

/// Exit status of a keeper whose kill rounds ran out with processes of its tree still
/// there (a tree forking faster than it is killed): the server ends them ([`crate::strays`]).
pub(crate) const TREE_LEFT_BEHIND: i32 = 3;

/// Exit status of a target whose set-up or `execve` failed (as a shell's "not found").
const SPAWN_FAILED_STATUS: i32 = 127;
/// How long the keeper sleeps between checks that its parent is still the server, should
/// the parent-death signal ever be missed. Only a safety net.
const PARENT_CHECK_MS: u64 = 30_000;
/// How long a round of [`kill_tree`] waits for an orphan that is being re-parented but is
/// not visible in `/proc` yet.
const ORPHAN_WAIT_MS: u64 = 10;
/// Most rounds of [`kill_tree`]; each round kills one more generation of orphans.
const MAX_KILL_ROUNDS: usize = 4096;
/// `__WALL`: wait for every kind of child.
const WALL: i32 = 0x4000_0000;

/// The signals the kernel delivers even when blocked: those of faults.
const FORCED_SIGNALS: [i32; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGTRAP,
    libc::SIGSYS,
];

/// Where the keeper moves what it keeps, in this order: the target's stdin, stdout, stderr,
/// then the status pipe.
const KEPT_FDS: [i32; 4] = [3, 4, 5, 6];
const STATUS_FD: i32 = 6;

// ---- the status pipe ----------------------------------------------------------------------

/// One record on the status pipe: 4 bytes of kind and 4 of value, native endian. Records are
/// far smaller than `PIPE_BUF`, so each arrives whole.
pub(crate) const RECORD_BYTES: usize = 8;

const KIND_STARTED: u32 = 1;
const KIND_FAILED: u32 = 2;
const KIND_EXITED: u32 = 3;

/// What a keeper reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Report {
    /// The target runs with this pid (always the first record on success).
    Started(i32),
    /// The target could not be started: `errno` (the only record; the keeper then exits).
    Failed(i32),
    /// The target was reaped with this wait status.
    Exited(i32),
}

impl Report {
    pub(crate) fn encode(self) -> [u8; RECORD_BYTES] {
        let (kind, value) = match self {
            Report::Started(pid) => (KIND_STARTED, pid),
            Report::Failed(errno) => (KIND_FAILED, errno),
            Report::Exited(status) => (KIND_EXITED, status),
        };
        let mut record = [0u8; RECORD_BYTES];
        let (head, tail) = record.split_at_mut(4);
        head.copy_from_slice(&kind.to_ne_bytes());
        tail.copy_from_slice(&value.to_ne_bytes());
        record
    }

    pub(crate) fn decode(record: [u8; RECORD_BYTES]) -> Option<Report> {
        let [k0, k1, k2, k3, v0, v1, v2, v3] = record;
        let value = i32::from_ne_bytes([v0, v1, v2, v3]);
        match u32::from_ne_bytes([k0, k1, k2, k3]) {
            KIND_STARTED => Some(Report::Started(value)),
            KIND_FAILED => Some(Report::Failed(value)),
            KIND_EXITED => Some(Report::Exited(value)),
            _ => None,
        }
    }
}

/// An exit code per PROTOCOL §4.11 from a wait status: the status, or 128 + the signal.
pub(crate) fn exit_code(wait_status: i32) -> i32 {
    if libc::WIFEXITED(wait_status) {
        libc::WEXITSTATUS(wait_status)
    } else if libc::WIFSIGNALED(wait_status) {
        128 + libc::WTERMSIG(wait_status)
    } else {
        -1
    }
}

// ---- what the keeper and the target read --------------------------------------------------

/// Everything the keeper and the target read, prepared by the spawner thread, which keeps
/// it alive and unchanged until the keeper's first record. Neither writes to it.
#[derive(Debug)]
pub(crate) struct KeeperArgs {
    /// Paths to try with `execve`, null-terminated.
    pub candidates: *const *const libc::c_char,
    pub argv: *const *const libc::c_char,
    pub envp: *const *const libc::c_char,
    pub cwd: *const libc::c_char,
    /// The server's descriptors to become the target's 0, 1 and 2.
    pub stdio: [i32; 3],
    /// Whether the stdio descriptor is a terminal to make controlling.
    pub terminal: bool,
    /// The status pipe's write end in the server's numbering.
    pub status: i32,
    /// The server's pid: the keeper's parent unless the server already died.
    pub server_pid: i32,
    /// The target's stack: lowest address and length (a guard page lies below).
    pub target_stack: (*mut u8, usize),
    /// The descriptor limit the target gets back: the server raised its own soft limit,
    /// and programs that `select(2)` or close every descriptor up to the limit expect the
    /// usual value. `None`: leave the inherited limit.
    pub open_file_limit: Option<libc::rlimit>,
}

/// What the target reads: the keeper's arguments, the keeper's pid, and where its error
/// goes. Lives in the keeper's frame while the target runs (the keeper is suspended).
struct TargetArgs<'a> {
    args: &'a KeeperArgs,
    keeper_pid: i32,
    /// `errno` of the step that failed, written by the target before it exits.
    error: *mut i32,
}

// ---- the keeper ---------------------------------------------------------------------------

/// The keeper's entry point (see the module documentation). Never returns.
///
/// # Safety contract
///
/// `arg` points to a [`KeeperArgs`] that stays valid and unchanged until the keeper's first
/// record, and the keeper runs on a stack of its own with all signals blocked.
pub(crate) extern "C" fn keeper_main(arg: *mut c_void) -> libc::c_int {
    // SAFETY: the spawner passes a live `KeeperArgs` (see the contract above).
    let args = unsafe { &*arg.cast::<KeeperArgs>() };
    // Only copies from here on: `args` may be freed once the first record is written.
    let server_pid = args.server_pid;
    let (target_stack, target_stack_len) = args.target_stack;

    // Every signal stays blocked in the keeper, so the server's handlers (which this copy
    // of its dispositions still names) can only run for a fault the kernel forces through;
    // such a fault must just end the keeper.
    for signal in FORCED_SIGNALS {
        let _ = raw::reset_disposition(signal);
    }
    for step in [
        raw::setsid(),
        raw::prctl(libc::PR_SET_CHILD_SUBREAPER, 1),
        raw::prctl(libc::PR_SET_PDEATHSIG, KILL_TREE as usize),
    ] {
        if step < 0 {
            report(args.status, Report::Failed(raw::errno_of(step)));
            raw::exit(1);
        }
    }
    // The server may have died before the signal was armed; nobody would ever kill us.
    if raw::getppid() != server_pid {
        raw::exit(1);
    }
    if let Err(errno) = keep_only_needed_descriptors(args) {
        report(args.status, Report::Failed(errno));
        raw::exit(1);
    }

    let mut error: i32 = 0;
    let target_args = TargetArgs {
        args,
        keeper_pid: raw::getpid(),
        error: std::ptr::addr_of_mut!(error),
    };
    let top = target_stack.wrapping_add(target_stack_len);
    // SAFETY: the target stack is ours alone; `target_main` reads `target_args`, which lives
    // in this frame, and CLONE_VFORK suspends us until the target execs or exits.
    let target = unsafe {
        raw::clone_on_stack(
            (libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD) as usize,
            top,
            target_main,
            std::ptr::addr_of!(target_args).cast_mut().cast(),
        )
    };
    // The target has its own copies now; ours would keep its streams open forever.
    for fd in &KEPT_FDS[..3] {
        let _ = raw::close(*fd);
    }
    // SAFETY: the target wrote `error` (if at all) before it exited or exec'd, which is
    // before CLONE_VFORK let us continue; volatile because the compiler cannot know that.
    let error = unsafe { std::ptr::read_volatile(std::ptr::addr_of!(error)) };
    if target < 0 {
        report(STATUS_FD, Report::Failed(raw::errno_of(target)));
        raw::exit(1);
    }
    let target = target as i32;
    if error != 0 {
        let _ = raw::wait4(target, WALL);
        report(STATUS_FD, Report::Failed(error));
        raw::exit(0);
    }
    let mut tree = Tree {
        target,
        target_reaped: false,
        me: target_args.keeper_pid,
    };
    if !report(STATUS_FD, Report::Started(target)) {
        tree.kill_and_exit();
    }
    // The target exec'd: its stack is free, and its pages need not stay in the server's RSS.
    // SAFETY: a private anonymous mapping nobody uses any more.
    let _ = unsafe { raw::discard_pages(target_stack, target_stack_len) };

    let watched = raw::sigset(&[libc::SIGCHLD, KILL_TREE]);
    loop {
        let signal = raw::wait_signal(watched, PARENT_CHECK_MS);
        if signal == KILL_TREE as isize
            || (signal == -(libc::EAGAIN as isize) && raw::getppid() != server_pid)
        {
            tree.kill_and_exit();
        }
        match tree.reap_ready() {
            Reaped::SomeLeft => {}
            Reaped::ServerGone => {
                tree.kill_and_exit();
            }
            Reaped::NoneLeft if tree.target_reaped => raw::exit(0),
            Reaped::NoneLeft => {}
        }
    }
}

/// Writes one record; false when the server is gone (`EPIPE`) or the pipe is unusable.
fn report(fd: i32, report: Report) -> bool {
    let record = report.encode();
    loop {
        let n = raw::write(fd, &record);
        if n == -(libc::EINTR as isize) {
            continue;
        }
        return n == RECORD_BYTES as isize;
    }
}

fn reset_signal_dispositions() {
    for signal in 1..=raw::LAST_SIGNAL {
        if signal != libc::SIGKILL && signal != libc::SIGSTOP {
            let _ = raw::reset_disposition(signal);
        }
    }
}

/// Step 2: moves the target's stdio and the status pipe to [`KEPT_FDS`] (close-on-exec, so
/// the target keeps only what it duplicates onto 0–2) and closes everything else.
fn keep_only_needed_descriptors(args: &KeeperArgs) -> Result<(), i32> {
    let [stdin, stdout, stderr] = args.stdio;
    let mut needed = [stdin, stdout, stderr, args.status];
    let last_kept = KEPT_FDS[KEPT_FDS.len() - 1];
    // Duplicating onto 3–6 must not overwrite a descriptor still to be moved: when one of
    // them is numbered there, first copy all of them above every kept number.
    if needed.iter().any(|fd| *fd <= last_kept) {
        let floor = needed.iter().copied().max().unwrap_or(0).max(last_kept) + 1;
        for fd in needed.iter_mut() {
            let moved = raw::fcntl_int(*fd, libc::F_DUPFD_CLOEXEC, floor);
            if moved < 0 {
                return Err(raw::errno_of(moved));
            }
            *fd = moved as i32;
        }
    }
    for (fd, target) in needed.iter().zip(KEPT_FDS) {
        let moved = raw::dup3(*fd, target, libc::O_CLOEXEC);
        if moved < 0 {
            return Err(raw::errno_of(moved));
        }
    }
    close_from(0, 2);
    close_from(last_kept + 1, i32::MAX);
    Ok(())
}

/// Closes every descriptor numbered from `first` to `last`.
fn close_from(first: i32, last: i32) {
    if raw::close_range(first as u32, last as u32, 0) == 0 {
        return;
    }
    // Before Linux 5.9: list the open descriptors, or close a generous range blindly.
    if !close_listed_descriptors(first, last) {
        for fd in first..=last.min(65_535) {
            let _ = raw::close(fd);
        }
    }
}

/// Closes the descriptors from `first` to `last` that `/proc/self/fd` lists; false if it
/// cannot be read.
fn close_listed_descriptors(first: i32, last: i32) -> bool {
    let dir = raw::open(
        c"/proc/self/fd",
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    );
    if dir < 0 {
        return false;
    }
    let dir = dir as i32;
    let mut buf = [0u8; 2048];
    loop {
        let n = raw::getdents64(dir, &mut buf);
        if n <= 0 {
            break;
        }
        let filled = buf.get(..n as usize).unwrap_or(&[]);
        let mut pos = 0;
        while let Some((name, next)) = next_dirent(filled, pos) {
            pos = next;
            if let Some(fd) = parse_number(name) {
                if (first..=last).contains(&fd) && fd != dir {
                    let _ = raw::close(fd);
                }
            }
        }
    }
    let _ = raw::close(dir);
    true
}

/// What a pass of reaping found.
enum Reaped {
    /// Children remain.
    SomeLeft,
    /// No child remains.
    NoneLeft,
    /// The target's exit could not be reported: the server is gone.
    ServerGone,
}

/// The keeper's view of its tree.
struct Tree {
    target: i32,
    target_reaped: bool,
    me: i32,
}

impl Tree {
    /// Reaps one child (`options` as for `wait4`) and reports the target's exit. Returns
    /// `wait4`'s answer.
    fn reap_one(&mut self, options: i32) -> (isize, bool) {
        let (pid, status) = raw::wait4(-1, options | WALL);
        let mut reported = true;
        if pid > 0 && pid as i32 == self.target && !self.target_reaped {
            self.target_reaped = true;
            reported = report(STATUS_FD, Report::Exited(status));
        }
        (pid, reported)
    }

    /// Reaps every child that has exited.
    fn reap_ready(&mut self) -> Reaped {
        loop {
            match self.reap_one(libc::WNOHANG) {
                (_, false) => return Reaped::ServerGone,
                (pid, true) if pid > 0 => continue,
                (0, true) => return Reaped::SomeLeft,
                (pid, true) if pid == -(libc::EINTR as isize) => continue,
                // ECHILD: nothing left to wait for.
                _ => return Reaped::NoneLeft,
            }
        }
    }

    /// Kills the whole tree and reaps it, then exits: 0, or [`TREE_LEFT_BEHIND`] when the
    /// rounds ran out with children still there (the server then ends them).
    fn kill_and_exit(&mut self) -> ! {
        if self.kill() {
            raw::exit(0)
        }
        raw::exit(TREE_LEFT_BEHIND)
    }

    /// Kills the whole tree and reaps it: the target's process group first, then, round
    /// after round, every process re-parented to the keeper, until no child is left.
    /// False when the rounds ran out first.
    fn kill(&mut self) -> bool {
        if !self.target_reaped {
            // The target's pid cannot have been reused: it is our unreaped child.
            let _ = raw::kill(-self.target, libc::SIGKILL);
            let _ = raw::kill(self.target, libc::SIGKILL);
        }
        for _ in 0..MAX_KILL_ROUNDS {
            let killed = kill_children(self.me);
            // Every process we killed is our child and dies: wait for each.
            let mut reaped = 0;
            while reaped < killed {
                match self.reap_one(0) {
                    (pid, _) if pid > 0 => reaped += 1,
                    (pid, _) if pid == -(libc::EINTR as isize) => {}
                    _ => break,
                }
            }
            loop {
                match self.reap_one(libc::WNOHANG) {
                    (pid, _) if pid > 0 => {}
                    (pid, _) if pid == -(libc::EINTR as isize) => {}
                    (0, _) => break,
                    _ => return true,
                }
            }
            if killed == 0 {
                // A child we could not see yet (being re-parented, or /proc unreadable).
                let _ = raw::wait_signal(raw::sigset(&[libc::SIGCHLD]), ORPHAN_WAIT_MS);
            }
        }
        false
    }
}

/// SIGKILLs every process whose parent is `me`; returns how many it signalled.
fn kill_children(me: i32) -> usize {
    let proc_dir = raw::open(
        c"/proc",
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    );
    if proc_dir < 0 {
        return 0;
    }
    let proc_dir = proc_dir as i32;
    let mut killed = 0;
    let mut entries = [0u8; 4096];
    loop {
        let n = raw::getdents64(proc_dir, &mut entries);
        if n <= 0 {
            break;
        }
        let filled = entries.get(..n as usize).unwrap_or(&[]);
        let mut pos = 0;
        while let Some((name, next)) = next_dirent(filled, pos) {
            pos = next;
            let Some(pid) = parse_number(name) else {
                continue;
            };
            if pid != me && parent_of(proc_dir, name) == Some(me) {
                let _ = raw::kill(pid, libc::SIGKILL);
                killed += 1;
            }
        }
    }
    let _ = raw::close(proc_dir);
    killed
}

/// The parent pid of `/proc/<name>`, read from its `stat`.
fn parent_of(proc_dir: i32, name: &[u8]) -> Option<i32> {
    let mut path = [0u8; 32];
    let suffix = b"/stat\0";
    let len = name.len().checked_add(suffix.len())?;
    path.get_mut(..name.len())?.copy_from_slice(name);
    path.get_mut(name.len()..len)?.copy_from_slice(suffix);
    let path = CStr::from_bytes_until_nul(&path).ok()?;
    let fd = raw::openat(proc_dir, path, libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return None;
    }
    let mut stat = [0u8; 256];
    let n = raw::read(fd as i32, &mut stat);
    let _ = raw::close(fd as i32);
    if n <= 0 {
        return None;
    }
    parent_from_stat(stat.get(..n as usize)?)
}

/// The parent pid in the text of `/proc/<pid>/stat`: `pid (comm) state ppid …`. The command
/// name may contain anything, `)` included, but nothing after it can: the parent follows the
/// last `)`.
pub(crate) fn parent_from_stat(stat: &[u8]) -> Option<i32> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    let mut fields = stat
        .get(close.checked_add(1)?..)?
        .split(|b| *b == b' ')
        .filter(|f| !f.is_empty());
    let _state = fields.next()?;
    parse_number(fields.next()?)
}

/// A non-negative decimal number that fits an `i32`; `None` for anything else.
pub(crate) fn parse_number(text: &[u8]) -> Option<i32> {
    if text.is_empty() {
        return None;
    }
    let mut value: i32 = 0;
    for digit in text {
        if !digit.is_ascii_digit() {
            return None;
        }
        value = value
            .checked_mul(10)?
            .checked_add(i32::from(digit - b'0'))?;
    }
    Some(value)
}

/// The name of the `linux_dirent64` at `pos` in `buf` and the position of the next one.
pub(crate) fn next_dirent(buf: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
    const RECLEN_AT: usize = 16;
    const NAME_AT: usize = 19;
    let reclen_bytes = buf.get(pos.checked_add(RECLEN_AT)?..pos.checked_add(RECLEN_AT + 2)?)?;
    let reclen = usize::from(u16::from_ne_bytes([
        *reclen_bytes.first()?,
        *reclen_bytes.get(1)?,
    ]));
    if reclen < NAME_AT {
        return None;
    }
    let record = buf.get(pos..pos.checked_add(reclen)?)?;
    let name = record.get(NAME_AT..)?;
    let end = name.iter().position(|b| *b == 0)?;
    Some((name.get(..end)?, pos + reclen))
}

// ---- the target, between clone and execve -------------------------------------------------

/// The target's entry point: set-up, then `execve`. Returns (to exit with 127) only after
/// storing the failed step's `errno` in the keeper's frame.
extern "C" fn target_main(arg: *mut c_void) -> libc::c_int {
    // SAFETY: the keeper passes its live `TargetArgs` and is suspended while we run.
    let target = unsafe { &*arg.cast::<TargetArgs<'_>>() };
    // SAFETY: the pointers of `KeeperArgs` are valid C strings and arrays (its contract).
    let errno = unsafe { set_up_and_exec(target) };
    // SAFETY: `error` points into the suspended keeper's frame.
    unsafe { std::ptr::write_volatile(target.error, errno.max(1)) };
    SPAWN_FAILED_STATUS
}

/// Returns the `errno` of the step that failed; does not return if `execve` succeeds.
///
/// # Safety
///
/// Runs only in the freshly cloned target; every pointer in the arguments is a valid C
/// string or null-terminated array of them.
unsafe fn set_up_and_exec(target: &TargetArgs<'_>) -> i32 {
    let args = target.args;
    // The server ignores SIGPIPE and may handle others; the program must start with
    // default dispositions and an empty mask.
    reset_signal_dispositions();
    let _ = raw::set_signal_mask(0);
    let fail = |ret: isize| -> Option<i32> { (ret < 0).then(|| raw::errno_of(ret)) };
    if let Some(errno) = fail(raw::setsid()) {
        return errno;
    }
    if args.terminal {
        if let Some(errno) = fail(raw::ioctl_int(KEPT_FDS[0], libc::TIOCSCTTY, 0)) {
            return errno;
        }
    }
    for (target_fd, source) in (0..3).zip(KEPT_FDS) {
        if let Some(errno) = fail(raw::dup3(source, target_fd, 0)) {
            return errno;
        }
    }
    if let Some(limit) = &args.open_file_limit {
        if let Some(errno) = fail(raw::set_open_file_limit(limit)) {
            return errno;
        }
    }
    if let Some(errno) = fail(raw::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as usize)) {
        return errno;
    }
    // The keeper may have been killed before the signal was armed.
    if raw::getppid() != target.keeper_pid {
        return libc::ESRCH;
    }
    // SAFETY: `cwd` is a valid C string (contract).
    if let Some(errno) = fail(unsafe { raw::chdir(args.cwd) }) {
        return errno;
    }
    // execvp's rules: keep trying on "not here" errors, remember EACCES, stop on others.
    let mut result = libc::ENOENT;
    let mut denied = false;
    let mut candidate = args.candidates;
    // SAFETY: `candidates` is a null-terminated array of valid C strings (contract).
    unsafe {
        while !(*candidate).is_null() {
            let errno = raw::errno_of(raw::execve(*candidate, args.argv, args.envp));
            match errno {
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                other => return other,
            }
            result = errno;
            candidate = candidate.add(1);
        }
    }
    if denied {
        libc::EACCES
    } else {
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        for report in [
            Report::Started(4242),
            Report::Failed(libc::ENOENT),
            Report::Exited(9),
            Report::Exited(0x0100),
        ] {
            assert_eq!(Report::decode(report.encode()), Some(report));
        }
        assert_eq!(Report::decode([0; RECORD_BYTES]), None);
    }

    #[test]
    fn exit_codes_follow_the_protocol() {
        assert_eq!(exit_code(0), 0);
        assert_eq!(exit_code(3 << 8), 3);
        assert_eq!(exit_code(libc::SIGKILL), 137);
        assert_eq!(exit_code(libc::SIGSYS | 0x80), 159);
    }

    #[test]
    fn the_parent_follows_the_last_parenthesis() {
        assert_eq!(parent_from_stat(b"42 (sleep) S 7 42 42 0 -1"), Some(7));
        assert_eq!(
            parent_from_stat(b"42 (a) b (c) S 9) Z 1234 1 1 0"),
            Some(1234)
        );
        assert_eq!(parent_from_stat(b"42 ( ) R 0 0"), Some(0));
        assert_eq!(parent_from_stat(b"42 (x) S"), None);
        assert_eq!(parent_from_stat(b"42 (x) S -1"), None);
        assert_eq!(parent_from_stat(b"no parenthesis"), None);
        assert_eq!(parent_from_stat(b""), None);
        let own = std::fs::read(format!("/proc/{}/stat", std::process::id())).unwrap();
        // SAFETY: getppid has no preconditions.
        assert_eq!(parent_from_stat(&own), Some(unsafe { libc::getppid() }));
    }

    #[test]
    fn numbers_are_plain_decimal() {
        assert_eq!(parse_number(b"0"), Some(0));
        assert_eq!(parse_number(b"2147483647"), Some(i32::MAX));
        assert_eq!(parse_number(b"2147483648"), None);
        assert_eq!(parse_number(b""), None);
        assert_eq!(parse_number(b"12a"), None);
        assert_eq!(parse_number(b"self"), None);
    }

    /// A `linux_dirent64` with `name`, padded to 8 bytes like the kernel's.
    fn dirent(name: &[u8]) -> Vec<u8> {
        let reclen = (19 + name.len() + 1).div_ceil(8) * 8;
        let mut record = vec![0u8; reclen];
        record[16..18].copy_from_slice(&(reclen as u16).to_ne_bytes());
        record[19..19 + name.len()].copy_from_slice(name);
        record
    }

    #[test]
    fn directory_entries_are_walked_without_overrunning() {
        let mut buf = dirent(b"1");
        buf.extend(dirent(b"self"));
        buf.extend(dirent(b"12345"));
        let mut names = Vec::new();
        let mut pos = 0;
        while let Some((name, next)) = next_dirent(&buf, pos) {
            names.push(name.to_vec());
            pos = next;
        }
        assert_eq!(names, [b"1".to_vec(), b"self".to_vec(), b"12345".to_vec()]);
        // Truncated and corrupt records end the walk instead of reading past the buffer.
        assert_eq!(next_dirent(&buf[..20], 0), None);
        let mut bad = dirent(b"1");
        bad[16..18].copy_from_slice(&4u16.to_ne_bytes());
        assert_eq!(next_dirent(&bad, 0), None);
        let mut huge = dirent(b"1");
        huge[16..18].copy_from_slice(&u16::MAX.to_ne_bytes());
        assert_eq!(next_dirent(&huge, 0), None);
    }

    #[test]
    fn the_own_processes_children_are_found_in_proc() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        // SAFETY: open of a NUL-terminated literal.
        let proc_dir = unsafe { libc::open(c"/proc".as_ptr(), libc::O_RDONLY) };
        let name = child.id().to_string();
        assert_eq!(
            parent_of(proc_dir, name.as_bytes()),
            Some(std::process::id() as i32)
        );
        // SAFETY: closes the descriptor opened above.
        unsafe { libc::close(proc_dir) };
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

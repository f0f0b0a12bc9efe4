//! Orphans that reach the server. A keeper is the subreaper of its tree, but the tree runs
//! as the server's user and may kill (or stop) its own keeper: its orphans would then be
//! re-parented to pid 1 and outlive `process/terminate`, the session and the server. The
//! server is therefore a child subreaper too: orphans of a keeper that died before its tree
//! come to it, and it kills and reaps them at once, generation after generation.
//!
//! A child of the server is a *stray* when it is not a keeper and not in the server's
//! session. Every process of a keeper's tree runs in a session the keeper or a descendant
//! created, while the server's other children (the fs helpers) stay in the server's session.
//! Keepers are recognised by pid: the spawner records each one while it holds [`creating`]
//! shared, and a sweep holds it exclusively, so no keeper is seen before it is recorded.
//!
//! Sweeping goes on for as long as strays keep appearing, and the exiting server sweeps
//! once more ([`sweep_at_exit`]). What still escapes: a tree that kills its keeper and the
//! server at the same moment, or a server killed (`SIGKILL`) while it sweeps: its orphans
//! then go to pid 1, those the sweep had already stopped stay stopped; `docs/SECURITY.md`
//! says so.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Mutex, RwLock, RwLockReadGuard};
use std::time::Duration;

use crate::keeper::parent_from_stat;
use crate::sys;

/// Pids of keepers that have not been reaped yet.
static KEEPERS: Mutex<Option<HashSet<libc::pid_t>>> = Mutex::new(None);

/// Held shared from a keeper's `clone` until its pid is recorded, exclusively by a sweep.
static CREATING: RwLock<()> = RwLock::new(());

/// Pause between sweeps while strays are still being found: short at first, then longer
/// once a tree has kept making strays for [`FAST_SWEEPS`] sweeps. Sweeping never stops
/// while strays keep appearing: a tree that outlasted a fixed number of sweeps would
/// otherwise live on.
const SWEEP_INTERVAL: Duration = Duration::from_millis(10);
const SLOW_SWEEP_INTERVAL: Duration = Duration::from_millis(100);
const FAST_SWEEPS: usize = 1000;
/// How long the server, exiting, sweeps at most for strays still appearing.
const EXIT_SWEEP_LIMIT: Duration = Duration::from_secs(5);

/// Makes the server the subreaper of everything below its keepers, and starts watching for
/// keepers their tree stopped. Called once, before the first keeper exists.
pub(crate) fn become_subreaper() {
    watch_stopped_keepers();
    exec_server_core::exit_hooks::at_exit(sweep_at_exit);
    // SAFETY: prctl with integer arguments changes a flag of this process only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        let e = io::Error::last_os_error();
        tracing::warn!(error = %e, "the server cannot adopt orphans of killed keepers");
    }
}

/// The guard a spawner holds from `clone` until [`keeper_started`].
pub(crate) fn creating() -> RwLockReadGuard<'static, ()> {
    CREATING.read().unwrap_or_else(|e| e.into_inner())
}

/// Records a new keeper (while the caller holds [`creating`]).
pub(crate) fn keeper_started(pid: libc::pid_t) {
    keepers().get_or_insert_with(HashSet::new).insert(pid);
}

/// Whether a keeper that exited with `code` may have left processes of its tree behind:
/// it died of a signal (killed by its own tree), or its kill rounds ran out.
pub(crate) fn left_a_tree(code: i32) -> bool {
    code >= 128 || code == crate::keeper::TREE_LEFT_BEHIND
}

/// Forgets a keeper that has been reaped; `killed` says it died of a signal, before it
/// could end its tree, and starts sweeping its orphans.
pub(crate) fn keeper_reaped(pid: libc::pid_t, killed: bool) {
    if let Some(set) = keepers().as_mut() {
        set.remove(&pid);
    }
    if killed {
        tracing::warn!(
            keeper = pid,
            "a process keeper left its tree behind; ending it"
        );
        sweep_in_background();
    }
}

fn keepers() -> std::sync::MutexGuard<'static, Option<HashSet<libc::pid_t>>> {
    KEEPERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sweeps until a sweep finds nothing, on the blocking pool (it reads `/proc`). One loop
/// at a time: a keeper death while it runs changes nothing.
fn sweep_in_background() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static SWEEPING: AtomicBool = AtomicBool::new(false);
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        sweep_until_clear(None);
        return;
    };
    if SWEEPING.swap(true, Ordering::SeqCst) {
        return;
    }
    runtime.spawn(async {
        for round in 0.. {
            match tokio::task::spawn_blocking(sweep).await {
                Ok(0) | Err(_) => break,
                Ok(_) => tokio::time::sleep(interval(round)).await,
            }
            if round == FAST_SWEEPS {
                tracing::warn!("orphans of a killed keeper keep appearing; sweeping on");
            }
        }
        SWEEPING.store(false, Ordering::SeqCst);
        // A keeper that died as the loop ended may have left strays it did not see.
        if sweep() > 0 {
            sweep_in_background();
        }
    });
}

fn interval(round: usize) -> Duration {
    if round < FAST_SWEEPS {
        SWEEP_INTERVAL
    } else {
        SLOW_SWEEP_INTERVAL
    }
}

/// Sweeps on this thread until a sweep finds nothing, or `limit` has passed.
fn sweep_until_clear(limit: Option<Duration>) {
    let start = std::time::Instant::now();
    for round in 0.. {
        if sweep() == 0 || limit.is_some_and(|limit| start.elapsed() >= limit) {
            return;
        }
        std::thread::sleep(interval(round));
    }
}

/// The server is exiting (its sessions ended, their keepers told to end their trees):
/// ends every stray left, sweeping until none appears or [`EXIT_SWEEP_LIMIT`] has passed.
/// A process the server leaves alive would be re-parented to pid 1.
pub(crate) fn sweep_at_exit() {
    sweep_until_clear(Some(EXIT_SWEEP_LIMIT));
}

/// Ends every stray child of the server with all its descendants, and reaps the strays
/// already dead; returns how many strays it found (live or dead). Never waits for a
/// process: one stuck in the kernel (a hung FUSE request) must not hold up the next
/// sweep, nor `process/start`, which waits for [`CREATING`].
pub(crate) fn sweep() -> usize {
    let _no_keeper_is_being_created = CREATING.write().unwrap_or_else(|e| e.into_inner());
    // SAFETY: getpid and getsid(0) have no preconditions.
    let (server, session) = unsafe { (libc::getpid(), libc::getsid(0)) };
    let keepers = keepers().clone().unwrap_or_default();
    let strays: Vec<(libc::pid_t, OwnedFd)> = children(server)
        .into_iter()
        .filter(|pid| !keepers.contains(pid))
        .filter_map(|pid| open_stray(server, session, pid).map(|fd| (pid, fd)))
        .collect();
    if strays.is_empty() {
        return 0;
    }
    let frozen = freeze_trees(&strays);
    for pidfd in frozen.values().chain(strays.iter().map(|(_, fd)| fd)) {
        let _ = sys::pidfd_signal(pidfd, libc::SIGKILL);
    }
    // The ones already dead are reaped now, the others by a later sweep.
    for (_, pidfd) in &strays {
        let _ = sys::try_wait(pidfd);
    }
    strays.len()
}

/// A pidfd for `pid` if it is a stray child (checked after opening, so the descriptor
/// names the process that was checked, whatever happens to the pid).
fn open_stray(server: libc::pid_t, session: libc::pid_t, pid: libc::pid_t) -> Option<OwnedFd> {
    let pidfd = pidfd_open(pid)?;
    let is_stray = parent_of(pid) == Some(server) && {
        // SAFETY: getsid takes a pid only.
        let sid = unsafe { libc::getsid(pid) };
        sid >= 0 && sid != session
    };
    is_stray.then_some(pidfd)
}

/// Most rounds of [`freeze_trees`]; each stops what forked during the previous one.
const MAX_FREEZE_ROUNDS: usize = 64;

/// Stops every descendant of `roots`, round after round until a round finds none that is
/// not stopped yet: a stopped process cannot fork, so the kill that follows leaves no
/// child behind that was made while it went through the list.
fn freeze_trees(roots: &[(libc::pid_t, OwnedFd)]) -> HashMap<libc::pid_t, OwnedFd> {
    for (_, pidfd) in roots {
        let _ = sys::pidfd_signal(pidfd, libc::SIGSTOP);
    }
    let mut frozen: HashMap<libc::pid_t, OwnedFd> = HashMap::new();
    for _ in 0..MAX_FREEZE_ROUNDS {
        let parents = parent_table();
        let mut new = 0;
        let mut below: Vec<libc::pid_t> = roots.iter().map(|(pid, _)| *pid).collect();
        while let Some(parent) = below.pop() {
            for child in parents
                .iter()
                .filter(|(_, p)| **p == parent)
                .map(|(c, _)| *c)
            {
                below.push(child);
                if frozen.contains_key(&child) {
                    continue;
                }
                // Checked after opening: the descriptor names this parent's child.
                let Some(pidfd) = pidfd_open(child).filter(|_| parent_of(child) == Some(parent))
                else {
                    continue;
                };
                let _ = sys::pidfd_signal(&pidfd, libc::SIGSTOP);
                frozen.insert(child, pidfd);
                new += 1;
            }
        }
        if new == 0 {
            break;
        }
    }
    frozen
}

/// Every process's parent, from one pass over `/proc`.
fn parent_table() -> HashMap<libc::pid_t, libc::pid_t> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect()
}

/// Kills every keeper that is stopped. Only its own tree can have stopped it (it leads a
/// session of its own, so no group signal reaches it); stopped, it would ignore its kill
/// signal and its parent-death signal, and the tree would outlive its end. Killed, its
/// orphans come to the server, which ends them.
pub(crate) fn kill_stopped_keepers() {
    let keepers = keepers().clone().unwrap_or_default();
    for pid in keepers {
        if is_stopped_child(pid) {
            tracing::warn!(
                keeper = pid,
                "a process keeper was stopped; killing it and its tree"
            );
            // SAFETY: kill has no memory effects; an unreaped child's pid is not reused.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Whether our child `pid` is stopped, without consuming the report.
fn is_stopped_child(pid: libc::pid_t) -> bool {
    let mut info = std::mem::MaybeUninit::<libc::siginfo_t>::zeroed();
    // SAFETY: `info` is a valid siginfo_t buffer; WNOWAIT leaves the child's state as is.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            info.as_mut_ptr(),
            libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: zero-initialised, and filled by a successful waitid.
    let info = unsafe { info.assume_init() };
    // SAFETY: after a successful waitid the pid member is the valid one.
    rc == 0 && unsafe { info.si_pid() } == pid && info.si_code == libc::CLD_STOPPED
}

/// Watches for stopped keepers: every stop of a child reaches the server as `SIGCHLD`.
fn watch_stopped_keepers() {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut children) = signal(SignalKind::child()) else {
            tracing::warn!("stopped process keepers cannot be noticed");
            return;
        };
        // Inline: a few non-blocking `waitid`s, not worth a thread of the blocking pool.
        while children.recv().await.is_some() {
            kill_stopped_keepers();
        }
    });
}

fn pidfd_open(pid: libc::pid_t) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; a non-negative result is a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    // SAFETY: as above, owned from here on.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn parent_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    parent_from_stat(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// The server's children: from each thread's `children` list where the kernel keeps one,
/// else by scanning every process's parent.
fn children(server: libc::pid_t) -> Vec<libc::pid_t> {
    let listed = std::fs::read_dir(format!("/proc/{server}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .map(|task| std::fs::read_to_string(task.path().join("children")))
                .collect::<io::Result<Vec<String>>>()
        })
        .and_then(|r| r);
    match listed {
        Ok(lists) => lists
            .iter()
            .flat_map(|list| list.split_ascii_whitespace())
            .filter_map(|pid| pid.parse().ok())
            .collect(),
        Err(_) => std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
            .filter(|pid| parent_of(*pid) == Some(server))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_spares_children_in_the_servers_session_and_ends_the_others() {
        // This test process plays the server: a child in our session is spared, one that
        // made a session of its own is killed and reaped.
        let mut ours = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut stray = std::process::Command::new("setsid")
            .args(["sleep", "30"])
            .spawn()
            .unwrap();
        let stray_pid = stray.id() as libc::pid_t;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        // Not a group leader, so setsid(1) calls setsid(2) without forking, then execs.
        // SAFETY: getsid takes a pid only.
        while unsafe { libc::getsid(stray_pid) } != stray_pid {
            assert!(std::time::Instant::now() < deadline, "setsid never ran");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(sweep() >= 1);
        assert!(
            ours.try_wait().unwrap().is_none(),
            "a child in our session was killed"
        );
        // The stray was killed (and reaped by the sweep if it was dead by then).
        match stray.wait() {
            Ok(status) => {
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
            }
            Err(error) => assert_eq!(error.raw_os_error(), Some(libc::ECHILD)),
        }
        ours.kill().unwrap();
        ours.wait().unwrap();
    }
}

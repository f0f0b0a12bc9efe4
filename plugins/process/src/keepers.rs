//! The live keepers of one session ([`crate::keeper`]): each is signalled with
//! [`KILL_TREE`](crate::keeper::KILL_TREE) when its process is terminated or the session
//! ends, and reaped by a task of its own when it exits, which only then releases its stack.
//!
//! A keeper can outlive its process's table entry: a daemon that closed its output keeps
//! running after `process/closed` and after the closed-retention time, and must still die
//! with the session. So keepers are tracked here, not in the process table's slots — and so
//! is each process's share of the session's process quota, given back when its keeper is
//! reaped, i.e. when nothing of its tree is left.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use exec_server_core::QuotaLease;
use exec_server_sandbox::placeholders::Placeholders;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::keeper::KILL_TREE;
use crate::spawn::{Keeper, KeeperStack};
use crate::sys;

/// How long a keeper told to end its tree may take before it is killed. Ending a tree
/// takes milliseconds; only a keeper the tree stopped or starved needs this.
const KEEPER_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// A keeper, until it has been reaped.
///
/// Signals go to its pid, but only while it is not reaped, and reaping happens under the
/// same lock: an unreaped keeper's pid cannot be reused, so a signal never reaches another
/// process. This way a retained process holds no descriptor for its keeper; the reaping
/// task alone holds the pidfd, for as long as the keeper runs.
#[derive(Debug)]
pub(crate) struct LiveKeeper {
    pub pid: libc::pid_t,
    /// Set by the reaping task, under the lock, when it reaped the keeper.
    reaped: Mutex<bool>,
}

impl LiveKeeper {
    /// Makes the keeper kill every process of its tree and exit. No effect once it exited.
    ///
    /// The tree may have stopped its keeper (it runs as the same user): the keeper is
    /// continued, and if it has not exited after [`KEEPER_GRACE`] it is killed, which makes
    /// the server adopt and end its orphans ([`crate::strays`]).
    pub fn kill_tree(self: &Arc<Self>) {
        if !self.signal(KILL_TREE) {
            return;
        }
        self.signal(libc::SIGCONT);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let keeper = Arc::clone(self);
            runtime.spawn(async move {
                tokio::time::sleep(KEEPER_GRACE).await;
                if keeper.signal(libc::SIGKILL) {
                    tracing::warn!(
                        keeper = keeper.pid,
                        "a process keeper did not end its tree in time; killed"
                    );
                }
            });
        }
    }

    /// Sends `signal` unless the keeper has been reaped; false if it has.
    fn signal(&self, signal: libc::c_int) -> bool {
        let reaped = self.reaped.lock().unwrap_or_else(|e| e.into_inner());
        if *reaped {
            return false;
        }
        // SAFETY: kill has no memory effects; the pid is our unreaped child (see above).
        if unsafe { libc::kill(self.pid, signal) } != 0 {
            let e = io::Error::last_os_error();
            tracing::warn!(keeper = self.pid, error = %e, "failed to signal a process keeper");
        }
        true
    }

    /// Reaps the keeper behind `pidfd` if it has exited; true once it is reaped. A keeper
    /// that died of a signal left its tree behind: the server ends it.
    fn try_reap(&self, pidfd: &OwnedFd) -> io::Result<bool> {
        let mut reaped = self.reaped.lock().unwrap_or_else(|e| e.into_inner());
        if !*reaped {
            if let Some(code) = sys::try_wait(pidfd)? {
                *reaped = true;
                crate::strays::keeper_reaped(self.pid, crate::strays::left_a_tree(code));
            }
        }
        Ok(*reaped)
    }

    /// A keeper handle for unit tests, which never signals anything.
    #[cfg(test)]
    pub fn for_tests() -> Arc<Self> {
        Arc::new(Self {
            pid: 0,
            reaped: Mutex::new(true),
        })
    }
}

#[derive(Debug, Default)]
pub(crate) struct KeeperRegistry {
    state: Mutex<RegistryState>,
}

#[derive(Debug, Default)]
struct RegistryState {
    /// Keyed by adoption order, not by pid: a reaped keeper's pid may be reused by the
    /// next keeper before the reaping task forgets the old one.
    live: HashMap<u64, KeeperEntry>,
    next_key: u64,
    /// Set when the session ended: keepers adopted afterwards are killed at once.
    ended: bool,
}

/// A live keeper and the quota share its tree holds.
#[derive(Debug)]
struct KeeperEntry {
    keeper: Arc<LiveKeeper>,
    _share: Option<QuotaLease>,
    /// Missing carve-outs held for the tree: they must outlive every process of it.
    _placeholders: Placeholders,
}

impl KeeperRegistry {
    fn state(&self) -> std::sync::MutexGuard<'_, RegistryState> {
        self.state.lock().expect("keeper registry lock")
    }

    /// Takes over a newly spawned keeper: it dies with the session, and a task reaps it when
    /// it exits, then frees its stack, gives back `share` (its process's share of the
    /// session's quota) and lets go of `placeholders`. Must be called within the tokio
    /// runtime.
    pub fn adopt(
        self: &Arc<Self>,
        keeper: Keeper,
        share: Option<QuotaLease>,
        placeholders: Placeholders,
    ) -> Arc<LiveKeeper> {
        let Keeper { pid, pidfd, stack } = keeper;
        let live = Arc::new(LiveKeeper {
            pid,
            reaped: Mutex::new(false),
        });
        let key;
        let ended = {
            let mut state = self.state();
            key = state.next_key;
            state.next_key += 1;
            state.live.insert(
                key,
                KeeperEntry {
                    keeper: Arc::clone(&live),
                    _share: share,
                    _placeholders: placeholders,
                },
            );
            state.ended
        };
        if ended {
            live.kill_tree();
        }
        tokio::spawn(reap(Arc::clone(self), key, Arc::clone(&live), pidfd, stack));
        live
    }

    /// The session ended: every keeper kills its tree.
    pub fn kill_all(&self) {
        let live: Vec<Arc<LiveKeeper>> = {
            let mut state = self.state();
            state.ended = true;
            state
                .live
                .values()
                .map(|entry| Arc::clone(&entry.keeper))
                .collect()
        };
        for keeper in live {
            keeper.kill_tree();
        }
    }
}

/// Waits for the keeper to exit, reaps it, releases its stack and forgets it. If it cannot
/// be reaped, its stack is leaked rather than pulled from under a running keeper.
async fn reap(
    registry: Arc<KeeperRegistry>,
    key: u64,
    keeper: Arc<LiveKeeper>,
    pidfd: OwnedFd,
    stack: KeeperStack,
) {
    let reaped = match sys::register(pidfd, Interest::READABLE) {
        Ok(pidfd) => reap_when_readable(&keeper, &pidfd).await,
        Err((pidfd, _)) => {
            let blocking = Arc::clone(&keeper);
            tokio::task::spawn_blocking(move || loop {
                sys::wait_readable(&pidfd)?;
                if blocking.try_reap(&pidfd)? {
                    return Ok(());
                }
            })
            .await
            .map_err(io::Error::other)
            .and_then(|r| r)
        }
    };
    match reaped {
        // SAFETY: the keeper has been reaped, so nothing runs on its stack any more.
        Ok(()) => unsafe { stack.release() },
        Err(e) => {
            tracing::warn!(keeper = keeper.pid, error = %e, "process keeper not reaped");
        }
    }
    // Dropped outside the registry's lock: giving the share back takes the quota's.
    let entry = registry.state().live.remove(&key);
    drop(entry);
}

async fn reap_when_readable(keeper: &LiveKeeper, pidfd: &AsyncFd<OwnedFd>) -> io::Result<()> {
    loop {
        let mut ready = pidfd.readable().await?;
        match ready.try_io(|fd| match keeper.try_reap(fd.get_ref()) {
            Ok(false) => Err(io::ErrorKind::WouldBlock.into()),
            Ok(true) => Ok(()),
            Err(e) => Err(e),
        }) {
            Ok(result) => return result,
            Err(_would_block) => continue,
        }
    }
}

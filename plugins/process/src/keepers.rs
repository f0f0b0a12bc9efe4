//! The live keepers of one session ([`crate::keeper`]): each is signalled with
//! [`KILL_TREE`](crate::keeper::KILL_TREE) when its process is terminated or the session
//! ends, and reaped by a task of its own when it exits, which only then frees its stack.
//!
//! A keeper can outlive its process's table entry: a daemon that closed its output keeps
//! running after `process/closed` and after the closed-retention time, and must still die
//! with the session. So keepers are tracked here, not in the process table's slots.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::keeper::KILL_TREE;
use crate::spawn::{Keeper, KeeperStack};
use crate::sys;

/// A keeper that has not been reaped yet (or just was).
#[derive(Debug)]
pub(crate) struct LiveKeeper {
    pub pid: libc::pid_t,
    /// Signals go through the pidfd, so they can never reach a process that reused the pid.
    pidfd: OwnedFd,
}

impl LiveKeeper {
    /// Makes the keeper kill every process of its tree and exit. No effect once it exited.
    pub fn kill_tree(&self) {
        if let Err(e) = sys::pidfd_signal(&self.pidfd, KILL_TREE) {
            tracing::warn!(keeper = self.pid, error = %e, "failed to signal a process keeper");
        }
    }

    /// A keeper handle for unit tests that never signal it: the test process itself.
    #[cfg(test)]
    pub fn for_tests() -> Arc<Self> {
        // SAFETY: pidfd_open of our own pid returns a new descriptor we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
        assert!(fd >= 0, "pidfd_open failed");
        // SAFETY: the descriptor was just created and is owned here alone.
        let pidfd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd) };
        Arc::new(Self { pid: 0, pidfd })
    }
}

impl AsRawFd for LiveKeeper {
    fn as_raw_fd(&self) -> RawFd {
        self.pidfd.as_raw_fd()
    }
}

#[derive(Debug, Default)]
pub(crate) struct KeeperRegistry {
    state: Mutex<RegistryState>,
}

#[derive(Debug, Default)]
struct RegistryState {
    live: HashMap<libc::pid_t, Arc<LiveKeeper>>,
    /// Set when the session ended: keepers adopted afterwards are killed at once.
    ended: bool,
}

impl KeeperRegistry {
    fn state(&self) -> std::sync::MutexGuard<'_, RegistryState> {
        self.state.lock().expect("keeper registry lock")
    }

    /// Takes over a newly spawned keeper: it dies with the session, and a task reaps it when
    /// it exits and then frees its stack. Must be called within the tokio runtime.
    pub fn adopt(self: &Arc<Self>, keeper: Keeper) -> Arc<LiveKeeper> {
        let Keeper { pid, pidfd, stack } = keeper;
        let live = Arc::new(LiveKeeper { pid, pidfd });
        let ended = {
            let mut state = self.state();
            state.live.insert(pid, Arc::clone(&live));
            state.ended
        };
        if ended {
            live.kill_tree();
        }
        tokio::spawn(reap(Arc::clone(self), Arc::clone(&live), stack));
        live
    }

    /// The session ended: every keeper kills its tree.
    pub fn kill_all(&self) {
        let live: Vec<Arc<LiveKeeper>> = {
            let mut state = self.state();
            state.ended = true;
            state.live.values().cloned().collect()
        };
        for keeper in live {
            keeper.kill_tree();
        }
    }
}

/// Waits for the keeper to exit, reaps it, frees its stack and forgets it. If it cannot be
/// reaped, its stack is leaked rather than pulled from under a running keeper.
async fn reap(registry: Arc<KeeperRegistry>, keeper: Arc<LiveKeeper>, stack: KeeperStack) {
    // SAFETY: the `LiveKeeper` owns its pidfd for as long as this `Arc` lives and always
    // returns the same descriptor, which is what registration requires.
    let registered =
        unsafe { AsyncFd::register_with_interest(Arc::clone(&keeper), Interest::READABLE) };
    let reaped = match registered {
        Ok(pidfd) => wait_exit(&pidfd).await,
        Err(_) => {
            let blocking = Arc::clone(&keeper);
            tokio::task::spawn_blocking(move || sys::wait_blocking(&blocking.pidfd))
                .await
                .map_err(io::Error::other)
                .and_then(|r| r)
        }
    };
    match reaped {
        // SAFETY: the keeper has been reaped, so nothing runs on its stack any more.
        Ok(_) => unsafe { stack.unmap() },
        Err(e) => {
            tracing::warn!(keeper = keeper.pid, error = %e, "process keeper not reaped");
        }
    }
    registry.state().live.remove(&keeper.pid);
}

async fn wait_exit(pidfd: &AsyncFd<Arc<LiveKeeper>>) -> io::Result<i32> {
    loop {
        let mut ready = pidfd.readable().await?;
        match ready.try_io(|fd| match sys::try_wait(&fd.get_ref().pidfd) {
            Ok(None) => Err(io::ErrorKind::WouldBlock.into()),
            other => other,
        }) {
            Ok(Ok(Some(code))) => return Ok(code),
            Ok(Ok(None)) => continue,
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

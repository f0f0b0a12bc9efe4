//! Process hardening every exec-server process applies before it does anything else
//! (SANDBOX.md §5.8): it becomes non-dumpable, so processes of the same user can neither
//! read its memory nor open its `/proc/<pid>/environ`, and it takes the secrets out of its
//! environment ([`exec_server_config::secret_env`]). Serving processes also raise their
//! descriptor limit, so the listener's reserve ([`crate::transport::http_server`]) has room.
//! [`DescriptorHeadroom`] is how the listener keeps descriptors in reserve below that
//! limit, judged by the descriptor numbers the kernel hands out; what clients may hold is
//! the descriptor budget's business ([`crate::descriptors`]).
//!
//! Neither step can be switched off by configuration or by a plugin: they run before
//! either exists.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::sync::{Mutex, OnceLock};

use exec_server_config::secret_env;

/// Warnings from the steps that run before logging exists, logged by [`log_deferred_warnings`].
static DEFERRED_WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The soft `RLIMIT_NOFILE` the process started with, before [`raise_open_file_limit`].
static ORIGINAL_OPEN_FILE_LIMIT: OnceLock<u64> = OnceLock::new();

/// Marks the process non-dumpable and captures its secret variables. Call it as the first
/// statement of `main`, while the process is single-threaded (it edits the environment).
///
/// It runs before the hidden-helper dispatch, so helpers start non-dumpable too; a helper
/// that must be dumpable (to write its own `uid_map`, for instance) switches it back on
/// itself, at the point where it needs it.
pub fn harden_process() {
    set_non_dumpable();
    secret_env::capture_secret_variables();
}

/// `prctl(PR_SET_DUMPABLE, 0)`: `/proc/<pid>` becomes root-owned and `ptrace`, `environ`,
/// `mem` and core dumps are refused to every unprivileged process, the same user included.
fn set_non_dumpable() {
    // SAFETY: PR_SET_DUMPABLE takes integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc != 0 {
        defer_warning(format!(
            "could not mark the process non-dumpable: {}",
            std::io::Error::last_os_error()
        ));
    }
}

fn defer_warning(warning: String) {
    DEFERRED_WARNINGS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(warning);
}

/// Logs what [`harden_process`] could not do; call once logging is set up.
pub fn log_deferred_warnings() {
    let mut warnings = std::mem::take(
        &mut *DEFERRED_WARNINGS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    );
    warnings.extend(secret_env::take_warnings());
    for warning in warnings {
        tracing::warn!("{warning}");
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, so connections, processes and files
/// can use every descriptor the administrator allows. Returns the soft limit in force.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let _ = ORIGINAL_OPEN_FILE_LIMIT.set(limit.rlim_cur);
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; lowering nothing, raising soft to hard.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        tracing::debug!(
            from = limit.rlim_cur,
            to = limit.rlim_max,
            "raised the open-file limit"
        );
        return Ok(limit.rlim_max);
    }
    Ok(limit.rlim_cur)
}

/// The soft `RLIMIT_NOFILE` the process started with, if [`raise_open_file_limit`] changed
/// it: what a spawned child should get back, since programs that use `select(2)` or close
/// every descriptor up to the limit expect the usual value.
pub fn original_open_file_limit() -> Option<u64> {
    ORIGINAL_OPEN_FILE_LIMIT.get().copied()
}

/// The current soft `RLIMIT_NOFILE`, or `None` when it is unlimited or unreadable.
pub fn open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Descriptors kept free below the soft `RLIMIT_NOFILE`, so that whatever uses them up (a
/// flood of connections, of processes) stops before the server reaches `EMFILE` and can
/// still do its own work. The kernel hands out the lowest free descriptor number, so a
/// fresh descriptor numbered `n` proves that `0..n` are all in use: one comparison tells
/// how much headroom is left, no counting needed.
#[derive(Debug, Clone, Copy)]
pub struct DescriptorHeadroom {
    /// The soft `RLIMIT_NOFILE`, if limited.
    limit: Option<u64>,
    /// The reserve in force: the configured one, at most half the limit.
    reserve: u64,
}

impl DescriptorHeadroom {
    /// A reserve of `reserve` descriptors under the current limit (none when the limit is
    /// unlimited or `reserve` is 0). Never more than half the limit: a tiny limit must
    /// still leave room for work.
    pub fn new(reserve: usize) -> Self {
        let limit = open_file_limit();
        let reserve = limit.map_or(0, |limit| (reserve as u64).min(limit / 2));
        Self { limit, reserve }
    }

    /// The soft descriptor limit, if any.
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// The reserve in force (0: none).
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// The first descriptor number inside the reserve; `None` when there is no reserve.
    pub fn high_water(&self) -> Option<u64> {
        let limit = self.limit?;
        (self.reserve > 0).then(|| limit - self.reserve)
    }

    /// Whether `needed` more descriptors, the first of which would be numbered
    /// `lowest_free` (a descriptor just opened proves that number was the lowest free one),
    /// would eat into the reserve.
    pub fn would_exhaust(&self, lowest_free: RawFd, needed: u64) -> bool {
        let lowest_free = u64::try_from(lowest_free).unwrap_or(0);
        self.high_water()
            .is_some_and(|high_water| lowest_free.saturating_add(needed) > high_water)
    }

    /// Whether `needed` more descriptors would eat into the reserve now. Opens `needed`
    /// probe descriptors (an `eventfd` and duplicates of it, which touch no file system),
    /// which the kernel numbers exactly as it would number the real ones — taking the
    /// holes lower descriptors left first — and closes them again. A failing probe
    /// (`EMFILE` above all) counts as exhausted.
    pub fn exhausted_for(&self, needed: u64) -> bool {
        let Some(high_water) = self.high_water() else {
            return false;
        };
        // SAFETY: eventfd takes integer arguments and returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return true;
        }
        // SAFETY: `fd` was just returned by eventfd and is owned by nothing else.
        let first = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut probes = Vec::with_capacity(usize::try_from(needed).unwrap_or(0));
        let mut highest = first.as_raw_fd();
        for _ in 1..needed {
            if u64::try_from(highest).unwrap_or(0) >= high_water {
                break;
            }
            // SAFETY: F_DUPFD_CLOEXEC creates a new descriptor; `first` stays open.
            let dup = unsafe { libc::fcntl(first.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
            if dup < 0 {
                return true;
            }
            // SAFETY: fcntl succeeded, so `dup` is an open descriptor owned by nothing else.
            probes.push(unsafe { OwnedFd::from_raw_fd(dup) });
            highest = highest.max(dup);
        }
        self.would_exhaust(highest, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_the_descriptors_numbered_from_limit_minus_reserve() {
        let headroom = DescriptorHeadroom {
            limit: Some(1024),
            reserve: 64,
        };
        assert_eq!(headroom.high_water(), Some(960));
        assert!(
            !headroom.would_exhaust(959, 1),
            "the last one outside the reserve"
        );
        assert!(headroom.would_exhaust(960, 1));
        assert!(!headroom.would_exhaust(950, 10));
        assert!(headroom.would_exhaust(950, 11));
        let none = DescriptorHeadroom {
            limit: Some(1024),
            reserve: 0,
        };
        assert!(!none.would_exhaust(1023, 1));
        let unlimited = DescriptorHeadroom {
            limit: None,
            reserve: 0,
        };
        assert!(!unlimited.exhausted_for(u64::MAX));
    }

    #[test]
    fn the_reserve_is_at_most_half_the_limit_and_the_probe_sees_free_descriptors() {
        let headroom = DescriptorHeadroom::new(usize::MAX);
        let limit = headroom.limit().expect("tests run with a descriptor limit");
        assert_eq!(headroom.reserve(), limit / 2);
        // This process uses far fewer than half its descriptors.
        assert!(!headroom.exhausted_for(1));
        assert!(!headroom.exhausted_for(16));
        assert!(headroom.exhausted_for(limit));
    }
}

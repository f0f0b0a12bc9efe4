//! Process hardening every exec-server process applies before it does anything else
//! (SANDBOX.md §5.8): it becomes non-dumpable, so processes of the same user can neither
//! read its memory nor open its `/proc/<pid>/environ`, and it takes the secrets out of its
//! environment ([`exec_server_config::secret_env`]). Serving processes also raise their
//! descriptor limit, so the listener's reserve ([`crate::transport::http_server`]) has room.
//!
//! Neither step can be switched off by configuration or by a plugin: they run before
//! either exists.

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

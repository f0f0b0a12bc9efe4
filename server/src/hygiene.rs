//! Process hardening every exec-server process applies before it does anything else
//! (SANDBOX.md §5.8): it becomes non-dumpable, so processes of the same user can neither
//! read its memory nor open its `/proc/<pid>/environ`, and it takes the secrets out of its
//! environment ([`exec_server_config::secret_env`]).
//!
//! Neither step can be switched off by configuration or by a plugin: they run before
//! either exists.

use std::sync::Mutex;

use exec_server_config::secret_env;

/// Warnings from the steps that run before logging exists, logged by [`log_deferred_warnings`].
static DEFERRED_WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

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

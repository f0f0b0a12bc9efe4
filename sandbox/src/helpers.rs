//! The hidden helpers of the sandbox (SANDBOX.md §9): the launcher is registered here; the
//! fs helper is registered by the crate that owns the filesystem executor (it passes that
//! executor to [`crate::fs_helper::main`]). Both sentinels must be registered in the
//! binary that serves, or enforced requests are refused (§9.3).

use std::ffi::OsString;
use std::sync::OnceLock;

use exec_server_core::helpers::{hidden_helpers, HiddenHelper};

use crate::exec::SANDBOX_EXEC_ARG1;
use crate::fs_helper::FS_HELPER_ARG1;

/// Never returns: runs the sandbox launcher (§8.3) on this process's arguments, then
/// execs the target or exits.
pub fn run_sandbox_exec_main() -> ! {
    let args: Vec<OsString> = std::env::args_os().skip(2).collect();
    std::process::exit(crate::exec::main(&args))
}

fn sandbox_exec_helper(args: &[OsString]) -> i32 {
    crate::exec::main(args)
}

exec_server_core::inventory::submit! {
    HiddenHelper { sentinel: SANDBOX_EXEC_ARG1, run: sandbox_exec_helper }
}

/// Both sentinels are registered in this binary (checked once).
pub fn helpers_registered() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        let registered = |sentinel: &str| hidden_helpers().any(|h| h.sentinel == sentinel);
        registered(FS_HELPER_ARG1) && registered(SANDBOX_EXEC_ARG1)
    })
}

/// Logs the missing registrations at start-up.
pub(crate) fn log_missing_registrations() {
    for sentinel in [FS_HELPER_ARG1, SANDBOX_EXEC_ARG1] {
        if !hidden_helpers().any(|h| h.sentinel == sentinel) {
            tracing::error!(
                "hidden helper {sentinel} is not registered in this binary: sandboxed requests will be refused"
            );
        }
    }
}

//! exec-server's sandbox (`SANDBOX.md`): which requests need confinement, and the helper
//! processes that confine themselves with Landlock and seccomp before doing the work.
//!
//! * [`policy`] — every accepted `sandbox` shape normalised into one decision: run directly,
//!   or enforce a [`policy::SandboxPolicy`]; plus the user-space access check of the fs
//!   helper and the policy's command-line JSON form.
//! * [`anchored`] — opening exactly the path a check approved (no symlink followed) and
//!   acting relative to the descriptor.
//! * [`config`] — the `[sandbox]` table and the config-only `sandbox` plugin.
//! * [`enforce`] — `no_new_privs`, the seccomp filter, the Landlock ruleset, the probe.
//! * [`fs_helper`] — the fs helper: protocol, helper `main`, and the server-side runner.
//! * [`exec`] — the sandbox launcher of `process/start` and its control socket.
//! * [`narrow`] — mount narrowing of carve-outs and deny entries for processes.
//! * [`placeholders`] — missing carve-outs held as empty directories while processes run.
//! * [`denial`] — the `sandboxDenied` classifier of process exits.
//! * [`runtime`] — what the `fs` and `process` plugins use to serve sandboxed requests.
//! * [`helpers`] — hidden-helper registration and the launcher's entry point.
//! * [`lookalikes`] — paths a lossy listing could have made from another file's name.

pub mod anchored;
pub mod config;
pub mod denial;
pub mod enforce;
pub mod exec;
pub mod fs_helper;
pub mod helpers;
pub mod lookalikes;
pub mod narrow;
pub mod placeholders;
pub mod policy;
pub mod runtime;

/// What the fuzz targets (`fuzz/`) need besides the public API: the flag types that
/// [`anchored`] takes, and the kernel call they compare its opens with.
#[doc(hidden)]
pub mod fuzzing {
    pub use rustix::fs::{openat2, Mode, OFlags, ResolveFlags};
}

pub use config::SandboxConfig;
pub use exec::SANDBOX_EXEC_ARG1;
pub use fs_helper::FS_HELPER_ARG1;
pub use helpers::run_sandbox_exec_main;
pub use runtime::SandboxRuntime;

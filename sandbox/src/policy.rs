//! The `sandbox` member, normalised into one decision (SANDBOX.md §2, §3.1).
//!
//! Callers route on the result: [`SandboxDecision::Unsandboxed`] runs the operation exactly
//! as without a sandbox; [`SandboxDecision::Enforce`] must run under enforcement or fail
//! closed. The submodules each do one step:
//!
//! * `shape` — decode the wire shapes and their casing rules (§2.2–§2.6);
//! * `intent` — turn a shape into access grants, incl. the legacy expansion (§2.8 steps 1–4);
//! * `expand` — grants to canonical paths and absolute globs (§2.4.5, §2.8 steps 5–6);
//! * `resolve` — path resolution as far as the path exists (§2.8, §5.6);
//! * `classify` — precedence and classification into the policy (§2.4.7, §2.8 step 7);
//! * `carve_outs` — `.git`, `.codex`, `.agents` under writable roots (§2.9);
//! * `normalise` — the whole algorithm with the server additions and the decision (§2.8–§2.10);
//! * `glob` — deny-glob matching (§2.4.4);
//! * `check` — the user-space access decision of the fs helper (§5.6);
//! * `helper_json` — the policy's JSON form on the helper command line (§4.3).

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use exec_server_proto::error::SandboxRequest;
use exec_server_proto::RpcError;
use serde_json::Value;

mod carve_outs;
mod check;
mod classify;
mod expand;
mod glob;
mod helper_json;
mod intent;
mod normalise;
mod resolve;
mod shape;

pub use check::AccessKind;
pub(crate) use glob::escape as escape_glob;
pub use glob::GlobPattern;
pub use helper_json::Enforcement;
pub use normalise::normalise;
pub use resolve::{canonicalise, normalise_lexically, resolve};

/// The platform read set of the `minimal` special kind (§2.4.5); only existing members
/// count.
pub const MINIMAL_READ_SET: &[&str] = &[
    "/bin",
    "/sbin",
    "/usr",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/nix/store",
    "/run/current-system/sw",
];

/// Glob expansion depth for process narrowing when the policy names none (§2.4.2).
pub const DEFAULT_GLOB_SCAN_MAX_DEPTH: u32 = 16;

/// What to do with a request's `sandbox`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxDecision {
    /// No enforcement needed; run as if no sandbox was given.
    Unsandboxed,
    /// Enforce this policy.
    Enforce(SandboxPolicy),
}

impl SandboxDecision {
    pub fn needs_enforcement(&self) -> bool {
        matches!(self, Self::Enforce(_))
    }

    /// The policy to enforce, if any.
    pub fn policy(&self) -> Option<&SandboxPolicy> {
        match self {
            Self::Unsandboxed => None,
            Self::Enforce(policy) => Some(policy),
        }
    }
}

/// The internal policy (§2.8). Paths are absolute and canonical; lists are sorted and
/// deduplicated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPolicy {
    pub readable: Readable,
    /// Writable roots.
    pub writable: Vec<PathBuf>,
    /// Read-only carve-outs strictly inside writable roots, explicit and computed (§2.9).
    pub read_only: Vec<PathBuf>,
    pub denied_paths: Vec<PathBuf>,
    /// Absolute patterns; each denies its matches and everything beneath them.
    pub denied_globs: Vec<GlobPattern>,
    pub network: Network,
    /// `/` is writable and nothing narrows it (computed carve-outs do not count).
    pub full_disk_write: bool,
    /// Bound of glob expansion for process narrowing (§8.4).
    pub glob_scan_max_depth: u32,
}

/// The read set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readable {
    All,
    Roots(Vec<PathBuf>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    Restricted,
    Enabled,
}

/// Which request the policy is for; the two differ in defaults, additions, error codes and
/// the final decision (§2.7–§2.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyTarget {
    /// An `fs/*` request, run by the fs helper.
    Fs,
    /// `process/start`; `cwd` is the request's working directory.
    Process { cwd: PathBuf },
}

/// Everything besides the `sandbox` member that normalisation depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyContext {
    pub target: PolicyTarget,
    /// The helper executable whose directory becomes readable when reads are restricted
    /// (§2.10), or why it could not be resolved (an error only for such policies).
    pub helper_executable: Result<PathBuf, String>,
    /// The server's `TMPDIR`, as found in its environment.
    pub tmpdir: Option<OsString>,
    /// Files that must never be readable: loaded configuration and secret sources (§2.10).
    pub secret_files: Vec<PathBuf>,
    /// Families of such files whose names are not all known in advance (an audit file and
    /// the names its rotation gives it).
    pub secret_globs: Vec<GlobPattern>,
}

impl PolicyContext {
    /// An `fs/*` context with the defaults of the running server: the helper is this very
    /// executable, `TMPDIR` is the server's, no secret files are known.
    pub fn fs() -> Self {
        Self::with_process_defaults(PolicyTarget::Fs)
    }

    /// A `process/start` context with the defaults of the running server (see [`Self::fs`]).
    pub fn process(cwd: &Path) -> Self {
        Self::with_process_defaults(PolicyTarget::Process {
            cwd: cwd.to_path_buf(),
        })
    }

    fn with_process_defaults(target: PolicyTarget) -> Self {
        Self {
            target,
            helper_executable: std::env::current_exe()
                .map_err(|e| format!("cannot resolve the helper executable: {e}")),
            tmpdir: std::env::var_os("TMPDIR"),
            secret_files: Vec::new(),
            secret_globs: Vec::new(),
        }
    }

    /// The request family, for error codes.
    pub fn request(&self) -> SandboxRequest {
        match self.target {
            PolicyTarget::Fs => SandboxRequest::Fs,
            PolicyTarget::Process { .. } => SandboxRequest::Process,
        }
    }
}

/// A decision plus what the caller should log about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyOutcome {
    pub decision: SandboxDecision,
    /// Special kinds of `deny` entries that were ignored because they are unknown (§2.4.5),
    /// in entry order, without duplicates.
    pub ignored_deny_kinds: Vec<String>,
}

/// Logs each ignored deny kind once per instance (§2.4.5 asks for once per connection; a
/// connection keeps one of these). The kinds are the client's text: each is quoted so that
/// it cannot forge a log line, and an instance remembers at most [`MAX_REMEMBERED_KINDS`]
/// of them; past that it says once that it logs no more.
#[derive(Debug, Default)]
pub struct IgnoredKindLog {
    logged: Mutex<HashSet<String>>,
}

/// The most ignored kinds one [`IgnoredKindLog`] remembers (and logs).
pub const MAX_REMEMBERED_KINDS: usize = 64;

impl IgnoredKindLog {
    /// Logs the kinds not logged before by this instance; returns those it logged.
    pub fn report(&self, kinds: &[String]) -> Vec<String> {
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        let mut fresh = Vec::new();
        for kind in kinds {
            if logged.len() >= MAX_REMEMBERED_KINDS {
                break;
            }
            if logged.insert(kind.clone()) {
                fresh.push(kind.clone());
                let kind = exec_server_proto::log_text::quoted(kind);
                tracing::warn!(
                    "sandbox deny entry with unsupported special path kind \"{kind}\" ignored"
                );
                if logged.len() == MAX_REMEMBERED_KINDS {
                    tracing::warn!(
                        "further unsupported special path kinds are ignored without a log line"
                    );
                }
            }
        }
        fresh
    }
}

/// The log used by [`decide_fs`] and [`decide_process`], which know no connection.
fn server_wide_log() -> &'static IgnoredKindLog {
    static LOG: OnceLock<IgnoredKindLog> = OnceLock::new();
    LOG.get_or_init(IgnoredKindLog::default)
}

/// Decides a `fs/*` request's sandbox. `top_level_policy` is a legacy `sandboxPolicy`
/// member placed directly in the params (PROTOCOL §5.2.1). Errors carry the fs codes.
pub fn decide_fs(
    sandbox: Option<&Value>,
    top_level_policy: Option<&Value>,
) -> Result<SandboxDecision, RpcError> {
    let outcome = decide_fs_in(sandbox, top_level_policy, &PolicyContext::fs())?;
    server_wide_log().report(&outcome.ignored_deny_kinds);
    Ok(outcome.decision)
}

/// Decides a `process/start` request's sandbox; `cwd` is the request's working directory.
pub fn decide_process(sandbox: Option<&Value>, cwd: &Path) -> Result<SandboxDecision, RpcError> {
    let outcome = decide_process_in(sandbox, &PolicyContext::process(cwd))?;
    server_wide_log().report(&outcome.ignored_deny_kinds);
    Ok(outcome.decision)
}

/// [`decide_fs`] with an explicit context (`ctx.target` should be [`PolicyTarget::Fs`]).
pub fn decide_fs_in(
    sandbox: Option<&Value>,
    top_level_policy: Option<&Value>,
    ctx: &PolicyContext,
) -> Result<PolicyOutcome, RpcError> {
    let wrapped;
    let sandbox = match (
        sandbox.filter(|v| !v.is_null()),
        top_level_policy.filter(|v| !v.is_null()),
    ) {
        (Some(_), Some(_)) => return Err(RpcError::sandbox_and_top_level_policy()),
        (Some(sandbox), None) => sandbox,
        (None, Some(policy)) => {
            wrapped = serde_json::json!({ "sandboxPolicy": policy });
            &wrapped
        }
        (None, None) => return Ok(unsandboxed()),
    };
    normalise(sandbox, ctx)
}

/// [`decide_process`] with an explicit context (`ctx.target` should be
/// [`PolicyTarget::Process`]).
pub fn decide_process_in(
    sandbox: Option<&Value>,
    ctx: &PolicyContext,
) -> Result<PolicyOutcome, RpcError> {
    match sandbox.filter(|v| !v.is_null()) {
        None => Ok(unsandboxed()),
        Some(sandbox) => normalise(sandbox, ctx),
    }
}

fn unsandboxed() -> PolicyOutcome {
    PolicyOutcome {
        decision: SandboxDecision::Unsandboxed,
        ignored_deny_kinds: Vec::new(),
    }
}

//! What the `fs` and `process` plugins need to serve sandboxed requests: the `[sandbox]`
//! settings, the helper executable, policy decisions in the server's context, the
//! fail-closed checks of §3.1/§6.1, and the fs helper runner.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use exec_server_core::config::{ConfigError, ConfigSource};
use exec_server_proto::{RpcError, StartErrorKind};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::config::SandboxConfig;
use crate::enforce;
use crate::fs_helper::runner::{FsHelperRunner, FsHelperSettings, SELF_EXE};
use crate::fs_helper::REQUEST_ENVELOPE_BYTES;
use crate::helpers::helpers_registered;
use crate::policy::{
    decide_fs_in, decide_process_in, Enforcement, IgnoredKindLog, PolicyContext, PolicyTarget,
    SandboxDecision, SandboxPolicy,
};

/// The sandbox as one plugin sees it.
#[derive(Debug)]
pub struct SandboxRuntime {
    config: SandboxConfig,
    /// The program spawned for helpers.
    program: PathBuf,
    /// The resolved helper executable: `argv[0]` of helpers and the directory readable
    /// under restricted reads (§2.10); an error text if it cannot be resolved.
    resolved: Result<PathBuf, String>,
    max_request_bytes: u64,
    fs_runner: FsHelperRunner,
    ignored_kinds: IgnoredKindLog,
    /// Files that hold the server's own secrets, denied to every sandbox (§2.10).
    secret_files: Vec<PathBuf>,
    secret_globs: Vec<crate::policy::GlobPattern>,
}

/// Keys whose value names a file holding a secret (a token or a key). Every configuration
/// key that names a file is here unless the file is public (`relay.ca_file`,
/// `rendezvous.tls_cert_file`).
const SECRET_FILE_KEYS: &[&str] = &[
    "relay.forward_bearer_token_file",
    "relay.token_file",
    "rendezvous.signing_key_file",
    "rendezvous.tls_key_file",
    "websocket.bearer_token_file",
    "websocket.shared_secret_file",
];

/// The configuration file the server read and every secret file its configuration names
/// (SANDBOX.md §2.10), canonical where they exist.
fn secret_files(source: &ConfigSource) -> Vec<PathBuf> {
    let named = SECRET_FILE_KEYS
        .iter()
        .filter_map(|key| source.string_value(key))
        .filter(|value| !value.is_empty())
        .map(PathBuf::from);
    source
        .config_file()
        .map(Path::to_path_buf)
        .into_iter()
        .chain(named)
        .chain(audit_token_files(source))
        .map(|path| std::fs::canonicalize(&path).unwrap_or(path))
        .collect()
}

/// The audit trail's backends, as configured (a table that does not decode stops the
/// server elsewhere, with the reason).
fn audit_backends(source: &ConfigSource) -> Vec<exec_server_core::audit::BackendConfig> {
    source
        .section::<exec_server_core::audit::AuditConfig>("audit")
        .map(|audit| audit.backends)
        .unwrap_or_default()
}

/// Each audit backend's token file.
fn audit_token_files(source: &ConfigSource) -> Vec<PathBuf> {
    audit_backends(source)
        .into_iter()
        .filter_map(|backend| backend.token_file)
        .collect()
}

/// Each audit file with every name its rotation gives it (`<name>*` in its directory):
/// the trail holds every session's commands and paths.
fn audit_file_globs(source: &ConfigSource) -> Vec<crate::policy::GlobPattern> {
    audit_backends(source)
        .into_iter()
        .filter_map(|backend| {
            let path = backend.path?;
            let path = std::fs::canonicalize(&path).unwrap_or(path);
            let directory = path.parent()?.to_path_buf();
            let name = crate::policy::escape_glob(&path.file_name()?.to_string_lossy());
            crate::policy::GlobPattern::with_prefix(directory, &format!("{name}*")).ok()
        })
        .collect()
}

impl SandboxRuntime {
    /// The server's one runtime, shared by every plugin that serves sandboxed requests, so
    /// that `sandbox.max_concurrent_helpers` and the per-session share of helper slots are
    /// server-wide, not per plugin.
    pub fn shared(
        install: &exec_server_core::Install<'_>,
    ) -> Result<std::sync::Arc<Self>, exec_server_core::InstallError> {
        install.shared(|| {
            let runtime = Self::from_source(
                install.config_source(),
                install.core_config().limits.max_message_bytes,
            )?;
            runtime.log_what_cannot_be_enforced();
            Ok(runtime)
        })
    }

    /// Logs once, when the server's runtime is built, what this host or binary cannot
    /// enforce (SANDBOX.md §6.2, §9.3), so an operator learns it at start-up rather than
    /// from the first refused request.
    fn log_what_cannot_be_enforced(&self) {
        let missing = enforce::probe_missing();
        if !missing.is_empty() {
            match self.config.enforcement {
                Enforcement::Require => tracing::warn!(
                    "sandboxed requests will be refused: this host cannot enforce {}",
                    missing.join(", ")
                ),
                Enforcement::BestEffort => tracing::warn!(
                    "sandbox enforcement is best-effort: this host cannot enforce {}",
                    missing.join(", ")
                ),
            }
        }
        crate::helpers::log_missing_registrations();
    }

    /// Reads `[sandbox]` from `source`; `max_message_bytes` is `limits.max_message_bytes`.
    pub fn from_source(
        source: &ConfigSource,
        max_message_bytes: usize,
    ) -> Result<Self, ConfigError> {
        let mut runtime = Self::new(SandboxConfig::from_source(source)?, max_message_bytes);
        runtime.secret_files = secret_files(source);
        runtime.secret_globs = audit_file_globs(source);
        Ok(runtime)
    }

    pub fn new(config: SandboxConfig, max_message_bytes: usize) -> Self {
        let max_request_bytes = max_message_bytes as u64 + REQUEST_ENVELOPE_BYTES;
        let mut runtime = Self {
            program: PathBuf::from(SELF_EXE),
            resolved: Err(String::new()),
            max_request_bytes,
            fs_runner: FsHelperRunner::new(
                FsHelperSettings {
                    program: PathBuf::from(SELF_EXE),
                    argv0: PathBuf::from(SELF_EXE),
                    timeout: Duration::from_millis(config.helper_timeout_ms),
                    max_response_bytes: config.helper_max_response_bytes,
                    max_request_bytes,
                    enforcement: config.enforcement,
                    reuse_for: None,
                },
                config.max_concurrent_helpers,
                config.max_helpers_per_session,
            ),
            ignored_kinds: IgnoredKindLog::default(),
            secret_files: Vec::new(),
            secret_globs: Vec::new(),
            config,
        };
        let configured = runtime.config.helper_executable.clone();
        runtime.set_helper_executable(configured);
        runtime
    }

    /// Names the executable spawned for helpers (same meaning as
    /// `sandbox.helper_executable`); the default is `/proc/self/exe`.
    pub fn with_helper_executable(mut self, path: impl Into<PathBuf>) -> Self {
        self.set_helper_executable(Some(path.into()));
        self
    }

    fn set_helper_executable(&mut self, path: Option<PathBuf>) {
        let (program, resolved) = match path {
            Some(path) => {
                let resolved = std::fs::canonicalize(&path).map_err(|e| {
                    format!(
                        "cannot resolve the helper executable {}: {e}",
                        path.display()
                    )
                });
                (path, resolved)
            }
            None => (
                PathBuf::from(SELF_EXE),
                std::env::current_exe()
                    .map_err(|e| format!("cannot resolve the helper executable: {e}")),
            ),
        };
        let settings = FsHelperSettings {
            program: program.clone(),
            argv0: resolved.clone().unwrap_or_else(|_| program.clone()),
            reuse_for: self.fs_helper_reuse(&program),
            ..self.fs_runner.settings().clone()
        };
        self.fs_runner = FsHelperRunner::new(
            settings,
            self.config.max_concurrent_helpers,
            self.config.max_helpers_per_session,
        );
        self.program = program;
        self.resolved = resolved;
    }

    /// How long an fs helper is kept for its session's next request: only helpers of this
    /// very binary, which is known to serve (`--serve`). A configured executable may be a
    /// host binary of another version that answers one request per process.
    fn fs_helper_reuse(&self, program: &Path) -> Option<Duration> {
        let idle = Duration::from_millis(self.config.fs_helper_idle_ms);
        (program == Path::new(SELF_EXE) && !idle.is_zero()).then_some(idle)
    }

    /// Kills the fs helpers kept for `session`, which ended.
    pub fn forget_session(&self, session: &str) {
        self.fs_runner.forget_session(session);
    }

    /// Makes the fs helpers kept for `session` end with it rather than when they would
    /// have expired; every plugin that runs fs helpers for a session calls this first.
    pub fn end_helpers_with(self: &Arc<Self>, session: &exec_server_core::Session) {
        session.state(|| HelpersEndWithSession {
            sandbox: Arc::clone(self),
            session: session.id().to_owned(),
        });
    }

    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    pub fn enforcement(&self) -> Enforcement {
        self.config.enforcement
    }

    /// The program spawned for helpers.
    pub fn helper_program(&self) -> &Path {
        &self.program
    }

    /// `argv[0]` of helpers.
    pub fn helper_argv0(&self) -> &Path {
        self.resolved.as_deref().unwrap_or(&self.program)
    }

    /// `--max-request-bytes` of helpers.
    pub fn max_request_bytes(&self) -> u64 {
        self.max_request_bytes
    }

    pub fn helper_timeout(&self) -> Duration {
        Duration::from_millis(self.config.helper_timeout_ms)
    }

    fn context(&self, target: PolicyTarget) -> PolicyContext {
        PolicyContext {
            target,
            helper_executable: self.resolved.clone(),
            tmpdir: std::env::var_os("TMPDIR"),
            secret_files: self.secret_files.clone(),
            secret_globs: self.secret_globs.clone(),
        }
    }

    /// Decides an `fs/*` request's sandbox in this server's context.
    pub fn decide_fs(
        &self,
        sandbox: Option<&Value>,
        top_level_policy: Option<&Value>,
    ) -> Result<SandboxDecision, RpcError> {
        let outcome = decide_fs_in(sandbox, top_level_policy, &self.context(PolicyTarget::Fs))?;
        self.ignored_kinds.report(&outcome.ignored_deny_kinds);
        Ok(outcome.decision)
    }

    /// Decides a `process/start` request's sandbox; `cwd` is the request's.
    pub fn decide_process(
        &self,
        sandbox: Option<&Value>,
        cwd: &Path,
    ) -> Result<SandboxDecision, RpcError> {
        let target = PolicyTarget::Process {
            cwd: cwd.to_path_buf(),
        };
        let outcome = decide_process_in(sandbox, &self.context(target))?;
        self.ignored_kinds.report(&outcome.ignored_deny_kinds);
        Ok(outcome.decision)
    }

    /// Whether an enforced request may go to a helper at all (§3.1, §6.1, §6.2, §9.3):
    /// the helpers must be registered (both modes), and in `require` mode the probe must
    /// find every layer. The helper's own result stays authoritative.
    fn enforceable(&self) -> bool {
        if !helpers_registered() && self.program == Path::new(SELF_EXE) {
            return false;
        }
        self.config.enforcement == Enforcement::BestEffort || enforce::probe_missing().is_empty()
    }

    /// -32600 `filesystem sandbox cannot be enforced on this executor` when refused early.
    pub fn check_fs_enforceable(&self) -> Result<(), RpcError> {
        if self.enforceable() {
            Ok(())
        } else {
            Err(RpcError::fs_sandbox_unenforceable())
        }
    }

    /// -32602 `sandbox intent cannot be enforced on this executor` when refused early.
    pub fn check_process_enforceable(&self) -> Result<(), RpcError> {
        if self.enforceable() {
            Ok(())
        } else {
            Err(RpcError::sandbox_intent_unenforceable()
                .with_start_error_kind(StartErrorKind::SandboxUnavailable))
        }
    }

    /// Runs one `fs/*` operation of `session` in an fs helper confined by `policy` (§4),
    /// in that session's share of the helper slots. `params` are the request's params in
    /// the helper's form (§4.4).
    pub async fn run_fs_helper(
        &self,
        session: &str,
        operation: &str,
        params: Box<RawValue>,
        policy: &SandboxPolicy,
    ) -> Result<Box<RawValue>, RpcError> {
        self.check_fs_enforceable()?;
        self.fs_runner.run(session, operation, params, policy).await
    }

    /// The fs helper runner (for inspection of its command).
    pub fn fs_runner(&self) -> &FsHelperRunner {
        &self.fs_runner
    }
}

/// A session's hook that kills the fs helpers kept for it when it ends.
struct HelpersEndWithSession {
    sandbox: Arc<SandboxRuntime>,
    session: String,
}

impl exec_server_core::SessionState for HelpersEndWithSession {
    fn session_ended(&self) {
        self.sandbox.forget_session(&self.session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_secret_file_the_configuration_names_is_denied() {
        let source = ConfigSource::from_toml_str(
            "[relay]\ntoken_file = \"/srv/secrets/token\"\nca_file = \"/srv/ca.pem\"\n\
             [rendezvous]\nsigning_key_file = \"/srv/secrets/signing\"\n\
             tls_cert_file = \"/srv/cert.pem\"\ntls_key_file = \"/srv/secrets/tls.key\"\n\
             [websocket]\nshared_secret_file = \"/srv/secrets/jwt\"\n",
        );
        let mut found = secret_files(&source);
        found.sort();
        assert_eq!(
            found,
            [
                PathBuf::from("/srv/secrets/jwt"),
                PathBuf::from("/srv/secrets/signing"),
                PathBuf::from("/srv/secrets/tls.key"),
                PathBuf::from("/srv/secrets/token"),
            ]
        );
    }
}

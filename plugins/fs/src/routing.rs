//! Where an `fs/*` operation runs, decided from its `sandbox` member (PROTOCOL §5.2.2,
//! SANDBOX.md §3.1).
//!
//! Every one-shot method hands its decoded and validated operation to [`execute`], and
//! `fs/open` asks [`check_streaming`]; nothing else interprets `sandbox`. An operation
//! that needs no enforcement runs here, in the session's share of the worker threads (see
//! `blocking`); one that does runs in an fs helper (see `helper`), in the session's share
//! of the helper slots, which executes [`FsOperation::run_confined`]: the same method,
//! acting only through descriptors opened at what the policy approved.

use std::future::Future;
use std::ops::Deref;

use exec_server_core::proto::{fs, RpcError};
use exec_server_core::Session;
use exec_server_sandbox::fs_helper::Target;
use exec_server_sandbox::policy::{SandboxDecision, SandboxPolicy};
use exec_server_sandbox::SandboxRuntime;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::ambiguous_names::{self, SpelledPaths};
use crate::blocking::{BlockingPool, Deadline};
use crate::config::FsConfig;

/// The plugin's state: its limits, its worker threads, and the sandbox it
/// routes enforced requests to.
#[derive(Debug)]
pub(crate) struct FsState {
    pub(crate) config: FsConfig,
    pub(crate) pool: BlockingPool,
    pub(crate) sandbox: std::sync::Arc<SandboxRuntime>,
    /// The inotify instance every watch shares, created by the first watch.
    pub(crate) inotify: std::sync::Mutex<Option<std::sync::Arc<crate::inotify::Inotify>>>,
}

impl Deref for FsState {
    type Target = FsConfig;

    fn deref(&self) -> &FsConfig {
        &self.config
    }
}

/// One filesystem operation with host paths and every default applied: exactly what runs,
/// in the server ([`FsOperation::run`]) or in the fs helper ([`FsOperation::run_confined`]).
///
/// [`FsOperation::from_params`] is the only reading of a method's params: the server's
/// handler and the fs helper's executor both build the operation through it, so the two
/// cannot disagree on a default or a check.
pub(crate) trait FsOperation: std::fmt::Debug + Send + Sized + 'static {
    /// The method's params as the client (or the server, for the helper) sends them.
    type Params: DeserializeOwned + SandboxMembers + WirePaths + Send;
    type Output: Send + 'static;

    /// The method, which is also the helper's `operation` (SANDBOX.md §4.4).
    const METHOD: &'static str;

    /// The operation `params` ask for, validated against `limits` and with every default
    /// applied; `sandbox` members are not read here (see [`SandboxMembers`]).
    fn from_params(params: Self::Params, limits: &FsConfig) -> Result<Self, RpcError>;

    /// The paths the operation touches and the access it needs at each: what the fs
    /// helper's user-space checks approve before it runs (SANDBOX.md §5.6).
    fn targets(&self) -> Vec<Target>;

    /// Runs the operation synchronously on the calling thread; whatever could wait on
    /// another party (a FIFO's reader) gives up at `deadline`.
    fn run(self, deadline: Deadline) -> Result<Self::Output, RpcError>;

    /// Runs the operation in the server: [`Self::run`] on a blocking thread in `session`'s
    /// share of `pool`, after `spelled` is checked on that same thread. A method overrides
    /// this when part of its work can wait without a thread; it checks `spelled` before
    /// it first touches a path.
    fn run_in_server(
        self,
        pool: &BlockingPool,
        session: &Session,
        spelled: SpelledPaths,
    ) -> impl Future<Output = Result<Self::Output, RpcError>> + Send {
        pool.run(session, Self::METHOD, move |deadline| {
            spelled.check()?;
            self.run(deadline)
        })
    }

    /// Runs the operation inside the fs helper (see `confined`): it resolves and checks
    /// its targets against `policy` itself and acts only through descriptors opened
    /// exactly at what was approved, checking every entry a recursive method touches
    /// (SANDBOX.md §5.6). Deliberately without a default: running [`Self::run`] there would
    /// reopen paths after the check.
    fn run_confined(self, policy: &SandboxPolicy) -> Result<Self::Output, RpcError>;

    /// The helper request's params: canonical `file:` URIs, every default explicit and
    /// `"sandbox": null` (§4.4).
    fn helper_params(&self) -> Value;

    /// The method's result object for `output` (what the helper answers).
    fn output_to_wire(output: Self::Output) -> Result<Box<RawValue>, RpcError>;

    /// `output_to_wire` reversed, on the server; may apply the server's own limits.
    fn output_from_wire(&self, response: &RawValue) -> Result<Self::Output, RpcError>;
}

/// The `sandbox` and legacy top-level `sandboxPolicy` members of a method's params, which
/// decide where its operation runs rather than what it does.
pub(crate) trait SandboxMembers {
    /// Takes `(sandbox, sandboxPolicy)` out of the params.
    fn take_sandbox(&mut self) -> (Option<Value>, Option<Value>);
}

/// The path members of a method's params, as the client sent them: what decides which
/// paths are checked for lookalike names (see `ambiguous_names`).
pub(crate) trait WirePaths {
    fn wire_paths(&self) -> Vec<&str>;
}

macro_rules! fs_params {
    ($($params:ty => [$($path:ident),+]),* $(,)?) => {$(
        impl SandboxMembers for $params {
            fn take_sandbox(&mut self) -> (Option<Value>, Option<Value>) {
                (self.sandbox.take(), self.sandbox_policy.take())
            }
        }

        impl WirePaths for $params {
            fn wire_paths(&self) -> Vec<&str> {
                vec![$(self.$path.as_str()),+]
            }
        }
    )*};
}

fs_params!(
    fs::ReadFileParams => [path],
    fs::WriteFileParams => [path],
    fs::CreateDirectoryParams => [path],
    fs::GetMetadataParams => [path],
    fs::CanonicalizeParams => [path],
    fs::ReadDirectoryParams => [path],
    fs::WalkParams => [path],
    fs::RemoveParams => [path],
    fs::CopyParams => [source_path, destination_path],
);

/// Serialises a result object.
pub(crate) fn to_wire(value: &impl Serialize) -> Result<Box<RawValue>, RpcError> {
    serde_json::value::to_raw_value(value).map_err(RpcError::fs_helper_message)
}

/// Decodes a helper's result object.
pub(crate) fn from_wire<T: DeserializeOwned>(response: &RawValue) -> Result<T, RpcError> {
    serde_json::from_str(response.get()).map_err(RpcError::fs_helper_message)
}

/// Builds `O` from the method's `params` and runs it as their `sandbox` members demand (see
/// [`execute`]): what every one-shot handler does first.
pub(crate) async fn execute_params<O: FsOperation>(
    state: &FsState,
    session: &Session,
    params: O::Params,
) -> Result<O::Output, RpcError> {
    let prepared = prepare::<O>(state, params)?;
    execute_decided(state, session, prepared).await
}

/// An operation built from its params, with the paths to check for lookalikes and the
/// decision on its sandbox, ready for [`execute_decided`].
pub(crate) struct Prepared<O> {
    operation: O,
    spelled: SpelledPaths,
    pub(crate) decision: SandboxDecision,
}

impl<O> Prepared<O> {
    /// The operation, for a handler that completes it before it runs.
    pub(crate) fn operation_mut(&mut self) -> &mut O {
        &mut self.operation
    }
}

/// Builds `O` from `params` and decides its sandbox, without running it: for a handler
/// with work to do between the two (`fs/readFile` reserves room for an answer it makes in
/// the server).
pub(crate) fn prepare<O: FsOperation>(
    state: &FsState,
    mut params: O::Params,
) -> Result<Prepared<O>, RpcError> {
    let (sandbox, top_level_policy) = params.take_sandbox();
    let spelled = SpelledPaths::of(params.wire_paths());
    let operation = O::from_params(params, &state.config)?;
    let decision = state
        .sandbox
        .decide_fs(sandbox.as_ref(), top_level_policy.as_ref())?;
    Ok(Prepared {
        operation,
        spelled,
        decision,
    })
}

/// Runs a prepared operation: directly, on the worker threads, when the policy does not
/// restrict the file system; otherwise in an fs helper that enforces the policy, or not at
/// all when it cannot be enforced. The paths in `spelled` are checked for lookalike names
/// on the side that then acts on them: the worker thread, or the fs helper (see
/// `ambiguous_names`).
pub(crate) async fn execute_decided<O: FsOperation>(
    state: &FsState,
    session: &Session,
    prepared: Prepared<O>,
) -> Result<O::Output, RpcError> {
    let Prepared {
        operation,
        spelled,
        decision,
    } = prepared;
    match decision {
        SandboxDecision::Unsandboxed => {
            operation.run_in_server(&state.pool, session, spelled).await
        }
        SandboxDecision::Enforce(policy) => {
            state.sandbox.end_helpers_with(session);
            let mut params = operation.helper_params();
            if !spelled.is_empty() {
                params[ambiguous_names::HELPER_MEMBER] = spelled.to_helper();
            }
            let params = to_wire(&params)?;
            let response = state
                .sandbox
                .run_fs_helper(session.id(), O::METHOD, params, &policy)
                .await?;
            operation.output_from_wire(&response)
        }
    }
}

/// Check 4 of `fs/open` (§5.14): a handle outlives any helper that could enforce a
/// policy, so a policy that needs enforcement is refused.
pub(crate) fn check_streaming(
    sandbox_runtime: &SandboxRuntime,
    sandbox: Option<&Value>,
    top_level_policy: Option<&Value>,
) -> Result<(), RpcError> {
    if sandbox_runtime
        .decide_fs(sandbox, top_level_policy)?
        .needs_enforcement()
    {
        return Err(RpcError::sandboxed_streaming_refused());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use exec_server_core::outbound::outbound_queue;
    use exec_server_core::session::SessionRegistry;
    use exec_server_sandbox::SandboxConfig;
    use serde_json::json;

    use super::*;

    /// Runs `operation` for `session` as its `sandbox` (and legacy top-level `sandboxPolicy`)
    /// demands (see [`execute_decided`]).
    async fn execute<O: FsOperation>(
        state: &FsState,
        session: &Session,
        (operation, spelled): (O, SpelledPaths),
        sandbox: Option<&Value>,
        top_level_policy: Option<&Value>,
    ) -> Result<O::Output, RpcError> {
        let decision = state.sandbox.decide_fs(sandbox, top_level_policy)?;
        let prepared = Prepared {
            operation,
            spelled,
            decision,
        };
        execute_decided(state, session, prepared).await
    }

    /// Records whether it ran.
    #[derive(Debug)]
    struct Probe(Arc<AtomicBool>);

    impl FsOperation for Probe {
        type Params = fs::WriteFileParams;
        type Output = ();
        const METHOD: &'static str = "fs/writeFile";

        fn from_params(_params: Self::Params, _limits: &FsConfig) -> Result<Self, RpcError> {
            unreachable!("built by the test")
        }

        fn targets(&self) -> Vec<Target> {
            Vec::new()
        }

        fn run(self, _deadline: Deadline) -> Result<(), RpcError> {
            self.0.store(true, Ordering::SeqCst);
            Ok(())
        }

        fn run_confined(self, _policy: &SandboxPolicy) -> Result<(), RpcError> {
            unreachable!("the runtime's helper program does not exist")
        }

        fn helper_params(&self) -> Value {
            json!({"path": "/nonexistent/x", "dataBase64": "", "sandbox": null})
        }

        fn output_to_wire((): ()) -> Result<Box<RawValue>, RpcError> {
            to_wire(&json!({}))
        }

        fn output_from_wire(&self, _response: &RawValue) -> Result<(), RpcError> {
            Ok(())
        }
    }

    /// A runtime whose helper program does not exist: enforced requests never run here.
    fn runtime() -> SandboxRuntime {
        SandboxRuntime::new(SandboxConfig::default(), 1024)
            .with_helper_executable("/nonexistent/exec-server")
    }

    async fn runs(sandbox: Option<&Value>, top_level: Option<&Value>) -> Result<bool, RpcError> {
        let config = FsConfig::default();
        let state = FsState {
            pool: BlockingPool::new(&config),
            config,
            sandbox: runtime().into(),
            inotify: std::sync::Mutex::new(None),
        };
        let registry = SessionRegistry::new(std::time::Duration::from_secs(30));
        let (outbound, _drain) = outbound_queue(1, None);
        let (session, _) = registry.create(outbound);
        let ran = Arc::new(AtomicBool::new(false));
        let probe = Probe(Arc::clone(&ran));
        execute(
            &state,
            &session,
            (probe, SpelledPaths::default()),
            sandbox,
            top_level,
        )
        .await?;
        Ok(ran.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn policies_without_restrictions_run_directly() {
        for sandbox in [
            json!({"permissions": {"type": "disabled"}}),
            json!({"permissions": {"type": "external"}}),
            json!({"permissions": {"type": "managed", "file_system": {"type": "unrestricted"}}}),
            json!({"sandboxPolicy": {"type": "danger-full-access"}}),
        ] {
            assert_eq!(runs(Some(&sandbox), None).await, Ok(true), "{sandbox}");
            assert_eq!(
                check_streaming(&runtime(), Some(&sandbox), None),
                Ok(()),
                "{sandbox}"
            );
        }
        assert_eq!(runs(None, None).await, Ok(true));
        assert_eq!(runs(Some(&Value::Null), None).await, Ok(true));
    }

    #[tokio::test]
    async fn enforcing_policies_never_run_in_the_server() {
        let restricted =
            json!({"permissions": {"type": "managed", "file_system": {"type": "restricted"}}});
        let workspace = json!({"type": "workspace-write"});
        for (sandbox, top_level) in [(Some(&restricted), None), (None, Some(&workspace))] {
            let error = runs(sandbox, top_level).await.unwrap_err();
            // The helper program is missing: the policy cannot be prepared or the helper
            // cannot be spawned; either way nothing ran here.
            assert!(
                error.message.starts_with("failed to prepare fs sandbox")
                    || error
                        .message
                        .starts_with("failed to spawn fs sandbox helper"),
                "{error:?}"
            );
        }
        assert_eq!(
            check_streaming(&runtime(), None, Some(&workspace)),
            Err(RpcError::sandboxed_streaming_refused())
        );
    }

    #[tokio::test]
    async fn shape_errors_are_invalid_params() {
        let error = runs(Some(&json!({})), None).await.unwrap_err();
        assert_eq!(error.code, -32602);
        assert_eq!(
            check_streaming(&runtime(), Some(&json!({})), None)
                .unwrap_err()
                .code,
            -32602
        );
    }
}

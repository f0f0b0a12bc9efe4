//! Where an `fs/*` operation runs, decided from its `sandbox` member (PROTOCOL §5.2.2).
//!
//! Every one-shot method hands its decoded and validated operation to [`execute`], and
//! `fs/open` asks [`check_streaming`]; nothing else interprets `sandbox`. Running enforced
//! operations in the sandbox helper therefore changes [`execute`] alone.

use exec_server_core::proto::RpcError;
use exec_server_sandbox::policy::decide_fs;
use serde_json::Value;

use crate::blocking;

/// One filesystem operation with host paths and every default applied: exactly what runs,
/// in the server or elsewhere.
pub(crate) trait FsOperation: Send + 'static {
    type Output: Send + 'static;

    /// Runs the operation synchronously on the calling thread.
    fn run(self) -> Result<Self::Output, RpcError>;
}

/// Runs `operation` as its `sandbox` (and legacy top-level `sandboxPolicy`) demands:
/// directly, on the blocking pool, when the policy does not restrict the file system;
/// otherwise it fails closed, because this executor cannot enforce a policy yet.
pub(crate) async fn execute<O: FsOperation>(
    operation: O,
    sandbox: Option<&Value>,
    top_level_policy: Option<&Value>,
) -> Result<O::Output, RpcError> {
    if needs_enforcement(sandbox, top_level_policy)? {
        return Err(RpcError::fs_sandbox_unenforceable());
    }
    blocking::run(move || operation.run()).await
}

/// Check 4 of `fs/open` (§5.14): a handle outlives any helper that could enforce a
/// policy, so a policy that needs enforcement is refused.
pub(crate) fn check_streaming(
    sandbox: Option<&Value>,
    top_level_policy: Option<&Value>,
) -> Result<(), RpcError> {
    if needs_enforcement(sandbox, top_level_policy)? {
        return Err(RpcError::sandboxed_streaming_refused());
    }
    Ok(())
}

fn needs_enforcement(
    sandbox: Option<&Value>,
    top_level_policy: Option<&Value>,
) -> Result<bool, RpcError> {
    Ok(decide_fs(sandbox, top_level_policy)?.needs_enforcement())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    /// Records whether it ran.
    struct Probe(Arc<AtomicBool>);

    impl FsOperation for Probe {
        type Output = ();

        fn run(self) -> Result<(), RpcError> {
            self.0.store(true, Ordering::SeqCst);
            Ok(())
        }
    }

    async fn runs(sandbox: Option<&Value>, top_level: Option<&Value>) -> Result<bool, RpcError> {
        let ran = Arc::new(AtomicBool::new(false));
        execute(Probe(Arc::clone(&ran)), sandbox, top_level).await?;
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
            assert_eq!(check_streaming(Some(&sandbox), None), Ok(()), "{sandbox}");
        }
        assert_eq!(runs(None, None).await, Ok(true));
        assert_eq!(runs(Some(&Value::Null), None).await, Ok(true));
    }

    #[tokio::test]
    async fn enforcing_policies_fail_closed_without_running() {
        let restricted =
            json!({"permissions": {"type": "managed", "file_system": {"type": "restricted"}}});
        let workspace = json!({"type": "workspace-write"});
        assert_eq!(
            runs(Some(&restricted), None).await,
            Err(RpcError::fs_sandbox_unenforceable())
        );
        assert_eq!(
            runs(None, Some(&workspace)).await,
            Err(RpcError::fs_sandbox_unenforceable())
        );
        assert_eq!(
            check_streaming(Some(&restricted), None),
            Err(RpcError::sandboxed_streaming_refused())
        );
    }

    #[tokio::test]
    async fn shape_errors_are_invalid_params() {
        let error = runs(Some(&json!({})), None).await.unwrap_err();
        assert_eq!(error.code, -32602);
        assert_eq!(
            check_streaming(Some(&json!({})), None).unwrap_err().code,
            -32602
        );
    }
}

//! The `sandbox` member, normalised into one decision (SANDBOX.md §2).
//!
//! Callers route on the result (SANDBOX.md §3): [`SandboxDecision::Unsandboxed`] runs the
//! operation exactly as without a sandbox; [`SandboxDecision::Enforce`] must run under
//! enforcement or fail closed.

use std::path::{Path, PathBuf};

use exec_server_proto::RpcError;
use serde_json::Value;

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
}

/// The internal policy (SANDBOX.md §2.8).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxPolicy {
    /// Where the policy came from, kept for enforcement (filled in by the normaliser).
    pub source: Value,
    /// The working directory the policy is relative to, when known.
    pub cwd: Option<PathBuf>,
}

/// Decides a `fs/*` request's sandbox. `top_level_policy` is a legacy `sandboxPolicy`
/// member placed directly in the params (PROTOCOL §5.2.1). Errors carry the fs codes.
pub fn decide_fs(
    sandbox: Option<&Value>,
    top_level_policy: Option<&Value>,
) -> Result<SandboxDecision, RpcError> {
    let wrapped;
    let sandbox = match (
        sandbox.filter(|v| !v.is_null()),
        top_level_policy.filter(|v| !v.is_null()),
    ) {
        (Some(_), Some(_)) => {
            return Err(RpcError::invalid_params(
                "sandbox and sandboxPolicy must not both be present",
            ))
        }
        (Some(sandbox), None) => sandbox,
        (None, Some(policy)) => {
            wrapped = serde_json::json!({ "sandboxPolicy": policy });
            &wrapped
        }
        (None, None) => return Ok(SandboxDecision::Unsandboxed),
    };
    decide(sandbox, None, false)
}

/// Decides a `process/start` request's sandbox; `cwd` is the request's working directory.
pub fn decide_process(sandbox: Option<&Value>, cwd: &Path) -> Result<SandboxDecision, RpcError> {
    match sandbox.filter(|v| !v.is_null()) {
        None => Ok(SandboxDecision::Unsandboxed),
        Some(sandbox) => decide(sandbox, Some(cwd), true),
    }
}

fn decide(
    sandbox: &Value,
    cwd: Option<&Path>,
    for_process: bool,
) -> Result<SandboxDecision, RpcError> {
    let object = sandbox
        .as_object()
        .ok_or_else(|| RpcError::invalid_params("invalid type: sandbox must be an object"))?;
    let enforce = || {
        Ok(SandboxDecision::Enforce(SandboxPolicy {
            source: sandbox.clone(),
            cwd: cwd.map(Path::to_path_buf),
        }))
    };
    let tag = |v: &Value, member: &str| v.get(member).and_then(Value::as_str).map(str::to_owned);
    match (object.get("permissions"), object.get("sandboxPolicy")) {
        (Some(permissions), None) => match tag(permissions, "type").as_deref() {
            Some("disabled") | Some("external") => Ok(SandboxDecision::Unsandboxed),
            Some("managed") => {
                let unrestricted = permissions
                    .get("file_system")
                    .and_then(|fs| tag(fs, "type"))
                    .as_deref()
                    == Some("unrestricted");
                let network_on = tag(permissions, "network").as_deref() == Some("enabled");
                if unrestricted && (!for_process || network_on) {
                    Ok(SandboxDecision::Unsandboxed)
                } else {
                    enforce()
                }
            }
            Some(other) => Err(RpcError::invalid_params(format!(
                "unknown variant `{other}`, expected one of `managed`, `disabled`, `external`"
            ))),
            None => enforce(),
        },
        (None, Some(policy)) => match tag(policy, "type").as_deref() {
            Some("danger-full-access") | Some("external-sandbox") => Ok(SandboxDecision::Unsandboxed),
            Some("read-only") | Some("workspace-write") => enforce(),
            Some(other) => Err(RpcError::invalid_params(format!(
                "unknown variant `{other}`, expected one of `danger-full-access`, `read-only`, `workspace-write`, `external-sandbox`"
            ))),
            None => Err(RpcError::invalid_params("missing field `type`")),
        },
        _ => Err(RpcError::invalid_params(
            "sandbox must contain either permissions or sandboxPolicy",
        )),
    }
}

//! The user-space checks of the fs helper (SANDBOX.md §5.6), per operation, and the
//! classification of permission errors as sandbox denials (§7.1).
//!
//! They run after Landlock is in force and before the operation, and refuse what can be
//! seen up front. They are not the last word: a check of a path is only worth what the
//! operation then opens, so the executor approves every path again with
//! [`SandboxPolicy::approve`] and acts through descriptors opened exactly at the approved
//! resolution (`crate::anchored`), entry by entry for recursive operations. Together they
//! are the only enforcement of carve-outs, deny entries and metadata confidentiality, and a
//! clearer second line for the root boundaries.

use std::path::PathBuf;

use exec_server_proto::path::parse_path;
use exec_server_proto::RpcError;
use serde_json::Value;

use crate::policy::{resolve, AccessKind, SandboxPolicy};

/// A resolved target of an operation and the access it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedTarget {
    pub path: PathBuf,
    pub access: AccessKind,
}

/// Checks the targets of `operation` against `policy`; returns them (resolved) for the
/// later classification of permission errors.
pub fn precheck(
    operation: &str,
    params: &Value,
    policy: &SandboxPolicy,
) -> Result<Vec<CheckedTarget>, RpcError> {
    let follow = params
        .get("followSymlinks")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let recursive = params
        .get("recursive")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let read = |member: &str, follow_last: bool| -> Result<CheckedTarget, RpcError> {
        let path = resolve(&path_member(params, member)?, follow_last);
        policy.check_read(&path)?;
        Ok(CheckedTarget {
            path,
            access: AccessKind::Read,
        })
    };
    let write = |member: &str, follow_last: bool| -> Result<CheckedTarget, RpcError> {
        let path = resolve(&path_member(params, member)?, follow_last);
        policy.check_write(&path)?;
        Ok(CheckedTarget {
            path,
            access: AccessKind::Write,
        })
    };
    match operation {
        "fs/readFile" | "fs/getMetadata" => Ok(vec![read("path", follow)?]),
        // The answer reveals the target, so the last link is always followed.
        "fs/canonicalize" | "fs/readDirectory" | "fs/walk" => Ok(vec![read("path", true)?]),
        "fs/writeFile" | "fs/createDirectory" => Ok(vec![write("path", follow)?]),
        "fs/remove" => {
            // Links are removed, never followed.
            let target = write("path", false)?;
            let is_dir = std::fs::symlink_metadata(&target.path).is_ok_and(|m| m.is_dir());
            if is_dir && recursive {
                policy.check_write_tree(&target.path)?;
            }
            Ok(vec![target])
        }
        "fs/copy" => {
            let source = read("sourcePath", false)?;
            let destination = write("destinationPath", true)?;
            policy.check_write_tree(&destination.path)?;
            Ok(vec![source, destination])
        }
        other => Err(RpcError::invalid_request(format!(
            "unsupported fs sandbox helper operation {other}"
        ))),
    }
}

fn path_member(params: &Value, member: &str) -> Result<PathBuf, RpcError> {
    let text = params
        .get(member)
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params(format!("missing field `{member}`")))?;
    parse_path(text).map_err(|e| e.into_rpc(text))
}

/// §7.1: a permission error (`EACCES`/`EPERM`) of the operation is a sandbox denial unless
/// the policy allows every target's access, in which case ordinary file permissions
/// refused it.
pub(crate) fn mark_denial(
    error: RpcError,
    targets: &[CheckedTarget],
    policy: &SandboxPolicy,
) -> RpcError {
    let permission_error = error.code == exec_server_proto::error::code::INVALID_REQUEST
        && error.data.is_none()
        && (error.message.ends_with("(os error 13)") || error.message.ends_with("(os error 1)"));
    if !permission_error {
        return error;
    }
    let allowed = targets.iter().all(|t| policy.allows(&t.path, t.access));
    if allowed {
        error
    } else {
        error.with_sandbox_denied()
    }
}

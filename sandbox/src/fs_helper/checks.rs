//! The user-space checks of the fs helper (SANDBOX.md §5.6) of the targets a decoded
//! operation reports, and the classification of permission errors as sandbox denials (§7.1).
//!
//! They run after Landlock is in force and before the operation, and refuse what can be
//! seen up front. They are not the last word: a check of a path is only worth what the
//! operation then opens, so the executor approves every path again with
//! [`SandboxPolicy::approve`] and acts through descriptors opened exactly at the approved
//! resolution (`crate::anchored`), entry by entry for recursive operations. Together they
//! are the only enforcement of carve-outs, deny entries and metadata confidentiality, and a
//! clearer second line for the root boundaries.

use std::path::PathBuf;

use exec_server_proto::RpcError;

use crate::policy::{resolve, AccessKind, SandboxPolicy};

/// A path an operation will touch and what it needs there, as the host's executor describes
/// its decoded operation: the executor knows the methods, these checks know the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The host path as the request names it, not yet resolved.
    pub path: PathBuf,
    /// Whether a symbolic link in the last component is followed.
    pub follow_last: bool,
    pub need: Need,
}

/// The access an operation needs at a [`Target`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Read,
    Write,
    /// Write access to the path and to everything below it (a recursive destination).
    WriteTree,
    /// [`Need::WriteTree`] when the path is a directory now, [`Need::Write`] otherwise (a
    /// recursive removal).
    WriteTreeIfDirectory,
}

/// A resolved target of an operation and the access it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedTarget {
    pub path: PathBuf,
    pub access: AccessKind,
}

/// Checks `targets` against `policy`; returns them (resolved) for the later
/// classification of permission errors.
pub fn precheck(
    targets: &[Target],
    policy: &SandboxPolicy,
) -> Result<Vec<CheckedTarget>, RpcError> {
    targets
        .iter()
        .map(|target| {
            let path = resolve(&target.path, target.follow_last);
            let access = match target.need {
                Need::Read => {
                    policy.check_read(&path)?;
                    AccessKind::Read
                }
                Need::Write => {
                    policy.check_write(&path)?;
                    AccessKind::Write
                }
                Need::WriteTree => {
                    policy.check_write(&path)?;
                    policy.check_write_tree(&path)?;
                    AccessKind::Write
                }
                Need::WriteTreeIfDirectory => {
                    policy.check_write(&path)?;
                    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                        policy.check_write_tree(&path)?;
                    }
                    AccessKind::Write
                }
            };
            Ok(CheckedTarget { path, access })
        })
        .collect()
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

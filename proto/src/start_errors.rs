//! `data.kind` of a failed `process/start` (CODEX-0171 §2.2): codex 0.171.0 tells a client
//! why a start failed with one of five kinds, next to an unchanged code and message.
//!
//! The kind is attached where the error is made, because only there is it known whether
//! the failure was the OS refusing the spawn or the sandbox policy that could not be built
//! or enforced; the message texts of the catalogue (`error.rs`) stay as they are.

use std::fmt;
use std::io;

use serde_json::{Map, Value};

use crate::error::{io_error_text, RpcError};

/// The member of `data` that carries the kind.
const KIND: &str = "kind";

/// Why a `process/start` failed, as codex 0.171.0 names it on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartErrorKind {
    /// The program, its `#!` interpreter or the working directory does not exist (`ENOENT`).
    SpawnNotFound,
    /// The OS refused to execute the program (`EACCES`, `EPERM`).
    SpawnPermissionDenied,
    /// Any other failure to create the process.
    SpawnFailed,
    /// The host cannot enforce the requested sandbox.
    SandboxUnavailable,
    /// The sandbox policy could not be built from the request.
    SandboxPreparation,
}

impl StartErrorKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SpawnNotFound => "spawnNotFound",
            Self::SpawnPermissionDenied => "spawnPermissionDenied",
            Self::SpawnFailed => "spawnFailed",
            Self::SandboxUnavailable => "sandboxUnavailable",
            Self::SandboxPreparation => "sandboxPreparation",
        }
    }

    /// The kind of a spawn that failed with `error`: what the OS said, not the text
    /// (`ENOENT` is `NotFound`; `EACCES` and `EPERM` are both `PermissionDenied`).
    pub fn of_spawn_error(error: &io::Error) -> Self {
        match error.kind() {
            io::ErrorKind::NotFound => Self::SpawnNotFound,
            io::ErrorKind::PermissionDenied => Self::SpawnPermissionDenied,
            _ => Self::SpawnFailed,
        }
    }
}

impl fmt::Display for StartErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl RpcError {
    /// -32603 `failed to spawn process: <os error>` with the kind the OS error gives.
    pub fn spawn_os_error(error: &io::Error) -> Self {
        Self::spawn_failed(io_error_text(error))
            .with_start_error_kind(StartErrorKind::of_spawn_error(error))
    }

    /// -32603 `failed to spawn process: <reason>` for a failure that is no OS error
    /// (`spawnFailed`).
    pub fn spawn_failed_other(reason: impl fmt::Display) -> Self {
        Self::spawn_failed(reason).with_start_error_kind(StartErrorKind::SpawnFailed)
    }

    /// Sets `data.kind`, keeping any other member of `data` (a sandbox denial keeps its
    /// `sandboxDenied`).
    pub fn with_start_error_kind(mut self, kind: StartErrorKind) -> Self {
        let mut data = match self.data.take() {
            Some(Value::Object(members)) => members,
            _ => Map::new(),
        };
        data.insert(KIND.to_owned(), Value::from(kind.as_str()));
        self.data = Some(Value::Object(data));
        self
    }

    /// Sets `data.kind` to `kind` unless the error already has a kind: for paths where any
    /// failure not classified closer to its cause is of one kind.
    pub fn or_start_error_kind(self, kind: StartErrorKind) -> Self {
        if self.start_error_kind().is_some() {
            self
        } else {
            self.with_start_error_kind(kind)
        }
    }

    /// `data.kind`, when set.
    pub fn start_error_kind(&self) -> Option<&str> {
        self.data.as_ref()?.get(KIND)?.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_map_to_their_kinds() {
        // ENOENT, EACCES, EPERM, ENOTDIR, ENOEXEC, EMFILE (the same numbers on every Linux
        // architecture).
        let cases = [
            (2, "spawnNotFound"),
            (13, "spawnPermissionDenied"),
            (1, "spawnPermissionDenied"),
            (20, "spawnFailed"),
            (8, "spawnFailed"),
            (24, "spawnFailed"),
        ];
        for (errno, kind) in cases {
            let error = RpcError::spawn_os_error(&io::Error::from_raw_os_error(errno));
            assert_eq!(error.start_error_kind(), Some(kind), "{errno}");
            assert_eq!(error.code, crate::error::code::INTERNAL_ERROR);
            assert!(error.message.starts_with("failed to spawn process: "));
        }
        let custom = io::Error::new(io::ErrorKind::InvalidInput, "nul");
        assert_eq!(
            RpcError::spawn_os_error(&custom).start_error_kind(),
            Some("spawnFailed")
        );
    }

    #[test]
    fn the_kind_joins_a_sandbox_denial_and_is_written_first() {
        let error = RpcError::spawn_failed("Permission denied (os error 13)")
            .with_sandbox_denied()
            .with_start_error_kind(StartErrorKind::SpawnPermissionDenied);
        assert!(error.is_sandbox_denied());
        assert_eq!(
            serde_json::to_string(&error).unwrap(),
            r#"{"code":-32603,"data":{"kind":"spawnPermissionDenied","sandboxDenied":true},"message":"failed to spawn process: Permission denied (os error 13)"}"#
        );
    }

    #[test]
    fn a_kind_set_closer_to_the_cause_is_kept() {
        let error = RpcError::sandbox_intent_unenforceable()
            .with_start_error_kind(StartErrorKind::SandboxUnavailable)
            .or_start_error_kind(StartErrorKind::SpawnFailed);
        assert_eq!(error.start_error_kind(), Some("sandboxUnavailable"));
        let error =
            RpcError::launcher_timed_out(5).or_start_error_kind(StartErrorKind::SpawnFailed);
        assert_eq!(error.start_error_kind(), Some("spawnFailed"));
    }
}

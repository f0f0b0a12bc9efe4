//! Refusing a path that could name two files (docs/SECURITY.md, "Name fidelity").
//!
//! `fs/readDirectory` answers a name that is not UTF-8 with its lossy text, as codex does,
//! so `a\xff` is listed as `a\u{FFFD}`. A client that ignores the entry's `uri` and sends
//! `dir + "/" + fileName` would then reach a different file, the one literally named
//! `a\u{FFFD}`, or nothing. A path that a request spells as text with U+FFFD is therefore
//! checked where the operation runs: when a directory on it also holds a name that is not
//! UTF-8 and reads the same, the request is refused rather than acted on.
//!
//! A `file:` URI whose U+FFFD is percent-encoded (`%EF%BF%BD`, what `to_file_uri` and
//! `fs/walk` produce) is byte-exact and never checked, so both files stay addressable.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use exec_server_core::proto::path::to_wire_path;
use exec_server_core::proto::RpcError;
use exec_server_sandbox::anchored::Directory;
use exec_server_sandbox::lookalikes;
use exec_server_sandbox::policy::{AccessKind, SandboxPolicy};
use serde_json::Value;

use crate::paths::{host_path, native};

/// The helper request member that carries the paths to check (SANDBOX.md §4.4): the
/// helper gets UTF-8 paths as native text, so it cannot tell on its own which of them
/// the client spelled as text.
pub(crate) const HELPER_MEMBER: &str = "ambiguityChecks";

/// The host paths of a request that the client spelled as text containing U+FFFD.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SpelledPaths(Vec<PathBuf>);

impl SpelledPaths {
    /// The paths among `values` (a request's path members as sent) to check. The test is
    /// on the text as sent, so the normal case costs one scan of each path string; a
    /// value that does not parse is left to the method, which refuses it.
    pub(crate) fn of<'a>(values: impl IntoIterator<Item = &'a str>) -> Self {
        Self(
            values
                .into_iter()
                .filter(|value| lookalikes::may_be_ambiguous(value))
                .filter_map(|value| host_path(value).ok())
                .collect(),
        )
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The helper request member's value: each path as the helper reads it back exactly,
    /// its `..` resolved through links as the kernel does (`to_wire_path`).
    pub(crate) fn to_helper(&self) -> Value {
        Value::Array(
            self.0
                .iter()
                .map(|p| Value::from(to_wire_path(p)))
                .collect(),
        )
    }

    /// Takes the member out of a helper request's params.
    pub(crate) fn take_from_helper(params: &mut Value) -> Result<Self, RpcError> {
        let Some(member) = params.as_object_mut().and_then(|o| o.remove(HELPER_MEMBER)) else {
            return Ok(Self::default());
        };
        let uris: Vec<String> =
            serde_json::from_value(member).map_err(|e| RpcError::invalid_params(e.to_string()))?;
        uris.iter()
            .map(|uri| host_path(uri))
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Refuses a path with a lookalike, listing directories with the server's rights.
    pub(crate) fn check(&self) -> Result<(), RpcError> {
        self.check_with(lookalikes::list)
    }

    /// Refuses a path with a lookalike, listing only directories `policy` lets the client
    /// read, through a descriptor opened exactly at their approved location. A directory
    /// the client may not read is not listed: its names cannot have come from a listing,
    /// and the refusal would tell what it holds.
    pub(crate) fn check_confined(&self, policy: &SandboxPolicy) -> Result<(), RpcError> {
        self.check_with(|directory| {
            let approved = policy.approve(directory, true, AccessKind::Read).ok()?;
            let names = Directory::open(&approved).ok()?.names().ok()?;
            Some(names.filter_map(Result::ok).collect())
        })
    }

    /// `list` gives a directory's names, or `None` when it cannot be listed (a missing
    /// directory is the operation's own error to report).
    fn check_with(&self, list: impl Fn(&Path) -> Option<Vec<OsString>>) -> Result<(), RpcError> {
        match self
            .0
            .iter()
            .find(|path| lookalikes::is_ambiguous(path, &list))
        {
            Some(path) => Err(RpcError::ambiguous_path(&native(path))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    use super::*;

    fn lookalikes() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(OsString::from_vec(b"a\xff".to_vec())), b"x").unwrap();
        std::fs::write(dir.path().join("a\u{FFFD}"), b"y").unwrap();
        let spelled = format!("{}/a\u{FFFD}", dir.path().to_str().unwrap());
        (dir, spelled)
    }

    #[test]
    fn text_with_a_lookalike_is_refused() {
        let (_dir, spelled) = lookalikes();
        let checked = SpelledPaths::of([spelled.as_str()]);
        assert_eq!(checked.check(), Err(RpcError::ambiguous_path(&spelled)));
        let uri = format!("file://{spelled}");
        assert!(SpelledPaths::of([uri.as_str()]).check().is_err());
    }

    #[test]
    fn encoded_uris_and_plain_names_are_not_checked() {
        let (dir, spelled) = lookalikes();
        let exact = exec_server_core::proto::path::to_file_uri(Path::new(&spelled));
        assert!(SpelledPaths::of([exact.as_str()]).is_empty());
        let plain = dir.path().join("b");
        assert!(SpelledPaths::of([plain.to_str().unwrap()]).is_empty());
    }

    #[test]
    fn text_without_a_lookalike_passes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a\u{FFFD}"), b"y").unwrap();
        let spelled = format!("{}/a\u{FFFD}", dir.path().to_str().unwrap());
        assert_eq!(SpelledPaths::of([spelled.as_str()]).check(), Ok(()));
    }

    #[test]
    fn the_helper_member_round_trips() {
        let (_dir, spelled) = lookalikes();
        let checked = SpelledPaths::of([spelled.as_str()]);
        let mut params = serde_json::json!({ "path": spelled, HELPER_MEMBER: checked.to_helper() });
        assert_eq!(SpelledPaths::take_from_helper(&mut params), Ok(checked));
        assert!(params.get(HELPER_MEMBER).is_none());
    }
}

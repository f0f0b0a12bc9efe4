//! The `search/*` messages on the wire: method names, params, results, notifications, and
//! the error each refusal answers with (one constructor per message).

use exec_server_core::proto::RpcError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The family label of gating errors.
pub const FAMILY_LABEL: &str = "search";
/// The extension a client names in `initialize.params.extensions` to receive
/// `search/match` and `search/done`.
pub const EXTENSION: &str = "search";
/// Starts a search; answers `{searchId}` at once.
pub const START: &str = "search/start";
/// Stops a running search.
pub const CANCEL: &str = "search/cancel";
/// One match (notification).
pub const MATCH: &str = "search/match";
/// The end of a search, sent exactly once per started search (notification).
pub const DONE: &str = "search/done";

/// Longest `searchId` accepted, in bytes: ids are kept per session while their search runs.
pub const MAX_SEARCH_ID_BYTES: usize = 256;

/// `search/start` params. Optional members accept `null` as "absent".
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StartParams {
    pub(crate) search_id: String,
    pub(crate) path: String,
    pub(crate) pattern: String,
    /// `false` (the default): `pattern` is a literal string.
    #[serde(default)]
    pub(crate) regex: Option<bool>,
    #[serde(default)]
    pub(crate) case_insensitive: Option<bool>,
    #[serde(default)]
    pub(crate) include: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) exclude: Option<Vec<String>>,
    /// `true` (the default): `.gitignore` rules leave files out.
    #[serde(default)]
    pub(crate) respect_gitignore: Option<bool>,
    #[serde(default)]
    pub(crate) max_results: Option<u64>,
    #[serde(default)]
    pub(crate) sandbox: Option<Value>,
    /// The legacy top-level policy `fs/*` accepts too; honoured so that a request of that
    /// generation never runs unsandboxed by mistake.
    #[serde(default)]
    pub(crate) sandbox_policy: Option<Value>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StartResult {
    pub(crate) search_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CancelParams {
    pub(crate) search_id: String,
}

/// `search/cancel` answers `{}`.
#[derive(Debug, Serialize)]
pub(crate) struct CancelResult {}

/// `search/match` params.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MatchNotification<'a> {
    pub(crate) search_id: &'a str,
    /// Canonical `file:` URI of the file.
    pub(crate) path: &'a str,
    /// 1-based.
    pub(crate) line_number: u64,
    /// The line without its terminator, lossily decoded, at most `search.max_line_bytes`.
    pub(crate) line: &'a str,
    /// Byte offsets of the match in the UTF-8 text of the whole (untruncated) line.
    pub(crate) start: usize,
    pub(crate) end: usize,
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) line_truncated: bool,
}

/// `search/done` params.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DoneNotification<'a> {
    pub(crate) search_id: &'a str,
    /// `search/match` notifications sent for this search.
    pub(crate) matches: u64,
    /// More matches existed than `maxResults` allowed.
    pub(crate) truncated: bool,
    /// The search was stopped by `search/cancel` (or the session ending).
    pub(crate) cancelled: bool,
    /// Why the search ended early, when it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

pub(crate) fn extension_not_accepted() -> RpcError {
    RpcError::invalid_request(format!(
        "search/start sends `search/match` and `search/done` notifications, which this connection did not opt in to; list `{EXTENSION}` in initialize.params.extensions"
    ))
}

pub(crate) fn empty_search_id() -> RpcError {
    RpcError::invalid_params("searchId must not be empty")
}

pub(crate) fn search_id_too_long() -> RpcError {
    RpcError::invalid_params(format!(
        "searchId must be at most {MAX_SEARCH_ID_BYTES} bytes"
    ))
}

pub(crate) fn empty_pattern() -> RpcError {
    RpcError::invalid_params("pattern must not be empty")
}

pub(crate) fn invalid_pattern(reason: impl std::fmt::Display) -> RpcError {
    RpcError::invalid_params(format!("invalid pattern: {reason}"))
}

/// `member` is `include` or `exclude`.
pub(crate) fn invalid_glob(member: &str, glob: &str, reason: impl std::fmt::Display) -> RpcError {
    RpcError::invalid_params(format!("invalid {member} glob `{glob}`: {reason}"))
}

/// The globs were each valid but could not be combined.
pub(crate) fn invalid_globs(reason: impl std::fmt::Display) -> RpcError {
    RpcError::invalid_params(format!("invalid include or exclude globs: {reason}"))
}

pub(crate) fn max_results_out_of_range(limit: u64) -> RpcError {
    RpcError::invalid_params(format!("maxResults must be between 1 and {limit}"))
}

pub(crate) fn search_already_running(search_id: &str) -> RpcError {
    RpcError::invalid_request(format!(
        "search `{search_id}` is already running in this session"
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn optional_outputs_are_omitted() {
        let found = MatchNotification {
            search_id: "s",
            path: "file:///a",
            line_number: 3,
            line: "abc",
            start: 1,
            end: 2,
            line_truncated: false,
        };
        assert_eq!(
            serde_json::to_value(&found).unwrap(),
            json!({"searchId": "s", "path": "file:///a", "lineNumber": 3, "line": "abc", "start": 1, "end": 2})
        );
        let done = DoneNotification {
            search_id: "s",
            matches: 0,
            truncated: false,
            cancelled: false,
            error: None,
        };
        assert_eq!(
            serde_json::to_value(&done).unwrap(),
            json!({"searchId": "s", "matches": 0, "truncated": false, "cancelled": false})
        );
        assert_eq!(serde_json::to_value(CancelResult {}).unwrap(), json!({}));
    }

    #[test]
    fn nulls_mean_absent_and_unknown_members_are_accepted() {
        let params: StartParams = serde_json::from_value(json!({
            "searchId": "s", "path": "/", "pattern": "x", "regex": null, "include": null,
            "maxResults": null, "sandbox": null, "future": 1,
        }))
        .unwrap();
        assert_eq!(params.regex, None);
        assert_eq!(params.include, None);
        assert_eq!(params.max_results, None);
    }
}

//! `fs/*` params and results (PROTOCOL §5). Paths are kept as the strings the client sent;
//! [`crate::path::parse_path`] turns them into host paths, because each member answers a
//! bad path with its own error.

use std::ffi::OsStr;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::path::to_file_uri;

pub const READ_FILE: &str = "fs/readFile";
pub const WRITE_FILE: &str = "fs/writeFile";
pub const CREATE_DIRECTORY: &str = "fs/createDirectory";
pub const GET_METADATA: &str = "fs/getMetadata";
pub const CANONICALIZE: &str = "fs/canonicalize";
pub const READ_DIRECTORY: &str = "fs/readDirectory";
pub const WALK: &str = "fs/walk";
pub const REMOVE: &str = "fs/remove";
pub const COPY: &str = "fs/copy";
pub const OPEN: &str = "fs/open";
pub const READ_BLOCK: &str = "fs/readBlock";
pub const CLOSE: &str = "fs/close";
pub const WRITE_BLOCK: &str = "fs/writeBlock";
pub const WATCH_MISSING: &str = "fs/watchMissing";
/// Server → client notification of `fs/watchMissing`.
pub const MISSING_CHANGED: &str = "fs/missingChanged";

/// Gating family label of every `fs/*` method (§2.10).
pub const FAMILY_LABEL: &str = "filesystem";

/// Maximum `handleId` length in bytes (fixed, §5.14).
pub const MAX_HANDLE_ID_BYTES: usize = 32;

/// Per-item overhead charged to the `fs/walk` response budget (fixed, §5.11).
pub const WALK_ITEM_OVERHEAD_BYTES: usize = 64;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadFileParams {
    pub path: String,
    #[serde(default)]
    pub follow_symlinks: Option<bool>,
    #[serde(default)]
    pub sandbox: Option<Value>,
    /// Legacy top-level policy (§5.2.1), honoured like `sandbox.sandboxPolicy`.
    #[serde(default)]
    pub sandbox_policy: Option<Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadFileResult<D = String> {
    pub data_base64: D,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteFileParams {
    pub path: String,
    pub data_base64: String,
    #[serde(default)]
    pub follow_symlinks: Option<bool>,
    #[serde(default)]
    pub sandbox: Option<Value>,
    #[serde(default)]
    pub sandbox_policy: Option<Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateDirectoryParams {
    pub path: String,
    #[serde(default)]
    pub recursive: Option<bool>,
    #[serde(default)]
    pub follow_symlinks: Option<bool>,
    #[serde(default)]
    pub sandbox: Option<Value>,
    #[serde(default)]
    pub sandbox_policy: Option<Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GetMetadataParams {
    pub path: String,
    #[serde(default)]
    pub follow_symlinks: Option<bool>,
    #[serde(default)]
    pub sandbox: Option<Value>,
    #[serde(default)]
    pub sandbox_policy: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    pub is_directory: bool,
    pub is_file: bool,
    pub is_symlink: bool,
    pub size: u64,
    pub created_at_ms: i64,
    pub modified_at_ms: i64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CanonicalizeParams {
    pub path: String,
    #[serde(default)]
    pub sandbox: Option<Value>,
    #[serde(default)]
    pub sandbox_policy: Option<Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct PathResult {
    pub path: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadDirectoryParams {
    pub path: String,
    #[serde(default)]
    pub sandbox: Option<Value>,
    #[serde(default)]
    pub sandbox_policy: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DirectoryEntry {
    /// The name, lossy UTF-8 as codex sends it: U+FFFD for bytes that are not UTF-8.
    pub file_name: String,
    pub is_directory: bool,
    pub is_file: bool,
    /// `Some(false)` when `file_name` is lossy; absent when it is the exact name, so an
    /// entry codex could send is exactly what codex sends (docs/PROTOCOL.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_is_exact: Option<bool>,
    /// With `name_is_exact: false`: the entry's byte-exact `file:` URI, usable as the
    /// `path` of any `fs/*` method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
}

impl DirectoryEntry {
    /// The entry `name` of `directory` (an absolute path that means the same as a `file:`
    /// URI, i.e. without `..`): a name that is not UTF-8 is marked and given its URI.
    pub fn new(directory: &Path, name: &OsStr, is_directory: bool, is_file: bool) -> Self {
        let (name_is_exact, uri) = match name.to_str() {
            Some(_) => (None, None),
            None => (Some(false), Some(to_file_uri(&directory.join(name)))),
        };
        Self {
            file_name: name.to_string_lossy().into_owned(),
            is_directory,
            is_file,
            name_is_exact,
            uri,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ReadDirectoryResult {
    pub entries: Vec<DirectoryEntry>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WalkParams {
    pub path: String,
    pub options: WalkOptions,
    #[serde(default)]
    pub sandbox: Option<Value>,
    #[serde(default)]
    pub sandbox_policy: Option<Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WalkOptions {
    pub max_depth: usize,
    pub max_directories: usize,
    pub max_entries: usize,
    pub follow_directory_symlinks: bool,
    #[serde(default)]
    pub prune_hidden_directories: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WalkEntryKind {
    Directory,
    File,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct WalkEntry {
    pub path: String,
    pub kind: WalkEntryKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct WalkError {
    pub path: String,
    pub message: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct WalkResult {
    pub entries: Vec<WalkEntry>,
    pub errors: Vec<WalkError>,
    pub truncated: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoveParams {
    pub path: String,
    #[serde(default)]
    pub recursive: Option<bool>,
    #[serde(default)]
    pub force: Option<bool>,
    #[serde(default)]
    pub follow_symlinks: Option<bool>,
    #[serde(default)]
    pub sandbox: Option<Value>,
    #[serde(default)]
    pub sandbox_policy: Option<Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyParams {
    pub source_path: String,
    pub destination_path: String,
    pub recursive: bool,
    #[serde(default)]
    pub sandbox: Option<Value>,
    #[serde(default)]
    pub sandbox_policy: Option<Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenParams {
    pub handle_id: String,
    pub path: String,
    /// Omitted (or `null`, a leniency) means [`OpenMode::Read`].
    #[serde(default)]
    pub mode: Option<OpenMode>,
    #[serde(default)]
    pub sandbox: Option<Value>,
    #[serde(default)]
    pub sandbox_policy: Option<Value>,
}

/// What an `fs/open` handle is for (codex 0.169.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OpenMode {
    /// `fs/readBlock` from an existing regular file.
    #[default]
    Read,
    /// `fs/writeBlock` into a new version of the file, which replaces it at `fs/close`.
    Replace,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HandleResult {
    pub handle_id: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadBlockParams {
    pub handle_id: String,
    pub offset: u64,
    pub len: usize,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ReadBlockResult<C = String> {
    pub chunk: C,
    pub eof: bool,
}

/// `fs/watchMissing` (codex 0.169.0).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchMissingParams {
    pub watch_id: u64,
    pub missing: Vec<String>,
    /// One path that exists now (not an array).
    #[serde(default)]
    pub present: Option<String>,
    #[serde(default)]
    pub sandbox: Option<Value>,
    #[serde(default)]
    pub sandbox_policy: Option<Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct WatchMissingResult {
    pub watching: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteBlockParams {
    pub handle_id: String,
    pub offset: u64,
    /// Decoded while the params are: bad base64 is -32602 with the decoder's text.
    #[serde(deserialize_with = "crate::bytes::deserialize_base64")]
    pub chunk: Vec<u8>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CloseParams {
    pub handle_id: String,
}

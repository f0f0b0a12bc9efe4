//! The `environmentConfig/read` messages and the error texts codex 0.169.0 answers with.

use std::path::Path;

use exec_server_core::proto::RpcError;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigReadParams {
    /// Where project layers are looked for (a `file:` URI or an absolute path).
    pub cwd: String,
    /// Literal TOML key paths, e.g. `[["mcp_servers"]]`.
    pub config_paths: Vec<Vec<String>>,
    pub requirements_paths: Vec<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigReadResult {
    pub user_home_dir: Option<String>,
    pub codex_home_dir: String,
    pub hostname: Option<String>,
    pub config: LayerStack,
    pub requirements: LayerStack,
}

/// Layers from lowest to highest precedence, and where the harness inserts cloud layers.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerStack {
    pub layers: Vec<Layer>,
    pub cloud_insertion_index: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Layer {
    /// Provenance, for diagnostics only.
    pub source: String,
    /// The directory relative paths in the layer are interpreted against.
    pub base_dir: String,
    /// The selected keys as TOML.
    pub toml: String,
}

/// The checks codex applies before reading anything.
pub(crate) fn check_paths(params: &super::ConfigReadParams) -> Result<(), RpcError> {
    if params.config_paths.is_empty() && params.requirements_paths.is_empty() {
        return Err(RpcError::invalid_params(
            "at least one config or requirements path is required",
        ));
    }
    let all = params.config_paths.iter().chain(&params.requirements_paths);
    if all.clone().any(Vec::is_empty) {
        return Err(RpcError::invalid_params(
            "TOML paths must contain at least one key segment",
        ));
    }
    Ok(())
}

fn load_failed(detail: impl std::fmt::Display) -> RpcError {
    RpcError::internal(format!("failed to load executor-local config: {detail}"))
}

/// A system, user or legacy managed layer that is not valid TOML: `<path>:<line>:<col>:
/// <message>`.
pub(crate) fn layer_parse_error(path: &Path, text: &str, error: &toml::de::Error) -> RpcError {
    let (line, column) = error
        .span()
        .map(|span| line_and_column(text, span.start))
        .unwrap_or((1, 1));
    load_failed(format_args!(
        "{}:{line}:{column}: {}",
        path.display(),
        error.message()
    ))
}

/// A project layer that is not valid TOML.
pub(crate) fn project_parse_error(path: &Path, error: &toml::de::Error) -> RpcError {
    load_failed(format_args!(
        "Error parsing project config file {}: {error}",
        path.display()
    ))
}

/// A requirements layer that is not valid TOML.
pub(crate) fn requirements_parse_error(path: &Path, error: &toml::de::Error) -> RpcError {
    load_failed(format_args!(
        "failed to parse requirements layer {}: {error}",
        path.display()
    ))
}

/// A layer file that exists but cannot be read; `project` picks codex's wording.
pub(crate) fn read_error(path: &Path, project: bool, reason: impl std::fmt::Display) -> RpcError {
    let what = if project {
        "project config file"
    } else {
        "config file"
    };
    load_failed(format_args!(
        "Failed to read {what} {}: {reason}",
        path.display()
    ))
}

/// The reason of [`read_error`] for a path that is not a regular file.
pub(crate) fn not_a_file(path: &Path) -> String {
    format!("path `{}` is not a file", path.display())
}

/// The reason of [`read_error`] for a layer past `environment.config_max_total_bytes`.
pub(crate) fn too_much(limit: u64) -> String {
    format!("the configuration layers are larger than the limit of {limit} bytes in all (environment.config_max_total_bytes)")
}

/// The reason of [`read_error`] for a file above `environment.config_max_file_bytes`.
pub(crate) fn too_large(limit: u64) -> String {
    format!("file is larger than the limit of {limit} bytes (environment.config_max_file_bytes)")
}

/// `CODEX_HOME` names a path that does not exist.
pub(crate) fn codex_home_missing(path: &Path) -> RpcError {
    RpcError::internal(format!(
        "failed to find Codex home: CODEX_HOME points to {:?}, but that path does not exist",
        path.display().to_string()
    ))
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_error(text: &str) -> toml::de::Error {
        toml::from_str::<toml::Table>(text).unwrap_err()
    }

    #[test]
    fn parse_errors_read_as_codex_writes_them() {
        let path = Path::new("/etc/codex/config.toml");
        let text = "zeta = \n";
        assert_eq!(
            layer_parse_error(path, text, &parse_error(text)).message,
            "failed to load executor-local config: /etc/codex/config.toml:1:8: string values must be quoted, expected literal string"
        );
        let text = "a = 1\na = 2\n";
        assert_eq!(
            layer_parse_error(path, text, &parse_error(text)).message,
            "failed to load executor-local config: /etc/codex/config.toml:2:1: duplicate key"
        );
        let project = Path::new("/r/.codex/config.toml");
        assert_eq!(
            project_parse_error(project, &parse_error("[[[")).message,
            "failed to load executor-local config: Error parsing project config file /r/.codex/config.toml: TOML parse error at line 1, column 3\n  |\n1 | [[[\n  |   ^\nunquoted keys cannot be empty, expected letters, numbers, `-`, `_`\n"
        );
        let requirements = Path::new("/etc/codex/requirements.toml");
        assert_eq!(
            requirements_parse_error(requirements, &parse_error("x = \n")).message,
            "failed to load executor-local config: failed to parse requirements layer /etc/codex/requirements.toml: TOML parse error at line 1, column 5\n  |\n1 | x = \n  |     ^\nstring values must be quoted, expected literal string\n"
        );
    }

    #[test]
    fn columns_count_characters() {
        assert_eq!(line_and_column("é = \n", 5), (1, 5));
        assert_eq!(line_and_column("a\nbc", 3), (2, 2));
    }
}

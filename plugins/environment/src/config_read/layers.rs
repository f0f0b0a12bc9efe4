//! Which files make up the layer stacks, as codex 0.169.0's loader forms them (observed
//! against the real binary; CODEX-0169 §2.5 leaves it unverified):
//!
//! * config, lowest first: the system file `<system dir>/config.toml`, the user file
//!   `$CODEX_HOME/config.toml`, the project files `<dir>/.codex/config.toml` of each
//!   trusted directory from the project root down to `cwd`, then the legacy
//!   `<system dir>/managed_config.toml`;
//! * requirements: `<system dir>/requirements.toml`.
//!
//! The project root is the nearest directory at or above `cwd` holding a git marker (a
//! `.git` file, or a `.git` directory with a `HEAD`), else `cwd` itself. A project
//! directory is trusted when it or an ancestor up to the project root is listed with
//! `trust_level = "trusted"` under `[projects]` in the system or user file.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use exec_server_core::proto::RpcError;

use super::wire;
use super::ReadSettings;

/// Where codex keeps its configuration on this host.
#[derive(Debug, Clone)]
pub struct CodexLayout {
    /// `/etc/codex` unless `environment.codex_system_dir` says otherwise.
    pub system_dir: PathBuf,
    /// `$CODEX_HOME`, else `~/.codex`.
    pub codex_home: PathBuf,
    pub user_home: Option<PathBuf>,
}

impl CodexLayout {
    /// The layout of the server's own environment (`HOME`, `CODEX_HOME`), with the
    /// configured system directory.
    pub fn from_environment(system_dir: &Path) -> Result<Self, RpcError> {
        let user_home = crate::host::user_home();
        Ok(Self {
            system_dir: system_dir.to_path_buf(),
            codex_home: codex_home(user_home.as_deref())?,
            user_home,
        })
    }
}

/// codex's system configuration directory on Unix.
pub const DEFAULT_SYSTEM_DIR: &str = "/etc/codex";

/// `$CODEX_HOME` (which must exist), else `<home>/.codex` (which need not).
pub fn codex_home(user_home: Option<&Path>) -> Result<PathBuf, RpcError> {
    match std::env::var_os("CODEX_HOME").filter(|v| !v.is_empty()) {
        Some(value) => {
            let path = PathBuf::from(value);
            if !path.exists() {
                return Err(wire::codex_home_missing(&path));
            }
            Ok(std::fs::canonicalize(&path).unwrap_or(path))
        }
        None => Ok(user_home.unwrap_or(Path::new("/")).join(".codex")),
    }
}

/// One layer file, parsed.
#[derive(Debug)]
pub(crate) struct SourceLayer {
    pub(crate) source: String,
    pub(crate) base_dir: PathBuf,
    pub(crate) table: toml::Table,
    /// Below the cloud insertion point.
    pub(crate) system: bool,
}

/// How a layer's errors are worded: codex words each kind differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    Project,
    Requirements,
}

/// The config stack for `cwd`, lowest precedence first.
pub(crate) fn config_layers(
    layout: &CodexLayout,
    cwd: &Path,
    limits: &LayerBudget<'_>,
) -> Result<Vec<SourceLayer>, RpcError> {
    let mut layers = Vec::new();
    let system = layout.system_dir.join("config.toml");
    if let Some(table) = load(&system, Kind::Plain, limits)? {
        layers.push(SourceLayer {
            source: format!("system ({})", system.display()),
            base_dir: layout.system_dir.clone(),
            table,
            system: true,
        });
    }
    let user = layout.codex_home.join("config.toml");
    if let Some(table) = load(&user, Kind::Plain, limits)? {
        layers.push(SourceLayer {
            source: format!("user ({})", user.display()),
            base_dir: layout.codex_home.clone(),
            table,
            system: false,
        });
    }
    let trusted = trusted_projects(&layers);
    for dir in project_dirs(cwd, &trusted) {
        let base_dir = dir.join(".codex");
        let file = base_dir.join("config.toml");
        if let Some(table) = load(&file, Kind::Project, limits)? {
            layers.push(SourceLayer {
                source: format!("project ({})", file.display()),
                base_dir,
                table,
                system: false,
            });
        }
    }
    let managed = layout.system_dir.join("managed_config.toml");
    if let Some(table) = load(&managed, Kind::Plain, limits)? {
        layers.push(SourceLayer {
            source: format!("legacy managed_config.toml ({})", managed.display()),
            base_dir: layout.system_dir.clone(),
            table,
            system: false,
        });
    }
    Ok(layers)
}

/// The requirements stack.
pub(crate) fn requirements_layers(
    layout: &CodexLayout,
    limits: &LayerBudget<'_>,
) -> Result<Vec<SourceLayer>, RpcError> {
    let file = layout.system_dir.join("requirements.toml");
    Ok(load(&file, Kind::Requirements, limits)?
        .map(|table| SourceLayer {
            source: file.display().to_string(),
            base_dir: layout.system_dir.clone(),
            table,
            system: true,
        })
        .into_iter()
        .collect())
}

/// Directories listed as trusted in the system or user layer.
fn trusted_projects(layers: &[SourceLayer]) -> Vec<PathBuf> {
    layers
        .iter()
        .filter_map(|layer| layer.table.get("projects")?.as_table())
        .flat_map(|projects| projects.iter())
        .filter(|(_, entry)| {
            entry.get("trust_level").and_then(toml::Value::as_str) == Some("trusted")
        })
        .map(|(path, _)| PathBuf::from(path))
        .collect()
}

/// The trusted directories from the project root down to `cwd`, root first.
fn project_dirs(cwd: &Path, trusted: &[PathBuf]) -> Vec<PathBuf> {
    if trusted.is_empty() {
        return Vec::new();
    }
    let root = cwd
        .ancestors()
        .find(|dir| has_git_marker(dir))
        .unwrap_or(cwd);
    let mut chain: Vec<&Path> = cwd
        .ancestors()
        .take_while(|dir| dir.starts_with(root))
        .collect();
    chain.reverse();
    chain
        .iter()
        .enumerate()
        .filter(|(depth, _)| {
            chain[..=*depth]
                .iter()
                .any(|dir| trusted.iter().any(|t| t == dir))
        })
        .map(|(_, dir)| dir.to_path_buf())
        .collect()
}

fn has_git_marker(dir: &Path) -> bool {
    let marker = dir.join(".git");
    match std::fs::metadata(&marker) {
        Ok(meta) if meta.is_file() => true,
        Ok(meta) if meta.is_dir() => marker.join("HEAD").exists(),
        _ => false,
    }
}

/// What one read may still load: every layer counts against
/// `environment.config_max_total_bytes`, so a `cwd` deep in a tree of project layers (or of
/// links to one large layer) cannot make one request read and parse without end.
pub(crate) struct LayerBudget<'a> {
    pub(crate) settings: &'a ReadSettings,
    left: std::cell::Cell<u64>,
}

impl<'a> LayerBudget<'a> {
    pub(crate) fn new(settings: &'a ReadSettings) -> Self {
        Self {
            settings,
            left: std::cell::Cell::new(settings.max_total_bytes),
        }
    }

    /// Takes `bytes` for the layer at `path`, or fails the read.
    fn spend(&self, bytes: u64, path: &Path, project: bool) -> Result<(), RpcError> {
        match self.left.get().checked_sub(bytes) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => {
                let limit = self.settings.max_total_bytes;
                Err(wire::read_error(path, project, wire::too_much(limit)))
            }
        }
    }
}

/// Reads and parses one layer file: `None` when it does not exist.
fn load(
    path: &Path,
    kind: Kind,
    limits: &LayerBudget<'_>,
) -> Result<Option<toml::Table>, RpcError> {
    let project = kind == Kind::Project;
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(wire::read_error(path, project, e)),
    };
    if !metadata.is_file() {
        return Err(wire::read_error(path, project, wire::not_a_file(path)));
    }
    let max_file_bytes = limits.settings.max_file_bytes;
    let too_large = || wire::read_error(path, project, wire::too_large(max_file_bytes));
    if metadata.len() > max_file_bytes {
        return Err(too_large());
    }
    // Project layers live in trees others may write: never wait on a FIFO swapped in
    // after the check, and judge the file actually opened.
    let file = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| wire::read_error(path, project, e))?
    };
    match file.metadata() {
        Ok(opened) if opened.is_file() => {}
        Ok(_) => return Err(wire::read_error(path, project, wire::not_a_file(path))),
        Err(e) => return Err(wire::read_error(path, project, e)),
    }
    let mut bytes = Vec::new();
    file.take(max_file_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| wire::read_error(path, project, e))?;
    if bytes.len() as u64 > max_file_bytes {
        return Err(too_large());
    }
    limits.spend(bytes.len() as u64, path, project)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| wire::read_error(path, project, "stream did not contain valid UTF-8"))?;
    toml::from_str::<toml::Table>(&text)
        .map(Some)
        .map_err(|error| match kind {
            Kind::Plain => wire::layer_parse_error(path, &text, &error),
            Kind::Project => wire::project_parse_error(path, &error),
            Kind::Requirements => wire::requirements_parse_error(path, &error),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_layers_follow_trust_from_the_git_root_down() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        let deeper = root.join("sub/deeper");
        std::fs::create_dir_all(&deeper).unwrap();
        // Without a git marker the project is `cwd` alone.
        let trusted_root = vec![root.clone()];
        assert!(project_dirs(&deeper, &trusted_root).is_empty());
        assert_eq!(
            project_dirs(&deeper, std::slice::from_ref(&deeper)),
            vec![deeper.clone()]
        );
        // An empty `.git` directory is no marker; one with HEAD is.
        std::fs::create_dir(root.join(".git")).unwrap();
        assert!(project_dirs(&deeper, &trusted_root).is_empty());
        std::fs::write(root.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        assert_eq!(
            project_dirs(&deeper, &trusted_root),
            vec![root.clone(), root.join("sub"), deeper.clone()]
        );
        // Trust below the root covers that directory and what lies under it only.
        assert_eq!(
            project_dirs(&deeper, &[root.join("sub")]),
            vec![root.join("sub"), deeper.clone()]
        );
        assert!(project_dirs(&deeper, &[]).is_empty());
    }
}

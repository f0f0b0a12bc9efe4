//! Which events are recorded, at which level: `[audit]`'s `level`, `levels`, `methods`,
//! `exclude_methods` and `workspace_roots`, resolved once at start-up.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::config::AuditConfig;
use super::event::Level;

/// What a method's request events record, as its plugin declares it
/// ([`crate::Install::audit_method`]).
#[derive(Debug, Clone, Copy)]
pub struct MethodAudit {
    /// The method can change the machine (write, remove, run, signal…). Undeclared
    /// methods count as changing: in `blocking` mode they wait for their `received` event.
    pub changes: bool,
    /// The event's members for the request's params, at the level recorded. `None`: only
    /// the names of the params' members, at `request` level.
    pub describe: Option<Describe>,
}

impl MethodAudit {
    /// A method that only reads, recorded with the names of its params' members.
    pub const READ_ONLY: Self = Self {
        changes: false,
        describe: None,
    };

    /// A method that changes something, described by `describe`.
    pub const fn changes(describe: Describe) -> Self {
        Self {
            changes: true,
            describe: Some(describe),
        }
    }

    /// A method that only reads, described by `describe`.
    pub const fn reads(describe: Describe) -> Self {
        Self {
            changes: false,
            describe: Some(describe),
        }
    }
}

impl Default for MethodAudit {
    fn default() -> Self {
        Self {
            changes: true,
            describe: None,
        }
    }
}

/// Describes a request for its event: `level` is `metadata` (targets: paths, ids) or
/// `request` (also what was asked: argv, sizes, the policy). Secrets must never be put in.
pub type Describe = fn(&serde_json::Value, Level) -> Described;

/// A request's event members, and the host paths it reads (for `workspace_roots`).
#[derive(Debug, Default)]
pub struct Described {
    pub details: serde_json::Map<String, serde_json::Value>,
    pub read_paths: Vec<PathBuf>,
}

/// The resolved policy.
#[derive(Debug)]
pub(crate) struct Policy {
    default: Level,
    levels: HashMap<String, Level>,
    methods: Vec<String>,
    exclude: Vec<String>,
    workspace_roots: Vec<PathBuf>,
}

impl Policy {
    pub(crate) fn new(config: &AuditConfig) -> Self {
        Self {
            default: config.level,
            levels: config.levels.clone().into_iter().collect(),
            methods: config.methods.clone(),
            exclude: config.exclude_methods.clone(),
            workspace_roots: config.workspace_roots.clone(),
        }
    }

    /// The level of events of `kind` (`process.exited`): `levels[kind]`, else
    /// `levels[<first part>]`, else `level`.
    pub(crate) fn level(&self, kind: &str) -> Level {
        let family = kind.split('.').next().unwrap_or(kind);
        self.levels
            .get(kind)
            .or_else(|| self.levels.get(family))
            .copied()
            .unwrap_or(self.default)
    }

    /// The level of `method`'s request events: `levels["request:<method>"]`, else
    /// `levels["request:<family>"]`, else `levels.request` (else `level`) for methods that
    /// change something and `levels.read` (else `none`: reads are off unless asked for)
    /// for methods that only read.
    pub(crate) fn request_level(&self, method: &str, changes: bool) -> Level {
        let listed = |patterns: &[String]| patterns.iter().any(|p| pattern_matches(p, method));
        if !listed(&self.methods) || listed(&self.exclude) {
            return Level::None;
        }
        let family = method.split('/').next().unwrap_or(method);
        let own = self
            .levels
            .get(&format!("request:{method}"))
            .or_else(|| self.levels.get(&format!("request:{family}")))
            .copied();
        match (own, changes) {
            (Some(level), _) => level,
            (None, true) => self.level("request"),
            (None, false) => self.levels.get("read").copied().unwrap_or(Level::None),
        }
    }

    /// True when every path is below a workspace root (lexically: `..` counts as leaving).
    pub(crate) fn inside_workspace(&self, paths: &[PathBuf]) -> bool {
        !paths.is_empty()
            && paths
                .iter()
                .all(|path| self.workspace_roots.iter().any(|root| below(path, root)))
    }
}

fn below(path: &Path, root: &Path) -> bool {
    use std::path::Component;
    path.starts_with(root)
        && path
            .components()
            .all(|c| !matches!(c, Component::ParentDir | Component::CurDir))
}

/// `*`, `family/*` or an exact name.
fn pattern_matches(pattern: &str, method: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some("") => true,
        Some(prefix) if prefix.ends_with('/') => method.starts_with(prefix),
        _ => pattern == method,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(toml: &str) -> Policy {
        let config: AuditConfig = toml::from_str(toml).unwrap();
        Policy::new(&config)
    }

    #[test]
    fn the_most_specific_level_wins() {
        let p = policy(
            r#"
            level = "metadata"
            levels = { process = "request", "process.exited" = "none", "request:fs" = "none", "request:fs/writeFile" = "request" }
            "#,
        );
        assert_eq!(p.level("process.started"), Level::Request);
        assert_eq!(p.level("process.exited"), Level::None);
        assert_eq!(p.level("session.opened"), Level::Metadata);
        assert_eq!(p.request_level("fs/writeFile", true), Level::Request);
        assert_eq!(p.request_level("fs/remove", true), Level::None);
        assert_eq!(p.request_level("process/start", true), Level::Metadata);
    }

    #[test]
    fn reads_are_off_unless_asked_for_and_lists_select_methods() {
        let p = policy(
            r#"methods = ["fs/*", "process/start"]
            exclude_methods = ["fs/remove"]"#,
        );
        assert_eq!(p.request_level("fs/readFile", false), Level::None);
        assert_eq!(p.request_level("fs/writeFile", true), Level::Metadata);
        assert_eq!(p.request_level("fs/remove", true), Level::None);
        assert_eq!(p.request_level("process/kill", true), Level::None);
        let p = policy(r#"levels = { read = "metadata" }"#);
        assert_eq!(p.request_level("fs/readFile", false), Level::Metadata);
    }

    #[test]
    fn workspace_reads_are_below_a_root_without_dot_dot() {
        let p = policy(r#"workspace_roots = ["/ws"]"#);
        let inside = |paths: &[&str]| {
            p.inside_workspace(&paths.iter().map(PathBuf::from).collect::<Vec<_>>())
        };
        assert!(inside(&["/ws/a", "/ws"]));
        assert!(!inside(&["/ws/a", "/etc/passwd"]));
        assert!(!inside(&["/ws/../etc/passwd"]));
        assert!(!inside(&["/wsx/a"]));
        assert!(!inside(&[]));
    }
}

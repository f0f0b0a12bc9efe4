//! Grants to concrete rules (SANDBOX.md §2.4.4, §2.4.5, §2.8 steps 5–6): wire paths are
//! parsed, special kinds expanded, relative globs joined to `cwd`, and every path
//! canonicalised. Errors carry the request's policy code (§2.7).

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use exec_server_proto::error::SandboxRequest;
use exec_server_proto::log_text;
use exec_server_proto::path::{parse_path, PathError};
use exec_server_proto::{RpcError, StartErrorKind};

use super::glob::{self, GlobPattern};
use super::intent::{Grant, GrantTarget};
use super::resolve::canonicalise;
use super::shape::{Access, Special};
use super::{MAX_REMEMBERED_KINDS, MINIMAL_READ_SET};

/// A concrete, canonical path with its access.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    pub path: PathBuf,
    pub access: Access,
}

/// Everything the grants expand to.
#[derive(Debug, Default)]
pub(crate) struct Expanded {
    pub rules: Vec<Rule>,
    pub globs: Vec<GlobPattern>,
    /// Unknown special kinds of `deny` entries, in order, without duplicates.
    pub ignored_deny_kinds: Vec<String>,
}

/// What expansion needs besides the grants.
#[derive(Debug)]
pub(crate) struct Expansion {
    pub request: SandboxRequest,
    /// The sandbox's working directory (§2.8 step 3), parsed but not canonicalised.
    pub cwd: Option<PathBuf>,
    /// What `project_roots` expands to; empty when unknown.
    pub project_roots: Vec<PathBuf>,
    /// The server's `TMPDIR`.
    pub tmpdir: Option<OsString>,
}

/// Which kind of path member a wire path came from; they answer with different errors.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PathMember {
    Permission,
    WorkspaceRoot,
}

/// Parses one wire path of the sandbox (§2.2): malformed → -32602 `invalid path`, another
/// OS's URI → the member's policy error.
pub(crate) fn parse_member(
    value: &str,
    member: PathMember,
    request: SandboxRequest,
) -> Result<PathBuf, RpcError> {
    parse_path(value).map_err(|error| match error {
        // Another machine's file (a UNC path) is as foreign here as a drive letter: codex
        // 0.171.0 fails both as a preparation of the process sandbox.
        PathError::Invalid(reason) if names_remote_host(value) => {
            policy_error(request, RpcError::invalid_path(value, reason))
        }
        PathError::Invalid(reason) => RpcError::invalid_path(value, reason),
        PathError::ForeignOs(reason) => policy_error(
            request,
            match member {
                PathMember::Permission => RpcError::invalid_sandbox_path_uri(request, reason),
                PathMember::WorkspaceRoot => {
                    RpcError::sandbox_workspace_root_not_native(request, reason)
                }
            },
        ),
    })
}

/// Whether `value` is a `file:` URI whose authority names a host other than this one.
fn names_remote_host(value: &str) -> bool {
    let Some(rest) = value
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case("file://"))
        .map(|_| &value[7..])
    else {
        return false;
    };
    let host = rest.split('/').next().unwrap_or_default();
    !host.is_empty() && !host.eq_ignore_ascii_case("localhost")
}

/// A policy error (§2.7: the request's code) of a `process/start` carries `data.kind`
/// `sandboxPreparation`, as codex 0.171.0's do (CODEX-0171 §2.2); `fs/*` errors carry none.
/// Shape and syntax errors are not policy errors: like codex's decode errors, they carry
/// no `data`.
pub(crate) fn policy_error(request: SandboxRequest, error: RpcError) -> RpcError {
    match request {
        SandboxRequest::Process => error.with_start_error_kind(StartErrorKind::SandboxPreparation),
        SandboxRequest::Fs => error,
    }
}

impl Expansion {
    pub(crate) fn expand(&self, grants: &[Grant]) -> Result<Expanded, RpcError> {
        let mut out = Expanded::default();
        for grant in grants {
            let access = grant.access;
            match &grant.target {
                GrantTarget::Path(value) => {
                    let path = parse_member(value, PathMember::Permission, self.request)?;
                    if access == Access::Read {
                        // A read-only link is kept as a name too (narrowing pins it), or a
                        // process in a writable parent could put its own entry there.
                        if let Some(link) = link_itself(&path) {
                            out.push(link, access);
                        }
                    }
                    out.push(canonicalise(&path), access);
                }
                GrantTarget::Glob(pattern) => out.globs.push(self.glob(pattern)?),
                GrantTarget::Cwd => {
                    if let Some(cwd) = &self.cwd {
                        out.push(canonicalise(cwd), access);
                    }
                }
                GrantTarget::Special(special) => self.expand_special(special, access, &mut out)?,
            }
        }
        Ok(out)
    }

    fn expand_special(
        &self,
        special: &Special,
        access: Access,
        out: &mut Expanded,
    ) -> Result<(), RpcError> {
        match special.kind.as_str() {
            "root" => out.push(PathBuf::from("/"), access),
            "minimal" => {
                // A platform set is never denied and never made writable (§2.4.5).
                if access != Access::Deny {
                    for path in existing_minimal_paths() {
                        out.push(path, Access::Read);
                    }
                }
            }
            "project_roots" | "current_working_directory" => {
                let subpath = match special.subpath.as_deref() {
                    Some(subpath) => Some(self.checked_subpath(subpath)?),
                    None => None,
                };
                if self.project_roots.is_empty() {
                    return Err(RpcError::sandbox_requires_cwd());
                }
                for root in &self.project_roots {
                    let path = match subpath {
                        Some(subpath) => root.join(subpath),
                        None => root.clone(),
                    };
                    out.push(canonicalise(&path), access);
                }
            }
            "tmpdir" => {
                if let Some(tmpdir) = usable_tmpdir(self.tmpdir.as_deref()) {
                    out.push(canonicalise(&tmpdir), access);
                }
            }
            "slash_tmp" => {
                if Path::new("/tmp").is_dir() {
                    out.push(canonicalise(Path::new("/tmp")), access);
                }
            }
            unknown => {
                let kinds = &mut out.ignored_deny_kinds;
                // Bounded: a policy of many (or long) unknown kinds costs no more to
                // scan, keep or log.
                let unknown = log_text::truncated(unknown);
                if access == Access::Deny
                    && kinds.len() < MAX_REMEMBERED_KINDS
                    && !kinds.iter().any(|k| k == unknown)
                {
                    kinds.push(unknown.to_owned());
                }
            }
        }
        Ok(())
    }

    /// `subpath` must be relative and free of `..` (§2.4.5).
    fn checked_subpath<'a>(&self, subpath: &'a str) -> Result<&'a Path, RpcError> {
        let path = Path::new(subpath);
        let acceptable = path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if acceptable {
            Ok(path)
        } else {
            Err(policy_error(
                self.request,
                RpcError::invalid_project_roots_subpath(self.request, subpath),
            ))
        }
    }

    /// An absolute pattern: relative ones are joined to `cwd`; the literal directory prefix
    /// is canonicalised like any policy path, so it matches resolved paths (§5.6). The
    /// prefix keeps the exact bytes of its names (a `file:` URI may name non-UTF-8 ones),
    /// so the launcher's scan and the fs helper's check start where the kernel would.
    fn glob(&self, pattern: &str) -> Result<GlobPattern, RpcError> {
        if pattern.is_empty() {
            return Err(RpcError::invalid_params("glob_pattern must not be empty"));
        }
        let absolute: PathBuf = if exec_server_proto::path::has_file_scheme(pattern) {
            parse_member(pattern, PathMember::Permission, self.request)?
        } else {
            PathBuf::from(pattern)
        };
        let mut prefix = if absolute.is_absolute() {
            PathBuf::from("/")
        } else {
            self.cwd
                .clone()
                .ok_or_else(RpcError::sandbox_requires_cwd)?
        };
        let mut rest: Vec<String> = Vec::new();
        for component in absolute.as_os_str().as_bytes().split(|b| *b == b'/') {
            if component.is_empty() {
                continue;
            }
            let name = std::ffi::OsStr::from_bytes(component);
            let text = name.to_string_lossy();
            if rest.is_empty() && !glob::has_meta(&text) {
                prefix.push(name);
            } else {
                rest.push(text.into_owned());
            }
        }
        GlobPattern::with_prefix(canonicalise(&prefix), &rest.join("/"))
            .map_err(RpcError::invalid_params)
    }
}

impl Expanded {
    fn push(&mut self, path: PathBuf, access: Access) {
        self.rules.push(Rule { path, access });
    }
}

/// The existing members of the `minimal` set, canonical.
/// `path` itself, its parent canonical and its name kept, when it is a symbolic link.
fn link_itself(path: &Path) -> Option<PathBuf> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.file_type().is_symlink() {
        return None;
    }
    Some(canonicalise(path.parent()?).join(path.file_name()?))
}

pub(crate) fn existing_minimal_paths() -> Vec<PathBuf> {
    MINIMAL_READ_SET
        .iter()
        .map(Path::new)
        .filter(|path| path.exists())
        .map(canonicalise)
        .collect()
}

/// `TMPDIR` counts when it is set, non-empty and absolute (§2.4.5).
fn usable_tmpdir(tmpdir: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let tmpdir = Path::new(tmpdir?);
    tmpdir.is_absolute().then(|| tmpdir.to_path_buf())
}

//! The user-space access decision of the fs helper (SANDBOX.md §5.6), a pure function of
//! the policy and an already resolved path (see [`super::resolve`]). It is the only
//! enforcement of carve-outs, deny entries and metadata confidentiality for `fs/*`.

use std::path::{Component, Path, PathBuf};

use exec_server_proto::RpcError;

use super::{normalise_lexically, resolve, Readable, SandboxPolicy};

/// The access an operation needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    Read,
    Write,
}

/// The kind of the rule that decides a path; ties on equal paths go D > W > R.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum RuleKind {
    ReadOnly,
    Writable,
    Denied,
}

impl SandboxPolicy {
    /// Resolves `path` (§5.6, the last link followed only with `follow_last`) and decides
    /// `access` on the resolution, which it returns: the only path the caller may then act
    /// on, opened exactly (see [`crate::anchored`]) so that no link swapped in since can
    /// redirect it.
    pub fn approve(
        &self,
        path: &Path,
        follow_last: bool,
        access: AccessKind,
    ) -> Result<PathBuf, RpcError> {
        let resolved = resolve(path, follow_last);
        self.check(&resolved, access)?;
        Ok(resolved)
    }

    /// `decide(path, access)`.
    pub fn check(&self, path: &Path, access: AccessKind) -> Result<(), RpcError> {
        match access {
            AccessKind::Read => self.check_read(path),
            AccessKind::Write => self.check_write(path),
        }
    }

    /// `decide(path, read)`: the refusal names `path` (native form, lossy UTF-8).
    pub fn check_read(&self, path: &Path) -> Result<(), RpcError> {
        if self.allows(path, AccessKind::Read) {
            Ok(())
        } else {
            Err(RpcError::sandbox_read_denied(&path.to_string_lossy()))
        }
    }

    /// `decide(path, write)`.
    pub fn check_write(&self, path: &Path) -> Result<(), RpcError> {
        if self.allows(path, AccessKind::Write) {
            Ok(())
        } else {
            Err(RpcError::sandbox_write_denied(&path.to_string_lossy()))
        }
    }

    /// `decide(path, write)` for an operation on a whole tree (recursive `fs/remove`, the
    /// destination of `fs/copy`): also refused when a read-only carve-out or a denied path
    /// lies strictly inside `path`.
    pub fn check_write_tree(&self, path: &Path) -> Result<(), RpcError> {
        self.check_write(path)?;
        let protected_inside = self
            .read_only
            .iter()
            .chain(&self.denied_paths)
            .any(|p| p != path && p.starts_with(path));
        if protected_inside {
            return Err(RpcError::sandbox_write_denied(&path.to_string_lossy()));
        }
        Ok(())
    }

    /// The decision of §5.6 for a resolved absolute path. A path that still holds `.` or
    /// `..` is judged on its lexical normal form, so such a path can never pass as lying
    /// below a root it climbs out of.
    pub fn allows(&self, path: &Path, access: AccessKind) -> bool {
        let normal;
        let path = if is_lexically_normal(path) {
            path
        } else {
            normal = normalise_lexically(path);
            &normal
        };
        if is_other_process(path) {
            return false;
        }
        if self.denied_globs.iter().any(|g| g.matches_or_beneath(path)) {
            return false;
        }
        match self.deciding_rule(path) {
            None | Some(RuleKind::Denied) => false,
            Some(RuleKind::ReadOnly) => access == AccessKind::Read,
            Some(RuleKind::Writable) => true,
        }
    }

    /// The longest rule path that is `path` or an ancestor of it.
    fn deciding_rule(&self, path: &Path) -> Option<RuleKind> {
        let all_readable = matches!(self.readable, Readable::All).then(|| Path::new("/"));
        let roots = match &self.readable {
            Readable::All => &[][..],
            Readable::Roots(roots) => roots.as_slice(),
        };
        let rules = self
            .writable
            .iter()
            .map(|p| (p.as_path(), RuleKind::Writable))
            .chain(
                self.read_only
                    .iter()
                    .chain(roots)
                    .map(|p| (p.as_path(), RuleKind::ReadOnly)),
            )
            .chain(all_readable.map(|p| (p, RuleKind::ReadOnly)))
            .chain(
                self.denied_paths
                    .iter()
                    .map(|p| (p.as_path(), RuleKind::Denied)),
            );
        rules
            .filter(|(rule, _)| path.starts_with(rule))
            .max_by_key(|(rule, kind)| (rule.components().count(), *kind))
            .map(|(_, kind)| kind)
    }
}

fn is_lexically_normal(path: &Path) -> bool {
    path.components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// `/proc/<n>` or below, for a pid `n` other than this process's (§5.6 rule 1).
fn is_other_process(path: &Path) -> bool {
    let mut components = path.components();
    if components.next() != Some(Component::RootDir)
        || components.next() != Some(Component::Normal("proc".as_ref()))
    {
        return false;
    }
    let Some(Component::Normal(name)) = components.next() else {
        return false;
    };
    let Some(digits) = name
        .to_str()
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
    else {
        return false;
    };
    digits
        .parse::<u32>()
        .map_or(true, |pid| pid != std::process::id())
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;

//! Classification of canonical rules into the policy's sets (SANDBOX.md §2.4.7, §2.8
//! step 7). Several rules on one path conflict as `deny` > `write` > `read`; longer paths
//! beating shorter ones is left to the consumers (the sets keep every path).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::expand::Rule;
use super::glob::GlobPattern;
use super::shape::Access;
use super::Readable;

/// The classified sets, before carve-outs and server additions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Classified {
    pub readable: Readable,
    pub writable: Vec<PathBuf>,
    /// Explicit `read` entries strictly inside a writable root.
    pub read_only: Vec<PathBuf>,
    pub denied_paths: Vec<PathBuf>,
    pub full_disk_write: bool,
}

pub(crate) fn classify(rules: &[Rule], globs: &[GlobPattern]) -> Classified {
    let mut effective: BTreeMap<&Path, Access> = BTreeMap::new();
    for rule in rules {
        let access = effective.entry(&rule.path).or_insert(rule.access);
        *access = strongest(*access, rule.access);
    }
    let with = |wanted: &[Access]| -> Vec<PathBuf> {
        effective
            .iter()
            .filter(|(_, access)| wanted.contains(access))
            .map(|(path, _)| path.to_path_buf())
            .collect()
    };
    let root = effective.get(Path::new("/")).copied();
    // A `read` entry below a denied path decides what lies below it (the longer path
    // wins, §2.4.7). `All` keeps no read entries (those inside a writable root survive as
    // carve-outs, and `/` writable holds them all), so with `/` only readable such an entry
    // needs the roots, `/` among them.
    let read_below_denied = || {
        effective.iter().any(|(path, access)| {
            *access == Access::Read
                && effective
                    .iter()
                    .any(|(d, a)| *a == Access::Deny && d != path && path.starts_with(d))
        })
    };
    let readable = match root {
        Some(Access::Write) => Readable::All,
        Some(Access::Read) if !read_below_denied() => Readable::All,
        _ => Readable::Roots(with(&[Access::Read, Access::Write])),
    };
    let writable = with(&[Access::Write]);
    let read_only = with(&[Access::Read])
        .into_iter()
        .filter(|path| writable.iter().any(|w| path != w && path.starts_with(w)))
        .collect();
    let narrowed_below_root = effective
        .iter()
        .any(|(path, access)| *path != Path::new("/") && *access != Access::Write);
    Classified {
        readable,
        writable,
        read_only,
        denied_paths: with(&[Access::Deny]),
        full_disk_write: root == Some(Access::Write) && !narrowed_below_root && globs.is_empty(),
    }
}

/// Equal paths conflict as deny > write > read (§2.4.7).
fn strongest(a: Access, b: Access) -> Access {
    let rank = |access| match access {
        Access::Read => 0,
        Access::Write => 1,
        Access::Deny => 2,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

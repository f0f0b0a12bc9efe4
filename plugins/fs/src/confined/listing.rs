//! `fs/readDirectory` and `fs/walk` in the fs helper (SANDBOX.md §5.6): directories are
//! listed through descriptors opened exactly at their approved location; a denied
//! directory is never listed or entered; a link is reported only when its resolved target
//! is readable, and its target's kind is learnt from a descriptor opened exactly there.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};

use exec_server_core::proto::fs::{DirectoryEntry, WalkEntryKind, WalkOptions, WalkResult};
use exec_server_core::proto::RpcError;
use exec_server_sandbox::anchored::{open_exact, Directory, EntryKind};
use exec_server_sandbox::policy::{resolve, AccessKind, SandboxPolicy};
use rustix::fs::{Mode, OFlags};

use crate::blocking::IoResultExt;
use crate::walker::{Inspected, WalkSource, Walker};

/// `fs/readDirectory`, stopping at the first entry beyond `limit`.
pub(crate) fn read_directory(
    policy: &SandboxPolicy,
    path: &Path,
    limit: usize,
) -> Result<Vec<DirectoryEntry>, RpcError> {
    let approved = policy.approve(path, true, AccessKind::Read)?;
    let directory = Directory::open(&approved).or_rpc()?;
    let mut entries = Vec::new();
    for (seen, name) in directory.names().or_rpc()?.enumerate() {
        if seen == limit {
            return Err(RpcError::too_many_directory_entries(limit + 1, limit));
        }
        let name = name.or_rpc()?;
        // Entries whose type cannot be learnt, or that the policy hides, are left out.
        let Some(kind) = entry_kind(policy, &directory, &approved, &name) else {
            continue;
        };
        // The approved location is where the names were listed, resolved as a URI
        // means it.
        entries.push(DirectoryEntry::new(
            &approved,
            &name,
            kind == EntryKind::Directory,
            kind == EntryKind::File,
        ));
    }
    Ok(entries)
}

/// The kind of `name` in `directory` (at `location`), a link's being its target's; `None`
/// when it cannot be learnt or the link's target is not readable.
fn entry_kind(
    policy: &SandboxPolicy,
    directory: &Directory,
    location: &Path,
    name: &OsStr,
) -> Option<EntryKind> {
    match directory.kind(name).ok()? {
        EntryKind::Symlink => {
            let (_, kind) = link_target(policy, &location.join(name)).ok()??;
            Some(kind)
        }
        kind => Some(kind),
    }
}

/// Where the link at `link` leads and what is there: `Ok(None)` when the policy does not
/// let it be read, an error when it cannot be opened exactly (dangling, or swapped).
fn link_target(policy: &SandboxPolicy, link: &Path) -> io::Result<Option<(PathBuf, EntryKind)>> {
    let target = resolve(link, true);
    if !policy.allows(&target, AccessKind::Read) {
        return Ok(None);
    }
    let handle = std::fs::File::from(open_exact(&target, OFlags::PATH, Mode::empty())?);
    let file_type = handle.metadata()?.file_type();
    let kind = if file_type.is_dir() {
        EntryKind::Directory
    } else if file_type.is_file() {
        EntryKind::File
    } else {
        EntryKind::Other
    };
    Ok(Some((target, kind)))
}

/// `fs/walk` under `policy`, with the walk's own order and limits (PROTOCOL §5.11).
pub(crate) fn walk(
    policy: &SandboxPolicy,
    root: &Path,
    options: &WalkOptions,
    budget_bytes: usize,
) -> Result<WalkResult, RpcError> {
    let source = Exact { policy };
    let Some(start) = source.start(root, options.follow_directory_symlinks)? else {
        return Ok(WalkResult::default());
    };
    Ok(Walker::new(source, options, budget_bytes, root, start).run())
}

/// The walk's view of the tree in the fs helper: directories are queued by their approved
/// location and listed through a descriptor opened exactly there.
struct Exact<'a> {
    policy: &'a SandboxPolicy,
}

fn walk_kind(kind: EntryKind) -> Option<WalkEntryKind> {
    match kind {
        EntryKind::Directory => Some(WalkEntryKind::Directory),
        EntryKind::File => Some(WalkEntryKind::File),
        EntryKind::Symlink | EntryKind::Other => None,
    }
}

impl WalkSource for Exact<'_> {
    type Queued = PathBuf;
    type Listed = (Directory, PathBuf);

    fn start(&self, root: &Path, follow: bool) -> Result<Option<(PathBuf, PathBuf)>, RpcError> {
        let approved = self.policy.approve(root, true, AccessKind::Read)?;
        let handle =
            std::fs::File::from(open_exact(&approved, OFlags::PATH, Mode::empty()).or_rpc()?);
        if !handle.metadata().or_rpc()?.is_dir() {
            return Ok(None);
        }
        // The root is a link exactly when resolving it followed its last name.
        if !follow && resolve(root, false) != approved {
            return Ok(None);
        }
        let identity = if follow {
            approved.clone()
        } else {
            root.to_path_buf()
        };
        Ok(Some((approved, identity)))
    }

    fn list(&self, location: &PathBuf) -> io::Result<((Directory, PathBuf), Vec<OsString>)> {
        let directory = Directory::open(location)?;
        let names = directory.names()?.collect::<io::Result<Vec<_>>>()?;
        Ok(((directory, location.clone()), names))
    }

    fn inspect(
        &self,
        (directory, location): &(Directory, PathBuf),
        _path: &Path,
        name: &OsStr,
        _follow: bool,
    ) -> io::Result<Inspected<PathBuf>> {
        let own = location.join(name);
        match directory.kind(name)? {
            EntryKind::Symlink => match link_target(self.policy, &own)? {
                None => Ok(Inspected::Hidden),
                Some((target, kind)) => Ok(Inspected::Found {
                    is_link: true,
                    kind: walk_kind(kind),
                    descend: target,
                }),
            },
            kind => Ok(Inspected::Found {
                is_link: false,
                kind: walk_kind(kind),
                descend: own,
            }),
        }
    }

    fn identity(&self, queued: &PathBuf, path: &Path, follow: bool) -> io::Result<PathBuf> {
        Ok(if follow {
            queued.clone()
        } else {
            path.to_path_buf()
        })
    }

    fn admit(&self, queued: &PathBuf) -> Result<(), String> {
        self.policy
            .check_read(queued)
            .map_err(|denial| denial.message)
    }
}

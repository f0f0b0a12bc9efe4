//! Read-only carve-outs that do not exist yet (SANDBOX.md §2.9, §8.4). A mount can only
//! cover a name that exists, and Landlock cannot forbid one name in a directory where it
//! allows creating others; so under `write` on a root without `.git`, a sandboxed process
//! could create `.git/config` with hooks, `.codex/config.toml` or `.agents/skills/…` for
//! whoever runs there next.
//!
//! Before such a process starts, the server therefore creates each missing carve-out as an
//! empty directory (mode 0555, born with it), which narrowing then mounts read-only: the
//! name cannot be created, replaced, renamed over or removed from inside (a mount point is
//! busy). The placeholder lives as long as any process that needs it — counted per path,
//! since sessions may share a root — and is removed afterwards if it is still the empty
//! directory we made. A carve-out whose parent directory is missing too cannot be held this
//! way without creating directories nobody asked for, so such a start is refused.
//!
//! What remains visible: while the process runs, the host sees an empty `.git` (or other)
//! directory; a server killed outright leaves it behind, empty. The server's own
//! `fs/watchMissing` treats a held placeholder as still missing ([`is_held`]), so a client
//! watching for the name is not told it appeared.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use rustix::fs::Mode;

use crate::policy::SandboxPolicy;

/// Mode of a placeholder: an empty directory nobody may write to.
const PLACEHOLDER_MODE: u32 = 0o555;

/// Placeholders held right now, by path, shared by every process that needs them, with the
/// identity of the directory made.
static HELD: Mutex<Option<HashMap<PathBuf, Held>>> = Mutex::new(None);

#[derive(Debug)]
struct Held {
    placeholder: Weak<Placeholder>,
    dev: u64,
    ino: u64,
}

/// One empty directory standing in for a carve-out that did not exist.
#[derive(Debug)]
struct Placeholder {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

/// The placeholders one process start holds; dropping the last holder of a path removes
/// it.
#[derive(Debug, Default)]
pub struct Placeholders(Vec<Arc<Placeholder>>);

impl Placeholders {
    /// How many placeholders this start holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether `path` is a placeholder held right now. The server's own watchers treat one as
/// still missing: clients (codex watches for `.codex` and `.git` to appear) must not be
/// told that a name appeared that only the sandbox sees as taken.
pub fn is_held(path: &Path) -> bool {
    let held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let Some(entry) = held.as_ref().and_then(|map| map.get(path)) else {
        return false;
    };
    entry.placeholder.strong_count() > 0
        && std::fs::symlink_metadata(path)
            .is_ok_and(|m| (m.dev(), m.ino()) == (entry.dev, entry.ino))
}

/// A carve-out that cannot be held.
#[derive(Debug)]
pub struct Unholdable {
    pub path: PathBuf,
    pub error: io::Error,
}

/// Creates (or shares) a placeholder for every read-only carve-out of `policy` that does
/// not exist.
pub fn hold(policy: &SandboxPolicy) -> Result<Placeholders, Unholdable> {
    let mut held = Placeholders::default();
    // Existing names are not skipped here: one may be a placeholder another start holds,
    // which this start must hold too, or it could be removed while this process runs.
    for path in &policy.read_only {
        match hold_one(path) {
            Ok(Some(placeholder)) => held.0.push(placeholder),
            Ok(None) => {}
            Err(error) => {
                return Err(Unholdable {
                    path: path.clone(),
                    error,
                })
            }
        }
    }
    Ok(held)
}

/// The placeholder for `path`, or `None` when something else created the name meanwhile
/// (narrowing then mounts whatever is there).
fn hold_one(path: &Path) -> io::Result<Option<Arc<Placeholder>>> {
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let held = held.get_or_insert_with(HashMap::new);
    if let Some(existing) = held.get(path).and_then(|h| h.placeholder.upgrade()) {
        return Ok(Some(existing));
    }
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => (parent, name),
        _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
    };
    // The parent is opened without following a last link, and the name is created in it
    // without following anything: a link planted in the name fails with EEXIST.
    let flags = rustix::fs::OFlags::DIRECTORY
        | rustix::fs::OFlags::NOFOLLOW
        | rustix::fs::OFlags::PATH
        | rustix::fs::OFlags::CLOEXEC;
    let dir = rustix::fs::open(parent, flags, Mode::empty())?;
    let created = match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(PLACEHOLDER_MODE)) {
        Ok(()) => true,
        Err(rustix::io::Errno::EXIST) => false,
        // Nothing we start may create there either: it runs as our user, with fewer rights.
        Err(rustix::io::Errno::ACCESS | rustix::io::Errno::PERM | rustix::io::Errno::ROFS) => {
            return Ok(None)
        }
        Err(e) => return Err(e.into()),
    };
    let stat = rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
    let (dev, ino) = (stat.st_dev, stat.st_ino);
    // A placeholder whose last holder is just letting go is still ours: take it over, so
    // that it is not removed under the new holder.
    let ours = created || held.get(path).is_some_and(|h| (h.dev, h.ino) == (dev, ino));
    if !ours {
        return Ok(None);
    }
    let placeholder = Arc::new(Placeholder {
        path: path.to_owned(),
        dev,
        ino,
    });
    let entry = Held {
        placeholder: Arc::downgrade(&placeholder),
        dev,
        ino,
    };
    held.insert(path.to_owned(), entry);
    Ok(Some(placeholder))
}

impl Drop for Placeholder {
    /// Removes the directory if nobody took it over and it is still the empty one we made
    /// (`rmdir` refuses anything that is not empty).
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        let map = held.get_or_insert_with(HashMap::new);
        if map
            .get(&self.path)
            .is_some_and(|h| h.placeholder.strong_count() > 0)
        {
            return;
        }
        map.remove(&self.path);
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.is_dir() && m.dev() == self.dev && m.ino() == self.ino);
        if ours {
            if let Err(e) = std::fs::remove_dir(&self.path) {
                tracing::warn!(path = ?self.path, error = %e, "a carve-out placeholder was left behind");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Network, Readable};

    fn policy(read_only: Vec<PathBuf>) -> SandboxPolicy {
        SandboxPolicy {
            readable: Readable::All,
            writable: Vec::new(),
            read_only,
            denied_paths: Vec::new(),
            denied_globs: Vec::new(),
            network: Network::Restricted,
            full_disk_write: false,
            glob_scan_max_depth: 16,
        }
    }

    #[test]
    fn missing_carve_outs_are_held_while_needed_then_removed() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join(".codex")).unwrap();
        let carve_outs = vec![root.join(".git"), root.join(".codex"), root.join(".agents")];
        let first = hold(&policy(carve_outs.clone())).unwrap();
        assert_eq!(first.len(), 2, "only the missing ones");
        let git = std::fs::metadata(root.join(".git")).unwrap();
        assert!(git.is_dir());
        assert_eq!(git.mode() & 0o7777, 0o555 & !umask());
        let second = hold(&policy(carve_outs)).unwrap();
        assert_eq!(second.len(), 2, "shared, not created again");
        assert!(is_held(&root.join(".git")));
        assert!(!is_held(&root.join(".codex")), "it existed before");
        drop(first);
        assert!(
            root.join(".git").exists(),
            "still needed by the second start"
        );
        drop(second);
        assert!(!root.join(".git").exists());
        assert!(!is_held(&root.join(".git")));
        assert!(!root.join(".agents").exists());
        assert!(root.join(".codex").exists(), "what existed before stays");
    }

    #[test]
    fn a_placeholder_that_was_filled_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let held = hold(&policy(vec![root.join(".git")])).unwrap();
        std::fs::set_permissions(
            root.join(".git"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        std::fs::write(root.join(".git/config"), "x").unwrap();
        drop(held);
        assert!(root.join(".git/config").exists());
    }

    #[test]
    fn a_carve_out_without_its_parent_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let error = hold(&policy(vec![root.join("missing/.git")])).unwrap_err();
        assert_eq!(error.path, root.join("missing/.git"));
        assert!(!root.join("missing").exists());
    }

    fn umask() -> u32 {
        // SAFETY: umask only swaps the process's mask; it is put back at once.
        unsafe {
            let old = libc::umask(0o022);
            libc::umask(old);
            old
        }
    }
}

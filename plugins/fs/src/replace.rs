//! `fs/open` mode `replace` (codex 0.169.0): a new version of a file, written block by
//! block into a temporary file beside it and put in its place atomically at `fs/close`.
//!
//! Readers of the target see its old content until the close and the new content after
//! it, never a part. The target is found the way the kernel would open it (a symbolic link
//! as the last component is followed, like codex), and from then on its directory is
//! reached only through the descriptor opened at `fs/open`: the temporary file is created,
//! renamed and removed relative to it, never by path again, so a directory or a link
//! swapped in meanwhile redirects nothing. A handle dropped before a successful close
//! (closed after a failure, or ended with its connection) removes its temporary file.

use std::collections::hash_map::RandomState;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use exec_server_core::proto::RpcError;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::acl::{self, Acl};
use crate::blocking::IoResultExt;
use crate::created_modes;
use crate::paths::native;

/// Links followed before giving up with `ELOOP`, as the kernel does.
const MAX_LINKS: usize = 40;

/// Bytes of the target's name kept in the temporary file's name, so that it stays within
/// `NAME_MAX` (255).
const TEMP_NAME_KEEP: usize = 200;

/// Attempts at a fresh temporary name before giving up.
const TEMP_NAME_ATTEMPTS: usize = 16;

/// One `replace` handle: the temporary file and the directory it will be renamed in.
#[derive(Debug)]
pub(crate) struct ReplaceFile {
    temp: File,
    /// The target's directory, as resolved at `fs/open`.
    dir: OwnedFd,
    /// Whether `dir` was opened for reading, so that it can be synced after the rename
    /// (a directory we may only search is opened `O_PATH`, which cannot be synced).
    dir_syncable: bool,
    temp_name: OsString,
    target_name: OsString,
    /// The file being replaced, as `fs/open` found it.
    existing: Option<Snapshot>,
    /// Writes hold it shared; the commit holds it exclusively, so no write lands in the
    /// file once it is the target. `true` once the temporary file is the target.
    committed: RwLock<bool>,
}

impl ReplaceFile {
    /// Prepares a new version of `path`: finds the file it names (following a last link),
    /// and creates an empty temporary file beside it with only the owner's bits (the
    /// target's, or read and write for a new file), the server's user's. It stays so
    /// while the client writes: nobody else may open it, whatever the target allows or
    /// comes to allow. The commit gives it the target's owner, permissions and ACL as
    /// they are then, and its set-id bits last.
    pub(crate) fn open(path: &Path) -> Result<Self, RpcError> {
        let Target {
            dir,
            dir_syncable,
            name,
            existing,
        } = resolve(path)?;
        let snapshot = match existing {
            Some(stat) => Some(Snapshot {
                owner: owner_of(&stat),
                acl: target_acl(&dir, &name, &stat).or_rpc()?,
                id: (stat.st_dev, stat.st_ino),
            }),
            None => None,
        };
        let creation_mode = created_modes::replacement_creation_mode(existing.map(|s| s.st_mode));
        let (temp, temp_name) = create_temp(&dir, &name, creation_mode).or_rpc()?;
        Ok(Self {
            temp,
            dir,
            dir_syncable,
            temp_name,
            target_name: name,
            existing: snapshot,
            committed: RwLock::new(false),
        })
    }

    /// Writes `chunk` at `offset` of the new version; `None` once it has been committed.
    pub(crate) fn write_at(&self, chunk: &[u8], offset: u64) -> Option<io::Result<()>> {
        let committed = self.read_lock();
        if *committed {
            return None;
        }
        Some(self.temp.write_all_at(chunk, offset))
    }

    /// The size of the new version.
    pub(crate) fn size(&self) -> u64 {
        self.temp.metadata().map_or(0, |m| m.len())
    }

    /// Puts the new version in place: syncs it, renames it over the target, syncs the
    /// directory. Waits for writes in flight.
    pub(crate) fn commit(&self) -> Result<(), RpcError> {
        let mut committed = self.write_lock();
        if *committed {
            return Ok(());
        }
        self.take_permissions().or_rpc()?;
        self.temp.sync_all().or_rpc()?;
        rustix::fs::renameat(&self.dir, &self.temp_name, &self.dir, &self.target_name)
            .map_err(io::Error::from)
            .or_rpc()?;
        *committed = true;
        if self.dir_syncable {
            rustix::fs::fsync(&self.dir)
                .map_err(io::Error::from)
                .or_rpc()?;
        }
        Ok(())
    }

    /// Gives the new version, its content final, its owner and permissions, set-id bits
    /// last: those of the file `fs/open` found as they are now (an owner who narrowed them
    /// since must not see them widened by the replace), or as `fs/open` found them if it
    /// is gone. A file someone else put at the name since gets nobody more than the file
    /// `fs/open` found gave, nor more than its own mode shows, and never the new version
    /// itself (no owner of theirs, no ACL, no set-id bits); likewise for a name that did
    /// not exist at `fs/open`, which otherwise gets what a file created there gets.
    fn take_permissions(&self) -> io::Result<()> {
        let now = self.current_target()?;
        let Some(snapshot) = &self.existing else {
            let present = now.map(|(stat, _)| stat.st_mode);
            return created_modes::finish_new_file(&self.temp, self.dir.as_fd(), present);
        };
        let (owner, acl) = match now {
            Some((stat, acl)) if (stat.st_dev, stat.st_ino) == snapshot.id => {
                (owner_of(&stat), acl)
            }
            None => (snapshot.owner, snapshot.acl.clone()),
            Some((stat, _)) => (snapshot.narrowed_to(stat.st_mode), None),
        };
        created_modes::adopt(&self.temp, owner, acl.as_ref())?;
        created_modes::restore_set_id(&self.temp, owner)
    }

    /// The file at the target's name now, with its access ACL, if it is a regular file.
    fn current_target(&self) -> io::Result<Option<(Stat, Option<Acl>)>> {
        let flags = AtFlags::SYMLINK_NOFOLLOW;
        let now = match rustix::fs::statat(&self.dir, &self.target_name, flags) {
            Ok(now) => now,
            Err(Errno::NOENT) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        if FileType::from_raw_mode(now.st_mode) != FileType::RegularFile {
            return Ok(None);
        }
        let acl = target_acl(&self.dir, &self.target_name, &now)?;
        Ok(Some((now, acl)))
    }

    fn read_lock(&self) -> RwLockReadGuard<'_, bool> {
        // The flag is one assignment: a panic cannot leave it half-updated.
        self.committed.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, bool> {
        self.committed.write().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for ReplaceFile {
    /// A version that never became the target is removed.
    fn drop(&mut self) {
        let committed = *self.committed.get_mut().unwrap_or_else(|p| p.into_inner());
        if !committed {
            let _ = rustix::fs::unlinkat(&self.dir, &self.temp_name, AtFlags::empty());
        }
    }
}

/// Where a `replace` handle writes: the directory and name the path resolves to.
struct Target {
    dir: OwnedFd,
    dir_syncable: bool,
    name: OsString,
    /// The regular file there now, if any.
    existing: Option<Stat>,
}

/// The file a `replace` handle replaces, as `fs/open` found it.
#[derive(Debug)]
struct Snapshot {
    owner: created_modes::Owner,
    acl: Option<Acl>,
    /// Device and inode: whether the file at the name at the commit is still this one.
    id: (u64, u64),
}

impl Snapshot {
    /// Its owner, with the permission bits both it and `mode` (another file's) allow
    /// (the group's its own where its ACL made them a mask), and no set-id bits.
    fn narrowed_to(&self, mode: u32) -> created_modes::Owner {
        let own = acl::mode_without_mask(self.acl.as_ref(), self.owner.mode);
        created_modes::Owner {
            mode: own & mode & 0o777,
            ..self.owner
        }
    }
}

fn owner_of(stat: &Stat) -> created_modes::Owner {
    created_modes::Owner {
        mode: stat.st_mode,
        uid: stat.st_uid,
        gid: stat.st_gid,
    }
}

/// The access ACL of the file `name` in `dir`, checked to be the file `stat` describes
/// (a file swapped in since is refused, not copied from).
fn target_acl(dir: &OwnedFd, name: &OsStr, stat: &Stat) -> io::Result<Option<Acl>> {
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let target = rustix::fs::openat(dir, name, flags, Mode::empty())?;
    let now = rustix::fs::fstat(&target)?;
    if (now.st_dev, now.st_ino) != (stat.st_dev, stat.st_ino) {
        return Err(io::Error::other(
            "the file changed while it was being opened",
        ));
    }
    acl::of_target(&target)
}

/// Resolves `path` to the directory and name the kernel would open, following links in
/// the last component; a directory is `EISDIR`, any other non-regular file is refused as
/// not a file (codex's answers).
fn resolve(path: &Path) -> Result<Target, RpcError> {
    let mut current: PathBuf = path.to_path_buf();
    for _ in 0..=MAX_LINKS {
        let Some(name) = current.file_name().map(OsStr::to_os_string) else {
            // `/` or a path ending in `..`: a directory.
            return Err(RpcError::from_io(&Errno::ISDIR.into()));
        };
        let parent = current.parent().unwrap_or(Path::new("/")).to_path_buf();
        let (dir, dir_syncable) = open_directory(&parent).or_rpc()?;
        let stat = match rustix::fs::statat(&dir, &*name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::NOENT) => {
                return Ok(Target {
                    dir,
                    dir_syncable,
                    name,
                    existing: None,
                })
            }
            Err(e) => return Err(RpcError::from_io(&e.into())),
        };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => {
                return Ok(Target {
                    dir,
                    dir_syncable,
                    name,
                    existing: Some(stat),
                })
            }
            FileType::Directory => return Err(RpcError::from_io(&Errno::ISDIR.into())),
            FileType::Symlink => {
                let link = rustix::fs::readlinkat(&dir, &*name, Vec::new())
                    .map_err(io::Error::from)
                    .or_rpc()?;
                let link = PathBuf::from(OsString::from_vec(link.into_bytes()));
                // An absolute link replaces the whole path; a relative one is read in the
                // link's directory.
                current = parent.join(link);
            }
            _ => return Err(RpcError::not_a_file(&native(path))),
        }
    }
    Err(RpcError::from_io(&Errno::LOOP.into()))
}

/// Opens a directory for reading (so it can be synced), or only to reach entries when
/// it may not be read.
fn open_directory(path: &Path) -> io::Result<(OwnedFd, bool)> {
    let flags = OFlags::DIRECTORY | OFlags::CLOEXEC;
    match rustix::fs::open(path, flags | OFlags::RDONLY, Mode::empty()) {
        Ok(dir) => Ok((dir, true)),
        Err(Errno::ACCESS) => Ok((
            rustix::fs::open(path, flags | OFlags::PATH, Mode::empty())?,
            false,
        )),
        Err(e) => Err(e.into()),
    }
}

/// Creates a new, empty file with `mode` in `dir` named after `target`
/// (`.<target>.<random>.tmp`), never reusing or following anything already there.
fn create_temp(dir: &OwnedFd, target: &OsStr, mode: Mode) -> io::Result<(File, OsString)> {
    let kept = &target.as_bytes()[..target.len().min(TEMP_NAME_KEEP)];
    let mut last = Errno::EXIST;
    for attempt in 0..TEMP_NAME_ATTEMPTS {
        let mut name = b".".to_vec();
        name.extend_from_slice(kept);
        name.extend_from_slice(format!(".{:016x}.tmp", random(attempt)).as_bytes());
        let name = OsString::from_vec(name);
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(dir, &*name, flags, mode) {
            Ok(fd) => return Ok((File::from(fd), name)),
            Err(Errno::EXIST) => last = Errno::EXIST,
            Err(e) => return Err(e.into()),
        }
    }
    Err(last.into())
}

/// A value nobody can predict from outside the process (std's per-process random hash
/// keys), different on every call.
fn random(attempt: usize) -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_usize(attempt);
    hasher.write_u32(std::process::id());
    hasher.finish()
}

#[cfg(test)]
#[path = "replace_tests.rs"]
mod tests;

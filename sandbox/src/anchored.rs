//! Acting on exactly the path a policy check approved (SANDBOX.md §1, "carve-out races"):
//! descriptors opened without following any symbolic link, and the `*at` calls that act
//! relative to them.
//!
//! The fs helper resolves a path, decides the policy on the resolution, and must then touch
//! that resolution and nothing else. Opening the resolved path again by name would follow
//! whatever links a concurrent writer swapped in since (check-then-use). Here every
//! component is looked up literally instead: `openat2(2)` with `RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_BENEATH` below `/`, or, where the kernel has no
//! `openat2` (before 5.6), a walk that opens one component at a time with
//! `O_PATH | O_NOFOLLOW`. A link anywhere in the path makes the open fail (`ELOOP`); it can
//! never redirect it. Entries below an opened directory are reached with `*at` calls on
//! single names, always with `O_NOFOLLOW` / `AT_SYMLINK_NOFOLLOW`.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// What a directory entry is, seen without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Directory,
    File,
    Symlink,
    /// FIFOs, sockets, devices.
    Other,
}

impl EntryKind {
    fn of(mode: u32) -> Self {
        match FileType::from_raw_mode(mode) {
            FileType::Directory => Self::Directory,
            FileType::RegularFile => Self::File,
            FileType::Symlink => Self::Symlink,
            _ => Self::Other,
        }
    }
}

/// Opens `path` — absolute, made of plain names only (what [`crate::policy::resolve`]
/// produces) — with `flags`, looking every component up literally: a symbolic link in any
/// component, the last one included, fails with `ELOOP`. `O_CLOEXEC` is always added.
pub fn open_exact(path: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    let names = plain_names(path)?;
    let flags = flags | OFlags::CLOEXEC;
    #[cfg(target_os = "linux")]
    {
        match open_with_openat2(&names, flags, mode) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {}
            other => return other,
        }
    }
    open_by_walk(&names, flags, mode)
}

/// [`open_exact`] with `openat2(2)`, relative to `/` and never leaving it.
#[cfg(target_os = "linux")]
pub fn open_with_openat2(names: &[&OsStr], flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    use rustix::fs::ResolveFlags;

    let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | ResolveFlags::BENEATH;
    let relative = join_names(names);
    // The kernel answers EAGAIN when a rename elsewhere raced with a `..`-free lookup it
    // cannot vouch for; a few retries settle it.
    let mut attempts = 0;
    let fd = loop {
        match rustix::fs::openat2(root()?, &relative, flags, mode, resolve) {
            Err(rustix::io::Errno::AGAIN) if attempts < 8 => attempts += 1,
            other => break other?,
        }
    };
    // `RESOLVE_NO_SYMLINKS` hands out a last link itself under `O_PATH | O_NOFOLLOW`.
    if flags.contains(OFlags::PATH | OFlags::NOFOLLOW) && kind_of(fd.as_fd())? == EntryKind::Symlink
    {
        return Err(io::Error::from_raw_os_error(libc::ELOOP));
    }
    Ok(fd)
}

/// [`open_exact`] for kernels without `openat2`: one `O_PATH | O_NOFOLLOW` open per
/// directory, each checked to be a directory (not a link) before the next name is looked
/// up in it; the last name is opened with `flags | O_NOFOLLOW`.
pub fn open_by_walk(names: &[&OsStr], flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    let Some((last, parents)) = names.split_last() else {
        return rustix::fs::openat(rustix::fs::CWD, "/", flags, mode).map_err(io::Error::from);
    };
    let mut directory = rustix::fs::openat(
        rustix::fs::CWD,
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for name in parents {
        directory = open_child_directory(directory.as_fd(), name)?;
    }
    let fd = match rustix::fs::openat(&directory, *last, flags | OFlags::NOFOLLOW, mode) {
        Ok(fd) => fd,
        // `O_DIRECTORY | O_NOFOLLOW` on a link says ENOTDIR; `openat2` says ELOOP.
        Err(rustix::io::Errno::NOTDIR)
            if rustix::fs::statat(&directory, *last, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|s| EntryKind::of(s.st_mode) == EntryKind::Symlink) =>
        {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
        Err(e) => return Err(e.into()),
    };
    // `O_PATH | O_NOFOLLOW` hands out the link itself instead of failing.
    if flags.contains(OFlags::PATH) && kind_of(fd.as_fd())? == EntryKind::Symlink {
        return Err(io::Error::from_raw_os_error(libc::ELOOP));
    }
    Ok(fd)
}

/// The names of an absolute path made of plain names; anything else (a relative path, `.`,
/// `..`, a trailing `/`) is refused with `EINVAL`, because its meaning would depend on links.
pub fn plain_names(path: &Path) -> io::Result<Vec<&OsStr>> {
    // `components` drops a `.` and a trailing `/`, after which the kernel follows the name
    // before them (and wants a directory): look at the bytes.
    let bytes = path.as_os_str().as_bytes();
    let dotted = bytes.split(|&b| b == b'/').any(|name| name == b".");
    if dotted || (bytes.len() > 1 && bytes.ends_with(b"/")) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut components = path.components();
    if components.next() != Some(Component::RootDir) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    components
        .map(|c| match c {
            Component::Normal(name) => Ok(name),
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        })
        .collect()
}

fn join_names(names: &[&OsStr]) -> OsString {
    if names.is_empty() {
        return OsString::from(".");
    }
    let mut joined = Vec::new();
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            joined.push(b'/');
        }
        joined.extend_from_slice(name.as_bytes());
    }
    OsString::from_vec(joined)
}

/// `/`, opened once per process as the anchor of every exact open.
#[cfg(target_os = "linux")]
fn root() -> io::Result<BorrowedFd<'static>> {
    static ROOT: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = ROOT.get() {
        return Ok(fd.as_fd());
    }
    let fd = rustix::fs::openat(
        rustix::fs::CWD,
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(ROOT.get_or_init(|| fd).as_fd())
}

fn open_child_directory(directory: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    let fd = rustix::fs::openat(
        directory,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    match kind_of(fd.as_fd())? {
        EntryKind::Directory => Ok(fd),
        EntryKind::Symlink => Err(io::Error::from_raw_os_error(libc::ELOOP)),
        _ => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
    }
}

fn kind_of(fd: BorrowedFd<'_>) -> io::Result<EntryKind> {
    Ok(EntryKind::of(rustix::fs::fstat(fd)?.st_mode))
}

/// A directory opened exactly (`O_PATH`): the anchor for calls on its entries, each named
/// by a single component and never followed if it is a link.
#[derive(Debug)]
pub struct Directory {
    fd: OwnedFd,
}

impl Directory {
    /// Opens the directory at `path` exactly (see [`open_exact`]).
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = open_exact(path, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        Ok(Self { fd })
    }

    /// Opens the directory holding `path`'s last component exactly, and returns it with
    /// that name. `/` has no parent: `EISDIR`.
    pub fn open_parent(path: &Path) -> io::Result<(Self, OsString)> {
        let name = match path.file_name() {
            Some(name) => name.to_owned(),
            None => return Err(io::Error::from_raw_os_error(libc::EISDIR)),
        };
        let parent = path.parent().unwrap_or(Path::new("/"));
        Ok((Self::open(parent)?, name))
    }

    /// What `name` is, without following it.
    pub fn kind(&self, name: &OsStr) -> io::Result<EntryKind> {
        let stat = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(EntryKind::of(stat.st_mode))
    }

    /// The directory `name` (a directory, not a link to one).
    pub fn directory(&self, name: &OsStr) -> io::Result<Directory> {
        Ok(Self {
            fd: open_child_directory(self.fd.as_fd(), name)?,
        })
    }

    /// Opens `name` with `flags | O_NOFOLLOW | O_CLOEXEC`: a link fails with `ELOOP`.
    pub fn open_file(&self, name: &OsStr, flags: OFlags, mode: Mode) -> io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            mode,
        )?;
        Ok(File::from(fd))
    }

    /// A handle on `name` itself, link or not, for its metadata (`O_PATH | O_NOFOLLOW`).
    pub fn handle(&self, name: &OsStr) -> io::Result<File> {
        self.open_file(name, OFlags::PATH, Mode::empty())
    }

    /// The names in this directory, without `.` and `..`, in the order the OS returns
    /// them. Listing needs read access to the directory (Landlock checks it here).
    pub fn names(&self) -> io::Result<Names> {
        let fd = rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Names(rustix::fs::Dir::new(fd)?))
    }

    /// The text of the link `name`.
    pub fn read_link(&self, name: &OsStr) -> io::Result<PathBuf> {
        let text = rustix::fs::readlinkat(&self.fd, name, Vec::new())?;
        Ok(PathBuf::from(OsString::from_vec(text.into_bytes())))
    }

    /// Creates the directory `name`.
    pub fn create_directory(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(mode)).map_err(io::Error::from)
    }

    /// Creates the link `name` with the text `target`.
    pub fn create_symlink(&self, target: &Path, name: &OsStr) -> io::Result<()> {
        rustix::fs::symlinkat(target, &self.fd, name).map_err(io::Error::from)
    }

    /// Unlinks `name` (a directory with `directory`, which must be empty); a link is
    /// removed itself.
    pub fn remove(&self, name: &OsStr, directory: bool) -> io::Result<()> {
        let flags = if directory {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        rustix::fs::unlinkat(&self.fd, name, flags).map_err(io::Error::from)
    }

    /// `(device, inode)` of this directory.
    pub fn identity(&self) -> io::Result<(u64, u64)> {
        let stat = rustix::fs::fstat(&self.fd)?;
        Ok((stat.st_dev, stat.st_ino))
    }
}

impl AsFd for Directory {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The names of one directory, read through its descriptor.
pub struct Names(rustix::fs::Dir);

impl std::fmt::Debug for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Names")
    }
}

impl Iterator for Names {
    type Item = io::Result<OsString>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let entry = match self.0.next()? {
                Ok(entry) => entry,
                Err(e) => return Some(Err(e.into())),
            };
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                return Some(Ok(OsString::from_vec(name.to_vec())));
            }
        }
    }
}

#[cfg(test)]
#[path = "anchored_tests.rs"]
pub(crate) mod tests;

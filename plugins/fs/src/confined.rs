//! Every method as the fs helper runs it (SANDBOX.md §1 "carve-out races", §5.6, §5.7):
//! each target is resolved, the policy is decided on the resolution, and the operation then
//! acts only through descriptors opened exactly at what was approved
//! ([`exec_server_sandbox::anchored`]). A link swapped into the path after the check makes
//! the operation fail (`ELOOP`, mapped as usual); it never redirects it. Recursive methods
//! check every entry they touch.
//!
//! * this module — the one-target methods: `fs/readFile`, `fs/writeFile`,
//!   `fs/createDirectory`, `fs/getMetadata`, `fs/canonicalize`;
//! * `listing` — `fs/readDirectory` and the walk's view of the tree (`fs/walk`);
//! * `tree_copy` — `fs/copy`;
//! * `tree_remove` — `fs/remove`.
//!
//! Results and error texts are those of the in-process methods (PROTOCOL §5).

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use exec_server_core::proto::fs::{Metadata, WRITE_FILE};
use exec_server_core::proto::RpcError;
use exec_server_sandbox::anchored::{open_exact, Directory, EntryKind};
use exec_server_sandbox::policy::{resolve, AccessKind, SandboxPolicy};
use rustix::fs::{Mode, OFlags};

use crate::blocking::{Deadline, IoResultExt};
// New files and directories that copy no other's mode are born with their final mode
// (`0666`/`0777` less the umask); copies take theirs from `created_modes` too.
use crate::created_modes::{NEW_DIRECTORY_MODE, NEW_FILE_MODE};
use crate::nonblocking;
use crate::paths::native;

mod listing;
mod tree_copy;
mod tree_remove;

pub(crate) use listing::{read_directory, walk};
pub(crate) use tree_copy::copy;
pub(crate) use tree_remove::remove;

/// `fs/readFile`: the regular file to read.
pub(crate) fn open_to_read(
    policy: &SandboxPolicy,
    path: &Path,
    follow: bool,
) -> Result<std::fs::File, RpcError> {
    let approved = policy.approve(path, follow, AccessKind::Read)?;
    let file = open_approved(&approved, path, follow, OFlags::RDONLY, 0)?;
    crate::regular_file::ensure_regular(file, path)
}

/// `fs/writeFile`: in place, like the server (§5.7).
pub(crate) fn write_file(
    policy: &SandboxPolicy,
    path: &Path,
    data: &[u8],
    follow: bool,
) -> Result<(), RpcError> {
    let approved = policy.approve(path, follow, AccessKind::Write)?;
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC;
    let mut file = open_approved(&approved, path, follow, flags, NEW_FILE_MODE)?;
    if !file.metadata().or_rpc()?.is_file() {
        // The helper's slot is shared: its reader gets a bounded wait, not the helper's.
        let deadline = Deadline::in_fs_helper(WRITE_FILE).for_peer_in_slot();
        return crate::stream_write::write_all_on_thread(&file, data, &deadline);
    }
    nonblocking::make_blocking(&file).or_rpc()?;
    file.write_all(data).or_rpc()
}

/// `fs/createDirectory`: the missing directories are made one at a time below the deepest
/// existing one, each checked and each reached without following links.
pub(crate) fn create_directory(
    policy: &SandboxPolicy,
    path: &Path,
    recursive: bool,
    follow: bool,
) -> Result<(), RpcError> {
    let approved = policy.approve(path, follow, AccessKind::Write)?;
    if !recursive {
        let (parent, name) = Directory::open_parent(&approved).or_rpc()?;
        return parent.create_directory(&name, NEW_DIRECTORY_MODE).or_rpc();
    }
    let names = exec_server_sandbox::anchored::plain_names(&approved).or_rpc()?;
    let mut directory = Directory::open(Path::new("/")).or_rpc()?;
    let mut location = PathBuf::from("/");
    for (i, name) in names.iter().enumerate() {
        location.push(name);
        let is_last = i + 1 == names.len();
        directory = match directory.directory(name) {
            Ok(next) => next,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                policy.check_write(&location)?;
                match directory.create_directory(name, NEW_DIRECTORY_MODE) {
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                        return Err(RpcError::from_io(&e))
                    }
                    _ => {}
                }
                directory.directory(name).or_rpc()?
            }
            // Something that is not a directory is in the way: at the end it is the
            // existing path (`EEXIST`), before it an ancestor (`ENOTDIR`), as `mkdir -p`
            // reports.
            Err(e) if is_not_directory(&e) => {
                let errno = if is_last { libc::EEXIST } else { libc::ENOTDIR };
                return Err(RpcError::from_io(&io::Error::from_raw_os_error(errno)));
            }
            Err(e) => return Err(RpcError::from_io(&e)),
        };
    }
    Ok(())
}

/// `fs/getMetadata`: with `follow`, the approved resolution is the target; without, the
/// path itself (a link is described as a link).
pub(crate) fn get_metadata(
    policy: &SandboxPolicy,
    path: &Path,
    follow: bool,
) -> Result<Metadata, RpcError> {
    let approved = policy.approve(path, follow, AccessKind::Read)?;
    let handle = if follow {
        File::from(open_exact(&approved, OFlags::PATH, Mode::empty()).or_rpc()?)
    } else {
        let (parent, name) = Directory::open_parent(&approved).or_rpc()?;
        parent.handle(&name).or_rpc()?
    };
    let described = handle.metadata().or_rpc()?;
    // With `follow` the path is a link exactly when resolving it followed its last name.
    let is_symlink = if follow {
        resolve(path, false) != approved
    } else {
        described.file_type().is_symlink()
    };
    Ok(crate::describe::describe(is_symlink, &described))
}

/// `fs/canonicalize`: the approved resolution, once it is shown to exist exactly there.
pub(crate) fn canonicalize(policy: &SandboxPolicy, path: &Path) -> Result<PathBuf, RpcError> {
    let approved = policy.approve(path, true, AccessKind::Read)?;
    open_exact(&approved, OFlags::PATH, Mode::empty()).or_rpc()?;
    Ok(approved)
}

/// Opens the approved resolution of `requested` exactly, without waiting on a FIFO. A link
/// as the last name fails; without `follow` that is the method's ``path `<path>` is a
/// symbolic link`` (§5.4).
fn open_approved(
    approved: &Path,
    requested: &Path,
    follow: bool,
    flags: OFlags,
    mode: u32,
) -> Result<File, RpcError> {
    match open_exact(
        approved,
        flags | OFlags::NONBLOCK,
        Mode::from_raw_mode(mode),
    ) {
        Ok(fd) => Ok(File::from(fd)),
        Err(e) if !follow && e.raw_os_error() == Some(libc::ELOOP) && is_link(approved) => {
            Err(RpcError::is_symlink(&native(requested)))
        }
        Err(e) => Err(RpcError::from_io(&e)),
    }
}

/// Whether the last name of `path` is a link (its directory reached exactly).
fn is_link(path: &Path) -> bool {
    Directory::open_parent(path)
        .and_then(|(parent, name)| parent.kind(&name))
        .is_ok_and(|kind| kind == EntryKind::Symlink)
}

/// The errors of [`Directory::directory`] for an entry that is not a directory.
fn is_not_directory(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP))
}

//! `fs/copy` in the fs helper (SANDBOX.md §5.6): every source entry must be readable and
//! every destination entry writable, each decided on its own resolved path.
//!
//! The source is read through descriptors and never followed: a link inside it is copied
//! as a link, and only when both the link and what it resolves to are readable (a copy must
//! not plant a way to a denied file, nor reveal where one is). In the destination an
//! existing link is followed as the server would, but only as far as its checked
//! resolution, which is then opened exactly. A directory is surveyed completely before
//! anything is written, so a denied entry refuses the whole copy up front; the copy itself
//! checks every entry again, so a file swapped in after the survey cannot slip through.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use exec_server_core::proto::fs::COPY;
use exec_server_core::proto::RpcError;
use exec_server_sandbox::anchored::{open_exact, Directory, EntryKind, Names};
use exec_server_sandbox::policy::{resolve, AccessKind, SandboxPolicy};
use rustix::fs::{Mode, OFlags};

use crate::blocking::{Deadline, IoResultExt};
use crate::copy_data::copy_opened;
use crate::created_modes;

/// `fs/copy`: the source examined without following its last link.
pub(crate) fn copy(
    policy: &SandboxPolicy,
    source: &Path,
    destination: &Path,
    recursive: bool,
) -> Result<(), RpcError> {
    let source = policy.approve(source, false, AccessKind::Read)?;
    let (parent, name) = Directory::open_parent(&source).or_rpc()?;
    match parent.kind(&name).or_rpc()? {
        EntryKind::Directory => {
            if !recursive {
                return Err(RpcError::copy_requires_recursive());
            }
            let destination = policy.approve(destination, true, AccessKind::Write)?;
            if destination.starts_with(&source) {
                return Err(RpcError::copy_into_itself());
            }
            policy.check_write_tree(&destination)?;
            let tree = parent.directory(&name).or_rpc()?;
            survey(policy, &tree, &source, &destination)?;
            copy_tree(policy, tree, source, destination)
        }
        EntryKind::Symlink => {
            policy.check_read(&resolve(&source, true))?;
            // Creating a link never follows one already at the destination.
            let destination = policy.approve(destination, false, AccessKind::Write)?;
            let text = parent.read_link(&name).or_rpc()?;
            let (destination_parent, new_name) = Directory::open_parent(&destination).or_rpc()?;
            destination_parent.create_symlink(&text, &new_name).or_rpc()
        }
        EntryKind::File => {
            let destination = policy.approve(destination, true, AccessKind::Write)?;
            let from = parent.open_file(&name, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty());
            let from = from.or_rpc()?;
            let source = from.metadata().or_rpc()?;
            if !source.is_file() {
                return Err(RpcError::copy_unsupported_type());
            }
            let to = create_file(&destination, source.mode())?;
            copy_opened(from, to, &Deadline::in_fs_helper(COPY))
        }
        EntryKind::Other => Err(RpcError::copy_unsupported_type()),
    }
}

/// Decides one entry of the tree: `source` is the entry, `kind` what it is, and
/// `destination` the directory (resolved) it is copied into under the same name. Returns
/// where the copy goes.
fn check_entry(
    policy: &SandboxPolicy,
    source: &Path,
    kind: EntryKind,
    destination: &Path,
    name: &OsString,
) -> Result<PathBuf, RpcError> {
    policy.check_read(source)?;
    if kind == EntryKind::Symlink {
        policy.check_read(&resolve(source, true))?;
    }
    let target = resolve(&destination.join(name), kind != EntryKind::Symlink);
    policy.check_write(&target)?;
    Ok(target)
}

/// A source directory being walked, and the resolved directory its entries go to.
struct Frame {
    source: Directory,
    source_location: PathBuf,
    names: Names,
    destination_location: PathBuf,
}

impl Frame {
    fn new(source: Directory, source_location: PathBuf, destination: PathBuf) -> io::Result<Self> {
        let names = source.names()?;
        Ok(Self {
            source,
            source_location,
            names,
            destination_location: destination,
        })
    }
}

/// Checks every entry of the tree at `source` before anything is written. Special files
/// are skipped by the copy and so are not checked.
fn survey(
    policy: &SandboxPolicy,
    tree: &Directory,
    source: &Path,
    destination: &Path,
) -> Result<(), RpcError> {
    // The very directory the copy will read, not whatever its path names by now.
    let root = tree.directory(".".as_ref()).or_rpc()?;
    let mut stack =
        vec![Frame::new(root, source.to_path_buf(), destination.to_path_buf()).or_rpc()?];
    while let Some(frame) = stack.last_mut() {
        let Some(name) = frame.names.next() else {
            stack.pop();
            continue;
        };
        let name = name.or_rpc()?;
        let kind = frame.source.kind(&name).or_rpc()?;
        if kind == EntryKind::Other {
            continue;
        }
        let entry = frame.source_location.join(&name);
        let target = check_entry(policy, &entry, kind, &frame.destination_location, &name)?;
        if kind == EntryKind::Directory {
            let child = frame.source.directory(&name).or_rpc()?;
            stack.push(Frame::new(child, entry, target).or_rpc()?);
        }
    }
    Ok(())
}

/// Copies the tree, depth first, checking each entry again as it goes.
fn copy_tree(
    policy: &SandboxPolicy,
    tree: Directory,
    source: PathBuf,
    destination: PathBuf,
) -> Result<(), RpcError> {
    let mut stack = vec![(
        Frame::new(tree, source, destination.clone()).or_rpc()?,
        make_directory(policy, &destination)?,
    )];
    while let Some((frame, destination)) = stack.last_mut() {
        let Some(name) = frame.names.next() else {
            stack.pop();
            continue;
        };
        let name = name.or_rpc()?;
        let kind = frame.source.kind(&name).or_rpc()?;
        if kind == EntryKind::Other {
            continue;
        }
        let entry = frame.source_location.join(&name);
        let target = check_entry(policy, &entry, kind, &frame.destination_location, &name)?;
        match kind {
            EntryKind::Directory => {
                let child = frame.source.directory(&name).or_rpc()?;
                let child_destination = make_directory(policy, &target)?;
                stack.push((
                    Frame::new(child, entry, target).or_rpc()?,
                    child_destination,
                ));
            }
            EntryKind::Symlink => {
                let text = frame.source.read_link(&name).or_rpc()?;
                destination.create_symlink(&text, &name).or_rpc()?;
            }
            EntryKind::File => {
                let from = frame
                    .source
                    .open_file(&name, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())
                    .or_rpc()?;
                // Swapped for a special file since it was listed: skipped like one.
                let source = from.metadata().or_rpc()?;
                if source.is_file() {
                    copy_opened(
                        from,
                        create_file(&target, source.mode())?,
                        &Deadline::in_fs_helper(COPY),
                    )?;
                }
            }
            EntryKind::Other => {}
        }
    }
    Ok(())
}

/// The directory at the checked `location`, created (with its missing ancestors, each
/// checked) if needed, and opened exactly.
fn make_directory(policy: &SandboxPolicy, location: &Path) -> Result<Directory, RpcError> {
    super::create_directory(policy, location, true, true)?;
    Directory::open(location).or_rpc()
}

/// Opens the checked `location` for writing exactly, creating it if missing no wider than
/// the source (mode `source_mode`); the copy truncates it once it knows it is not the
/// source itself.
fn create_file(location: &Path, source_mode: u32) -> Result<(File, bool), RpcError> {
    let flags = OFlags::WRONLY | OFlags::NONBLOCK;
    let mode = created_modes::copy_creation_mode(source_mode);
    match open_exact(location, flags | OFlags::CREATE | OFlags::EXCL, mode) {
        Ok(fd) => Ok((File::from(fd), true)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let fd = open_exact(location, flags, Mode::empty()).or_rpc()?;
            Ok((File::from(fd), false))
        }
        Err(e) => Err(RpcError::from_io(&e)),
    }
}

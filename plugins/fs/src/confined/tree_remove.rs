//! `fs/remove` in the fs helper (SANDBOX.md §5.6): links are removed, never followed; a
//! directory tree is first surveyed — any entry the policy does not let us write (a
//! carve-out, a deny entry, a deny-glob match) refuses the whole removal before anything is
//! deleted — and then removed through descriptors, each entry checked again just before it
//! goes.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use exec_server_core::proto::RpcError;
use exec_server_sandbox::anchored::{Directory, EntryKind, Names};
use exec_server_sandbox::policy::{AccessKind, SandboxPolicy};

use crate::blocking::IoResultExt;

/// `fs/remove`; `force` only turns a missing path into success.
pub(crate) fn remove(
    policy: &SandboxPolicy,
    path: &Path,
    recursive: bool,
    force: bool,
) -> Result<(), RpcError> {
    let approved = policy.approve(path, false, AccessKind::Write)?;
    let found = Directory::open_parent(&approved)
        .and_then(|(parent, name)| Ok((parent.kind(&name)?, parent, name)));
    let (kind, parent, name) = match found {
        Ok(found) => found,
        Err(e) if force && e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(RpcError::from_io(&e)),
    };
    if kind != EntryKind::Directory {
        return parent.remove(&name, false).or_rpc();
    }
    if recursive {
        policy.check_write_tree(&approved)?;
        let directory = parent.directory(&name).or_rpc()?;
        survey(policy, &directory, &approved)?;
        remove_contents(policy, directory, approved)?;
    }
    parent.remove(&name, true).or_rpc()
}

/// One directory being walked: where it is and the names still to visit.
struct Frame {
    directory: Directory,
    location: PathBuf,
    names: Names,
}

impl Frame {
    fn new(directory: Directory, location: PathBuf) -> io::Result<Self> {
        let names = directory.names()?;
        Ok(Self {
            directory,
            location,
            names,
        })
    }
}

/// Refuses when any entry below `directory` (at `location`) may not be written; never
/// enters a directory it may not write.
fn survey(policy: &SandboxPolicy, directory: &Directory, location: &Path) -> Result<(), RpcError> {
    // The very directory the removal will empty, not whatever its path names by now.
    let root = directory.directory(".".as_ref()).or_rpc()?;
    let mut stack = vec![Frame::new(root, location.to_path_buf()).or_rpc()?];
    while let Some(frame) = stack.last_mut() {
        let Some(name) = frame.names.next() else {
            stack.pop();
            continue;
        };
        let name = name.or_rpc()?;
        let entry = frame.location.join(&name);
        policy.check_write(&entry)?;
        if frame.directory.kind(&name).or_rpc()? == EntryKind::Directory {
            let child = frame.directory.directory(&name).or_rpc()?;
            stack.push(Frame::new(child, entry).or_rpc()?);
        }
    }
    Ok(())
}

/// Removes everything below `directory`, depth first, checking each entry again.
fn remove_contents(
    policy: &SandboxPolicy,
    directory: Directory,
    location: PathBuf,
) -> Result<(), RpcError> {
    // Each frame but the first remembers its name in the frame below, to be removed once
    // it is empty.
    let mut stack: Vec<(Frame, Option<OsString>)> =
        vec![(Frame::new(directory, location).or_rpc()?, None)];
    while let Some((frame, _)) = stack.last_mut() {
        let Some(name) = frame.names.next() else {
            let (_, name) = stack.pop().expect("the stack is not empty");
            if let (Some(name), Some((parent, _))) = (name, stack.last()) {
                parent.directory.remove(&name, true).or_rpc()?;
            }
            continue;
        };
        let name = name.or_rpc()?;
        let entry = frame.location.join(&name);
        policy.check_write(&entry)?;
        if frame.directory.kind(&name).or_rpc()? == EntryKind::Directory {
            let child = frame.directory.directory(&name).or_rpc()?;
            stack.push((Frame::new(child, entry).or_rpc()?, Some(name)));
        } else {
            frame.directory.remove(&name, false).or_rpc()?;
        }
    }
    Ok(())
}

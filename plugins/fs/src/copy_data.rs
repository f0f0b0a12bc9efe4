//! Copying the bytes of one opened file into another: shared by `fs/copy` in the server and
//! in the fs helper.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;

use exec_server_core::proto::RpcError;

use crate::blocking::{Deadline, IoResultExt};
use crate::{created_modes, nonblocking, stream_write};

/// [`copy_file`] between opened files (both opened without waiting on a FIFO; `from` a
/// regular file; `to`, if the copy `created` it, created with
/// [`created_modes::copy_creation_mode`]). Before any content is written `to` loses any
/// access ACL and gets the permission bits it may have ([`created_modes::prepare_copy`]:
/// an existing destination is narrowed to what both allow); the source's mode (set-id
/// bits included, where nobody else could have written the copy) is given only once all
/// of it is in. A destination that is a FIFO or device is written as
/// its reader makes room, for at most [`crate::blocking::PEER_WAIT_IN_SLOT`] in all (the copy holds a shared
/// slot) and never past `deadline`.
pub(crate) fn copy_opened(
    mut from: File,
    (mut to, created): (File, bool),
    deadline: &Deadline,
) -> Result<(), RpcError> {
    nonblocking::make_blocking(&from).or_rpc()?;
    let from_meta = from.metadata().or_rpc()?;
    let to_meta = to.metadata().or_rpc()?;
    if (to_meta.dev(), to_meta.ino()) == (from_meta.dev(), from_meta.ino()) {
        return Ok(());
    }
    if !to_meta.is_file() {
        return copy_into_stream(&mut from, &to, &deadline.for_peer_in_slot());
    }
    nonblocking::make_blocking(&to).or_rpc()?;
    // The source's mode, its group bits the owning group's own where an ACL made them a
    // mask: the copy takes no ACL.
    let source = created_modes::Owner {
        mode: crate::acl::copy_mode(&from, from_meta.mode()).or_rpc()?,
        uid: from_meta.uid(),
        gid: from_meta.gid(),
    };
    created_modes::prepare_copy(&to, created, to_meta.mode(), source).or_rpc()?;
    to.set_len(0).or_rpc()?;
    io::copy(&mut from, &mut to).or_rpc()?;
    created_modes::finish_copy(&to, source, created).or_rpc()?;
    Ok(())
}

/// Copies `from` into the non-blocking FIFO or device `to` by `deadline`.
fn copy_into_stream(from: &mut File, to: &File, deadline: &Deadline) -> Result<(), RpcError> {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(RpcError::from_io(&e)),
        };
        stream_write::write_all_on_thread(to, &buffer[..n], deadline)?;
    }
}

//! Streamed reads and writes (PROTOCOL §5.14–§5.16, codex 0.169.0 `fileWriteStreaming`):
//! `fs/open` puts a file in the connection's [`HandleTable`]; `fs/readBlock` reads from a
//! `read` handle at an offset; `fs/writeBlock` writes into a `replace` handle's new version
//! (see `replace`); `fs/close` drops a handle, and puts a `replace` handle's new version in
//! place. The table is connection state, so every handle closes when its connection ends
//! (§3.5), and an uncommitted new version is removed then.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use exec_server_core::proto::bytes::Empty;
use exec_server_core::proto::fs::{
    CloseParams, HandleResult, OpenMode, OpenParams, ReadBlockParams, ReadBlockResult,
    WriteBlockParams, CLOSE, MAX_HANDLE_ID_BYTES, OPEN, READ_BLOCK, WRITE_BLOCK,
};
use exec_server_core::proto::RpcError;
use exec_server_core::{descriptors, Call, DescriptorLease};

use crate::ambiguous_names::SpelledPaths;
use crate::blocking::IoResultExt;
use crate::paths::host_path;
use crate::payload::Base64Bytes;
use crate::regular_file::open_regular;
use crate::replace::ReplaceFile;
use crate::routing::{check_streaming, FsState};

pub(crate) async fn handle_open(
    config: Arc<FsState>,
    cx: Call,
    params: OpenParams,
) -> Result<HandleResult, RpcError> {
    let path = host_path(&params.path)?;
    check_handle_id(&params.handle_id)?;
    let table = cx.connection_state(HandleTable::default);
    let mut reservation = HandleTable::reserve(&table, &params.handle_id, config.max_open_handles)?;
    check_streaming(
        &config.sandbox,
        params.sandbox.as_ref(),
        params.sandbox_policy.as_ref(),
    )?;
    let mode = params.mode.unwrap_or_default();
    // Charged before the file is opened, held until the handle closes.
    reservation.hold_descriptors(descriptors::charge(
        cx.session().id(),
        descriptors_held(mode),
        "an fs/open handle",
    )?);
    let spelled = SpelledPaths::of([params.path.as_str()]);
    let handle = config
        .pool
        .run(cx.session(), OPEN, move |_| {
            spelled.check()?;
            match mode {
                OpenMode::Read => open_regular(&path, true).map(OpenHandle::Read),
                OpenMode::Replace => ReplaceFile::open(&path).map(OpenHandle::Replace),
            }
        })
        .await?;
    reservation.fill(handle);
    Ok(HandleResult {
        handle_id: params.handle_id,
    })
}

pub(crate) async fn handle_read_block(
    config: Arc<FsState>,
    cx: Call,
    params: ReadBlockParams,
) -> Result<ReadBlockResult<Base64Bytes>, RpcError> {
    check_handle_id(&params.handle_id)?;
    let max = config.max_read_block_bytes;
    if params.len == 0 || params.len > max {
        return Err(RpcError::block_len_out_of_range(max));
    }
    let table = cx.connection_state(HandleTable::default);
    let handle = table
        .get(&params.handle_id)
        .ok_or_else(|| RpcError::unknown_handle(&params.handle_id))?;
    if let OpenHandle::Replace(_) = &*handle {
        // The wrong kind of request, not a failed read: the handle stays open.
        return Err(bad_descriptor());
    }
    let reader = Arc::clone(&handle);
    let (offset, len) = (params.offset, params.len);
    let read = config
        .pool
        .run(cx.session(), READ_BLOCK, move |_| match &*reader {
            OpenHandle::Read(file) => read_block(file, offset, len).or_rpc(),
            OpenHandle::Replace(_) => Err(bad_descriptor()),
        });
    match read.await {
        Ok(chunk) => Ok(ReadBlockResult {
            eof: chunk.len() < len,
            chunk: Base64Bytes(chunk),
        }),
        Err(error) => {
            table.close_if_same(&params.handle_id, &handle);
            Err(error)
        }
    }
}

/// `fs/writeBlock`: checks in codex 0.169.0's order, then a positional write into the
/// new version (a hole is zero-filled, an overlap overwrites).
pub(crate) async fn handle_write_block(
    config: Arc<FsState>,
    cx: Call,
    params: WriteBlockParams,
) -> Result<Empty, RpcError> {
    check_handle_id(&params.handle_id)?;
    let max = config.max_write_block_bytes;
    if params.chunk.is_empty() || params.chunk.len() > max {
        return Err(RpcError::write_block_len_out_of_range(max));
    }
    let end = u64::try_from(params.chunk.len())
        .ok()
        .and_then(|len| params.offset.checked_add(len));
    if end.is_none_or(|end| end > i64::MAX as u64) {
        return Err(RpcError::write_range_too_large());
    }
    let table = cx.connection_state(HandleTable::default);
    let handle = table
        .get(&params.handle_id)
        .ok_or_else(|| RpcError::unknown_handle(&params.handle_id))?;
    let WriteBlockParams {
        handle_id,
        offset,
        chunk,
    } = params;
    config
        .pool
        .run(cx.session(), WRITE_BLOCK, move |_| match &*handle {
            OpenHandle::Read(_) => Err(bad_descriptor()),
            OpenHandle::Replace(file) => match file.write_at(&chunk, offset) {
                Some(written) => written.or_rpc(),
                // Closed (and committed) while this write waited for its turn.
                None => Err(RpcError::unknown_handle(&handle_id)),
            },
        })
        .await?;
    Ok(Empty {})
}

/// Closes a handle; a `replace` handle's new version is put in place first. If that
/// fails, the error is the answer, the target is unchanged and the new version is removed.
pub(crate) async fn handle_close(
    config: Arc<FsState>,
    cx: Call,
    params: CloseParams,
) -> Result<Empty, RpcError> {
    check_handle_id(&params.handle_id)?;
    let closed = cx
        .connection_state(HandleTable::default)
        .close(&params.handle_id);
    if let Some(handle) = closed {
        if let OpenHandle::Replace(_) = &*handle {
            let commit = move |_| match &*handle {
                OpenHandle::Replace(file) => file.commit().map(|()| file.size()),
                OpenHandle::Read(_) => Ok(0),
            };
            let bytes = config.pool.run(cx.session(), CLOSE, commit).await?;
            // The streamed write is in place: its size goes with its audit event.
            cx.audit_note("bytes", || bytes.into());
        }
    }
    Ok(Empty {})
}

/// Descriptors an open handle holds: the file, or a `replace` handle's temporary file and
/// the directory it will be renamed in.
fn descriptors_held(mode: OpenMode) -> u64 {
    match mode {
        OpenMode::Read => 1,
        OpenMode::Replace => 2,
    }
}

/// What codex answers for a read on a `replace` handle or a write on a `read` one.
fn bad_descriptor() -> RpcError {
    RpcError::from_io(&io::Error::from_raw_os_error(libc::EBADF))
}

fn check_handle_id(id: &str) -> Result<(), RpcError> {
    if id.len() > MAX_HANDLE_ID_BYTES {
        return Err(RpcError::handle_id_too_long());
    }
    Ok(())
}

/// Up to `len` bytes at `offset`, without touching a shared file position, so reads on
/// one handle may run concurrently. Short only at the end of the file.
pub(crate) fn read_block(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    // No file reaches past i64::MAX, and pread refuses ranges that do.
    let room = u64::try_from(i64::MAX)
        .unwrap_or(u64::MAX)
        .saturating_sub(offset);
    let wanted = len.min(usize::try_from(room).unwrap_or(usize::MAX));
    let mut buffer = vec![0u8; wanted];
    let mut filled = 0;
    while filled < wanted {
        match file.read_at(&mut buffer[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buffer.truncate(filled);
    Ok(buffer)
}

/// What an open handle holds.
#[derive(Debug)]
pub(crate) enum OpenHandle {
    /// The file opened for `fs/readBlock`.
    Read(File),
    /// The new version of a file, for `fs/writeBlock`.
    Replace(ReplaceFile),
}

/// The read and replace handles of one connection, by client-chosen id.
#[derive(Debug, Default)]
pub(crate) struct HandleTable {
    inner: Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    by_id: HashMap<String, Slot>,
    /// Tells reservations apart, so an `fs/open` that finishes after its id was closed and
    /// reused does not take over the newer slot.
    next_ticket: u64,
}

#[derive(Debug)]
enum Slot {
    /// Claimed by an `fs/open` that is still opening the file; counts against the limit.
    Opening(u64),
    /// The handle, and its charge to the session's descriptor budget, given back when the
    /// slot goes (close, failed read, connection end).
    Open(
        Arc<OpenHandle>,
        // Held, never read: dropping the slot gives the charge back.
        #[allow(dead_code)] Option<DescriptorLease>,
    ),
}

impl HandleTable {
    /// Claims `id` for an `fs/open` (checks 2 and 3 of §5.14). The claim is given back if
    /// the open fails or is abandoned.
    pub(crate) fn reserve(
        table: &Arc<Self>,
        id: &str,
        limit: usize,
    ) -> Result<Reservation, RpcError> {
        let mut slots = table.lock();
        if slots.by_id.contains_key(id) {
            return Err(RpcError::handle_exists(id));
        }
        if slots.by_id.len() >= limit {
            return Err(RpcError::too_many_handles(limit));
        }
        slots.next_ticket += 1;
        let ticket = slots.next_ticket;
        slots.by_id.insert(id.to_owned(), Slot::Opening(ticket));
        Ok(Reservation {
            table: Arc::clone(table),
            id: id.to_owned(),
            ticket,
            filled: false,
            descriptors: None,
        })
    }

    /// The open handle behind `id`.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<OpenHandle>> {
        match self.lock().by_id.get(id) {
            Some(Slot::Open(handle, _)) => Some(Arc::clone(handle)),
            _ => None,
        }
    }

    /// Closes `id` whatever its state; unknown ids are fine. Returns the handle if it was
    /// open.
    pub(crate) fn close(&self, id: &str) -> Option<Arc<OpenHandle>> {
        let removed = self.lock().by_id.remove(id);
        match removed {
            Some(Slot::Open(handle, _)) => Some(handle),
            _ => None,
        }
    }

    /// Closes `id` if it still refers to `file` (a failed read must not close a handle
    /// opened later under the same id).
    pub(crate) fn close_if_same(&self, id: &str, file: &Arc<OpenHandle>) {
        let mut slots = self.lock();
        if matches!(slots.by_id.get(id), Some(Slot::Open(f, _)) if Arc::ptr_eq(f, file)) {
            slots.by_id.remove(id);
        }
    }

    /// Number of ids open or being opened.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        // A panic while holding the lock leaves the map consistent: every update is one call.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// An id claimed by an `fs/open` in progress.
#[derive(Debug)]
pub(crate) struct Reservation {
    table: Arc<HandleTable>,
    id: String,
    ticket: u64,
    filled: bool,
    /// The handle's charge to the descriptor budget, moved into its slot by `fill`.
    descriptors: Option<DescriptorLease>,
}

impl Reservation {
    /// Keeps `lease` charged while the file is opened and then for as long as the handle
    /// is open.
    pub(crate) fn hold_descriptors(&mut self, lease: DescriptorLease) {
        self.descriptors = Some(lease);
    }

    /// Makes the handle usable. If the client closed the id meanwhile, the handle is
    /// dropped (outside the table's lock): the close was for this handle.
    pub(crate) fn fill(mut self, handle: OpenHandle) {
        let mut handle = Some(handle);
        let mut slots = self.table.lock();
        if let Some(slot) = slots.by_id.get_mut(&self.id) {
            if matches!(slot, Slot::Opening(t) if *t == self.ticket) {
                let handle = Arc::new(handle.take().expect("filled once"));
                *slot = Slot::Open(handle, self.descriptors.take());
            }
        }
        drop(slots);
        drop(handle);
        self.filled = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.filled {
            return;
        }
        let mut slots = self.table.lock();
        if matches!(slots.by_id.get(&self.id), Some(Slot::Opening(t)) if *t == self.ticket) {
            slots.by_id.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(content: &[u8]) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, content).unwrap();
        let file = File::open(&path).unwrap();
        (dir, file)
    }

    #[test]
    fn blocks_are_positional_and_short_only_at_the_end() {
        let (_dir, file) = file_with(b"0123456789");
        assert_eq!(read_block(&file, 2, 3).unwrap(), b"234");
        assert_eq!(read_block(&file, 0, 2).unwrap(), b"01");
        assert_eq!(read_block(&file, 8, 5).unwrap(), b"89");
        assert!(read_block(&file, 10, 5).unwrap().is_empty());
        assert!(read_block(&file, u64::MAX, 5).unwrap().is_empty());
        assert!(read_block(&file, i64::MAX as u64 - 1, 5)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn reservations_claim_ids_and_count_against_the_limit() {
        let table = Arc::new(HandleTable::default());
        let first = HandleTable::reserve(&table, "a", 2).unwrap();
        assert_eq!(
            HandleTable::reserve(&table, "a", 2).unwrap_err(),
            RpcError::handle_exists("a")
        );
        let second = HandleTable::reserve(&table, "b", 2).unwrap();
        assert_eq!(
            HandleTable::reserve(&table, "c", 2).unwrap_err(),
            RpcError::too_many_handles(2)
        );
        assert!(table.get("a").is_none(), "not readable while opening");
        drop(second);
        assert_eq!(table.len(), 1);
        let (_dir, file) = file_with(b"x");
        first.fill(OpenHandle::Read(file));
        assert!(table.get("a").is_some());
        table.close("a");
        table.close("a");
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn a_late_open_does_not_take_over_a_reused_id() {
        let table = Arc::new(HandleTable::default());
        let stale = HandleTable::reserve(&table, "a", 4).unwrap();
        table.close("a");
        let fresh = HandleTable::reserve(&table, "a", 4).unwrap();
        let (_dir, old_file) = file_with(b"old");
        stale.fill(OpenHandle::Read(old_file));
        assert!(table.get("a").is_none());
        let (_dir2, new_file) = file_with(b"new");
        fresh.fill(OpenHandle::Read(new_file));
        let file = table.get("a").unwrap();
        let OpenHandle::Read(reader) = &*file else {
            panic!("a read handle")
        };
        assert_eq!(read_block(reader, 0, 3).unwrap(), b"new");
        let other = Arc::new(OpenHandle::Read(
            File::open(_dir2.path().join("f")).unwrap(),
        ));
        table.close_if_same("a", &other);
        assert!(table.get("a").is_some());
        table.close_if_same("a", &file);
        assert!(table.get("a").is_none());
    }
}

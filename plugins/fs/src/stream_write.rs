//! Writing to FIFOs and devices, whose reader decides when there is room: the descriptor
//! stays non-blocking (as `nonblocking::open` opened it) and a write that finds no room
//! waits at most until the operation's deadline, then fails with the deadline's error
//! (what was written by then stays written).
//!
//! [`write_all`] waits on the reactor and holds no thread at all (`fs/writeFile`);
//! [`write_all_on_thread`] waits with `poll(2)` on the blocking thread that already runs
//! the operation (`fs/copy` into a FIFO).

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;

use exec_server_core::proto::RpcError;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::blocking::Deadline;

/// Writes all of `data` to the non-blocking `file` by `deadline`, waiting for room on the
/// reactor. A descriptor that cannot be polled (`/dev/null` and other devices that never
/// make a writer wait) is handed back as `Err(file)`, to be written on a blocking thread.
pub(crate) async fn write_all(
    file: File,
    data: &[u8],
    deadline: Deadline,
) -> Result<Result<(), RpcError>, File> {
    // SAFETY: the `File` owns its descriptor and moves into the `AsyncFd`, which is its
    // only owner from then on: nothing else can close or replace the descriptor while the
    // registration lives, and `get_mut` is never used.
    let registered = unsafe { AsyncFd::register_with_interest(file, Interest::WRITABLE) };
    let file = match registered {
        Ok(file) => file,
        Err(refused) => return Err(refused.into_parts().0),
    };
    let write = async {
        let mut written = 0;
        while written < data.len() {
            let mut ready = file.writable().await.map_err(|e| RpcError::from_io(&e))?;
            match ready.try_io(|file| file.get_ref().write(&data[written..])) {
                Ok(Ok(0)) => return Err(RpcError::from_io(&io::ErrorKind::WriteZero.into())),
                Ok(Ok(n)) => written += n,
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(RpcError::from_io(&e)),
                // No room after all: wait for the next readiness.
                Err(_would_block) => {}
            }
        }
        Ok(())
    };
    Ok(tokio::time::timeout_at(deadline.instant().into(), write)
        .await
        .unwrap_or_else(|_| Err(deadline.missed())))
}

/// Writes all of `data` to the non-blocking `file` by `deadline`, waiting for room with
/// `poll(2)` on the calling thread.
pub(crate) fn write_all_on_thread(
    file: &File,
    mut data: &[u8],
    deadline: &Deadline,
) -> Result<(), RpcError> {
    while !data.is_empty() {
        match (&*file).write(data) {
            Ok(0) => return Err(RpcError::from_io(&io::ErrorKind::WriteZero.into())),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.remaining().ok_or_else(|| deadline.missed())?;
                let timeout = Timespec::try_from(left).unwrap_or(Timespec {
                    tv_sec: i64::MAX,
                    tv_nsec: 0,
                });
                let fd = file.as_fd();
                let mut fds = [PollFd::new(&fd, PollFlags::OUT)];
                match poll(&mut fds, Some(&timeout)) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(RpcError::from_io(&e.into())),
                }
            }
            Err(e) => return Err(RpcError::from_io(&e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    use std::time::Duration;

    use super::*;

    /// A FIFO with a reader that never reads, and a non-blocking writer whose buffer is
    /// already full.
    fn full_fifo() -> (tempfile::TempDir, File, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c_path` is a valid NUL-terminated string for the duration of the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        let writer = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        while (&writer).write(&[0u8; 4096]).is_ok() {}
        (dir, reader, writer)
    }

    #[tokio::test]
    async fn a_full_fifo_fails_at_the_deadline_without_a_thread() {
        let (_dir, _reader, writer) = full_fifo();
        let deadline = Deadline::new("fs/writeFile", Duration::from_millis(50));
        let result = write_all(writer, b"x", deadline).await.unwrap();
        assert_eq!(
            result,
            Err(RpcError::fs_operation_timed_out("fs/writeFile", 50))
        );
    }

    #[test]
    fn a_full_fifo_fails_at_the_deadline_on_a_thread() {
        let (_dir, _reader, writer) = full_fifo();
        let deadline = Deadline::new("fs/copy", Duration::from_millis(50));
        assert_eq!(
            write_all_on_thread(&writer, b"x", &deadline),
            Err(RpcError::fs_operation_timed_out("fs/copy", 50))
        );
    }

    #[tokio::test]
    async fn everything_arrives_when_the_reader_reads() {
        let (_dir, mut reader, writer) = full_fifo();
        let mut drained = Vec::new();
        let _ = reader.read_to_end(&mut drained);
        let data = vec![7u8; 256 * 1024];
        let writing = tokio::spawn({
            let data = data.clone();
            async move {
                let deadline = Deadline::new("fs/writeFile", Duration::from_secs(60));
                write_all(writer, &data, deadline).await.unwrap()
            }
        });
        let mut received = Vec::new();
        while received.len() < data.len() {
            let mut chunk = [0u8; 65536];
            match reader.read(&mut chunk) {
                Ok(n) => received.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(writing.await.unwrap(), Ok(()));
        assert_eq!(received, data);
    }

    #[tokio::test]
    async fn devices_that_cannot_be_polled_are_handed_back() {
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap();
        let deadline = Deadline::new("fs/writeFile", Duration::from_secs(60));
        assert!(write_all(null, b"x", deadline).await.is_err());
    }
}

//! `fs/writeFile` (PROTOCOL §5.6): creates or truncates a file and writes the given bytes.
//!
//! A regular file is written at once on the blocking thread that opened it. A FIFO or a
//! device is written as its reader makes room (`stream_write`): in the server without
//! holding a thread, and never past the operation's deadline.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use exec_server_core::proto::bytes::{decode_base64, Empty};
use exec_server_core::proto::fs::{WriteFileParams, WRITE_FILE};
use exec_server_core::proto::RpcError;
use exec_server_core::{Call, Session};
use exec_server_sandbox::fs_helper::{Need, Target};
use exec_server_sandbox::policy::SandboxPolicy;
use serde_json::json;
use serde_json::value::RawValue;

use crate::ambiguous_names::SpelledPaths;
use crate::blocking::{BlockingPool, Deadline, IoResultExt};
use crate::config::FsConfig;
use crate::paths::{helper_path, host_path, native};
use crate::routing::{execute_params, to_wire, FsOperation, FsState};
use crate::{nonblocking, stream_write};

pub(crate) async fn handle(
    config: Arc<FsState>,
    cx: Call,
    params: WriteFileParams,
) -> Result<Empty, RpcError> {
    execute_params::<WriteFile>(&config, cx.session(), params).await?;
    Ok(Empty {})
}

/// `fs/writeFile` with its data decoded and its defaults applied.
#[derive(Debug)]
pub(crate) struct WriteFile {
    pub(crate) path: PathBuf,
    pub(crate) data: Vec<u8>,
    pub(crate) follow_symlinks: bool,
}

impl FsOperation for WriteFile {
    type Params = WriteFileParams;
    type Output = ();
    const METHOD: &'static str = WRITE_FILE;

    /// The text is dropped here: it is not needed while the write runs.
    fn from_params(params: WriteFileParams, _limits: &FsConfig) -> Result<Self, RpcError> {
        let path = host_path(&params.path)?;
        // Decoded late (not as -32602) like the reference, but before anything is touched.
        let data = decode_base64(&params.data_base64).map_err(RpcError::write_file_bad_base64)?;
        Ok(Self {
            path,
            data,
            follow_symlinks: params.follow_symlinks.unwrap_or(true),
        })
    }

    fn targets(&self) -> Vec<Target> {
        vec![Target {
            path: self.path.clone(),
            follow_last: self.follow_symlinks,
            need: Need::Write,
        }]
    }

    fn run(self, deadline: Deadline) -> Result<(), RpcError> {
        write_file(&self.path, &self.data, self.follow_symlinks, &deadline)
    }

    /// Opens on a blocking thread; a FIFO or device is then written from the reactor, so
    /// a reader that takes its time holds no thread and no slot.
    async fn run_in_server(
        self,
        pool: &BlockingPool,
        session: &Session,
        spelled: SpelledPaths,
    ) -> Result<(), RpcError> {
        let WriteFile {
            path,
            data,
            follow_symlinks,
        } = self;
        let open_and_write = move |deadline| {
            spelled.check()?;
            match open_for_write(&path, follow_symlinks)? {
                WriteTarget::Regular(mut file) => file.write_all(&data).or_rpc().map(|()| None),
                WriteTarget::Stream(file) => Ok(Some((file, data, deadline))),
            }
        };
        let Some((file, data, deadline)) = pool.run(session, WRITE_FILE, open_and_write).await?
        else {
            return Ok(());
        };
        match stream_write::write_all(file, &data, deadline).await {
            Ok(written) => written,
            // A device that cannot be polled never makes a writer wait for long.
            Err(file) => {
                let write = move |deadline: Deadline| {
                    stream_write::write_all_on_thread(&file, &data, &deadline.for_peer_in_slot())
                };
                pool.run(session, WRITE_FILE, write).await
            }
        }
    }

    fn run_confined(self, policy: &SandboxPolicy) -> Result<(), RpcError> {
        crate::confined::write_file(policy, &self.path, &self.data, self.follow_symlinks)
    }

    fn helper_params(&self) -> serde_json::Value {
        json!({
            "path": helper_path(&self.path),
            "dataBase64": exec_server_core::proto::bytes::Base64(&self.data),
            "followSymlinks": self.follow_symlinks,
            "sandbox": null,
        })
    }

    fn output_to_wire((): ()) -> Result<Box<RawValue>, RpcError> {
        to_wire(&Empty {})
    }

    fn output_from_wire(&self, _response: &RawValue) -> Result<(), RpcError> {
        Ok(())
    }
}

/// What `fs/writeFile` writes to.
#[derive(Debug)]
pub(crate) enum WriteTarget {
    /// A regular file, switched to blocking I/O: written at once.
    Regular(File),
    /// A FIFO or device, still non-blocking: its reader decides when there is room.
    Stream(File),
}

/// Opens `path` for writing, creating or truncating it. New files get mode 0666 minus the
/// umask; existing ones keep their mode. Opening never waits on a FIFO without a reader
/// (that fails with `ENXIO` instead).
pub(crate) fn open_for_write(path: &Path, follow: bool) -> Result<WriteTarget, RpcError> {
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    let file = nonblocking::open(path, &mut options, follow).map_err(|e| {
        if !follow && nonblocking::is_symlink_refusal(&e, path) {
            RpcError::is_symlink(&native(path))
        } else {
            RpcError::from_io(&e)
        }
    })?;
    if !file.metadata().or_rpc()?.is_file() {
        return Ok(WriteTarget::Stream(file));
    }
    nonblocking::make_blocking(&file).or_rpc()?;
    Ok(WriteTarget::Regular(file))
}

/// Writes `data` to `path` on this thread; a FIFO or device gets until `deadline`.
pub(crate) fn write_file(
    path: &Path,
    data: &[u8],
    follow: bool,
    deadline: &Deadline,
) -> Result<(), RpcError> {
    match open_for_write(path, follow)? {
        WriteTarget::Regular(mut file) => file.write_all(data).or_rpc(),
        WriteTarget::Stream(file) => {
            stream_write::write_all_on_thread(&file, data, &deadline.for_peer_in_slot())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use std::time::Duration;

    use super::*;

    fn deadline() -> Deadline {
        Deadline::new(WRITE_FILE, Duration::from_secs(60))
    }

    #[test]
    fn truncates_existing_files_and_keeps_their_mode() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"a long original text").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        write_file(&file, b"new", true, &deadline()).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn follows_dangling_links_unless_told_not_to() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("target", &link).unwrap();
        let error = write_file(&link, b"x", false, &deadline()).unwrap_err();
        assert_eq!(error, RpcError::is_symlink(&native(&link)));
        assert!(!dir.path().join("target").exists());
        write_file(&link, b"x", true, &deadline()).unwrap();
        assert_eq!(std::fs::read(dir.path().join("target")).unwrap(), b"x");
    }

    #[test]
    fn a_fifo_without_a_reader_is_refused_and_one_nobody_reads_ends_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c_path` is a valid NUL-terminated string for the duration of the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let error = write_file(&fifo, b"x", true, &deadline()).unwrap_err();
        assert_eq!(error.code, -32603);
        assert!(error.message.ends_with("(os error 6)"), "{error:?}");

        use std::os::unix::fs::OpenOptionsExt;
        let _reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let short = Deadline::new(WRITE_FILE, Duration::from_millis(50));
        // More than a pipe holds: the rest waits for a read that never comes.
        let error = write_file(&fifo, &vec![0u8; 1 << 20], true, &short).unwrap_err();
        assert_eq!(error, RpcError::fs_operation_timed_out(WRITE_FILE, 50));
    }
}

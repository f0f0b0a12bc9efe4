//! `fs/copy` (PROTOCOL §5.13): files by content, directories recursively, links as links.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use exec_server_core::proto::bytes::Empty;
use exec_server_core::proto::fs::CopyParams;
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use exec_server_sandbox::fs_helper::{Need, Target};
use exec_server_sandbox::policy::SandboxPolicy;
use serde_json::json;
use serde_json::value::RawValue;

use crate::blocking::{Deadline, IoResultExt};
use crate::config::FsConfig;
use crate::copy_data::copy_opened;
use crate::created_modes;
use crate::nonblocking;
use crate::paths::{helper_path, host_path};
use crate::routing::{execute_params, to_wire, FsOperation, FsState};

pub(crate) async fn handle(
    config: Arc<FsState>,
    cx: Call,
    params: CopyParams,
) -> Result<Empty, RpcError> {
    execute_params::<Copy>(&config, cx.session(), params).await?;
    Ok(Empty {})
}

/// `fs/copy`.
#[derive(Debug)]
pub(crate) struct Copy {
    pub(crate) source: PathBuf,
    pub(crate) destination: PathBuf,
    pub(crate) recursive: bool,
}

impl FsOperation for Copy {
    type Params = CopyParams;
    type Output = ();
    const METHOD: &'static str = exec_server_core::proto::fs::COPY;

    fn from_params(params: CopyParams, _limits: &FsConfig) -> Result<Self, RpcError> {
        Ok(Self {
            source: host_path(&params.source_path)?,
            destination: host_path(&params.destination_path)?,
            recursive: params.recursive,
        })
    }

    fn targets(&self) -> Vec<Target> {
        vec![
            Target {
                path: self.source.clone(),
                follow_last: false,
                need: Need::Read,
            },
            Target {
                path: self.destination.clone(),
                follow_last: true,
                need: Need::WriteTree,
            },
        ]
    }

    fn run(self, deadline: Deadline) -> Result<(), RpcError> {
        copy(&self.source, &self.destination, self.recursive, &deadline)
    }

    fn run_confined(self, policy: &SandboxPolicy) -> Result<(), RpcError> {
        crate::confined::copy(policy, &self.source, &self.destination, self.recursive)
    }

    fn helper_params(&self) -> serde_json::Value {
        json!({
            "sourcePath": helper_path(&self.source),
            "destinationPath": helper_path(&self.destination),
            "recursive": self.recursive,
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

/// Copies `source`, examined without following a final link, to `destination`. Writing
/// into a FIFO or device waits for its reader at most until `deadline`.
pub(crate) fn copy(
    source: &Path,
    destination: &Path,
    recursive: bool,
    deadline: &Deadline,
) -> Result<(), RpcError> {
    let file_type = fs::symlink_metadata(source).or_rpc()?.file_type();
    if file_type.is_dir() {
        if !recursive {
            return Err(RpcError::copy_requires_recursive());
        }
        let source = fs::canonicalize(source).or_rpc()?;
        if resolve_existing(destination).or_rpc()?.starts_with(&source) {
            return Err(RpcError::copy_into_itself());
        }
        copy_tree(&source, destination, deadline)
    } else if file_type.is_symlink() {
        copy_link(source, destination).or_rpc()
    } else if file_type.is_file() {
        match copy_file(source, destination, deadline)? {
            Copied::Yes => Ok(()),
            Copied::NotARegularFile => Err(RpcError::copy_unsupported_type()),
        }
    } else {
        Err(RpcError::copy_unsupported_type())
    }
}

/// Creates `destination` if missing and merges `source` into it. Special files are
/// skipped (also one swapped in after the listing); links inside the tree are never
/// followed.
fn copy_tree(source: &Path, destination: &Path, deadline: &Deadline) -> Result<(), RpcError> {
    // Directories copy no mode (§5.13): born `0777 & ~umask`, their final mode. What makes
    // them worth reading, the files, are born no wider than their sources.
    fs::create_dir_all(destination).or_rpc()?;
    for entry in fs::read_dir(source).or_rpc()? {
        // Its request has been answered: a copy past its deadline stops rather than
        // going on in the background.
        if deadline.remaining().is_none() {
            return Err(deadline.missed());
        }
        let entry = entry.or_rpc()?;
        let from = entry.path();
        let to = destination.join(entry.file_name());
        let file_type = entry.file_type().or_rpc()?;
        if file_type.is_dir() {
            copy_tree(&from, &to, deadline)?;
        } else if file_type.is_symlink() {
            copy_link(&from, &to).or_rpc()?;
        } else if file_type.is_file() {
            copy_file(&from, &to, deadline)?;
        }
    }
    Ok(())
}

/// Whether [`copy_file`] copied.
#[derive(Debug, PartialEq, Eq)]
enum Copied {
    Yes,
    /// What was opened at the source is not a regular file (it was swapped since it was
    /// examined): nothing was read or written.
    NotARegularFile,
}

/// A new link with the same target text; an existing destination is `EEXIST`.
fn copy_link(source: &Path, destination: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(fs::read_link(source)?, destination)
}

/// Copies content and permission bits, creating or overwriting `destination`; a new
/// destination is born no wider than the source. Copying a
/// file onto itself (the same inode, e.g. through a link) leaves it untouched rather than
/// truncating it to nothing. The source is checked once opened: a FIFO swapped in after
/// it was examined would make the read wait for a writer.
fn copy_file(source: &Path, destination: &Path, deadline: &Deadline) -> Result<Copied, RpcError> {
    let from = nonblocking::open(source, OpenOptions::new().read(true), true).or_rpc()?;
    let from_meta = from.metadata().or_rpc()?;
    if !from_meta.is_file() {
        return Ok(Copied::NotARegularFile);
    }
    // Born with the source's owner bits only, never `0666 & ~umask` first (SECURITY.md).
    let mode = created_modes::copy_creation_mode(from_meta.mode());
    let mut create = OpenOptions::new();
    create.write(true).create_new(true).mode(mode.bits());
    let to = match nonblocking::open(destination, &mut create, true) {
        Ok(to) => (to, true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let mut existing = OpenOptions::new();
            let to = nonblocking::open(destination, existing.write(true), true).or_rpc()?;
            (to, false)
        }
        Err(e) => return Err(RpcError::from_io(&e)),
    };
    copy_opened(from, to, deadline)?;
    Ok(Copied::Yes)
}

/// `path` with its longest existing ancestor canonicalised and the rest appended
/// lexically, so a destination reached through links is judged where it really is.
fn resolve_existing(path: &Path) -> io::Result<PathBuf> {
    let mut existing = path;
    let mut rest = Vec::new();
    let mut resolved = loop {
        match fs::canonicalize(existing) {
            Ok(resolved) => break resolved,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        match (existing.parent(), existing.components().next_back()) {
            (Some(parent), Some(last)) => {
                rest.push(last);
                existing = parent;
            }
            _ => return Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    };
    for component in rest.into_iter().rev() {
        match component {
            Component::ParentDir => {
                resolved.pop();
            }
            Component::Normal(name) => resolved.push(name),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::unix::fs::{symlink, PermissionsExt};

    use std::time::Duration;

    use exec_server_core::proto::fs::COPY;

    use super::*;

    fn copy(source: &Path, destination: &Path, recursive: bool) -> Result<(), RpcError> {
        super::copy(
            source,
            destination,
            recursive,
            &Deadline::new(COPY, Duration::from_secs(60)),
        )
    }

    #[test]
    fn trees_keep_links_skip_specials_and_merge() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("src");
        fs::create_dir_all(source.join("nested")).unwrap();
        fs::write(source.join("nested/f"), b"data").unwrap();
        fs::set_permissions(source.join("nested/f"), fs::Permissions::from_mode(0o640)).unwrap();
        symlink("nested", source.join("link")).unwrap();
        let destination = dir.path().join("dst");
        fs::create_dir(&destination).unwrap();
        fs::write(destination.join("existing"), b"kept").unwrap();

        copy(&source, &destination, true).unwrap();
        assert_eq!(fs::read(destination.join("nested/f")).unwrap(), b"data");
        let mode = fs::metadata(destination.join("nested/f"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        assert_eq!(
            fs::read_link(destination.join("link")).unwrap(),
            Path::new("nested")
        );
        assert_eq!(fs::read(destination.join("existing")).unwrap(), b"kept");
    }

    #[test]
    fn directories_never_copy_into_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("src");
        fs::create_dir_all(source.join("nested")).unwrap();
        symlink(&source, dir.path().join("alias")).unwrap();
        for destination in [
            source.clone(),
            source.join("nested/copy"),
            dir.path().join("alias/new/deeper"),
        ] {
            assert_eq!(
                copy(&source, &destination, true),
                Err(RpcError::copy_into_itself()),
                "{destination:?}"
            );
        }
        assert_eq!(
            copy(&source, &dir.path().join("x"), false),
            Err(RpcError::copy_requires_recursive())
        );
    }

    #[test]
    fn a_file_copied_onto_itself_keeps_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"precious").unwrap();
        symlink("f", dir.path().join("link")).unwrap();
        copy(&file, &file, false).unwrap();
        copy(&file, &dir.path().join("link"), false).unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"precious");
    }

    #[test]
    fn files_overwrite_and_links_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"new").unwrap();
        let destination = dir.path().join("g");
        fs::write(&destination, b"old and longer").unwrap();
        copy(&file, &destination, false).unwrap();
        assert_eq!(fs::read(&destination).unwrap(), b"new");

        let link = dir.path().join("link");
        symlink("f", &link).unwrap();
        let error = copy(&link, &destination, false).unwrap_err();
        assert_eq!(error.code, -32603);
        copy(&link, &dir.path().join("link2"), false).unwrap();
        assert_eq!(
            fs::read_link(dir.path().join("link2")).unwrap(),
            Path::new("f")
        );
    }

    #[test]
    fn the_missing_part_of_a_destination_is_resolved_lexically() {
        let dir = tempfile::tempdir().unwrap();
        let real = fs::canonicalize(dir.path()).unwrap();
        fs::create_dir(real.join("src")).unwrap();
        symlink(real.join("src"), real.join("alias")).unwrap();
        assert_eq!(
            resolve_existing(&real.join("alias/new/../../sibling")).unwrap(),
            real.join("sibling")
        );
        assert_eq!(
            resolve_existing(&real.join("alias/a/b")).unwrap(),
            real.join("src/a/b")
        );
    }

    /// A FIFO at `path` with a reader (the returned descriptor) that never reads.
    fn fifo_with_idle_reader(path: &Path) -> File {
        use std::os::unix::fs::OpenOptionsExt;
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c_path` is a valid NUL-terminated string for the duration of the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .unwrap()
    }

    #[test]
    fn a_source_that_is_no_longer_a_regular_file_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let _ends = fifo_with_idle_reader(&fifo);
        let deadline = Deadline::new(COPY, Duration::from_secs(60));
        // What `copy` meets when the file it examined was swapped for a FIFO.
        let copied = copy_file(&fifo, &dir.path().join("copy"), &deadline).unwrap();
        assert_eq!(copied, Copied::NotARegularFile);
        assert!(!dir.path().join("copy").exists());
    }

    #[test]
    fn copying_into_a_fifo_nobody_reads_ends_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("big");
        fs::write(&source, vec![1u8; 1 << 20]).unwrap();
        let fifo = dir.path().join("fifo");
        let _ends = fifo_with_idle_reader(&fifo);
        let deadline = Deadline::new(COPY, Duration::from_millis(50));
        assert_eq!(
            super::copy(&source, &fifo, false, &deadline),
            Err(RpcError::fs_operation_timed_out(COPY, 50))
        );
    }

    #[test]
    fn copying_into_a_fifo_nobody_reads_holds_its_slot_no_longer_than_the_peer_wait() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("big");
        fs::write(&source, vec![1u8; 1 << 20]).unwrap();
        let fifo = dir.path().join("fifo");
        let _ends = fifo_with_idle_reader(&fifo);
        let deadline = Deadline::new(COPY, Duration::from_secs(600));
        let ms = crate::blocking::PEER_WAIT_IN_SLOT.as_millis() as u64;
        assert_eq!(
            super::copy(&source, &fifo, false, &deadline),
            Err(RpcError::fs_reader_stalled(COPY, ms))
        );
    }
}

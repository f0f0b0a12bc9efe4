//! `fs/copy` (PROTOCOL §5.13): files by content, directories recursively, links as links.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use exec_server_core::proto::bytes::Empty;
use exec_server_core::proto::fs::CopyParams;
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use exec_server_sandbox::policy::SandboxPolicy;
use serde_json::json;
use serde_json::value::RawValue;

use crate::blocking::IoResultExt;
use crate::nonblocking;
use crate::paths::{helper_path, host_path};
use crate::routing::{execute, to_wire, FsOperation, FsState};

pub(crate) async fn handle(
    config: Arc<FsState>,
    _cx: Call,
    params: CopyParams,
) -> Result<Empty, RpcError> {
    let operation = Copy {
        source: host_path(&params.source_path)?,
        destination: host_path(&params.destination_path)?,
        recursive: params.recursive,
    };
    execute(
        &config.sandbox,
        operation,
        params.sandbox.as_ref(),
        params.sandbox_policy.as_ref(),
    )
    .await?;
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
    type Output = ();
    const METHOD: &'static str = exec_server_core::proto::fs::COPY;

    fn run(self) -> Result<(), RpcError> {
        copy(&self.source, &self.destination, self.recursive)
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

/// Copies `source`, examined without following a final link, to `destination`.
pub(crate) fn copy(source: &Path, destination: &Path, recursive: bool) -> Result<(), RpcError> {
    let file_type = fs::symlink_metadata(source).or_rpc()?.file_type();
    if file_type.is_dir() {
        if !recursive {
            return Err(RpcError::copy_requires_recursive());
        }
        let source = fs::canonicalize(source).or_rpc()?;
        if resolve_existing(destination).or_rpc()?.starts_with(&source) {
            return Err(RpcError::copy_into_itself());
        }
        copy_tree(&source, destination).or_rpc()
    } else if file_type.is_symlink() {
        copy_link(source, destination).or_rpc()
    } else if file_type.is_file() {
        copy_file(source, destination).or_rpc()
    } else {
        Err(RpcError::copy_unsupported_type())
    }
}

/// Creates `destination` if missing and merges `source` into it. Special files are
/// skipped; links inside the tree are never followed.
fn copy_tree(source: &Path, destination: &Path) -> io::Result<()> {
    fs::create_dir_all(destination)?;
    for entry in fs::read_dir(source)? {
        let entry = entry?;
        let from = entry.path();
        let to = destination.join(entry.file_name());
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            copy_tree(&from, &to)?;
        } else if file_type.is_symlink() {
            copy_link(&from, &to)?;
        } else if file_type.is_file() {
            copy_file(&from, &to)?;
        }
    }
    Ok(())
}

/// A new link with the same target text; an existing destination is `EEXIST`.
fn copy_link(source: &Path, destination: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(fs::read_link(source)?, destination)
}

/// Copies content and permission bits, creating or overwriting `destination`. Copying a
/// file onto itself (the same inode, e.g. through a link) leaves it untouched rather than
/// truncating it to nothing.
fn copy_file(source: &Path, destination: &Path) -> io::Result<()> {
    let from = nonblocking::open(source, OpenOptions::new().read(true), true)?;
    let mut options = OpenOptions::new();
    options.write(true).create(true);
    let to = nonblocking::open(destination, &mut options, true)?;
    copy_opened(from, to)
}

/// [`copy_file`] between opened files (both opened without waiting on a FIFO).
pub(crate) fn copy_opened(mut from: File, mut to: File) -> io::Result<()> {
    nonblocking::make_blocking(&from)?;
    let from_meta = from.metadata()?;
    nonblocking::make_blocking(&to)?;
    let to_meta = to.metadata()?;
    if (to_meta.dev(), to_meta.ino()) == (from_meta.dev(), from_meta.ino()) {
        return Ok(());
    }
    if to_meta.is_file() {
        to.set_len(0)?;
    }
    io::copy(&mut from, &mut to)?;
    if to_meta.is_file() {
        to.set_permissions(from_meta.permissions())?;
    }
    Ok(())
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
    use std::os::unix::fs::{symlink, PermissionsExt};

    use super::*;

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
}

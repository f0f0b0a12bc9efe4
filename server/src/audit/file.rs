//! The `file` backend: JSON lines, owner-only, rotated by size, `fsync` as configured.
//!
//! The file is opened at start-up (the server refuses to start when it cannot), appended
//! to, and never followed through a symlink. At `max_file_bytes` it is renamed to
//! `<path>.1` (older ones move up to `<path>.<max_files>`, the oldest is removed) and a new
//! file is created with mode 0600 from the first instant, exclusively, so nothing another
//! user prepared at that name is written to.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use exec_server_config::ConfigSource;

use super::backend::{AuditBackend, AuditWriter};
use super::config::{BackendConfig, Fsync, Mode};

/// Owner read and write, nothing for anyone else.
const MODE: u32 = 0o600;

/// In `batch` mode, how long the writer lets events gather before it writes them: one
/// wake-up and one `write` per this much time on a busy server, instead of one per event.
const BATCH_LINGER: Duration = Duration::from_millis(10);

crate::inventory::submit! {
    AuditBackend { kind: "file", open }
}

fn open(config: &BackendConfig, _: &ConfigSource) -> Result<Box<dyn AuditWriter>, String> {
    let path = config.path.clone().ok_or("needs `path`")?;
    let file = AuditFile::open(path, config)?;
    Ok(Box::new(FileWriter {
        file: Some(file),
        linger: (config.mode == Mode::Batch).then_some(BATCH_LINGER),
    }))
}

/// The open file and its rotation state; moved to a blocking thread for each write.
struct AuditFile {
    path: PathBuf,
    file: File,
    size: u64,
    max_bytes: u64,
    max_files: u32,
    fsync: Fsync,
    fsync_every: Duration,
    last_sync: Instant,
    unsynced: bool,
}

impl AuditFile {
    fn open(path: PathBuf, config: &BackendConfig) -> Result<Self, String> {
        let file = open_append(&path)?;
        let size = file
            .metadata()
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?
            .len();
        Ok(Self {
            path,
            file,
            size,
            max_bytes: config.max_file_bytes,
            max_files: config.max_files,
            fsync: config.fsync,
            fsync_every: Duration::from_millis(config.fsync_interval_ms),
            last_sync: Instant::now(),
            unsynced: false,
        })
    }

    /// Appends `lines`, rotating first when they would take the file past its size. A
    /// rotation that fails is logged and the lines go to the current file: history is
    /// never given up for it.
    fn write(&mut self, lines: &[Arc<str>]) -> Result<(), String> {
        let mut buffer = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        for line in lines {
            buffer.extend_from_slice(line.as_bytes());
            buffer.push(b'\n');
        }
        self.reopen_if_moved()?;
        let grown = self.size.saturating_add(buffer.len() as u64);
        if self.size > 0 && grown > self.max_bytes {
            if let Err(e) = self.rotate() {
                tracing::warn!(error = %e, "audit file rotation failed; writing on in the current file");
            }
        }
        if let Err(e) = self.file.write_all(&buffer) {
            // A batch is retried whole: take back the part that was written, so no line
            // is ever cut or doubled.
            let _ = self.file.set_len(self.size);
            return Err(format!("cannot write {}: {e}", self.path.display()));
        }
        self.size += buffer.len() as u64;
        self.unsynced = true;
        match self.fsync {
            Fsync::Always => self.sync(),
            Fsync::Interval if self.last_sync.elapsed() >= self.fsync_every => self.sync(),
            _ => Ok(()),
        }
    }

    fn sync(&mut self) -> Result<(), String> {
        if self.unsynced {
            self.file
                .sync_data()
                .map_err(|e| format!("cannot fsync {}: {e}", self.path.display()))?;
            self.unsynced = false;
        }
        self.last_sync = Instant::now();
        Ok(())
    }

    /// `path` → `path.1` → … → `path.<max_files>` (dropped), then a new `path`. The
    /// current file is first moved aside under a name of its own, so a rotation that
    /// cannot start moves nothing; each rotated file moves up once per rotation.
    fn rotate(&mut self) -> Result<(), String> {
        if self.fsync != Fsync::Never {
            self.sync()?;
        }
        let named = |suffix: &str| {
            let mut name = self.path.clone().into_os_string();
            name.push(suffix);
            PathBuf::from(name)
        };
        let aside = named(".rotating");
        std::fs::rename(&self.path, &aside)
            .map_err(|e| format!("cannot rotate {}: {e}", self.path.display()))?;
        if self.max_files == 0 {
            let _ = std::fs::remove_file(&aside);
        } else {
            for n in (1..self.max_files).rev() {
                let _ = std::fs::rename(named(&format!(".{n}")), named(&format!(".{}", n + 1)));
            }
            std::fs::rename(&aside, named(".1"))
                .map_err(|e| format!("cannot rotate {}: {e}", self.path.display()))?;
        }
        self.file = create_new(&self.path)?;
        self.size = 0;
        Ok(())
    }

    /// Opens `path` again when the file there is not the one this writer holds (moved or
    /// removed by someone else, or a rotation that could not create the new file), so
    /// events never go to a file nobody can find.
    fn reopen_if_moved(&mut self) -> Result<(), String> {
        let held = self
            .file
            .metadata()
            .map_err(|e| format!("cannot read {}: {e}", self.path.display()))?;
        let current = std::fs::symlink_metadata(&self.path).ok();
        let same = current.is_some_and(|m| m.dev() == held.dev() && m.ino() == held.ino());
        if !same {
            tracing::warn!(path = %self.path.display(), "the audit file was moved or removed; opening it again");
            self.file = open_append(&self.path)?;
            self.size = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        }
        Ok(())
    }
}

/// Opens `path` to append, creating it owner-only. An existing file must be a regular
/// file of this user; one readable by others is narrowed to 0600 (and said so).
fn open_append(path: &Path) -> Result<File, String> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot open {} to append: {e}", path.display()))?;
    let metadata = file
        .metadata()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !metadata.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if metadata.uid() != rustix::process::geteuid().as_raw() {
        return Err(format!("{} belongs to another user", path.display()));
    }
    if metadata.nlink() != 1 {
        return Err(format!(
            "{} has other names (hard links): it may be another file",
            path.display()
        ));
    }
    check_directory(path)?;
    if metadata.mode() & 0o077 != 0 {
        tracing::warn!(path = %path.display(), "the audit file was readable by others: narrowed to 0600");
        file.set_permissions(std::fs::Permissions::from_mode(MODE))
            .map_err(|e| format!("cannot narrow {}: {e}", path.display()))?;
    }
    Ok(file)
}

/// The directory of `path` must not let other users create or replace names in it (a
/// planted `<path>.1` or `<path>.rotating` would break rotation or take its place).
fn check_directory(path: &Path) -> Result<(), String> {
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let metadata = std::fs::metadata(directory)
        .map_err(|e| format!("cannot read {}: {e}", directory.display()))?;
    let euid = rustix::process::geteuid().as_raw();
    let others_write = metadata.mode() & 0o022 != 0;
    if others_write || (metadata.uid() != euid && metadata.uid() != 0) {
        return Err(format!(
            "{} may be written by other users (mode {:04o}): keep the audit trail in a directory only this user (or root) owns and writes, e.g. /var/log/exec-server",
            directory.display(),
            metadata.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Creates a new `path`, owner-only from its first instant; an existing name is an error.
fn create_new(path: &Path) -> Result<File, String> {
    OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))
}

struct FileWriter {
    /// `None` only while a write runs on a blocking thread.
    file: Option<AuditFile>,
    linger: Option<Duration>,
}

impl FileWriter {
    async fn with_file(
        &mut self,
        job: impl FnOnce(&mut AuditFile) -> Result<(), String> + Send + 'static,
    ) -> Result<(), String> {
        let mut file = self.file.take().ok_or("the audit file was lost")?;
        let (file, result) = tokio::task::spawn_blocking(move || {
            let result = job(&mut file);
            (file, result)
        })
        .await
        .map_err(|e| format!("the audit writer failed: {e}"))?;
        self.file = Some(file);
        result
    }
}

#[async_trait]
impl AuditWriter for FileWriter {
    async fn write(&mut self, lines: &[Arc<str>]) -> Result<(), String> {
        let lines = lines.to_vec();
        self.with_file(move |file| file.write(&lines)).await
    }

    async fn flush(&mut self) -> Result<(), String> {
        self.with_file(|file| match file.fsync {
            Fsync::Never => Ok(()),
            _ => file.sync(),
        })
        .await
    }

    fn linger(&self) -> Option<Duration> {
        self.linger
    }
}

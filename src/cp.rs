//! `exec-server cp SRC DST`: one file between this machine and a server, over the fs
//! methods, on any transport `run` uses (`--url`, `--stdio`, `--remote`, `-p`). The side
//! on the server is written `:PATH`, as `scp` writes `host:path`.
//!
//! Uploads stream through `fs/open` (mode `replace`), `fs/writeBlock` and `fs/close`, which
//! puts the new version in place whole; downloads read `fs/readBlock` into a temporary
//! file beside the destination and rename it. Neither side ever holds the whole file.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use exec_server_client::proto::fs::{GetMetadataParams, OpenMode, OpenParams, ReadBlockParams};
use exec_server_client::{ExecServerClient, ExecServerError};

use crate::server_args::{connect, ServerArgs};

/// The longest handle id the protocol allows.
const MAX_HANDLE_ID_BYTES: usize = 32;
/// Bytes per block: the server's default `fs.max_read_block_bytes`.
const BLOCK_BYTES: usize = 1024 * 1024;

/// Arguments of `exec-server cp`.
#[derive(Debug, Clone, Args)]
pub struct CpArgs {
    /// Where the server is.
    #[command(flatten)]
    pub server: ServerArgs,

    /// The file to copy: a local path, or `:/PATH` on the server.
    #[arg(value_name = "SRC")]
    pub source: String,

    /// Where to copy it: a local path, or `:/PATH` on the server. An existing directory
    /// (or a path ending in `/`) receives the file under its own name.
    #[arg(value_name = "DST")]
    pub destination: String,
}

enum Direction {
    Upload { local: PathBuf, remote: String },
    Download { remote: String, local: PathBuf },
}

/// Copies and returns the exit status: 0, 1 when the copy failed, 2 for a usage error.
pub fn main(mut args: CpArgs, config: Option<&Path>) -> ExitCode {
    let direction = args.server.resolve().and_then(|()| direction(&args));
    let direction = match direction {
        Ok(direction) => direction,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("exec-server cp: failed to start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let copied = runtime.block_on(async {
        let client = connect(&args.server, "exec-server cp", config).await?;
        let copied = match &direction {
            Direction::Upload { local, remote } => upload(&client, local, remote).await,
            Direction::Download { remote, local } => download(&client, remote, local).await,
        };
        let _ = client.close_session().await;
        copied
    });
    match copied {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let text = exec_server_proto::log_text::printable(&error.to_string());
            if let Some(hint) = args.server.refusal_hint(&error) {
                eprintln!("exec-server cp: {hint}");
            }
            eprintln!(
                "exec-server cp: {} → {}: {text}",
                args.source, args.destination
            );
            ExitCode::from(1)
        }
    }
}

fn direction(args: &CpArgs) -> Result<Direction, String> {
    let remote = |text: &str| text.strip_prefix(':').map(str::to_owned);
    match (remote(&args.source), remote(&args.destination)) {
        (None, Some(remote)) => Ok(Direction::Upload {
            local: args.source.clone().into(),
            remote: absolute(remote)?,
        }),
        (Some(remote), None) => Ok(Direction::Download {
            remote: absolute(remote)?,
            local: args.destination.clone().into(),
        }),
        _ => Err("one side is on the server, written `:/PATH` (e.g. `exec-server cp -p build ./app.tar :/srv/app.tar`)".into()),
    }
}

fn absolute(remote: String) -> Result<String, String> {
    if remote.starts_with('/') || remote.starts_with("file:") {
        Ok(remote)
    } else {
        Err(format!(
            "`:{remote}`: a path on the server must be absolute (`:/…`)"
        ))
    }
}

fn local_error(path: &Path, error: std::io::Error) -> ExecServerError {
    ExecServerError::InvalidRequest(format!("{}: {error}", path.display()))
}

async fn upload(
    client: &ExecServerClient,
    local: &Path,
    remote: &str,
) -> Result<(), ExecServerError> {
    let mut file = std::fs::File::open(local).map_err(|e| local_error(local, e))?;
    let name = local.file_name().map(|n| n.to_string_lossy().into_owned());
    let target = match (into_directory(client, remote).await?, name) {
        (true, Some(name)) => format!("{}/{name}", remote.trim_end_matches('/')),
        _ => remote.to_owned(),
    };
    let handle = open(client, &target, OpenMode::Replace).await?;
    let mut block = vec![0u8; BLOCK_BYTES];
    let mut offset = 0u64;
    loop {
        let n = file.read(&mut block).map_err(|e| local_error(local, e))?;
        if n == 0 {
            break;
        }
        client.fs_write_block(&handle, offset, &block[..n]).await?;
        offset += n as u64;
    }
    // Puts the new version in place, whole.
    client.fs_close(&handle).await
}

/// Whether the remote destination names a directory (ends in `/`, or is one).
async fn into_directory(client: &ExecServerClient, remote: &str) -> Result<bool, ExecServerError> {
    if remote.ends_with('/') {
        return Ok(true);
    }
    let params = GetMetadataParams {
        path: remote.to_owned(),
        follow_symlinks: Some(true),
        sandbox: None,
        sandbox_policy: None,
    };
    Ok(client
        .fs_get_metadata(params)
        .await
        .is_ok_and(|m| m.is_directory))
}

async fn open(
    client: &ExecServerClient,
    path: &str,
    mode: OpenMode,
) -> Result<String, ExecServerError> {
    client
        .fs_open(OpenParams {
            handle_id: unique_name("cp")
                .chars()
                .take(MAX_HANDLE_ID_BYTES)
                .collect(),
            path: path.to_owned(),
            mode: Some(mode),
            sandbox: None,
            sandbox_policy: None,
        })
        .await
}

async fn download(
    client: &ExecServerClient,
    remote: &str,
    local: &Path,
) -> Result<(), ExecServerError> {
    let local = if local.is_dir() {
        let name = remote
            .rsplit('/')
            .next()
            .filter(|n| !n.is_empty())
            .unwrap_or("download");
        local.join(name)
    } else {
        local.to_owned()
    };
    let handle = open(client, remote, OpenMode::Read).await?;
    let parent = local
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let (partial, mut file) = tempfile_in(parent).map_err(|e| local_error(parent, e))?;
    let received = receive(client, &handle, &partial, &mut file).await;
    let closed = client.fs_close(&handle).await;
    let placed = received
        .and(closed)
        .and_then(|()| std::fs::rename(&partial, &local).map_err(|e| local_error(&local, e)));
    if placed.is_err() {
        // Nothing half-copied is left behind.
        let _ = std::fs::remove_file(&partial);
    }
    placed
}

/// Reads the handle to its end into `file`, and flushes it to disk.
async fn receive(
    client: &ExecServerClient,
    handle: &str,
    path: &Path,
    file: &mut std::fs::File,
) -> Result<(), ExecServerError> {
    let mut offset = 0u64;
    loop {
        let params = ReadBlockParams {
            handle_id: handle.to_owned(),
            offset,
            len: BLOCK_BYTES,
        };
        let block = client.fs_read_block(params).await?;
        file.write_all(&block.chunk)
            .map_err(|e| local_error(path, e))?;
        offset += block.chunk.len() as u64;
        if block.eof || block.chunk.is_empty() {
            break;
        }
    }
    file.sync_all().map_err(|e| local_error(path, e))
}

/// `prefix` and a random suffix: a handle id or a temporary file name nobody else uses.
fn unique_name(prefix: &str) -> String {
    // The client's process ids are random UUIDs.
    format!("{prefix}-{}", ExecServerClient::new_process_id())
}

/// A new file beside the destination (`.exec-server-cp-<id>`), created exclusively.
fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let path = dir.join(unique_name(".exec-server-cp"));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    Ok((path, file))
}

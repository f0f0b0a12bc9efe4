//! `fs/*` end to end (PROTOCOL §5): real files in temporary directories, the real binary.
//!
//! One module per topic; the fixtures they share are here.

mod copy_remove;
mod directories;
mod handles;
mod helper;
mod paths;
mod read_write;
mod sandbox;
mod surface;
mod walk;
mod watch;
mod write_handles;

use std::path::{Path, PathBuf};

use exec_server_proto::path::to_file_uri;
use serde_json::{json, Value};

use crate::util::{config_file, Client};

/// The canonical `file:` URI of a path.
fn uri(path: &Path) -> String {
    to_file_uri(path)
}

/// The native form of a (UTF-8) path, as sent by older clients.
fn native(path: &Path) -> String {
    path.to_str().expect("test paths are UTF-8").to_owned()
}

/// Both wire forms of a path.
fn forms(path: &Path) -> [String; 2] {
    [uri(path), native(path)]
}

/// A temporary directory under its canonical name, so results compare byte for byte.
fn temp_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let real = std::fs::canonicalize(dir.path()).unwrap();
    (dir, real)
}

/// A stdio server with the handshake done; `config` is the text of a `--config` file.
async fn started(config: Option<&str>) -> Client {
    let file = config.map(config_file);
    let args = match &file {
        Some(file) => vec!["--config", file.to_str().unwrap()],
        None => vec![],
    };
    let mut client = Client::stdio(&args).await;
    // Once the server answers, it has read the file, which may then go.
    client.handshake().await;
    client
}

fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
}

/// Asserts an OS error: its code and the `(os error N)` suffix of its message.
#[track_caller]
fn assert_os_error(error: &Value, code: i64, errno: i32) {
    assert_eq!(error["code"], code, "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.ends_with(&format!("(os error {errno})")),
        "expected errno {errno} in {error}"
    );
}

/// Deterministic, non-repeating test bytes.
fn pattern(len: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as u8
        })
        .collect()
}

fn walk_options(max_depth: usize, max_directories: usize, max_entries: usize) -> Value {
    json!({
        "maxDepth": max_depth,
        "maxDirectories": max_directories,
        "maxEntries": max_entries,
        "followDirectorySymlinks": false
    })
}

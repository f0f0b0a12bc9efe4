//! Computed read-only carve-outs under writable roots (SANDBOX.md §2.9): `.git` (with the
//! directory a `gitdir:` pointer file names, and the target of a symlinked `.git`),
//! `.codex` and `.agents`, unless an explicit write grant re-opens them.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::resolve::canonicalise;

/// Names protected under every writable root.
const PROTECTED_NAMES: &[&str] = &[".git", ".codex", ".agents"];

/// Longest `gitdir:` line read from a `.git` file; real ones are a path and a newline.
const MAX_GITDIR_LINE: u64 = 4096;

/// The carve-outs for `writable` (canonical writable roots, which are also the explicit
/// write grants that can re-open a carve-out).
pub(crate) fn computed_carve_outs(writable: &[PathBuf]) -> Vec<PathBuf> {
    let mut carve_outs = Vec::new();
    for root in writable.iter().filter(|w| w.parent().is_some()) {
        for name in PROTECTED_NAMES {
            let path = root.join(name);
            // A link is a carve-out as a name (pinned by narrowing) and as what it points
            // at, which may not exist yet either.
            if is_link(&path) {
                carve_outs.push(canonicalise(&path));
            }
            carve_outs.push(path);
        }
        let dot_git = root.join(".git");
        if let Some(target) = git_dir_elsewhere(root, &dot_git) {
            carve_outs.push(target);
        }
    }
    // An explicit write grant on the carve-out or below it re-opens it.
    carve_outs.retain(|carve_out| !writable.iter().any(|w| w.starts_with(carve_out)));
    carve_outs
}

fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Where the repository data of `root/.git` lives when it is not `root/.git` itself: the
/// canonical target of a symlink, or the directory named by a `gitdir:` pointer file.
fn git_dir_elsewhere(root: &Path, dot_git: &Path) -> Option<PathBuf> {
    let meta = std::fs::symlink_metadata(dot_git).ok()?;
    if meta.file_type().is_symlink() {
        return Some(canonicalise(dot_git));
    }
    if !meta.is_file() {
        return None;
    }
    let pointer = read_gitdir_pointer(dot_git)?;
    Some(canonicalise(&root.join(pointer)))
}

/// The `<p>` of a first line `gitdir: <p>`.
fn read_gitdir_pointer(file: &Path) -> Option<PathBuf> {
    let mut line = Vec::new();
    BufReader::new(File::open(file).ok()?.take(MAX_GITDIR_LINE))
        .read_until(b'\n', &mut line)
        .ok()?;
    let rest = line.strip_prefix(b"gitdir:")?;
    let pointer = rest.trim_ascii();
    if pointer.is_empty() {
        return None;
    }
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(pointer)))
}

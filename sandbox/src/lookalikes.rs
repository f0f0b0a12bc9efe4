//! Paths that a lossy listing could have made from another file's name (docs/SECURITY.md,
//! "Name fidelity"). Names are bytes; a listing sent as JSON text shows a name that is not
//! UTF-8 with U+FFFD in place of its bad bytes, so `a\xff` reads as `a\u{FFFD}`, which may
//! also be the real name of another file. A path a client spells as text with U+FFFD is
//! ambiguous when a directory on it holds such a lookalike: acting on it could reach a
//! different file than the one the client listed. Shared by `fs/*` (in the server and the
//! fs helper) and `process/start` (its working directory).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// Whether any component of `path` is UTF-8 text with U+FFFD whose directory (as `list`
/// gives its names; `None`: it cannot be listed) also holds a name that is not UTF-8 and
/// reads the same.
pub fn is_ambiguous(path: &Path, list: impl Fn(&Path) -> Option<Vec<OsString>>) -> bool {
    let mut directory = PathBuf::new();
    for component in path.iter() {
        if has_replacement(component) && has_lookalike(component, list(&directory)) {
            return true;
        }
        directory.push(component);
    }
    false
}

/// The names in `directory`, listed with this process's rights.
pub fn list(directory: &Path) -> Option<Vec<OsString>> {
    let names = std::fs::read_dir(directory).ok()?;
    Some(
        names
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect(),
    )
}

/// Whether `text` could name an ambiguous path at all: the only check on the common path.
pub fn may_be_ambiguous(text: &str) -> bool {
    text.contains(char::REPLACEMENT_CHARACTER)
}

/// Whether `name` is UTF-8 text containing U+FFFD: the only names a lossy listing can
/// have produced from another.
fn has_replacement(name: &OsStr) -> bool {
    name.to_str().is_some_and(may_be_ambiguous)
}

/// Whether `names` holds a name that is not UTF-8 whose lossy text is `name`.
fn has_lookalike(name: &OsStr, names: Option<Vec<OsString>>) -> bool {
    names
        .into_iter()
        .flatten()
        .any(|other| other.to_str().is_none() && other.to_string_lossy() == name.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStringExt;

    use super::*;

    #[test]
    fn a_lookalike_in_any_directory_of_the_path_makes_it_ambiguous() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join(OsString::from_vec(b"d\xff".to_vec()))).unwrap();
        std::fs::create_dir_all(root.join("d\u{FFFD}/sub")).unwrap();
        assert!(is_ambiguous(&root.join("d\u{FFFD}"), list));
        assert!(is_ambiguous(&root.join("d\u{FFFD}/sub"), list));
        assert!(!is_ambiguous(&root.join("e\u{FFFD}"), list));
        assert!(!is_ambiguous(
            &root.join(OsString::from_vec(b"d\xff".to_vec())),
            list
        ));
    }
}

//! Path resolution with the kernel's rules, as far as the path exists (SANDBOX.md §2.8,
//! §5.6): symlinks are followed and `..` is applied after following; the part that does
//! not exist is appended after lexical `.`/`..` resolution (nothing in it can be a symlink).
//!
//! Only `lstat` and `readlink` are used, which Landlock does not mediate, so resolution also
//! works for paths the caller may not read.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

/// Symlinks followed before giving up, like the kernel's `ELOOP` limit.
const MAX_SYMLINKS: usize = 40;

/// Resolves an absolute path (a relative one is taken relative to `/`). With `follow_last`
/// false, a last component that is a symlink is kept as a name, not followed.
pub fn resolve(path: &Path, follow_last: bool) -> PathBuf {
    let mut pending: Vec<OsString> = Vec::new();
    push_components(&mut pending, path);
    let mut resolved = PathBuf::from("/");
    // Names below `resolved` that do not exist; once non-empty, resolution is lexical.
    let mut missing: Vec<OsString> = Vec::new();
    let mut symlinks_followed = 0;

    // `pending` is a stack: its last element is the next component.
    while let Some(name) = pending.pop() {
        if name == "." {
            continue;
        }
        if name == ".." {
            if missing.pop().is_none() {
                resolved.pop();
            }
            continue;
        }
        if !missing.is_empty() {
            missing.push(name);
            continue;
        }
        let candidate = resolved.join(&name);
        let is_last = pending.is_empty();
        match std::fs::symlink_metadata(&candidate) {
            Ok(meta) if meta.file_type().is_symlink() && (follow_last || !is_last) => {
                symlinks_followed += 1;
                match std::fs::read_link(&candidate) {
                    Ok(target) if symlinks_followed <= MAX_SYMLINKS => {
                        if target.is_absolute() {
                            resolved = PathBuf::from("/");
                        }
                        push_components(&mut pending, &target);
                    }
                    // A loop or an unreadable link: keep the name, lexically.
                    _ => missing.push(name),
                }
            }
            Ok(_) => resolved = candidate,
            Err(_) => missing.push(name),
        }
    }
    resolved.extend(missing);
    resolved
}

/// Canonical form of a policy path: resolved, the last component followed.
pub fn canonicalise(path: &Path) -> PathBuf {
    resolve(path, true)
}

/// Pushes `path`'s components so that the first one is popped next.
fn push_components(stack: &mut Vec<OsString>, path: &Path) {
    let names: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::CurDir => Some(".".into()),
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::Prefix(_) => None,
        })
        .collect();
    stack.extend(names.into_iter().rev());
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn real_temp_dir() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        (dir, root)
    }

    #[test]
    fn existing_paths_match_the_kernel() {
        let (_dir, t) = real_temp_dir();
        std::fs::create_dir_all(t.join("a/b")).unwrap();
        symlink(t.join("a/b"), t.join("link")).unwrap();
        symlink("a/b", t.join("rel")).unwrap();
        assert_eq!(resolve(&t.join("link"), true), t.join("a/b"));
        assert_eq!(resolve(&t.join("rel/../b"), true), t.join("a/b"));
        assert_eq!(resolve(&t.join("./a/./b/.."), true), t.join("a"));
        assert_eq!(
            resolve(&t.join("link/.."), true),
            std::fs::canonicalize(t.join("link/..")).unwrap()
        );
    }

    #[test]
    fn missing_remainder_is_appended_lexically() {
        let (_dir, t) = real_temp_dir();
        std::fs::create_dir(t.join("a")).unwrap();
        symlink(t.join("a"), t.join("link")).unwrap();
        assert_eq!(resolve(&t.join("link/new/x/../y"), true), t.join("a/new/y"));
        // `..` that cancels the missing part returns to kernel resolution.
        assert_eq!(resolve(&t.join("nope/../link"), true), t.join("a"));
    }

    #[test]
    fn last_symlink_kept_when_not_following() {
        let (_dir, t) = real_temp_dir();
        std::fs::create_dir(t.join("a")).unwrap();
        symlink(t.join("a"), t.join("link")).unwrap();
        assert_eq!(resolve(&t.join("link"), false), t.join("link"));
        assert_eq!(resolve(&t.join("link"), true), t.join("a"));
    }

    #[test]
    fn symlink_loops_terminate() {
        let (_dir, t) = real_temp_dir();
        symlink(t.join("loop"), t.join("loop")).unwrap();
        assert_eq!(resolve(&t.join("loop/x"), true), t.join("loop/x"));
    }

    #[test]
    fn dangling_symlink_resolves_to_its_target() {
        let (_dir, t) = real_temp_dir();
        symlink(t.join("gone/x"), t.join("dangling")).unwrap();
        assert_eq!(resolve(&t.join("dangling"), true), t.join("gone/x"));
    }
}

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

/// The lexical normal form of `path`, without looking at the file system: absolute (a
/// relative path is taken relative to `/`), no `.`, no repeated `/`, and each `..` removes
/// the name before it — never climbing above `/`. Only right for paths in which nothing is
/// a symlink (for the others, see [`resolve`]).
pub fn normalise_lexically(path: &Path) -> PathBuf {
    let mut names: Vec<&std::ffi::OsStr> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => names.push(name),
            Component::ParentDir => {
                names.pop();
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    let mut normal = PathBuf::from("/");
    normal.extend(names);
    normal
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
    use crate::policy::AccessKind;

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
    fn lexical_normal_forms() {
        for (path, normal) in [
            ("/a/./b//c/", "/a/b/c"),
            ("/a/b/../../..", "/"),
            ("/../../x/..//y", "/y"),
            ("a/b", "/a/b"),
            ("", "/"),
        ] {
            assert_eq!(
                normalise_lexically(Path::new(path)),
                Path::new(normal),
                "{path}"
            );
        }
    }

    /// The normal form by a different route: a stack over the `/`-separated texts.
    fn model(path: &str) -> String {
        let mut stack: Vec<&str> = Vec::new();
        for part in path.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    stack.pop();
                }
                name => stack.push(name),
            }
        }
        format!("/{}", stack.join("/"))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        #[test]
        fn the_lexical_normaliser_never_leaves_the_root(
            parts in proptest::collection::vec(
                proptest::sample::select(vec!["a", "b", "..", ".", "", "c.d", "..."]), 0..12),
            absolute: bool,
        ) {
            let text = format!("{}{}", if absolute { "/" } else { "" }, parts.join("/"));
            let normal = normalise_lexically(Path::new(&text));
            proptest::prop_assert_eq!(normal.to_str().unwrap(), model(&text));
            proptest::prop_assert!(normal.has_root());
            proptest::prop_assert!(normal
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_))));
            proptest::prop_assert_eq!(normalise_lexically(&normal), normal.clone());
            if !parts.contains(&"..") {
                let plain: PathBuf = Path::new("/").join(Path::new(&text));
                proptest::prop_assert_eq!(normal, plain.components().collect::<PathBuf>());
            }
        }

        /// `resolve` agrees with the kernel: existing paths are what `canonicalize` says;
        /// a missing last name is appended to its parent's canonical form; and the policy
        /// decides a path exactly as it decides what the kernel resolves it to.
        #[test]
        fn resolution_agrees_with_the_kernel(
            nodes in crate::anchored::tests::nodes(),
            probes in crate::anchored::tests::probes(),
        ) {
            let (_dir, t) = real_temp_dir();
            crate::anchored::tests::build(&t, &nodes);
            let policy = crate::policy::SandboxPolicy {
                readable: crate::policy::Readable::Roots(vec![t.clone()]),
                writable: vec![t.join("a")],
                read_only: vec![t.join("a/b")],
                denied_paths: vec![t.join("b")],
                denied_globs: vec![crate::policy::GlobPattern::new(
                    &format!("{}/**/x", t.display())).unwrap()],
                network: crate::policy::Network::Restricted,
                full_disk_write: false,
                glob_scan_max_depth: crate::policy::DEFAULT_GLOB_SCAN_MAX_DEPTH,
            };
            for probe in probes {
                let path = t.join(&probe);
                let resolved = resolve(&path, true);
                // A trailing `/` or `.` makes the kernel follow the last name; `Path` drops
                // both, so the oracles below only judge probes that end in a plain name.
                let ends_in_name =
                    !matches!(probe.rsplit('/').next(), Some("" | "." | ".."));
                match std::fs::canonicalize(&path) {
                    Ok(canonical) => {
                        proptest::prop_assert_eq!(&resolved, &canonical, "{}", probe);
                        for access in [AccessKind::Read, AccessKind::Write] {
                            proptest::prop_assert_eq!(
                                policy.approve(&path, true, access).is_ok(),
                                policy.allows(&canonical, access),
                                "{}", probe
                            );
                        }
                    }
                    Err(_) => {
                        let missing = std::fs::symlink_metadata(&path).is_err();
                        if let (true, true, Some(Component::Normal(name)), Some(parent)) =
                            (ends_in_name, missing, path.components().next_back(), path.parent())
                        {
                            if let Ok(parent) = std::fs::canonicalize(parent) {
                                proptest::prop_assert_eq!(&resolved, &parent.join(name), "{}", probe);
                            }
                        }
                    }
                }
                // Without following, a last name is kept as it is, below its resolved parent.
                if let (true, Some(Component::Normal(name)), Some(parent)) =
                    (ends_in_name, path.components().next_back(), path.parent())
                {
                    if let Ok(parent) = std::fs::canonicalize(parent) {
                        proptest::prop_assert_eq!(
                            resolve(&path, false), parent.join(name), "{}", probe);
                    }
                }
            }
        }
    }

    #[test]
    fn dangling_symlink_resolves_to_its_target() {
        let (_dir, t) = real_temp_dir();
        symlink(t.join("gone/x"), t.join("dangling")).unwrap();
        assert_eq!(resolve(&t.join("dangling"), true), t.join("gone/x"));
    }
}

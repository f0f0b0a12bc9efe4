#![no_main]
//! `paths`: wire paths and host paths through parsing, formatting, lexical normalisation,
//! policy resolution and the exact opens of the sandbox, judged against simple models and
//! against the kernel.
//!
//! Input: the wire text, then optionally a 0xFF byte (never part of UTF-8 text) and the
//! bytes that shape a small tree in a fresh temporary directory and the probes below it.
//!
//! Invariants:
//! * `parse_path`: native paths are kept byte for byte; URIs never keep a dot segment
//!   (unless an encoded `/` made one), never hold NUL, ignore the scheme's case and
//!   `localhost`; a foreign-OS refusal only for URIs.
//! * `encode_file_uri` is canonical (path characters and upper-case `%XX` only, decoding to the
//!   path's bytes) and `parse_path` reads it back as the path with its dot segments removed
//!   (a first name like `C:` is refused as a drive letter); `to_file_uri` and
//!   `to_wire_path` read back as exactly the path.
//! * `normalise_lexically` is a stack over the `/`-separated names: normal, idempotent, and
//!   below the tree whenever the names never climb out of it.
//! * In the tree (directories, files, links of every kind, long and non-UTF-8 names):
//!   `plain_names` refuses `.`, `..` and a trailing `/`; `open_exact`, `open_with_openat2`
//!   and `open_by_walk` agree with each other and with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` from the tree's root (a link as the last
//!   name fails with `ELOOP` for every flag), and never open anything outside the tree;
//!   `Directory` sees what the kernel sees; and whatever `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_MAGICLINKS)` opens, with and without following the last link, is what an
//!   exact open of `resolve(path, follow)` opens.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use exec_server_proto::path::{
    encode_file_uri, has_file_scheme, parse_path, to_file_uri, to_wire_path, PathError,
};
use exec_server_sandbox::anchored::{self, Directory, EntryKind};
use exec_server_sandbox::fuzzing::{openat2, Mode, OFlags, ResolveFlags};
use exec_server_sandbox::policy::{normalise_lexically, resolve};
use libfuzzer_sys::arbitrary::{Result as ArbResult, Unstructured};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (text, rest) = match data.iter().position(|&b| b == 0xFF) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let text = String::from_utf8_lossy(text);
    check_wire_text(&text);
    let mut u = Unstructured::new(rest);
    if let Ok(bytes) = host_bytes(&mut u) {
        check_host_path(&path_of(bytes));
    }
    if !rest.is_empty() {
        let _ = check_tree(&mut u);
    }
});

fn path_of(bytes: Vec<u8>) -> PathBuf {
    PathBuf::from(OsString::from_vec(bytes))
}

fn bytes_of(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}

/// The text a client sends as a `path` member.
fn check_wire_text(text: &str) {
    let scheme = text.len() >= 5 && text.as_bytes()[..5].eq_ignore_ascii_case(b"file:");
    assert_eq!(has_file_scheme(text), scheme, "{text:?}");
    match parse_path(text) {
        Ok(path) => {
            let bytes = bytes_of(&path);
            assert!(bytes.starts_with(b"/"), "{text:?} -> {path:?}");
            if scheme {
                assert!(!bytes.contains(&0), "{text:?}");
                if !text.to_ascii_lowercase().contains("%2f") {
                    assert!(!has_dot_segment(bytes), "{text:?} -> {path:?}");
                }
                let rest = &text[5..];
                for variant in [format!("FILE:{rest}"), format!("fIlE:{rest}")]
                    .into_iter()
                    .chain(
                        rest.strip_prefix("///")
                            .map(|names| format!("file://LocalHost/{names}")),
                    )
                {
                    let again = parse_path(&variant).expect(&variant);
                    assert_eq!(bytes_of(&again), bytes, "{variant:?} vs {text:?}");
                }
            } else {
                assert_eq!(bytes, text.as_bytes(), "a native path is used as given");
            }
            check_host_path(&path);
        }
        Err(PathError::ForeignOs(_)) => assert!(scheme, "{text:?}"),
        Err(PathError::Invalid(_)) => {
            assert!(scheme || !text.starts_with('/'), "{text:?}")
        }
    }
}

/// Whether the `/`-separated names of an absolute path hold `.` or `..`.
fn has_dot_segment(bytes: &[u8]) -> bool {
    bytes
        .split(|&b| b == b'/')
        .skip(1)
        .any(|s| s == b"." || s == b"..")
}

/// RFC 3986 dot-segment removal on the names of an absolute path, as a model.
fn without_dot_segments(bytes: &[u8]) -> Vec<u8> {
    let mut stack: Vec<&[u8]> = Vec::new();
    let mut ends_in_dot = false;
    for segment in bytes[1..].split(|&b| b == b'/') {
        ends_in_dot = matches!(segment, b"." | b"..");
        match segment {
            b"." => {}
            b".." => {
                stack.pop();
            }
            name => stack.push(name),
        }
    }
    let mut out = b"/".to_vec();
    out.extend(stack.join(&b'/'));
    if ends_in_dot && !out.ends_with(b"/") {
        out.push(b'/');
    }
    out
}

fn is_path_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&b)
}

/// An absolute host path (the member after parsing, or any bytes).
fn check_host_path(path: &Path) {
    let bytes = bytes_of(path);
    if !bytes.starts_with(b"/") {
        return;
    }
    let uri = encode_file_uri(path);
    let encoded = uri.strip_prefix("file://").expect("file:// prefix");
    let mut decoded = Vec::new();
    let mut i = 0;
    let e = encoded.as_bytes();
    while i < e.len() {
        if e[i] == b'%' {
            let hex = &e[i + 1..i + 3];
            assert!(
                hex.iter()
                    .all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(h)),
                "{uri}"
            );
            decoded.push(u8::from_str_radix(std::str::from_utf8(hex).unwrap(), 16).unwrap());
            i += 3;
        } else {
            assert!(is_path_char(e[i]), "{uri}: {:?}", e[i] as char);
            decoded.push(e[i]);
            i += 1;
        }
    }
    assert_eq!(decoded, bytes, "{uri}");

    let first = bytes[1..].split(|&b| b == b'/').next().unwrap_or_default();
    let drive_letter =
        first.len() == 2 && first[0].is_ascii_alphabetic() && matches!(first[1], b':' | b'|');
    match parse_path(&uri) {
        Ok(back) => {
            assert!(!drive_letter && !bytes.contains(&0), "{uri}");
            assert_eq!(bytes_of(&back), without_dot_segments(bytes), "{uri}");
            if !has_dot_segment(bytes) {
                assert_eq!(encode_file_uri(&back), uri);
            }
        }
        Err(PathError::ForeignOs(_)) => assert!(drive_letter, "{uri}"),
        Err(PathError::Invalid(reason)) => assert!(bytes.contains(&0), "{uri}: {reason}"),
    }

    if !bytes.contains(&0) {
        if bytes != b"/." && bytes != b"/.." {
            let exact = to_file_uri(path);
            let back = parse_path(&exact).unwrap_or_else(|e| panic!("{exact}: {e:?}"));
            assert_eq!(bytes_of(&back), bytes, "{exact}");
        }
        let wire = to_wire_path(path);
        let back = parse_path(&wire).unwrap_or_else(|e| panic!("{wire:?}: {e:?}"));
        assert_eq!(bytes_of(&back), bytes, "{wire:?}");
    }

    let normal = normalise_lexically(path);
    assert!(normal
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_))));
    assert_eq!(bytes_of(&normal), lexical_model(bytes), "{path:?}");
    assert_eq!(normalise_lexically(&normal), normal);
}

/// The lexical normal form by a stack over the `/`-separated names.
fn lexical_model(bytes: &[u8]) -> Vec<u8> {
    let mut stack: Vec<&[u8]> = Vec::new();
    for name in bytes.split(|&b| b == b'/') {
        match name {
            b"" | b"." => {}
            b".." => {
                stack.pop();
            }
            name => stack.push(name),
        }
    }
    let mut out = b"/".to_vec();
    out.extend(stack.join(&b'/'));
    out
}

/// Names for tree entries and probe components.
fn name(u: &mut Unstructured<'_>) -> ArbResult<Vec<u8>> {
    Ok(match u.int_in_range(0..=13)? {
        0 => b"a".to_vec(),
        1 => b"b".to_vec(),
        2 => b"c".to_vec(),
        3 => b"x".to_vec(),
        4 => b".git".to_vec(),
        5 => "é z".as_bytes().to_vec(),
        6 => b"\xff\xfe".to_vec(),
        7 => vec![b'n'; 255],
        8 => vec![b'n'; 256],
        9 => b"C:".to_vec(),
        10 => b"%2F".to_vec(),
        _ => {
            let len = u.int_in_range(1..=12)?;
            let mut name: Vec<u8> = (0..len)
                .map(|_| u.arbitrary::<u8>())
                .collect::<ArbResult<_>>()?;
            name.retain(|&b| b != b'/' && b != 0);
            if name.is_empty() || name == b"." || name == b".." {
                name = b"z".to_vec();
            }
            name
        }
    })
}

/// An absolute path of fuzz names and dot segments.
fn host_bytes(u: &mut Unstructured<'_>) -> ArbResult<Vec<u8>> {
    let mut out = Vec::new();
    for _ in 0..u.int_in_range(0..=6)? {
        out.push(b'/');
        match u.int_in_range(0..=5)? {
            0 => out.extend_from_slice(b".."),
            1 => out.extend_from_slice(b"."),
            2 => {}
            _ => out.extend(name(u)?),
        }
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}

/// A fresh temporary directory (canonical path) with its root opened.
struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
    fd: OwnedFd,
}

type Identity = Result<(u64, u64), i32>;

fn identity(fd: std::io::Result<OwnedFd>) -> Identity {
    let fd = fd.map_err(|e| e.raw_os_error().unwrap_or(-1))?;
    let meta = std::fs::File::from(fd)
        .metadata()
        .map_err(|e| e.raw_os_error().unwrap_or(-1))?;
    Ok((meta.dev(), meta.ino()))
}

fn fd_kind(fd: BorrowedFd<'_>) -> Option<std::fs::FileType> {
    let fd = fd.try_clone_to_owned().ok()?;
    Some(std::fs::File::from(fd).metadata().ok()?.file_type())
}

impl Tree {
    /// `openat2` from the tree's root, never leaving it.
    fn beneath(
        &self,
        rel: &[u8],
        flags: OFlags,
        resolve: ResolveFlags,
    ) -> std::io::Result<OwnedFd> {
        // Empty names at the start would make the path absolute; below the root they are
        // nothing.
        let start = rel.iter().position(|&b| b != b'/').unwrap_or(rel.len());
        let rel = &rel[start..];
        let rel: &OsStr = if rel.is_empty() {
            OsStr::new(".")
        } else {
            OsStr::from_bytes(rel)
        };
        loop {
            match openat2(
                &self.fd,
                rel,
                flags | OFlags::CLOEXEC,
                Mode::empty(),
                resolve | ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
            ) {
                // A rename elsewhere raced with the lookup: ask again.
                Err(e) if e.raw_os_error() == EAGAIN => continue,
                other => return other.map_err(Into::into),
            }
        }
    }

    fn abs(&self, rel: &[u8]) -> PathBuf {
        let mut bytes = bytes_of(&self.root).to_vec();
        if !rel.is_empty() {
            bytes.push(b'/');
            bytes.extend_from_slice(rel);
        }
        path_of(bytes)
    }

    /// `(device, inode)` of the root and everything below it, links not followed.
    fn identities(&self) -> HashSet<(u64, u64)> {
        let mut seen = HashSet::new();
        let mut pending = vec![self.root.clone()];
        while let Some(dir) = pending.pop() {
            if let Ok(meta) = std::fs::symlink_metadata(&dir) {
                seen.insert((meta.dev(), meta.ino()));
            }
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let Ok(meta) = entry.metadata() else { continue };
                seen.insert((meta.dev(), meta.ino()));
                if meta.is_dir() {
                    pending.push(entry.path());
                }
            }
        }
        seen
    }
}

// Linux errno values (the same on every architecture).
const EAGAIN: i32 = 11;
const EINVAL: i32 = 22;
const ELOOP: i32 = 40;

/// Directories, files and links of every kind below the tree's root, each created only in
/// a directory of the tree reached without following a link.
fn build(u: &mut Unstructured<'_>, tree: &Tree) -> ArbResult<()> {
    // Relative paths of the directories created so far (`""` is the root).
    let mut dirs: Vec<Vec<u8>> = vec![Vec::new()];
    for _ in 0..u.int_in_range(0..=14)? {
        let parent = u.choose(&dirs)?.clone();
        // Only below a directory reached without any link: nothing is created elsewhere.
        let Ok(parent_fd) = tree.beneath(
            &parent,
            OFlags::PATH | OFlags::DIRECTORY,
            ResolveFlags::NO_SYMLINKS,
        ) else {
            continue;
        };
        drop(parent_fd);
        let name = name(u)?;
        let mut rel = parent.clone();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(&name);
        let path = tree.abs(&rel);
        match u.int_in_range(0..=3)? {
            0 | 1 => {
                if std::fs::create_dir(&path).is_ok() {
                    dirs.push(rel);
                }
            }
            2 => {
                let _ = std::fs::File::create_new(&path);
            }
            _ => {
                let root = bytes_of(&tree.root).to_vec();
                let target: Vec<u8> = match u.int_in_range(0..=17)? {
                    0 => b".".to_vec(),
                    1 => b"..".to_vec(),
                    2 => b"../..".to_vec(),
                    3 => b"../../..".to_vec(),
                    4 => b"a".to_vec(),
                    5 => b"a/b".to_vec(),
                    6 => b"b/../a".to_vec(),
                    7 => b"/".to_vec(),
                    8 => root.clone(),
                    9 => [&root[..], b"/a"].concat(),
                    10 => [&root[..], b"/a/../b"].concat(),
                    11 => b"missing".to_vec(),
                    12 => name.clone(),
                    13 => b"a/".to_vec(),
                    14 => b"/proc/self/root".to_vec(),
                    15 => b"/etc".to_vec(),
                    16 => {
                        let base = tree.root.file_name().unwrap().as_bytes();
                        [b"../", base, b"/a"].concat()
                    }
                    _ => name_path(u)?,
                };
                let _ = std::os::unix::fs::symlink(path_of(target), &path);
            }
        }
    }
    Ok(())
}

/// Names, dot segments and empty names joined by `/`, maybe with a trailing `/`.
fn name_path(u: &mut Unstructured<'_>) -> ArbResult<Vec<u8>> {
    let mut parts: Vec<Vec<u8>> = Vec::new();
    for _ in 0..u.int_in_range(0..=7)? {
        parts.push(match u.int_in_range(0..=9)? {
            0 => b"..".to_vec(),
            1 => b".".to_vec(),
            2 => Vec::new(),
            3 => b"missing".to_vec(),
            _ => name(u)?,
        });
    }
    let mut joined = parts.join(&b'/');
    if u.ratio(1, 8)? {
        joined.push(b'/');
    }
    Ok(joined)
}

fn check_tree(u: &mut Unstructured<'_>) -> ArbResult<()> {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = std::fs::canonicalize(dir.path()).expect("canonical temp dir");
    let fd = std::fs::File::open(&root).expect("open temp dir").into();
    let tree = Tree {
        _dir: dir,
        root,
        fd,
    };
    build(u, &tree)?;
    let inside = tree.identities();
    for _ in 0..u.int_in_range(1..=6)? {
        let rel = name_path(u)?;
        check_probe(&tree, &inside, &rel);
    }
    Ok(())
}

/// `rel` made of names only: no `.`, no `..`, no trailing `/` (empty names are fine).
fn is_plain(rel: &[u8]) -> bool {
    !rel.ends_with(b"/")
        && rel
            .split(|&b| b == b'/')
            .all(|name| name != b"." && name != b"..")
}

fn ends_in_name(rel: &[u8]) -> bool {
    !matches!(
        rel.rsplit(|&b| b == b'/').next(),
        Some(b"" | b"." | b"..") | None
    )
}

fn check_probe(tree: &Tree, inside: &HashSet<(u64, u64)>, rel: &[u8]) {
    let abs = tree.abs(rel);
    let names = anchored::plain_names(&abs);
    if !is_plain(rel) {
        let error = names.as_ref().map(|_| ()).map_err(|e| e.raw_os_error());
        assert_eq!(error, Err(Some(EINVAL)), "plain_names({abs:?})");
    }
    if let Ok(names) = &names {
        check_exact_opens(tree, inside, rel, &abs, names);
        if !rel.is_empty() {
            check_directory(tree, rel, &abs);
        }
    }
    check_resolution(tree, rel, &abs);

    // The lexical normal form stays below the tree when the names never climb out of it.
    let mut depth: i64 = 0;
    let mut climbs_out = false;
    for name in rel.split(|&b| b == b'/') {
        match name {
            b"" | b"." => {}
            b".." => {
                depth -= 1;
                climbs_out |= depth < 0;
            }
            _ => depth += 1,
        }
    }
    if !climbs_out {
        assert!(normalise_lexically(&abs).starts_with(&tree.root), "{abs:?}");
    }
}

/// The three exact opens agree with each other and with the kernel, and stay in the tree.
fn check_exact_opens(
    tree: &Tree,
    inside: &HashSet<(u64, u64)>,
    rel: &[u8],
    abs: &Path,
    names: &[&OsStr],
) {
    for flags in [
        OFlags::PATH,
        OFlags::PATH | OFlags::NOFOLLOW,
        OFlags::PATH | OFlags::DIRECTORY,
        OFlags::RDONLY,
        OFlags::RDONLY | OFlags::DIRECTORY,
    ] {
        let kernel = tree.beneath(rel, flags, ResolveFlags::NO_SYMLINKS);
        // `RESOLVE_NO_SYMLINKS` hands out a last link itself under `O_PATH | O_NOFOLLOW`;
        // an exact open promises `ELOOP` for a link anywhere, the last name included.
        let expected = match kernel {
            Ok(fd) if fd_kind(fd.as_fd()).is_some_and(|t| t.is_symlink()) => Err(ELOOP),
            other => identity(other),
        };
        let exact = identity(anchored::open_exact(abs, flags, Mode::empty()));
        let with_openat2 = identity(anchored::open_with_openat2(
            names,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
        ));
        let by_walk = identity(anchored::open_by_walk(
            names,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
        ));
        if abs.as_os_str().len() < 4096 {
            assert_eq!(exact, expected, "open_exact({abs:?}, {flags:?})");
            assert_eq!(
                with_openat2, expected,
                "open_with_openat2({abs:?}, {flags:?})"
            );
        }
        assert_eq!(
            by_walk.is_ok(),
            expected.is_ok(),
            "open_by_walk({abs:?}, {flags:?}): {by_walk:?} vs {expected:?}"
        );
        if let (Ok(walked), Ok(wanted)) = (by_walk, expected) {
            assert_eq!(walked, wanted, "open_by_walk({abs:?}, {flags:?})");
        }
        for opened in [exact, with_openat2, by_walk].into_iter().flatten() {
            assert!(inside.contains(&opened), "{abs:?} opened outside the tree");
        }
    }
}

/// `Directory` on the parent of `rel` sees the entry as the kernel does.
fn check_directory(tree: &Tree, rel: &[u8], abs: &Path) {
    let (parent_rel, name) = match rel.iter().rposition(|&b| b == b'/') {
        Some(at) => (&rel[..at], &rel[at + 1..]),
        None => (&[][..], rel),
    };
    if name.is_empty() {
        return;
    }
    let kernel_parent = identity(tree.beneath(
        parent_rel,
        OFlags::PATH | OFlags::DIRECTORY,
        ResolveFlags::NO_SYMLINKS,
    ));
    let opened = Directory::open_parent(abs);
    let (directory, entry) = match opened {
        Ok(pair) => pair,
        Err(e) => {
            if abs.as_os_str().len() < 4096 {
                assert!(kernel_parent.is_err(), "open_parent({abs:?}): {e}");
            }
            return;
        }
    };
    assert_eq!(entry.as_bytes(), name);
    assert_eq!(
        directory
            .identity()
            .map_err(|e| e.raw_os_error().unwrap_or(-1)),
        kernel_parent,
        "open_parent({abs:?})"
    );
    let itself = tree.beneath(
        rel,
        OFlags::PATH | OFlags::NOFOLLOW,
        ResolveFlags::NO_SYMLINKS,
    );
    let kind = itself
        .as_ref()
        .ok()
        .and_then(|fd| fd_kind(fd.as_fd()))
        .map(|t| {
            if t.is_dir() {
                EntryKind::Directory
            } else if t.is_file() {
                EntryKind::File
            } else if t.is_symlink() {
                EntryKind::Symlink
            } else {
                EntryKind::Other
            }
        });
    assert_eq!(directory.kind(&entry).ok(), kind, "kind of {abs:?}");
    assert_eq!(
        identity(directory.handle(&entry).map(OwnedFd::from)),
        identity(itself),
        "handle of {abs:?}"
    );
    let as_directory = directory.directory(&entry).map(|d| d.identity());
    let kernel_directory = identity(tree.beneath(
        rel,
        OFlags::PATH | OFlags::DIRECTORY,
        ResolveFlags::NO_SYMLINKS,
    ));
    match (as_directory, kernel_directory) {
        (Ok(Ok(found)), Ok(wanted)) => assert_eq!(found, wanted, "directory {abs:?}"),
        (Err(_), Err(_)) => {}
        (found, wanted) => panic!("directory {abs:?}: {found:?} vs {wanted:?}"),
    }
    if kind == Some(EntryKind::Symlink) {
        let error = directory
            .open_file(&entry, OFlags::RDONLY, Mode::empty())
            .unwrap_err();
        assert_eq!(error.raw_os_error(), Some(ELOOP), "open_file {abs:?}");
    }
    if let Ok(listed) = directory.names() {
        let mut listed: Vec<OsString> = listed.map(|n| n.expect("name")).collect();
        listed.sort();
        let parent = abs.parent().expect("parent");
        let mut kernel: Vec<OsString> = std::fs::read_dir(parent)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        kernel.sort();
        assert_eq!(listed, kernel, "names of {parent:?}");
    }
}

/// What the kernel opens below the tree (following links, `..` after them) is what an exact
/// open of the resolution opens.
fn check_resolution(tree: &Tree, rel: &[u8], abs: &Path) {
    for follow in [true, false] {
        let resolved = resolve(abs, follow);
        assert!(
            resolved.has_root()
                && resolved
                    .components()
                    .all(|c| matches!(c, Component::RootDir | Component::Normal(_))),
            "resolve({abs:?}, {follow}) = {resolved:?}"
        );
        if !follow && !ends_in_name(rel) {
            // A trailing `/` or `.` makes the kernel follow the last name; `Path` drops
            // both, so `resolve` cannot see them (resolve.rs says so).
            continue;
        }
        let flags = if follow {
            OFlags::PATH
        } else {
            OFlags::PATH | OFlags::NOFOLLOW
        };
        let Ok(kernel) = tree.beneath(rel, flags, ResolveFlags::empty()) else {
            continue;
        };
        let is_link = fd_kind(kernel.as_fd()).is_some_and(|t| t.is_symlink());
        let wanted = identity(Ok(kernel));
        let found = if is_link {
            Directory::open_parent(&resolved)
                .and_then(|(parent, name)| parent.handle(&name))
                .map(OwnedFd::from)
        } else {
            anchored::open_exact(&resolved, OFlags::PATH, Mode::empty())
        };
        assert_eq!(
            identity(found),
            wanted,
            "resolve({abs:?}, {follow}) = {resolved:?}"
        );
    }
}

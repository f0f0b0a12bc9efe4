use std::os::fd::AsRawFd;
use std::os::unix::fs::symlink;

use proptest::prelude::*;

use super::*;
use crate::policy::resolve;

fn real_temp_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    (dir, root)
}

/// A way of opening a path exactly.
type Opener = fn(&Path, OFlags) -> io::Result<OwnedFd>;

/// Both ways of opening exactly, so the fallback is tested on kernels that have `openat2`.
fn openers() -> Vec<(&'static str, Opener)> {
    fn walk(path: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        open_by_walk(&plain_names(path)?, flags | OFlags::CLOEXEC, Mode::empty())
    }
    fn exact(path: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        open_exact(path, flags, Mode::empty())
    }
    vec![("open_exact", exact), ("open_by_walk", walk)]
}

/// Where the kernel says an open descriptor really is.
fn location(fd: &OwnedFd) -> PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap()
}

#[test]
fn links_anywhere_in_the_path_fail_and_plain_paths_open() {
    let (_dir, t) = real_temp_dir();
    std::fs::create_dir_all(t.join("a/b")).unwrap();
    std::fs::write(t.join("a/b/f"), b"x").unwrap();
    symlink(t.join("a"), t.join("dir-link")).unwrap();
    symlink(t.join("a/b/f"), t.join("file-link")).unwrap();
    for (name, open) in openers() {
        let fd = open(&t.join("a/b/f"), OFlags::RDONLY).unwrap();
        assert_eq!(location(&fd), t.join("a/b/f"), "{name}");
        let fd = open(&t.join("a/b"), OFlags::PATH | OFlags::DIRECTORY).unwrap();
        assert_eq!(location(&fd), t.join("a/b"), "{name}");
        for (path, flags) in [
            (t.join("dir-link/b/f"), OFlags::RDONLY),
            (t.join("file-link"), OFlags::RDONLY),
            (t.join("file-link"), OFlags::PATH),
            // `openat2` handed the link itself out here; found by the `paths` fuzz target.
            (t.join("file-link"), OFlags::PATH | OFlags::NOFOLLOW),
            (t.join("dir-link"), OFlags::PATH | OFlags::NOFOLLOW),
            (t.join("dir-link"), OFlags::PATH | OFlags::DIRECTORY),
        ] {
            let error = open(&path, flags).unwrap_err();
            assert_eq!(error.raw_os_error(), Some(libc::ELOOP), "{name} {path:?}");
        }
        assert_eq!(
            open(&t.join("a/missing"), OFlags::RDONLY)
                .unwrap_err()
                .kind(),
            io::ErrorKind::NotFound,
            "{name}"
        );
        let fd = open(Path::new("/"), OFlags::PATH | OFlags::DIRECTORY).unwrap();
        assert_eq!(location(&fd), Path::new("/"), "{name}");
    }
}

#[test]
fn paths_that_are_not_plain_are_refused() {
    // `.` and a trailing `/` were let through (`Path::components` drops them), so
    // `/t/file/.` opened the file the kernel refuses (`ENOTDIR`) and `/t/link/` named the
    // link the kernel follows; found by the `paths` fuzz target.
    for path in [
        "relative/x",
        "/a/../b",
        "",
        "../x",
        "/a/./b",
        "/a/b/.",
        "/a/b/",
        "/a//b/",
        "./a",
    ] {
        let error = open_exact(Path::new(path), OFlags::PATH, Mode::empty()).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EINVAL), "{path}");
    }
    assert_eq!(plain_names(Path::new("/a//b")).unwrap(), ["a", "b"]);
    assert!(plain_names(Path::new("/")).unwrap().is_empty());
}

#[test]
fn directories_act_on_their_entries_without_following_them() {
    let (_dir, t) = real_temp_dir();
    std::fs::create_dir(t.join("d")).unwrap();
    std::fs::create_dir(t.join("elsewhere")).unwrap();
    symlink(t.join("elsewhere"), t.join("d/link")).unwrap();
    let (parent, name) = Directory::open_parent(&t.join("d/link")).unwrap();
    assert_eq!(name, "link");
    assert_eq!(parent.kind(&name).unwrap(), EntryKind::Symlink);
    assert_eq!(parent.read_link(&name).unwrap(), t.join("elsewhere"));
    assert_eq!(
        parent.directory(&name).unwrap_err().raw_os_error(),
        Some(libc::ELOOP)
    );
    let error = parent
        .open_file(&name, OFlags::RDONLY, Mode::empty())
        .unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::ELOOP));
    assert!(parent
        .handle(&name)
        .unwrap()
        .metadata()
        .unwrap()
        .is_symlink());

    parent.create_directory("sub".as_ref(), 0o755).unwrap();
    parent
        .create_symlink(Path::new("sub"), "sub-link".as_ref())
        .unwrap();
    let mut names: Vec<OsString> = parent.names().unwrap().map(Result::unwrap).collect();
    names.sort();
    assert_eq!(names, ["link", "sub", "sub-link"]);
    parent.remove(&name, false).unwrap();
    parent.remove("sub-link".as_ref(), false).unwrap();
    parent.remove("sub".as_ref(), true).unwrap();
    assert!(t.join("elsewhere").is_dir());
    assert_eq!(parent.names().unwrap().count(), 0);
    assert_eq!(
        Directory::open_parent(Path::new("/"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EISDIR)
    );
}

/// A small random tree below a temp dir: directories, files, and links of every kind
/// (relative, absolute, dangling, looping, with `..` in their targets).
#[derive(Debug, Clone)]
pub(crate) enum Node {
    Dir(String),
    File(String),
    Link(String, String),
}

pub(crate) fn nodes() -> impl Strategy<Value = Vec<Node>> {
    let name = prop::sample::select(vec!["a", "b", "c", "a/b", "b/c", "a/x", "c/a/b"]);
    let target = prop::sample::select(vec![
        "a",
        "../a",
        "b/..",
        "./c",
        "a/b",
        "/",
        "ABS/a",
        "ABS/b/c",
        "missing",
        "self",
        "..",
        "../../..",
        "ABS/a/../c",
        "b/c/..",
    ]);
    let node = prop_oneof![
        name.clone().prop_map(|n| Node::Dir(n.to_owned())),
        name.clone().prop_map(|n| Node::File(n.to_owned())),
        (name, target).prop_map(|(n, t)| Node::Link(n.to_owned(), t.to_owned())),
    ];
    prop::collection::vec(node, 1..12)
}

/// Builds `nodes` below `t` as far as they fit (a name below a file is skipped). A node
/// that an existing link would redirect (a link on the way, or as the name itself for
/// directories and files) is skipped too: the links point anywhere, `/` included, and
/// these tests run as root in CI.
pub(crate) fn build(t: &Path, nodes: &[Node]) {
    for node in nodes {
        let name = match node {
            Node::Dir(name) | Node::File(name) => name.as_str(),
            Node::Link(name, _) => name.rsplit_once('/').map_or("", |(parent, _)| parent),
        };
        if through_a_link(t, name) {
            continue;
        }
        let _ = match node {
            Node::Dir(name) => std::fs::create_dir_all(t.join(name)),
            Node::File(name) => std::fs::write(t.join(name), name),
            Node::Link(name, target) => {
                let target = match target.as_str() {
                    "self" => PathBuf::from(name.rsplit('/').next().unwrap()),
                    other => match other.strip_prefix("ABS/") {
                        Some(rest) => t.join(rest),
                        None => PathBuf::from(other),
                    },
                };
                symlink(target, t.join(name))
            }
        };
    }
}

/// Whether `t/name` or one of its ancestors below `t` is a symbolic link.
fn through_a_link(t: &Path, name: &str) -> bool {
    let mut at = t.to_path_buf();
    name.split('/').filter(|n| !n.is_empty()).any(|n| {
        at.push(n);
        std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink())
    })
}

pub(crate) fn probes() -> impl Strategy<Value = Vec<String>> {
    let component = prop::sample::select(vec!["a", "b", "c", "x", "..", ".", "", "missing"]);
    prop::collection::vec(prop::collection::vec(component, 0..6), 1..8)
        .prop_map(|paths| paths.into_iter().map(|c| c.join("/")).collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever path is asked for, the exact open either fails or yields a descriptor whose
    /// real location is the path that was checked: the resolution it opened.
    #[test]
    fn an_exact_open_is_where_the_check_was(nodes in nodes(), probes in probes()) {
        let (_dir, t) = real_temp_dir();
        build(&t, &nodes);
        for probe in probes {
            let path = t.join(&probe);
            for follow_last in [true, false] {
                let checked = resolve(&path, follow_last);
                for (name, open) in openers() {
                    match open(&checked, OFlags::PATH) {
                        Ok(fd) => {
                            prop_assert_eq!(location(&fd), checked.clone(), "{} {}", name, probe)
                        }
                        // What exists without a link on the way opens.
                        Err(e) => prop_assert!(
                            !follow_last || std::fs::canonicalize(&path).is_err(),
                            "{} {}: {}", name, probe, e
                        ),
                    }
                }
            }
        }
    }
}

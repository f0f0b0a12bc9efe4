use std::path::PathBuf;

use exec_server_proto::error::code;

use super::*;
use crate::policy::{GlobPattern, Network, DEFAULT_GLOB_SCAN_MAX_DEPTH};

fn paths(list: &[&str]) -> Vec<PathBuf> {
    list.iter().map(PathBuf::from).collect()
}

fn policy(
    readable: Readable,
    writable: &[&str],
    read_only: &[&str],
    denied: &[&str],
) -> SandboxPolicy {
    SandboxPolicy {
        readable,
        writable: paths(writable),
        read_only: paths(read_only),
        denied_paths: paths(denied),
        denied_globs: Vec::new(),
        network: Network::Restricted,
        full_disk_write: false,
        glob_scan_max_depth: DEFAULT_GLOB_SCAN_MAX_DEPTH,
    }
}

fn can(policy: &SandboxPolicy, path: &str, access: AccessKind) -> bool {
    policy.allows(Path::new(path), access)
}

#[test]
fn denial_messages() {
    let p = policy(Readable::Roots(paths(&["/srv"])), &[], &[], &[]);
    let read = p.check_read(Path::new("/etc/passwd")).unwrap_err();
    assert_eq!(read.code, code::INVALID_REQUEST);
    assert!(read.is_sandbox_denied());
    assert_eq!(
        read.message,
        "read access to /etc/passwd is not permitted by the filesystem sandbox"
    );
    let write = p.check_write(Path::new("/srv/x")).unwrap_err();
    assert!(write.is_sandbox_denied());
    assert_eq!(
        write.message,
        "write access to /srv/x is not permitted by the filesystem sandbox"
    );
    assert_eq!(p.check_read(Path::new("/srv/x")), Ok(()));
}

#[test]
fn longest_matching_prefix_decides() {
    let p = policy(
        Readable::Roots(paths(&["/a", "/a/b/c"])),
        &["/a/b"],
        &[],
        &["/a/b/d"],
    );
    assert!(can(&p, "/a/x", AccessKind::Read));
    assert!(!can(&p, "/a/x", AccessKind::Write));
    assert!(can(&p, "/a/b/x", AccessKind::Write));
    // A read root below a writable root narrows it to reads.
    assert!(can(&p, "/a/b/c/x", AccessKind::Read));
    assert!(!can(&p, "/a/b/c/x", AccessKind::Write));
    assert!(!can(&p, "/a/b/d", AccessKind::Read));
    assert!(!can(&p, "/a/b/d/e", AccessKind::Read));
    // Component-wise prefixes only: `/a/bc` is not below `/a/b`.
    assert!(!can(&p, "/a/bc", AccessKind::Write));
    // Nothing applies outside the roots.
    assert!(!can(&p, "/z", AccessKind::Read));
}

#[test]
fn equal_paths_conflict_as_deny_write_read() {
    let deny_write = policy(Readable::All, &["/a"], &[], &["/a"]);
    assert!(!can(&deny_write, "/a/x", AccessKind::Read));
    let write_read = policy(Readable::Roots(paths(&["/a"])), &["/a"], &["/a"], &[]);
    assert!(can(&write_read, "/a/x", AccessKind::Write));
    // A deny below a broader write wins below it only.
    let nested = policy(Readable::All, &["/"], &[], &["/a"]);
    assert!(can(&nested, "/b", AccessKind::Write));
    assert!(!can(&nested, "/a", AccessKind::Read));
}

#[test]
fn write_implies_read() {
    let p = policy(Readable::Roots(Vec::new()), &["/w"], &[], &[]);
    assert!(can(&p, "/w/f", AccessKind::Read));
    assert!(can(&p, "/w", AccessKind::Write));
}

#[test]
fn deny_globs_beat_every_path_rule() {
    let mut p = policy(Readable::All, &["/srv/repo"], &[], &[]);
    p.denied_globs = vec![GlobPattern::new("/srv/repo/**/*.pem").unwrap()];
    assert!(!can(&p, "/srv/repo/a/key.pem", AccessKind::Read));
    assert!(!can(&p, "/srv/repo/key.pem/inner", AccessKind::Read));
    assert!(can(&p, "/srv/repo/a/key.txt", AccessKind::Write));
}

#[test]
fn other_processes_are_hidden() {
    let p = policy(Readable::All, &[], &[], &[]);
    let own = format!("/proc/{}/status", std::process::id());
    assert!(can(&p, &own, AccessKind::Read));
    let other = if std::process::id() == 1 {
        "/proc/2"
    } else {
        "/proc/1/environ"
    };
    assert!(!can(&p, other, AccessKind::Read));
    assert!(!can(&p, "/proc/99999999999/x", AccessKind::Read));
    assert!(can(&p, "/proc/self", AccessKind::Read));
    assert!(can(&p, "/proc/meminfo", AccessKind::Read));
    assert!(can(&p, "/srv/proc/1", AccessKind::Read));
}

#[test]
fn carve_outs_are_read_only() {
    let p = policy(Readable::All, &["/r"], &["/r/.git"], &[]);
    assert!(can(&p, "/r/.git/config", AccessKind::Read));
    assert!(!can(&p, "/r/.git/config", AccessKind::Write));
    assert!(!can(&p, "/r/.git", AccessKind::Write));
    assert!(can(&p, "/r/src", AccessKind::Write));
}

#[test]
fn tree_writes_refuse_protected_descendants() {
    let p = policy(Readable::All, &["/r"], &["/r/a/.git"], &["/r/b/secret"]);
    assert!(p.check_write_tree(Path::new("/r/c")).is_ok());
    for tree in ["/r/a", "/r/b", "/r"] {
        let error = p.check_write_tree(Path::new(tree)).unwrap_err();
        assert_eq!(
            error.message,
            format!("write access to {tree} is not permitted by the filesystem sandbox")
        );
        assert!(error.is_sandbox_denied());
    }
}

//! Mount narrowing for sandboxed processes (SANDBOX.md §8.4): Landlock cannot take rights
//! away below a granted directory (§5.5), so the launcher enforces carve-outs and deny
//! entries in a private mount namespace, before Landlock forbids mount changes.
//!
//! Read-only carve-outs become read-only bind mounts (writes fail with `EROFS`); denied
//! directories are covered by an empty read-only `tmpfs`, denied files by `/dev/null`.
//! The launcher's other mounts live here too: private propagation for its own mount
//! namespace, and the fresh `/proc` of its PID namespace.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::policy::{Enforcement, Readable, SandboxPolicy};

/// How processes get carve-outs and deny entries (§8.4): `sandbox.process_narrowing`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProcessNarrowing {
    #[default]
    MountNamespace,
    Skip,
}

/// Most deny-glob matches narrowing covers.
const MAX_GLOB_MATCHES: usize = 8192;

/// What narrowing did, as reported by the launcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NarrowingOutcome {
    Applied,
    NotNeeded,
    Skipped,
}

/// Narrowing was needed but impossible in `require` mode.
#[derive(Debug)]
pub struct NarrowingFailed(pub String);

/// What to mount, computed before any namespace exists.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Directories between a writable root and a carve-out below it (the roots included),
    /// shallowest first: each is bind-mounted onto itself, and a mount point cannot be
    /// renamed or removed. Otherwise renaming one away and making the path again would
    /// give the process a fresh, unprotected `.git` where the carve-out was.
    pub pinned: Vec<PathBuf>,
    /// Existing carve-outs, shallowest first.
    pub read_only: Vec<PathBuf>,
    /// Writable roots inside a carve-out, re-opened after it.
    pub reopen: Vec<PathBuf>,
    /// Existing denied paths inside a readable area, shallowest first.
    pub denied: Vec<PathBuf>,
}

impl Plan {
    fn is_empty(&self) -> bool {
        self.read_only.is_empty() && self.denied.is_empty()
    }
}

pub(crate) fn plan(policy: &SandboxPolicy) -> Result<Plan, NarrowingFailed> {
    let exists = |p: &PathBuf| std::fs::symlink_metadata(p).is_ok();
    let mut read_only: Vec<PathBuf> = policy
        .read_only
        .iter()
        .filter(|p| exists(p))
        .cloned()
        .collect();
    sort_shallowest_first(&mut read_only);
    let reopen = policy
        .writable
        .iter()
        .filter(|w| read_only.iter().any(|r| *w != r && w.starts_with(r)))
        .cloned()
        .collect();
    let readable = |p: &Path| match &policy.readable {
        Readable::All => true,
        Readable::Roots(roots) => roots.iter().any(|r| p.starts_with(r)),
    } || policy.writable.iter().any(|w| p.starts_with(w));
    let mut denied: Vec<PathBuf> = policy
        .denied_paths
        .iter()
        .filter(|p| exists(p) && readable(p))
        .cloned()
        .collect();
    for glob in &policy.denied_globs {
        let matches = expand_glob(glob, policy.glob_scan_max_depth)?;
        denied.extend(matches.into_iter().filter(|p| readable(p)));
    }
    sort_shallowest_first(&mut denied);
    denied.dedup();
    Ok(Plan {
        pinned: pinned(&read_only, &policy.writable),
        read_only,
        reopen,
        denied,
    })
}

/// Every directory from a writable root down to the parent of a carve-out below it.
fn pinned(carve_outs: &[PathBuf], writable: &[PathBuf]) -> Vec<PathBuf> {
    let mut pinned: Vec<PathBuf> = carve_outs
        .iter()
        .flat_map(|carve_out| carve_out.ancestors().skip(1))
        .filter(|dir| writable.iter().any(|w| dir.starts_with(w)))
        .map(Path::to_path_buf)
        .collect();
    sort_shallowest_first(&mut pinned);
    pinned.dedup();
    pinned
}

fn sort_shallowest_first(paths: &mut [PathBuf]) {
    paths.sort_by_key(|p| (p.components().count(), p.clone()));
}

/// Existing paths matching `glob`, scanning below its literal prefix.
fn expand_glob(
    glob: &crate::policy::GlobPattern,
    max_depth: u32,
) -> Result<Vec<PathBuf>, NarrowingFailed> {
    let pattern = glob.as_str();
    let mut matches = Vec::new();
    // The prefix is the exact host path (non-UTF-8 names included), never its text.
    let mut stack = vec![(glob.prefix().to_path_buf(), 0u32)];
    while let Some((dir, depth)) = stack.pop() {
        if glob.matches_or_beneath(&dir) && std::fs::symlink_metadata(&dir).is_ok() {
            matches.push(dir);
            if matches.len() > MAX_GLOB_MATCHES {
                return Err(NarrowingFailed(format!(
                    "deny glob {pattern} matches more than {MAX_GLOB_MATCHES} paths"
                )));
            }
            continue;
        }
        if depth >= max_depth {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            let path = entry.path();
            if is_dir {
                stack.push((path, depth + 1));
            } else if glob.matches_or_beneath(&path) {
                matches.push(path);
            }
        }
    }
    Ok(matches)
}

/// Whether the caller already has a mount namespace of its own, with `/` recursively
/// private (the launcher enters one together with its other namespaces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountNamespace {
    OwnAndPrivate,
    /// Still the server's: narrowing enters one first.
    Shared,
}

/// Applies narrowing for `policy` (§8.3 step 3). In `best-effort` mode an impossible
/// namespace is reported as skipped.
pub fn apply(
    policy: &SandboxPolicy,
    mode: ProcessNarrowing,
    enforcement: Enforcement,
    namespace: MountNamespace,
) -> Result<NarrowingOutcome, NarrowingFailed> {
    if mode == ProcessNarrowing::Skip {
        return Ok(NarrowingOutcome::Skipped);
    }
    let plan = match plan(policy) {
        Ok(plan) => plan,
        Err(e) if enforcement == Enforcement::BestEffort => {
            let _ = e;
            return Ok(NarrowingOutcome::Skipped);
        }
        Err(e) => return Err(e),
    };
    if plan.is_empty() {
        return Ok(NarrowingOutcome::NotNeeded);
    }
    match mount_plan(&plan, namespace) {
        Ok(()) => Ok(NarrowingOutcome::Applied),
        Err(_) if enforcement == Enforcement::BestEffort => Ok(NarrowingOutcome::Skipped),
        Err(e) => Err(NarrowingFailed(e.to_string())),
    }
}

fn mount_plan(plan: &Plan, namespace: MountNamespace) -> io::Result<()> {
    // A mount on `/` itself would not move the process's root, which was taken before it:
    // absolute paths would still walk the unnarrowed tree.
    let on_root = |p: &PathBuf| p.parent().is_none();
    if plan.read_only.iter().chain(&plan.denied).any(on_root) {
        return Err(io::Error::other(
            "the root directory itself cannot be narrowed",
        ));
    }
    if namespace == MountNamespace::Shared {
        enter_namespace()?;
        make_root_private()?;
    }
    for path in &plan.pinned {
        bind(path, path)?;
    }
    for path in &plan.read_only {
        if is_link(path) {
            // The link's own name first: `bind` below follows it to its target.
            pin_link(path)?;
            if std::fs::metadata(path).is_err() {
                continue;
            }
        }
        bind(path, path)?;
        remount(path, true)?;
    }
    for path in &plan.reopen {
        bind(path, path)?;
        remount(path, false)?;
    }
    for path in &plan.denied {
        if std::fs::symlink_metadata(path)?.is_dir() {
            mount(
                Some(Path::new("tmpfs")),
                path,
                Some("tmpfs"),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                Some("size=0,mode=000"),
            )?;
        } else {
            bind(Path::new("/dev/null"), path)?;
            remount(path, true)?;
        }
    }
    Ok(())
}

fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Pins a symbolic link itself: a bind of the link onto its own name, made with the new
/// mount API, which does not follow a trailing link where `mount(2)` would. A mount point
/// can be neither removed nor renamed, so a process cannot put a directory of its own in
/// the link's place, and the link still points where it did.
fn pin_link(path: &Path) -> io::Result<()> {
    use rustix::fs::CWD;
    use rustix::mount::{move_mount, open_tree, MoveMountFlags, OpenTreeFlags};
    let flags = OpenTreeFlags::OPEN_TREE_CLONE
        | OpenTreeFlags::OPEN_TREE_CLOEXEC
        | OpenTreeFlags::AT_SYMLINK_NOFOLLOW;
    let link = open_tree(CWD, path, flags)?;
    move_mount(
        &link,
        "",
        CWD,
        path,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )?;
    Ok(())
}

/// A mount namespace of our own: directly with `CAP_SYS_ADMIN`, else inside a new user
/// namespace that maps our ids to themselves.
fn enter_namespace() -> io::Result<()> {
    // SAFETY: unshare takes flags only and affects this (single-threaded) process.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } == 0 {
        return Ok(());
    }
    // SAFETY: as above.
    let uid = unsafe { libc::getuid() };
    // SAFETY: as above.
    let gid = unsafe { libc::getgid() };
    // SAFETY: as above.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    std::fs::write("/proc/self/setgroups", "deny")?;
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    Ok(())
}

/// Set once this process has a `/dev` (and so a `/dev/shm`) of its own.
static PRIVATE_DEV: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The host devices a sandboxed process keeps: what programs open by name.
const KEPT_DEVICES: [&str; 7] = ["null", "zero", "full", "random", "urandom", "tty", "ptmx"];

/// Replaces `/dev` (in the launcher's own mount namespace) with a `tmpfs` holding only the
/// harmless devices, the process's own terminal under `pts/`, an empty `tmpfs` on `shm/`
/// and the usual links. New pseudo-terminals cannot be made inside (`ptmx` needs a `devpts`
/// beside it, and a fresh one would not hold the process's own terminal, which `tty` must
/// name, SANDBOX.md §10.6 P8). Under "read everything" Landlock would otherwise let the process open whatever
/// the host's `/dev` holds that its user may open: other sessions' terminals (reading one
/// steals its input), a root server's raw disks and consoles, the host's shared memory.
pub fn mount_minimal_dev() -> io::Result<()> {
    // The host's nodes are reached through descriptors once the new `/dev` covers them.
    let kept: Vec<(&str, std::fs::File)> = KEPT_DEVICES
        .iter()
        .filter_map(|name| Some((*name, open_path(&Path::new("/dev").join(name)).ok()?)))
        .collect();
    // By its path in this mount namespace: a bind mount's source must be a mount of the
    // caller's namespace, and standard input was opened in the server's.
    let own_terminal = own_terminal_name().and_then(|name| {
        let node = open_path(&Path::new("/dev/pts").join(&name)).ok()?;
        Some((name, node))
    });
    mount(
        Some(Path::new("tmpfs")),
        Path::new("/dev"),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=755,size=64k"),
    )?;
    for (name, file) in &kept {
        bind_node(&Path::new("/dev").join(name), &fd_path(file))?;
    }
    std::fs::create_dir(Path::new("/dev/pts"))?;
    if let Some((name, node)) = &own_terminal {
        // Where `ttyname` looks for the terminal on standard input.
        bind_node(&Path::new("/dev/pts").join(name), &fd_path(node))?;
    }
    // A `tmpfs` of its own, not a directory of the small `/dev` one: shared memory users
    // (browsers, data loaders) need room.
    std::fs::create_dir(Path::new("/dev/shm"))?;
    mount(
        Some(Path::new("tmpfs")),
        Path::new("/dev/shm"),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777"),
    )?;
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, Path::new("/dev").join(link))?;
    }
    PRIVATE_DEV.store(true, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

/// Whether [`mount_minimal_dev`] succeeded in this process: its `/dev/shm` is its own.
pub fn has_private_shm() -> bool {
    PRIVATE_DEV.load(std::sync::atomic::Ordering::SeqCst)
}

/// The name under `/dev/pts` of the terminal on standard input, if it is one.
pub fn own_terminal_name() -> Option<std::ffi::OsString> {
    let path = std::fs::read_link("/proc/self/fd/0").ok()?;
    let name = path.strip_prefix("/dev/pts/").ok()?;
    let digits = name
        .to_str()
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    digits.then(|| name.as_os_str().to_owned())
}

fn open_path(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(path)
}

fn fd_path(file: &std::fs::File) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// An empty file at `target`, with the node behind `source` bind-mounted on it.
fn bind_node(target: &Path, source: &Path) -> io::Result<()> {
    std::fs::File::create(target)?;
    mount(Some(source), target, None, libc::MS_BIND, None)
}

/// Makes every mount below `/` private, so that what this namespace mounts never
/// propagates to the server's.
pub fn make_root_private() -> io::Result<()> {
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
}

/// Mounts a fresh `proc` on `/proc` (no set-user-ID, devices or execution), showing the
/// caller's PID namespace instead of the server's.
pub fn mount_fresh_proc() -> io::Result<()> {
    mount(
        Some(Path::new("proc")),
        Path::new("/proc"),
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
}

fn bind(source: &Path, target: &Path) -> io::Result<()> {
    mount(
        Some(source),
        target,
        None,
        libc::MS_BIND | libc::MS_REC,
        None,
    )
}

/// Remounts a bind mount read-only (or read-write), keeping the flags a user namespace
/// refuses to drop.
fn remount(target: &Path, read_only: bool) -> io::Result<()> {
    let mut flags = libc::MS_BIND | libc::MS_REMOUNT | preserved_flags(target)?;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    mount(None, target, None, flags, None)
}

fn preserved_flags(path: &Path) -> io::Result<libc::c_ulong> {
    let c_path = c_path(path)?;
    // SAFETY: statvfs fills the zeroed struct for a valid C path.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let pairs = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ];
    Ok(pairs
        .iter()
        .filter(|(st, _)| stat.f_flag & *st != 0)
        .fold(0, |acc, (_, ms)| acc | ms))
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = source.map(c_path).transpose()?;
    let target = c_path(target)?;
    let fstype = fstype.map(|f| CString::new(f).expect("no NUL in a file system type"));
    let data = data.map(|d| CString::new(d).expect("no NUL in mount options"));
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is null or a valid C string that outlives the call.
    let rc = unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Network;

    #[test]
    fn plan_keeps_existing_paths_shallowest_first() {
        let dir = tempfile::tempdir().unwrap();
        let t = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(t.join("w/.git/sub")).unwrap();
        std::fs::create_dir_all(t.join("w/secret")).unwrap();
        std::fs::write(t.join("w/key.pem"), "k").unwrap();
        let policy = SandboxPolicy {
            readable: Readable::All,
            writable: vec![t.join("w"), t.join("w/.git/sub")],
            read_only: vec![t.join("w/.git"), t.join("w/.codex")],
            denied_paths: vec![t.join("w/secret"), t.join("w/missing")],
            denied_globs: vec![crate::policy::GlobPattern::new(&format!(
                "{}/**/*.pem",
                t.display()
            ))
            .unwrap()],
            network: Network::Restricted,
            full_disk_write: false,
            glob_scan_max_depth: 16,
        };
        let plan = plan(&policy).unwrap();
        assert_eq!(plan.read_only, vec![t.join("w/.git")]);
        assert_eq!(plan.pinned, vec![t.join("w")]);
        assert_eq!(plan.reopen, vec![t.join("w/.git/sub")]);
        assert_eq!(plan.denied, vec![t.join("w/key.pem"), t.join("w/secret")]);
    }
}

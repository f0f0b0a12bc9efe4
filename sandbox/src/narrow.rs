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
        read_only,
        reopen,
        denied,
    })
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
    let mut base = PathBuf::from("/");
    for component in pattern.split('/').filter(|c| !c.is_empty()) {
        if crate::policy::glob_has_meta(component) {
            break;
        }
        base.push(component);
    }
    let mut matches = Vec::new();
    let mut stack = vec![(base, 0u32)];
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
    if namespace == MountNamespace::Shared {
        enter_namespace()?;
        make_root_private()?;
    }
    for path in &plan.read_only {
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
        assert_eq!(plan.reopen, vec![t.join("w/.git/sub")]);
        assert_eq!(plan.denied, vec![t.join("w/key.pem"), t.join("w/secret")]);
    }
}

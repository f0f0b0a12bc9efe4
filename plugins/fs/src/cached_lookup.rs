//! `fs/getMetadata` answered on the calling thread when the kernel can answer it from its
//! caches, without a hand-off to the fs worker threads.
//!
//! The worker threads exist because a path lookup or a `stat` can wait indefinitely (a
//! dead network mount, a FUSE daemon that hangs). Two kernel features let us ask only
//! questions that cannot wait:
//!
//! * `openat2(O_PATH, RESOLVE_CACHED)` resolves the path from the dentry cache alone and
//!   fails with `EAGAIN` where any step would have to ask the file system (an uncached
//!   name, a network file system's revalidation). An `O_PATH` open never calls the file
//!   system's `open`;
//! * `statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC)` on that descriptor asks the
//!   inode we hold, and reports the mount it is on by its unique id (Linux 6.8+), which
//!   is never reused while the system runs.
//!
//! The answer is used only when that mount's file system keeps its attributes in memory:
//! its superblock magic is in [`LOCAL_MAGICS`]. A mount is judged once, by `statmount(2)`
//! on a worker thread in the asking session's share ([`judge_mount`]): `statmount` reads
//! the mount table, whose lock is system-wide and may be held for long by anyone changing
//! mounts, so it never runs on the caller's thread; until its mount is judged a path is
//! answered by the workers. Overlayfs is not on the list: it passes `AT_STATX_DONT_SYNC`
//! to its layers, and a FUSE or network lower layer then answers with stale or
//! placeholder attributes.
//!
//! The work a lookup may do here is bounded too: the path has at most [`MAX_PATH_BYTES`]
//! and no symbolic link is followed (`RESOLVE_NO_SYMLINKS`), so a path through links, or
//! a final link to follow, goes to the workers.
//!
//! Anything else (an error, a name not in the cache, another file system, an older
//! kernel) is answered by the worker threads as before, with every guarantee they give:
//! so a stuck mount still stalls only the requests that touch it.
//!
//! Closing the `O_PATH` descriptor can do work too: when it holds the last reference to a
//! file already unlinked, the close frees its blocks; to a mount detached meanwhile, it
//! tears down the whole file system; on another file system it may ask that file system.
//! So no descriptor opened here is closed on the caller's thread: each goes to the closer
//! thread ([`close_later`]), which closes what it was given in batches, [`CLOSE_DELAY`]
//! after the first, waking once per batch.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

use exec_server_core::metrics::{self, Counter};
use exec_server_core::proto::fs::Metadata;
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Statx, StatxFlags, CWD};

use crate::describe::describe_statx;

/// `STATX_MNT_ID_UNIQUE` (Linux 6.8): `stx_mnt_id` is the mount's unique 64-bit id.
const STATX_MNT_ID_UNIQUE: u32 = 0x4000;

/// Superblock magics of file systems whose lookups and attributes, once cached, are
/// answered from memory: ext2/3/4, XFS, Btrfs, tmpfs, ramfs and F2FS.
const LOCAL_MAGICS: [u64; 6] = [
    0xEF53,      // ext2, ext3, ext4
    0x5846_5342, // XFS
    0x9123_683E, // Btrfs
    0x0102_1994, // tmpfs
    0x8584_58F6, // ramfs
    0xF2F5_2010, // F2FS
];

/// The longest path looked up here: with no links followed, the walk is at most this
/// many bytes of names.
const MAX_PATH_BYTES: usize = 1024;

/// How long the closer thread lets descriptors gather before it closes them: short, as a
/// descriptor held keeps its file system busy (an `umount` meanwhile fails with `EBUSY`).
const CLOSE_DELAY: Duration = Duration::from_millis(1);

/// Descriptors waiting for the closer thread at most; beyond (some 64,000 lookups a
/// second), they are closed where they were opened. They are not charged to the
/// descriptor budget: this is within `descriptors.reserve`.
const MAX_WAITING_CLOSES: usize = 64;

/// Whether the kernel has what this needs (cache-only lookups, 5.12; unique mount ids,
/// 6.8), found once by looking up `/`: without it every lookup goes straight to the
/// workers, without the system calls that cannot help.
fn supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let flags = OFlags::PATH | OFlags::CLOEXEC | OFlags::DIRECTORY;
        let Ok(root) = rustix::fs::openat2(CWD, "/", flags, Mode::empty(), ResolveFlags::CACHED)
        else {
            return false;
        };
        let unique = StatxFlags::from_bits_retain(STATX_MNT_ID_UNIQUE);
        rustix::fs::statx(
            &root,
            "",
            AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC,
            unique,
        )
        .is_ok_and(|stat| stat.stx_mask & STATX_MNT_ID_UNIQUE != 0)
    })
}

/// Mounts judged so far, by unique id; bounded, as mounts come and go.
const MAX_KNOWN_MOUNTS: usize = 4096;

/// What the cache could say about a path.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    Answer(Metadata),
    /// Ask the worker threads; with the unique id of a mount not judged yet, which the
    /// worker should judge ([`judge_mount`]).
    Ask(Option<u64>),
}

/// The metadata of `path` (following a final symbolic link when `follow`) if the kernel
/// has it cached on a judged mount of a file system in [`LOCAL_MAGICS`].
pub(crate) fn metadata(path: &Path, follow: bool) -> Lookup {
    let own = match cached_stat(path) {
        Ok(stat) => stat,
        Err(unjudged) => return Lookup::Ask(unjudged),
    };
    let is_symlink = own.stx_mode & 0o170_000 == 0o120_000;
    if follow && is_symlink {
        // Following it is a link walk, which is left to the workers.
        return Lookup::Ask(None);
    }
    answered().inc();
    Lookup::Answer(describe_statx(is_symlink, &own))
}

/// `statx` of `path` (not following a final link) through a cache-only lookup, when its
/// mount is judged local; else the mount id still to judge, if that is why.
fn cached_stat(path: &Path) -> Result<Statx, Option<u64>> {
    if path.as_os_str().len() > MAX_PATH_BYTES {
        return Err(None);
    }
    let flags = OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    if !supported() {
        return Err(None);
    }
    let resolve = ResolveFlags::CACHED | ResolveFlags::NO_SYMLINKS;
    let fd: OwnedFd =
        rustix::fs::openat2(CWD, path, flags, Mode::empty(), resolve).map_err(|_| None)?;
    let wanted = StatxFlags::BASIC_STATS
        | StatxFlags::BTIME
        | StatxFlags::from_bits_retain(STATX_MNT_ID_UNIQUE);
    let flags = AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC;
    let stat = rustix::fs::statx(fd.as_fd(), "", flags, wanted);
    close_later(fd);
    let Ok(stat) = stat else {
        return Err(None);
    };
    let verdict = if stat.stx_mask & STATX_MNT_ID_UNIQUE == 0 {
        Some(false)
    } else {
        known_mount(stat.stx_mnt_id)
    };
    match verdict {
        Some(true) => Ok(stat),
        Some(false) => Err(None),
        None => Err(Some(stat.stx_mnt_id)),
    }
}

/// Descriptors handed to the closer thread, and how it is woken for the first of a batch.
#[derive(Default)]
struct Closes {
    waiting: Mutex<Vec<OwnedFd>>,
    first: Condvar,
}

/// Closes `fd` on the closer thread, within [`CLOSE_DELAY`] or so. Only when that thread
/// could not be started, or [`MAX_WAITING_CLOSES`] already wait, is it closed here.
fn close_later(fd: OwnedFd) {
    #[cfg(test)]
    CLOSED_LATER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    static CLOSER: OnceLock<Option<&'static Closes>> = OnceLock::new();
    let closer = CLOSER.get_or_init(|| {
        let closes: &'static Closes = Box::leak(Box::default());
        std::thread::Builder::new()
            .name("exec-fs-closer".into())
            .spawn(move || closer_main(closes))
            .ok()
            .map(|_| closes)
    });
    let Some(closes) = closer else {
        return;
    };
    let mut waiting = closes.waiting.lock().unwrap_or_else(|e| e.into_inner());
    if waiting.len() >= MAX_WAITING_CLOSES {
        return;
    }
    waiting.push(fd);
    let first = waiting.len() == 1;
    drop(waiting);
    if first {
        closes.first.notify_one();
    }
}

/// The closer thread: sleeps until a descriptor comes, lets others gather for
/// [`CLOSE_DELAY`], closes them all.
fn closer_main(closes: &Closes) {
    loop {
        let mut waiting = closes.waiting.lock().unwrap_or_else(|e| e.into_inner());
        while waiting.is_empty() {
            waiting = closes
                .first
                .wait(waiting)
                .unwrap_or_else(|e| e.into_inner());
        }
        drop(waiting);
        std::thread::sleep(CLOSE_DELAY);
        let batch = std::mem::take(&mut *closes.waiting.lock().unwrap_or_else(|e| e.into_inner()));
        drop(batch);
    }
}

/// Descriptors given to [`close_later`], for the tests.
#[cfg(test)]
static CLOSED_LATER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[cfg(test)]
fn closed_later() -> usize {
    CLOSED_LATER.load(std::sync::atomic::Ordering::SeqCst)
}

/// Mounts judged so far, by unique id: whether each holds a file system in
/// [`LOCAL_MAGICS`].
fn known_mounts() -> &'static Mutex<HashMap<u64, bool>> {
    static KNOWN: OnceLock<Mutex<HashMap<u64, bool>>> = OnceLock::new();
    KNOWN.get_or_init(Mutex::default)
}

/// The verdict on the mount with unique id `mount`; `None` until it is judged.
fn known_mount(mount: u64) -> Option<bool> {
    let known = known_mounts().lock().unwrap_or_else(|e| e.into_inner());
    known.get(&mount).copied()
}

/// Judges the mount with unique id `mount` by its superblock magic. Blocking: run it on a
/// worker thread, never on the runtime's (see the module text).
pub(crate) fn judge_mount(mount: u64) {
    if known_mount(mount).is_some() {
        return;
    }
    let local = superblock_magic(mount).is_some_and(|magic| LOCAL_MAGICS.contains(&magic));
    let mut known = known_mounts().lock().unwrap_or_else(|e| e.into_inner());
    if known.len() >= MAX_KNOWN_MOUNTS {
        // Mounts come and go; the ones still used are judged again on their next lookup.
        known.clear();
    }
    known.insert(mount, local);
}

/// The superblock magic of the mount with unique id `mount`, by `statmount(2)`.
fn superblock_magic(mount: u64) -> Option<u64> {
    /// `struct mnt_id_req`, version 0.
    #[repr(C)]
    struct Request {
        size: u32,
        spare: u32,
        mnt_id: u64,
        param: u64,
    }
    /// The head of `struct statmount` up to `sb_magic`, with room for what follows.
    #[repr(C, align(8))]
    struct Answer {
        size: u32,
        mnt_opts: u32,
        mask: u64,
        sb_dev_major: u32,
        sb_dev_minor: u32,
        sb_magic: u64,
        rest: [u8; 512],
    }
    const SYS_STATMOUNT: libc::c_long = 457;
    const STATMOUNT_SB_BASIC: u64 = 0x1;
    let request = Request {
        size: std::mem::size_of::<Request>() as u32,
        spare: 0,
        mnt_id: mount,
        param: STATMOUNT_SB_BASIC,
    };
    let mut answer = std::mem::MaybeUninit::<Answer>::zeroed();
    // SAFETY: `request` is a valid version-0 `mnt_id_req`; the kernel writes at most
    // `size_of::<Answer>()` bytes into `answer`, which is zeroed and that large. rustix
    // has no `statmount` yet.
    let done = unsafe {
        libc::syscall(
            SYS_STATMOUNT,
            &request as *const Request,
            answer.as_mut_ptr(),
            std::mem::size_of::<Answer>(),
            0,
        )
    };
    if done != 0 {
        return None;
    }
    // SAFETY: zero-initialised plain integers, partly written by the kernel.
    let answer = unsafe { answer.assume_init() };
    (answer.mask & STATMOUNT_SB_BASIC != 0).then_some(answer.sb_magic)
}

/// Requests answered here rather than by the worker threads.
fn answered() -> &'static Counter {
    static ANSWERED: OnceLock<Counter> = OnceLock::new();
    ANSWERED.get_or_init(|| {
        metrics::counter(
            "exec_server_fs_cached_answers_total",
            "fs/getMetadata requests answered from the kernel's caches on the connection's thread, without a worker thread.",
            &[],
        )
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Held by tests that forget mounts, and by [`answer`]: the table is process-wide.
    static MOUNT_TABLE: Mutex<()> = Mutex::new(());

    fn hold_mount_table() -> std::sync::MutexGuard<'static, ()> {
        MOUNT_TABLE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new temporary directory, when paths in it are answered from the cache here (not
    /// on a kernel before 6.8, or a temporary directory on another file system).
    pub(crate) fn answerable_tempdir() -> Option<tempfile::TempDir> {
        let dir = tempfile::tempdir().unwrap();
        if answer(dir.path(), true).is_none() {
            eprintln!(
                "SKIP: {} is not answered from the cache",
                dir.path().display()
            );
            return None;
        }
        Some(dir)
    }

    /// The answer for `path`, judging its mount first as a worker would.
    pub(crate) fn answer(path: &Path, follow: bool) -> Option<Metadata> {
        let _table = hold_mount_table();
        if let Lookup::Ask(Some(mount)) = metadata(path, follow) {
            judge_mount(mount);
        }
        match metadata(path, follow) {
            Lookup::Answer(answer) => Some(answer),
            Lookup::Ask(_) => None,
        }
    }

    #[test]
    fn other_file_systems_missing_names_and_links_go_to_the_workers() {
        assert_eq!(answer(Path::new("/proc/self/status"), true), None);
        assert_eq!(answer(Path::new("/no/such/path/anywhere"), true), None);
        let Some(dir) = answerable_tempdir() else {
            return;
        };
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        std::os::unix::fs::symlink("file", dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(".", dir.path().join("here")).unwrap();
        let _ = std::fs::metadata(dir.path().join("here/link"));
        // A final link is described as itself here, and followed only by the workers;
        // a link inside the path is never walked here.
        let link = dir.path().join("link");
        assert!(answer(&link, false).is_some_and(|own| own.is_symlink));
        assert_eq!(answer(&link, true), None);
        assert_eq!(answer(&dir.path().join("here/file"), true), None);
        // A long path is not walked here either.
        let long = format!(
            "{}/{}file",
            dir.path().display(),
            "./".repeat(MAX_PATH_BYTES)
        );
        let _ = std::fs::metadata(&long);
        assert_eq!(answer(Path::new(&long), true), None);
    }

    /// A mount is judged by a worker (`judge_mount`) before any path on it is answered.
    #[test]
    fn an_unjudged_mount_is_left_to_the_workers_until_judged() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        if answer(&file, true).is_none() {
            eprintln!("SKIP: {} is not answered from the cache", file.display());
            return;
        }
        let _table = hold_mount_table();
        known_mounts()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let Lookup::Ask(Some(mount)) = metadata(&file, true) else {
            panic!("a path on a mount not judged yet was answered");
        };
        assert_eq!(known_mount(mount), None);
        judge_mount(mount);
        assert_eq!(known_mount(mount), Some(true));
        assert!(matches!(metadata(&file, true), Lookup::Answer(_)));
        judge_mount(u64::MAX - 7);
        assert_eq!(known_mount(u64::MAX - 7), Some(false));
    }

    /// Every descriptor opened here is closed on the closer thread (the last close of a
    /// large file unlinked meanwhile frees its blocks; of a mount detached meanwhile, tears
    /// it down); the answer is the same. A file already unlinked is reachable by path only
    /// through a `/proc` magic link, which a cache-only lookup does not follow: the
    /// workers answer it.
    #[test]
    fn descriptors_are_closed_on_the_closer_thread() {
        use std::os::unix::fs::FileExt;
        let Some(dir) = answerable_tempdir() else {
            return;
        };
        let large = dir.path().join("large");
        let file = std::fs::File::create(&large).unwrap();
        file.write_all_at(&vec![1u8; 2 << 20], 0).unwrap();
        drop(file);
        let _ = std::fs::metadata(&large);
        let closed = closed_later();
        let answered = answer(&large, true).expect("a cached local file");
        assert_eq!(answered.size, 2 << 20);
        assert!(closed_later() > closed);
        // And the closer thread does close it, soon.
        let open_on_large = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
                .any(|target| target == large)
        };
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while open_on_large() {
            assert!(std::time::Instant::now() < until, "never closed");
            std::thread::sleep(Duration::from_millis(5));
        }

        let gone = dir.path().join("gone");
        let kept = std::fs::File::create(&gone).unwrap();
        std::fs::remove_file(&gone).unwrap();
        let magic = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&kept));
        let _ = std::fs::metadata(&magic);
        assert_eq!(answer(Path::new(&magic), true), None);
    }

    /// Overlayfs passes `AT_STATX_DONT_SYNC` to its layers: over a FUSE layer it answered
    /// the FUSE root's placeholder attributes (size 0, modified 1970) where `stat` asks
    /// the daemon. It stays off the list.
    #[test]
    fn overlayfs_is_not_judged_local() {
        const OVERLAYFS_MAGIC: u64 = 0x794C_7630;
        assert!(!LOCAL_MAGICS.contains(&OVERLAYFS_MAGIC));
    }
}

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
//! its superblock magic, read once per mount with `statmount(2)` (which reads the mount
//! table, never the file system), is in [`LOCAL_MAGICS`]. Anything else (an error, a
//! name not in the cache, another file system, an older kernel) is answered by the worker
//! threads as before, with every guarantee they give: so a stuck mount still stalls only
//! the requests that touch it.
//!
//! Closing the `O_PATH` descriptor can do work too: when it holds the last reference to a
//! file already unlinked, the close frees its blocks, which takes long for a large file.
//! The descriptor of a file that is unlinked or larger than [`SMALL_FILE_BLOCKS`] is
//! therefore closed by a thread of its own ([`close_later`]), never on the caller's.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Mutex, OnceLock};

use exec_server_core::metrics::{self, Counter};
use exec_server_core::proto::fs::Metadata;
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Statx, StatxFlags, CWD};

use crate::describe::describe_statx;

/// `STATX_MNT_ID_UNIQUE` (Linux 6.8): `stx_mnt_id` is the mount's unique 64-bit id.
const STATX_MNT_ID_UNIQUE: u32 = 0x4000;

/// Superblock magics of file systems whose lookups and attributes, once cached, are
/// answered from memory: ext2/3/4, XFS, Btrfs, tmpfs, ramfs, F2FS and overlayfs (which
/// passes `AT_STATX_DONT_SYNC` on to its layers).
const LOCAL_MAGICS: [u64; 7] = [
    0xEF53,      // ext2, ext3, ext4
    0x5846_5342, // XFS
    0x9123_683E, // Btrfs
    0x0102_1994, // tmpfs
    0x8584_58F6, // ramfs
    0xF2F5_2010, // F2FS
    0x794C_7630, // overlayfs
];

/// Files larger than this many 512-byte blocks (1 MiB) are closed on the closer thread:
/// closing the last reference to one unlinked meanwhile frees its blocks.
const SMALL_FILE_BLOCKS: u64 = 2048;

/// Mounts judged so far, by unique id; bounded, as mounts come and go.
const MAX_KNOWN_MOUNTS: usize = 4096;

/// The metadata of `path` (following a final symbolic link when `follow`) if the kernel
/// has it cached on a file system in [`LOCAL_MAGICS`]; `None`: ask the worker threads.
pub(crate) fn metadata(path: &Path, follow: bool) -> Option<Metadata> {
    let own = cached_stat(path, false)?;
    let is_symlink = own.stx_mode & 0o170_000 == 0o120_000;
    let described = if follow && is_symlink {
        cached_stat(path, true)?
    } else {
        own
    };
    answered().inc();
    Some(describe_statx(is_symlink, &described))
}

/// `statx` of `path` through a cache-only lookup, when its mount is local.
fn cached_stat(path: &Path, follow: bool) -> Option<Statx> {
    let mut flags = OFlags::PATH | OFlags::CLOEXEC;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    let fd: OwnedFd =
        rustix::fs::openat2(CWD, path, flags, Mode::empty(), ResolveFlags::CACHED).ok()?;
    let wanted = StatxFlags::BASIC_STATS
        | StatxFlags::BTIME
        | StatxFlags::from_bits_retain(STATX_MNT_ID_UNIQUE);
    let stat = rustix::fs::statx(
        fd.as_fd(),
        "",
        AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC,
        wanted,
    )
    .ok()?;
    if stat.stx_nlink == 0 || stat.stx_blocks > SMALL_FILE_BLOCKS {
        close_later(fd);
    }
    let unique_mount = stat.stx_mask & STATX_MNT_ID_UNIQUE != 0;
    (unique_mount && is_local(stat.stx_mnt_id)).then_some(stat)
}

/// Closes `fd` on the closer thread: its close may free the blocks of an unlinked file.
/// Only when that thread cannot take it (4,096 closes already wait for it, or it could
/// not be started) is it closed here.
fn close_later(fd: OwnedFd) {
    #[cfg(test)]
    CLOSED_LATER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    static CLOSER: OnceLock<Option<SyncSender<OwnedFd>>> = OnceLock::new();
    let closer = CLOSER.get_or_init(|| {
        let (queue, closes) = sync_channel::<OwnedFd>(4096);
        std::thread::Builder::new()
            .name("exec-fs-closer".into())
            .spawn(move || closes.into_iter().for_each(drop))
            .ok()
            .map(|_| queue)
    });
    if let Some(queue) = closer {
        // A full or gone queue hands the descriptor back, and it is closed here.
        let _ = queue.try_send(fd);
    }
}

/// Descriptors given to [`close_later`], for the tests.
#[cfg(test)]
static CLOSED_LATER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[cfg(test)]
fn closed_later() -> usize {
    CLOSED_LATER.load(std::sync::atomic::Ordering::SeqCst)
}

/// Whether the mount with unique id `mount` holds a file system in [`LOCAL_MAGICS`].
fn is_local(mount: u64) -> bool {
    static KNOWN: OnceLock<Mutex<HashMap<u64, bool>>> = OnceLock::new();
    let known = KNOWN.get_or_init(Mutex::default);
    if let Some(local) = known.lock().unwrap_or_else(|e| e.into_inner()).get(&mount) {
        return *local;
    }
    let local = superblock_magic(mount).is_some_and(|magic| LOCAL_MAGICS.contains(&magic));
    let mut known = known.lock().unwrap_or_else(|e| e.into_inner());
    if known.len() >= MAX_KNOWN_MOUNTS {
        known.clear();
    }
    known.insert(mount, local);
    local
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
mod tests {
    use super::*;

    #[test]
    fn other_file_systems_and_missing_names_go_to_the_workers() {
        assert_eq!(metadata(Path::new("/proc/self/status"), true), None);
        assert_eq!(metadata(Path::new("/no/such/path/anywhere"), true), None);
        let dir = tempfile::tempdir().unwrap();
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink("missing", &dangling).unwrap();
        let _ = std::fs::symlink_metadata(&dangling);
        assert_eq!(metadata(&dangling, true), None);
    }

    /// The descriptor of a large file is closed on the closer thread (the last close of
    /// a large file unlinked meanwhile frees its blocks); the answer is the same. A file
    /// already unlinked is reachable by path only through a `/proc` magic link, which a
    /// cache-only lookup does not follow: the workers answer it.
    #[test]
    fn large_files_are_closed_on_the_closer_thread() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        if metadata(dir.path(), true).is_none() {
            eprintln!(
                "SKIP: {} is not answered from the cache",
                dir.path().display()
            );
            return;
        }
        let large = dir.path().join("large");
        let file = std::fs::File::create(&large).unwrap();
        file.write_all_at(&vec![1u8; 2 << 20], 0).unwrap();
        let _ = std::fs::metadata(&large);
        let closed = closed_later();
        let answer = metadata(&large, true).expect("a cached local file");
        assert_eq!(answer.size, 2 << 20);
        assert_eq!(closed_later(), closed + 1);

        let gone = dir.path().join("gone");
        let kept = std::fs::File::create(&gone).unwrap();
        std::fs::remove_file(&gone).unwrap();
        let magic = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&kept));
        let _ = std::fs::metadata(&magic);
        assert_eq!(metadata(Path::new(&magic), true), None);
    }

    #[test]
    fn an_unknown_mount_id_is_not_local() {
        assert!(!is_local(u64::MAX - 7));
    }
}

//! Giving memory back to the system once connections are gone.
//!
//! Each connection's buffers are freed when it closes (and its session's state when the
//! session ends), but the allocator keeps the freed pages for reuse: after a burst of
//! 10,000 connections the server stayed at about 20 times its idle resident set. So when
//! the last connection closes or a session ends with no connection open, or after every
//! [`TRIM_EVERY_CLOSES`] closes, the allocator is asked to return what it holds free
//! (`malloc_trim`) — once for a whole burst ([`TRIM_DELAY`]), on a blocking thread because
//! a large heap takes milliseconds to walk. After a burst, once no connection is open, the
//! worker threads' allocator caches are emptied first ([`crate::worker_caches`]): the
//! chunks they hold are spread over the whole heap and would keep their pages from being
//! released.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Closes after which the heap is trimmed even while other connections stay open.
const TRIM_EVERY_CLOSES: usize = 1_024;
/// How long a trim waits, so that a burst of closes or expiries is trimmed once.
const TRIM_DELAY: Duration = Duration::from_millis(100);
/// Closes and session ends since the last trim that make a burst, after which the worker
/// threads' caches are worth emptying. After a few the heap is small, its pages mostly
/// in use anyway, and refilling the emptied caches would only grow each worker's heap by
/// the size of a cache (about 240 KiB).
const BURST_CLOSES: usize = 64;

static OPEN: AtomicUsize = AtomicUsize::new(0);
static CLOSED_SINCE_TRIM: AtomicUsize = AtomicUsize::new(0);
/// A trim is under way: one at a time is enough.
static TRIMMING: AtomicBool = AtomicBool::new(false);

/// Counts a connection until it is dropped; the last one out (or every
/// [`TRIM_EVERY_CLOSES`]th) trims the heap.
pub(crate) struct OpenConnection(());

impl OpenConnection {
    pub(crate) fn new() -> Self {
        OPEN.fetch_add(1, Ordering::Relaxed);
        Self(())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
        released();
    }
}

/// A session ended: its state is freed.
pub(crate) fn session_ended() {
    released();
}

fn released() {
    let closed = CLOSED_SINCE_TRIM.fetch_add(1, Ordering::Relaxed) + 1;
    if OPEN.load(Ordering::Relaxed) == 0 || closed >= TRIM_EVERY_CLOSES {
        schedule_trim();
    }
}

/// Trims after [`TRIM_DELAY`] unless a trim is already waiting or running.
fn schedule_trim() {
    if TRIMMING.swap(true, Ordering::AcqRel) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        TRIMMING.store(false, Ordering::Release);
        return;
    };
    runtime.spawn(async {
        tokio::time::sleep(TRIM_DELAY).await;
        let runtime = tokio::runtime::Handle::current();
        let trimmed = tokio::task::spawn_blocking(move || {
            let released = CLOSED_SINCE_TRIM.swap(0, Ordering::Relaxed);
            // Emptying the caches holds every worker thread for a moment: only while no
            // connection could be waiting for one.
            let empty_caches = released >= BURST_CLOSES && OPEN.load(Ordering::Relaxed) == 0;
            release_free_memory(&runtime, empty_caches);
        });
        let _ = trimmed.await;
        TRIMMING.store(false, Ordering::Release);
    });
}

/// Returns the allocator's free pages to the system (glibc); other C libraries have no
/// such call and keep their own policy.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_memory(runtime: &tokio::runtime::Handle, empty_caches: bool) {
    if empty_caches {
        crate::worker_caches::empty_worker_caches(runtime);
    }
    // SAFETY: malloc_trim only walks and releases the allocator's own free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_memory(_runtime: &tokio::runtime::Handle, _empty_caches: bool) {}

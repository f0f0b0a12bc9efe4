//! Giving memory back to the system once connections are gone.
//!
//! Each connection's buffers are freed when it closes (and its session's state when the
//! session ends), but the allocator keeps the freed pages for reuse: after a burst of
//! 10,000 connections the server stayed at about 20 times its idle resident set. So when
//! the last connection closes or a session ends with no connection open, or after every
//! [`TRIM_EVERY_CLOSES`] closes, the allocator is asked to return what it holds free
//! (`malloc_trim`) — once for a whole burst ([`TRIM_DELAY`]), on a blocking thread because
//! a large heap takes milliseconds to walk.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Closes after which the heap is trimmed even while other connections stay open.
const TRIM_EVERY_CLOSES: usize = 1_024;
/// How long a trim waits, so that a burst of closes or expiries is trimmed once.
const TRIM_DELAY: Duration = Duration::from_millis(100);

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
        let trimmed = tokio::task::spawn_blocking(|| {
            CLOSED_SINCE_TRIM.store(0, Ordering::Relaxed);
            release_free_memory();
        });
        let _ = trimmed.await;
        TRIMMING.store(false, Ordering::Release);
    });
}

/// Returns the allocator's free pages to the system (glibc); other C libraries have no
/// such call and keep their own policy.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and releases the allocator's own free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

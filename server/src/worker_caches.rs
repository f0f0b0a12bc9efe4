//! Emptying the allocator's per-thread caches of the runtime's worker threads (glibc).
//!
//! glibc keeps, for each thread, up to 7 freed chunks of each of its 64 smallest sizes
//! (up to 1,032 bytes, the "tcache") to hand out again without taking a lock. To the heap
//! those chunks are in use, so `malloc_trim` cannot release the pages they sit on. After a
//! burst of connections each worker's cache is full of chunks freed last, spread all over
//! a heap that grew to tens of megabytes: about 450 chunks per worker, each keeping its page
//! and the page of the free space next to it resident — 1.6 MB per worker after 10,000
//! connections closed, most of what the trim left behind.
//!
//! glibc has no call that empties a cache: only its own thread can take chunks out (by
//! allocating them), and a thread's cache goes back to the heap when the thread exits. So
//! every worker allocates its cached chunks (which empties its cache), and a thread made
//! for the purpose frees them and exits, which returns its own cache too; the heap can
//! then be trimmed around them.

use std::collections::HashSet;
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// glibc's default number of chunks cached per size (`glibc.malloc.tcache_count`).
const CACHED_PER_SIZE: usize = 7;
/// The cached chunk sizes are 32, 48, …, 1,040 bytes: 64 sizes, 16 bytes apart.
const CACHED_SIZES: usize = 64;
/// The request that gets a chunk of the smallest cached size (its 8-byte header added).
const SMALLEST_REQUEST: usize = 24;
const SIZE_STEP: usize = 16;

/// How long the workers are waited for, and so the longest a worker is held. They are
/// idle when this runs, so they arrive in microseconds; a worker busy longer than this
/// keeps its cache until the next time rather than hold another worker up.
const GATHER_WAIT: Duration = Duration::from_millis(5);

/// Empties the cache of every worker thread of `runtime` into the heap. Runs on a thread
/// outside the runtime's workers (a blocking-pool thread), since it waits for them. Returns
/// how many workers' caches were emptied.
pub(crate) fn empty_worker_caches(runtime: &tokio::runtime::Handle) -> usize {
    empty_worker_caches_within(runtime, GATHER_WAIT)
}

/// [`empty_worker_caches`], waiting at most `wait` for the workers.
fn empty_worker_caches_within(runtime: &tokio::runtime::Handle, wait: Duration) -> usize {
    let workers = runtime.metrics().num_workers();
    let gathering = Arc::new(Gathering::new(workers, wait));
    for _ in 0..workers {
        let gathering = Arc::clone(&gathering);
        runtime.spawn(async move { gathering.arrive() });
    }
    let (chunks, emptied) = gathering.close(Instant::now() + wait);
    free_on_a_passing_thread(chunks);
    emptied
}

/// One chunk taken out of a thread's cache; freed when dropped.
struct CachedChunk(NonNull<libc::c_void>);

// SAFETY: memory from malloc belongs to no thread; any thread may free it.
unsafe impl Send for CachedChunk {}

impl Drop for CachedChunk {
    fn drop(&mut self) {
        // SAFETY: the pointer came from malloc and is freed once, here.
        unsafe { libc::free(self.0.as_ptr()) }
    }
}

/// Allocates as many chunks of every cached size as a cache holds: the cache hands out
/// its own chunks first, so afterwards this thread's cache holds none of the chunks it
/// held before (at most a few that glibc moved in from a bin of the same size).
fn take_cached_chunks(into: &mut Vec<CachedChunk>) {
    // Reserved first: growing the list must not put a chunk back into the cache.
    into.reserve(CACHED_SIZES * CACHED_PER_SIZE);
    for size in 0..CACHED_SIZES {
        let request = SMALLEST_REQUEST + size * SIZE_STEP;
        for _ in 0..CACHED_PER_SIZE {
            // SAFETY: malloc hands out memory of its own, or null.
            let chunk = unsafe { libc::malloc(request) };
            into.extend(NonNull::new(chunk).map(CachedChunk));
        }
    }
}

/// Frees `chunks` on a new thread that exits at once: chunks freed into its cache go back
/// to the heap when it exits, before this returns. If no thread can be started they are
/// freed here instead (into this thread's cache, some of them).
fn free_on_a_passing_thread(chunks: Vec<CachedChunk>) {
    if chunks.is_empty() {
        return;
    }
    let freeing = std::thread::Builder::new()
        .name("exec-server-free".into())
        .spawn(move || drop(chunks));
    if let Ok(thread) = freeing {
        let _ = thread.join();
    }
}

/// The workers' meeting point: each empties its cache and waits until all have arrived,
/// so that no two of the tasks run on the same worker thread.
struct Gathering {
    workers: usize,
    /// How long a worker waits for the others.
    wait: Duration,
    state: Mutex<GatheringState>,
    changed: Condvar,
}

struct GatheringState {
    /// Threads whose cache was emptied.
    arrived: HashSet<ThreadId>,
    /// Set once the caller stopped waiting: late tasks leave their cache alone, since
    /// nobody would free what they took.
    closed: bool,
    chunks: Vec<CachedChunk>,
}

impl Gathering {
    fn new(workers: usize, wait: Duration) -> Self {
        Self {
            workers,
            wait,
            state: Mutex::new(GatheringState {
                arrived: HashSet::with_capacity(workers),
                closed: false,
                chunks: Vec::new(),
            }),
            changed: Condvar::new(),
        }
    }

    /// Runs on a worker: empties its cache, then holds the thread until every worker has
    /// arrived (or the caller gave up), so the other tasks must run on the other workers.
    fn arrive(&self) {
        let deadline = Instant::now() + self.wait;
        let mut state = self.lock();
        if state.closed || !state.arrived.insert(std::thread::current().id()) {
            return;
        }
        take_cached_chunks(&mut state.chunks);
        self.changed.notify_all();
        drop(self.wait_until(state, deadline, |s| s.closed));
    }

    /// Waits for every worker until `deadline`, then closes the meeting: the chunks taken
    /// and how many workers arrived.
    fn close(&self, deadline: Instant) -> (Vec<CachedChunk>, usize) {
        let mut state = self.wait_until(self.lock(), deadline, |_| false);
        state.closed = true;
        self.changed.notify_all();
        (std::mem::take(&mut state.chunks), state.arrived.len())
    }

    /// Waits until every worker has arrived, `also` holds, or `deadline` passed.
    fn wait_until<'a>(
        &self,
        mut state: MutexGuard<'a, GatheringState>,
        deadline: Instant,
        also: impl Fn(&GatheringState) -> bool,
    ) -> MutexGuard<'a, GatheringState> {
        while state.arrived.len() < self.workers && !also(&state) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state
    }

    fn lock(&self) -> MutexGuard<'_, GatheringState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long enough for a loaded machine to schedule every worker; the gathering ends as
    /// soon as all have arrived.
    const PATIENT: Duration = Duration::from_secs(10);

    #[test]
    fn the_chunks_taken_are_the_ones_the_cache_held() {
        // glibc may move chunks from a bin into the cache while the first emptying
        // allocates (it stashes the rest of a small bin it takes from); those would then
        // take the cache's room and some of the chunks freed below would go to a bin. That
        // depends on the heap's state, which other tests' threads share through the arena,
        // so the experiment gets twenty tries; a glibc that did not hand out cached chunks
        // first fails every one.
        let kept_all = (0..20).any(|_| freed_chunks_are_taken_back());
        assert!(kept_all, "freed chunks stayed in the cache in every try");
    }

    /// Empties this thread's cache, frees a cache's worth of one size into it, empties it
    /// again: whether every chunk freed was among those taken.
    fn freed_chunks_are_taken_back() -> bool {
        let mut earlier = Vec::new();
        take_cached_chunks(&mut earlier);
        let mut freed = Vec::with_capacity(CACHED_PER_SIZE);
        for _ in 0..CACHED_PER_SIZE {
            // SAFETY: plain malloc; freed below.
            freed.push(unsafe { libc::malloc(100) } as usize);
        }
        for &chunk in &freed {
            // SAFETY: each came from malloc above and is freed once.
            unsafe { libc::free(chunk as *mut libc::c_void) };
        }
        let mut taken = Vec::new();
        take_cached_chunks(&mut taken);
        let taken: HashSet<usize> = taken.iter().map(|c| c.0.as_ptr() as usize).collect();
        freed.iter().all(|chunk| taken.contains(chunk))
    }

    #[test]
    fn every_worker_empties_its_cache() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        let handle = runtime.handle().clone();
        let emptied = runtime
            .block_on(runtime.spawn_blocking(move || empty_worker_caches_within(&handle, PATIENT)))
            .unwrap();
        assert_eq!(emptied, 4);
    }

    #[test]
    fn a_worker_that_does_not_come_is_left_out() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let handle = runtime.handle().clone();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel();
        // One worker stays blocked until the gathering is over.
        runtime.spawn(async move {
            started_tx.send(()).unwrap();
            let _ = held.recv();
        });
        started.recv().unwrap();
        // The free worker arrives; the blocked one is given up on after the wait.
        let wait = Duration::from_secs(1);
        let emptied = runtime
            .block_on(runtime.spawn_blocking(move || empty_worker_caches_within(&handle, wait)))
            .unwrap();
        release.send(()).unwrap();
        assert_eq!(emptied, 1);
    }
}

//! One inotify instance for the whole plugin, shared by every watch of every session: the
//! kernel limits instances per user (`fs.inotify.max_user_instances`, often 128), not
//! watches. Each kernel watch is held by a [`KernelWatch`]; the last holder of a watch
//! descriptor removes it from the kernel. Events are read on the reactor and handed to the
//! holders' sinks, which must only record them (never wait).
//!
//! The instance also follows the mount table (`/proc/self/mounts` signals a change with
//! `POLLPRI`): a mount or unmount anywhere can make a watched path appear, so missing-path
//! watches treat it as a change.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Bytes read from the instance at once (a few hundred events).
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// One event as a holder sees it.
#[derive(Debug, Clone)]
pub(crate) struct RawEvent {
    pub(crate) flags: ReadFlags,
    /// The entry of a watched directory the event is about; `None` for the watched object
    /// itself (and for a queue overflow).
    pub(crate) name: Option<OsString>,
}

impl RawEvent {
    /// The kernel dropped events: anything may have changed.
    pub(crate) fn overflowed(&self) -> bool {
        self.flags.contains(ReadFlags::QUEUE_OVERFLOW)
    }
}

/// Where a holder's events go. Called on the reactor with no lock held; must not block.
pub(crate) type Sink = Arc<dyn Fn(&RawEvent) + Send + Sync>;

/// The plugin's inotify instance.
pub(crate) struct Inotify {
    fd: AsyncFd<OwnedFd>,
    registry: Mutex<Registry>,
    /// Bumped at every change of the mount table.
    mounts: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for Inotify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inotify")
            .field("kernel_watches", &self.lock().by_wd.len())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Registry {
    /// The holders of each kernel watch descriptor, by holder id.
    by_wd: HashMap<i32, HashMap<u64, Sink>>,
    next_holder: u64,
}

impl Inotify {
    /// Creates the instance and starts reading it (and the mount table) on the current
    /// runtime.
    pub(crate) fn start() -> io::Result<Arc<Self>> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?;
        let hub = Arc::new(Self {
            fd: register(fd, Interest::READABLE)?,
            registry: Mutex::new(Registry::default()),
            mounts: tokio::sync::watch::Sender::new(0),
        });
        tokio::spawn(read_events(Arc::downgrade(&hub)));
        tokio::spawn(follow_mounts(Arc::downgrade(&hub)));
        Ok(hub)
    }

    /// Watches `path` for `mask` on behalf of a new holder whose events go to `sink`.
    pub(crate) fn add(
        self: &Arc<Self>,
        path: &Path,
        mask: WatchFlags,
        sink: Sink,
    ) -> io::Result<KernelWatch> {
        let mut registry = self.lock();
        // Another holder may watch the same inode with another mask: add to it, never
        // narrow it; each holder filters what it gets.
        let wd = inotify::add_watch(self.fd.get_ref(), path, mask | WatchFlags::MASK_ADD)?;
        registry.next_holder += 1;
        let holder = registry.next_holder;
        registry.by_wd.entry(wd).or_default().insert(holder, sink);
        Ok(KernelWatch {
            hub: Arc::clone(self),
            wd,
            holder,
        })
    }

    /// A receiver that sees every change of the mount table from now on.
    pub(crate) fn mount_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.mounts.subscribe()
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Every update is one map operation: a panic cannot leave the maps inconsistent.
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One holder's interest in a kernel watch; dropping it releases the watch when it was
/// the last holder.
pub(crate) struct KernelWatch {
    hub: Arc<Inotify>,
    wd: i32,
    holder: u64,
}

impl std::fmt::Debug for KernelWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelWatch").field("wd", &self.wd).finish()
    }
}

impl Drop for KernelWatch {
    fn drop(&mut self) {
        let mut registry = self.hub.lock();
        let Some(holders) = registry.by_wd.get_mut(&self.wd) else {
            // The kernel already removed it (its object is gone).
            return;
        };
        if holders.remove(&self.holder).is_none() || !holders.is_empty() {
            return;
        }
        registry.by_wd.remove(&self.wd);
        let _ = inotify::remove_watch(self.hub.fd.get_ref(), self.wd);
    }
}

/// Reads events and hands them to their holders until the instance is gone.
async fn read_events(hub: std::sync::Weak<Inotify>) {
    let mut buffer = vec![MaybeUninit::<u8>::uninit(); READ_BUFFER_BYTES];
    loop {
        let Some(strong) = hub.upgrade() else { return };
        let events = match read_ready(&strong, &mut buffer).await {
            Ok(events) => events,
            Err(e) => {
                tracing::warn!(error = %e, "metadata watch unavailable; retaining live discovery");
                return;
            }
        };
        let deliveries: Vec<(Sink, RawEvent)> = {
            let mut registry = strong.lock();
            let mut deliveries = Vec::new();
            for (wd, event) in events {
                if event.overflowed() {
                    for holders in registry.by_wd.values() {
                        deliveries.extend(holders.values().map(|s| (Arc::clone(s), event.clone())));
                    }
                    continue;
                }
                let Some(holders) = registry.by_wd.get(&wd) else {
                    continue;
                };
                deliveries.extend(holders.values().map(|s| (Arc::clone(s), event.clone())));
                if event.flags.contains(ReadFlags::IGNORED) {
                    registry.by_wd.remove(&wd);
                }
            }
            deliveries
        };
        drop(strong);
        for (sink, event) in deliveries {
            sink(&event);
        }
    }
}

/// Waits until the instance is readable and reads what it has.
async fn read_ready(
    hub: &Inotify,
    buffer: &mut [MaybeUninit<u8>],
) -> io::Result<Vec<(i32, RawEvent)>> {
    loop {
        let mut guard = hub.fd.readable().await?;
        let mut events = Vec::new();
        let mut reader = inotify::Reader::new(hub.fd.get_ref(), buffer);
        loop {
            match reader.next() {
                Ok(event) => {
                    let name = event
                        .file_name()
                        .map(|name| OsString::from_vec(name.to_bytes().to_vec()));
                    events.push((
                        event.wd(),
                        RawEvent {
                            flags: event.events(),
                            name,
                        },
                    ));
                    if reader.is_buffer_empty() {
                        break;
                    }
                }
                Err(Errno::AGAIN) => {
                    guard.clear_ready();
                    break;
                }
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if !events.is_empty() {
            return Ok(events);
        }
    }
}

/// Registers `fd` with the reactor for `interest`.
fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is a valid open descriptor that only its owner closes, and the
    // `AsyncFd` owns it from here until it is dropped, so it stays the same descriptor.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts().1)
}

/// Bumps the mount generation at every change of the mount table.
async fn follow_mounts(hub: std::sync::Weak<Inotify>) {
    let mounts = match std::fs::File::open("/proc/self/mounts")
        .and_then(|file| register(OwnedFd::from(file), Interest::PRIORITY))
    {
        Ok(mounts) => mounts,
        Err(e) => {
            tracing::warn!(error = %e, "mount changes unavailable for missing-path watch");
            return;
        }
    };
    loop {
        let Ok(mut guard) = mounts.ready(Interest::PRIORITY).await else {
            return;
        };
        guard.clear_ready();
        let Some(hub) = hub.upgrade() else { return };
        tracing::debug!("invalidating watched missing paths");
        hub.mounts.send_modify(|generation| *generation += 1);
    }
}

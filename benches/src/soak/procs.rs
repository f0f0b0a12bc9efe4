//! What `/proc` says about the processes of the soak, and stopping all of them.
//!
//! The soak process makes itself a child subreaper, so anything the server leaves behind
//! (a process whose parent died before it) becomes the soak's child instead of init's:
//! it is still counted among the descendants, and killed at the end.

use std::collections::BTreeSet;
use std::time::Duration;

/// Resources of one process at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub rss_kib: f64,
    pub descriptors: f64,
    pub threads: f64,
}

impl Usage {
    pub fn of(pid: u32) -> Self {
        let count = |dir: String| {
            std::fs::read_dir(dir)
                .map(|entries| entries.count() as f64)
                .unwrap_or(0.0)
        };
        Self {
            rss_kib: crate::target::rss_kib(pid),
            descriptors: count(format!("/proc/{pid}/fd")),
            threads: count(format!("/proc/{pid}/task")),
        }
    }
}

/// Makes orphaned descendants this process's children (`PR_SET_CHILD_SUBREAPER`).
pub fn become_subreaper() {
    // SAFETY: a prctl with integer arguments; no memory is passed.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc != 0 {
        eprintln!(
            "soak: PR_SET_CHILD_SUBREAPER failed ({}); orphans are not counted",
            std::io::Error::last_os_error()
        );
    }
}

/// The children of every thread of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Every descendant of `pid` (children, their children, …).
pub fn descendants(pid: u32) -> BTreeSet<u32> {
    let mut found = BTreeSet::new();
    let mut todo = vec![pid];
    while let Some(next) = todo.pop() {
        for child in children(next) {
            if found.insert(child) {
                todo.push(child);
            }
        }
    }
    found
}

/// The process's state letter (`R`, `S`, `Z`, …), from `/proc/<pid>/stat`.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain anything; the state follows it.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Collects the exit status of the soak's own children that are zombies, except `kept`
/// (the server and the rendezvous, which tokio waits for): orphans handed to the soak.
pub fn reap_orphans(kept: &[u32]) {
    for child in children(std::process::id()) {
        if !kept.contains(&child) && state(child) == Some('Z') {
            // SAFETY: waits for one known zombie child; the status pointer may be null.
            unsafe { libc::waitpid(child as i32, std::ptr::null_mut(), libc::WNOHANG) };
        }
    }
}

/// The descendants of the soak that the server started (directly or not): every
/// descendant except `kept` (the server and the rendezvous).
pub fn workload_processes(kept: &[u32]) -> BTreeSet<u32> {
    let mut all = descendants(std::process::id());
    all.retain(|pid| !kept.contains(pid));
    all
}

/// `pid (command line)`, for messages.
pub fn describe(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let text: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|part| !part.is_empty())
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect();
    let state = state(pid).map(|s| format!(" [{s}]")).unwrap_or_default();
    format!("{pid} ({}){state}", text.join(" "))
}

/// SIGTERM to `pid`'s process group, then SIGKILL once `grace` has passed without it
/// exiting; `exited` says whether it is gone.
pub async fn stop_group(pid: u32, grace: Duration, mut exited: impl FnMut() -> bool) -> bool {
    // SAFETY: signals a process group this program started; no memory involved.
    unsafe { libc::kill(-(pid as i32), libc::SIGTERM) };
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        if exited() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // SAFETY: as above.
    unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
    false
}

/// SIGKILLs every descendant of the soak (and each one's process group) until none is
/// left, reaping the orphans among them; returns the ones found (described).
pub fn kill_all_descendants() -> Vec<String> {
    let mut killed = Vec::new();
    for _ in 0..100 {
        let left = descendants(std::process::id());
        if left.is_empty() {
            break;
        }
        for pid in left {
            if state(pid) != Some('Z') {
                killed.push(describe(pid));
            }
            // SAFETY: signals a descendant of this process (and the group it leads, if
            // any); no memory involved.
            unsafe {
                libc::kill(-(pid as i32), libc::SIGKILL);
                libc::kill(pid as i32, libc::SIGKILL);
            }
        }
        // Nothing else of this process waits any more: collect every exited child.
        // SAFETY: non-blocking waits for any child; the status pointer may be null.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        std::thread::sleep(Duration::from_millis(20));
    }
    killed.sort();
    killed.dedup();
    killed
}

//! Work a plugin leaves for the moment the server exits, after every session ended and
//! the listeners closed, before the runtime goes: ending processes that would otherwise
//! outlive the server.

use std::sync::Mutex;

static HOOKS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// Runs `hook` when the server exits (once, however often it is registered).
pub fn at_exit(hook: fn()) {
    let mut hooks = HOOKS.lock().unwrap_or_else(|e| e.into_inner());
    if !hooks.iter().any(|known| std::ptr::fn_addr_eq(*known, hook)) {
        hooks.push(hook);
    }
}

/// Runs every hook, in the order they were registered. Called by the server's `main` as
/// it exits; they block.
pub fn run() {
    let hooks = std::mem::take(&mut *HOOKS.lock().unwrap_or_else(|e| e.into_inner()));
    for hook in hooks {
        hook();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static RAN: AtomicUsize = AtomicUsize::new(0);

    fn count() {
        RAN.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn each_hook_runs_once_at_exit() {
        at_exit(count);
        at_exit(count);
        assert_eq!(RAN.load(Ordering::SeqCst), 0);
        run();
        assert_eq!(RAN.load(Ordering::SeqCst), 1);
        run();
        assert_eq!(RAN.load(Ordering::SeqCst), 1);
    }
}

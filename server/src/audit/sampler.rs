//! A bound on events an unauthenticated peer can cause (refused upgrades, refused
//! rendezvous calls): at most so many a second are recorded; the others are counted, in
//! `/metrics` and in the `suppressed` member of the next one recorded. Without it, one
//! peer sending refused requests as fast as it can would fill the trail's queue (and in
//! `batch` mode make others' events drop) and rotate its history out.

use std::sync::Mutex;
use std::time::Instant;

use crate::metrics::{self, Counter};

/// Refusals of one kind recorded per second at most.
pub const RECORDED_PER_SECOND: u64 = 20;

/// The limiter of one event kind.
pub struct Sampler {
    kind: &'static str,
    state: Mutex<Window>,
    suppressed_total: std::sync::OnceLock<Counter>,
}

struct Window {
    started: Option<Instant>,
    recorded: u64,
    suppressed: u64,
}

impl Sampler {
    pub const fn new(kind: &'static str) -> Self {
        Self {
            kind,
            state: Mutex::new(Window {
                started: None,
                recorded: 0,
                suppressed: 0,
            }),
            suppressed_total: std::sync::OnceLock::new(),
        }
    }

    /// The event kind it bounds.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// `Some(n)`: record this event, with `n` suppressed since the last one recorded;
    /// `None`: this one is suppressed (counted).
    pub fn admit(&self) -> Option<u64> {
        let mut window = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if window
            .started
            .is_none_or(|started| now.duration_since(started).as_secs() >= 1)
        {
            window.started = Some(now);
            window.recorded = 0;
        }
        if window.recorded < RECORDED_PER_SECOND {
            window.recorded += 1;
            return Some(std::mem::take(&mut window.suppressed));
        }
        window.suppressed += 1;
        self.suppressed_total
            .get_or_init(|| {
                metrics::counter(
                    "exec_server_audit_events_suppressed_total",
                    "Audit events of unauthenticated peers not recorded past the per-second bound (counted in the next one recorded), by kind.",
                    &[("kind", self.kind)],
                )
            })
            .inc();
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_recorded_at_the_bound_and_counted() {
        let sampler = Sampler::new("test.refused");
        let admitted = (0..100).filter(|_| sampler.admit().is_some()).count();
        assert_eq!(admitted as u64, RECORDED_PER_SECOND);
        let mut window = sampler.state.lock().unwrap();
        window.started = window
            .started
            .map(|s| s - std::time::Duration::from_secs(1));
        drop(window);
        assert_eq!(sampler.admit(), Some(100 - RECORDED_PER_SECOND));
    }
}

//! `/metrics` of the shared store: how long each call takes and how many failed.

use std::sync::LazyLock;
use std::time::Duration;

use exec_server_core::metrics::{self, Counter, Histogram};

static DURATION: LazyLock<Histogram> = LazyLock::new(|| {
    metrics::histogram(
        "exec_server_rendezvous_store_duration_seconds",
        "Time taken by calls of the rendezvous to its shared store.",
        &[("store", "redis")],
    )
});

static ERRORS: LazyLock<Counter> = LazyLock::new(|| {
    metrics::counter(
        "exec_server_rendezvous_store_errors_total",
        "Calls of the rendezvous to its shared store that failed (unreachable, timed out or refused).",
        &[("store", "redis")],
    )
});

/// Registers both series, so `/metrics` shows them from start-up.
pub(super) fn register() {
    LazyLock::force(&DURATION);
    LazyLock::force(&ERRORS);
}

pub(super) fn observe(elapsed: Duration, failed: bool) {
    DURATION.observe(elapsed);
    if failed {
        ERRORS.inc();
    }
}

//! What a listener does when `accept` fails for lack of resources (`EMFILE`, `ENFILE`,
//! `ENOBUFS`, `ENOMEM`): the pending connection stays in the kernel's queue and the socket
//! stays readable, so retrying at once would spin. The listener sleeps instead, longer
//! after each failure, and logs once when the episode starts and once when it ends (at
//! debug level for an episode that starts soon after the last warning, so a server that
//! keeps hovering at its limit does not flood the log).

use std::time::{Duration, Instant};

/// First sleep of an episode.
const FIRST_DELAY: Duration = Duration::from_millis(10);
/// Longest sleep: descriptors freed by closing connections are used within a second.
const MAX_DELAY: Duration = Duration::from_secs(1);
/// Episodes starting within this long of the last warning are logged at debug level.
const QUIET_INTERVAL: Duration = Duration::from_secs(10);

/// Back-off state of one listener's accept loop.
pub(crate) struct AcceptBackoff {
    listener: &'static str,
    /// Failures in the current episode; 0 when accepting works.
    failures: u64,
    started: Option<Instant>,
    next_delay: Duration,
    /// When the last warning was logged, and whether the current episode was warned about.
    last_warning: Option<Instant>,
    warned: bool,
}

impl AcceptBackoff {
    pub(crate) fn new(listener: &'static str) -> Self {
        Self {
            listener,
            failures: 0,
            started: None,
            next_delay: FIRST_DELAY,
            last_warning: None,
            warned: false,
        }
    }

    /// Records a failed `accept` and returns how long to sleep before the next one.
    pub(crate) fn failed(&mut self, error: &std::io::Error) -> Duration {
        if self.failures == 0 {
            let now = Instant::now();
            self.started = Some(now);
            self.warned = self
                .last_warning
                .is_none_or(|at| now.duration_since(at) >= QUIET_INTERVAL);
            if self.warned {
                self.last_warning = Some(now);
                tracing::warn!(
                    listener = self.listener,
                    "cannot accept connections: {error}; backing off until it works again"
                );
            } else {
                tracing::debug!(
                    listener = self.listener,
                    "cannot accept connections: {error}"
                );
            }
        }
        self.failures += 1;
        let delay = self.next_delay;
        self.next_delay = (self.next_delay * 2).min(MAX_DELAY);
        delay
    }

    /// Records a successful `accept`, ending an episode if one was running.
    pub(crate) fn succeeded(&mut self) {
        if self.failures == 0 {
            return;
        }
        let elapsed = self.started.map(|s| s.elapsed()).unwrap_or_default();
        if self.warned {
            tracing::info!(
                listener = self.listener,
                failed_attempts = self.failures,
                after_ms = elapsed.as_millis() as u64,
                "accepting connections again"
            );
        } else {
            tracing::debug!(listener = self.listener, "accepting connections again");
        }
        self.failures = 0;
        self.started = None;
        self.next_delay = FIRST_DELAY;
    }
}

/// Errors that concern one connection the peer already gave up on, not the listener: the
/// next `accept` is made at once.
pub(crate) fn is_connection_error(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        error.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) || error.raw_os_error() == Some(libc::EPROTO)
}

/// The `/metrics` label of an accept error.
pub(crate) fn error_label(error: &std::io::Error) -> &'static str {
    match error.raw_os_error() {
        Some(libc::EMFILE) => "emfile",
        Some(libc::ENFILE) => "enfile",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_a_second_and_reset_on_success() {
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        let mut backoff = AcceptBackoff::new("test");
        let delays: Vec<u128> = (0..9)
            .map(|_| backoff.failed(&emfile).as_millis())
            .collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        backoff.succeeded();
        assert_eq!(backoff.failed(&emfile), FIRST_DELAY);
    }

    #[test]
    fn errors_are_classified() {
        let err = std::io::Error::from_raw_os_error;
        assert_eq!(error_label(&err(libc::EMFILE)), "emfile");
        assert_eq!(error_label(&err(libc::ENFILE)), "enfile");
        assert_eq!(error_label(&err(libc::ENOMEM)), "other");
        assert!(is_connection_error(&err(libc::ECONNABORTED)));
        assert!(!is_connection_error(&err(libc::EMFILE)));
    }
}

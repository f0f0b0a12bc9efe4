//! Waiting for a busy server: `503` and `429` answers are tried again after the server's
//! `Retry-After`, a few times and for a bounded time in all. Shared by every client call
//! that meets a server at its capacity: the harness's registry `connect` and the client
//! library's WebSocket upgrade.

use std::time::Duration;

/// Retries after the first answer.
pub const BUSY_RETRIES: u32 = 5;
/// The wait when a busy answer names none.
pub const BUSY_DEFAULT_WAIT: Duration = Duration::from_secs(1);
/// The most waited in all; a `Retry-After` beyond what is left is not waited for.
pub const BUSY_MAX_WAIT: Duration = Duration::from_secs(30);

/// The retries of one call.
#[derive(Debug, Default)]
pub struct BusyRetries {
    retries: u32,
    waited: Duration,
}

impl BusyRetries {
    /// How long to wait before trying again after an answer with `status` and
    /// `retry_after`; `None` when the answer is not "busy" or the budget is spent.
    pub fn next_wait(&mut self, status: u16, retry_after: Option<Duration>) -> Option<Duration> {
        if status != 503 && status != 429 {
            return None;
        }
        // A peer chooses `Retry-After`: any value, up to u64::MAX seconds, must neither
        // overflow nor be waited for beyond the budget.
        let wait = retry_after.unwrap_or(BUSY_DEFAULT_WAIT);
        let waited = self
            .waited
            .checked_add(wait)
            .filter(|w| *w <= BUSY_MAX_WAIT)?;
        if self.retries >= BUSY_RETRIES {
            return None;
        }
        self.retries += 1;
        self.waited = waited;
        Some(wait)
    }
}

/// `Retry-After` in whole seconds (the HTTP-date form is not used by these servers).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_answers_wait_as_asked_within_the_budget() {
        let mut busy = BusyRetries::default();
        assert_eq!(busy.next_wait(401, None), None);
        assert_eq!(busy.next_wait(503, None), Some(BUSY_DEFAULT_WAIT));
        assert_eq!(
            busy.next_wait(429, Some(Duration::from_secs(2))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(busy.next_wait(503, Some(Duration::from_secs(3600))), None);
        let mut busy = BusyRetries::default();
        for _ in 0..BUSY_RETRIES {
            assert!(busy.next_wait(503, None).is_some());
        }
        assert_eq!(busy.next_wait(503, None), None, "five retries at most");
        assert_eq!(parse_retry_after(" 7 "), Some(Duration::from_secs(7)));
        // A hostile peer's largest value after a first wait: refused, not an overflow.
        let mut busy = BusyRetries::default();
        assert!(busy.next_wait(503, Some(Duration::from_secs(1))).is_some());
        let huge = parse_retry_after("18446744073709551615");
        assert_eq!(busy.next_wait(503, huge), None);
        assert_eq!(busy.next_wait(429, Some(Duration::MAX)), None);
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }
}

//! RFC 3339 timestamps in UTC without a calendar crate: with milliseconds
//! (`2026-11-28T00:54:10.103Z`, the form of `network/policyDecision.timestamp`) or
//! microseconds (`2026-11-28T00:54:10.103412Z`, audit events).

use std::time::{SystemTime, UNIX_EPOCH};

/// `time` with milliseconds.
pub fn rfc3339_millis(time: SystemTime) -> String {
    let (date, subsec) = rfc3339_seconds(time);
    format!("{date}.{:03}Z", subsec.as_millis())
}

/// `time` with microseconds.
pub fn rfc3339_micros(time: SystemTime) -> String {
    let (date, subsec) = rfc3339_seconds(time);
    format!("{date}.{:06}Z", subsec.as_micros())
}

/// `YYYY-MM-DDTHH:MM:SS` of `time`, and the fraction of its second.
fn rfc3339_seconds(time: SystemTime) -> (String, std::time::Duration) {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since_epoch.as_secs();
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    let date = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        day_secs / 3600,
        day_secs / 60 % 60,
        day_secs % 60,
    );
    let subsec = since_epoch - std::time::Duration::from_secs(secs);
    (date, subsec)
}

/// Days since 1970-01-01 → (year, month, day), Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn formats_known_instants() {
        let at = |ms: u64| rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(1_795_827_250_103), "2026-11-28T00:54:10.103Z");
        let micros = rfc3339_micros(UNIX_EPOCH + Duration::from_micros(1_795_827_250_103_412));
        assert_eq!(micros, "2026-11-28T00:54:10.103412Z");
    }
}

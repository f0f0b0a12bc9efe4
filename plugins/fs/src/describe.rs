//! The `fs/getMetadata` answer for what a file's metadata says, shared by the server and
//! the fs helper.

use std::fs;
use std::time::{SystemTime, UNIX_EPOCH};

use exec_server_core::proto::fs::Metadata;

/// The answer for `described`; `is_symlink` is about the requested path itself.
pub(crate) fn describe(is_symlink: bool, described: &fs::Metadata) -> Metadata {
    Metadata {
        is_directory: described.is_dir(),
        is_file: described.is_file(),
        is_symlink,
        size: described.len(),
        created_at_ms: described.created().map(unix_ms).unwrap_or(0),
        modified_at_ms: described.modified().map(unix_ms).unwrap_or(0),
    }
}

/// Milliseconds since the Unix epoch; earlier times are negative.
fn unix_ms(time: SystemTime) -> i64 {
    let clamp = |ms: u128| i64::try_from(ms).unwrap_or(i64::MAX);
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => clamp(after.as_millis()),
        Err(before) => -clamp(before.duration().as_millis()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn times_are_signed_milliseconds() {
        assert_eq!(unix_ms(UNIX_EPOCH + Duration::from_millis(1500)), 1500);
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_millis(1500)), -1500);
    }
}

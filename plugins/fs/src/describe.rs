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

/// The same answer from a `statx` result (see `cached_lookup`): a birth time the file
/// system does not report is 0, as from [`describe`].
pub(crate) fn describe_statx(is_symlink: bool, described: &rustix::fs::Statx) -> Metadata {
    const S_IFMT: u16 = 0o170_000;
    let kind = described.stx_mode & S_IFMT;
    let btime = rustix::fs::StatxFlags::BTIME.bits();
    Metadata {
        is_directory: kind == 0o040_000,
        is_file: kind == 0o100_000,
        is_symlink,
        size: described.stx_size,
        created_at_ms: if described.stx_mask & btime != 0 {
            statx_ms(described.stx_btime.tv_sec, described.stx_btime.tv_nsec)
        } else {
            0
        },
        modified_at_ms: statx_ms(described.stx_mtime.tv_sec, described.stx_mtime.tv_nsec),
    }
}

/// [`unix_ms`] of a `statx` time: whole milliseconds toward the epoch.
fn statx_ms(sec: i64, nsec: u32) -> i64 {
    let nanos = i128::from(sec) * 1_000_000_000 + i128::from(nsec);
    i64::try_from(nanos / 1_000_000).unwrap_or(if nanos < 0 { i64::MIN + 1 } else { i64::MAX })
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

    #[test]
    fn statx_times_round_like_system_times() {
        for (sec, nsec) in [(1, 500_400_000), (-2, 500_400_000), (-1, 0), (0, 999_999)] {
            let system = if sec >= 0 {
                UNIX_EPOCH + Duration::new(sec as u64, nsec)
            } else {
                UNIX_EPOCH - Duration::new((-sec) as u64, 0) + Duration::from_nanos(nsec.into())
            };
            assert_eq!(statx_ms(sec, nsec), unix_ms(system), "{sec} s {nsec} ns");
        }
    }
}

//! Capabilities of the confined helpers (SANDBOX.md §5.8): a root server's powers must not
//! reach the workload. The launcher keeps none; the fs helper keeps only the three that give
//! a root server's sandboxed file operations the access its unsandboxed ones have.

use std::io;

/// Capability numbers (`linux/capability.h`; the libc crate does not carry them).
pub const CAP_DAC_OVERRIDE: u32 = 1;
pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_FOWNER: u32 = 3;
pub const CAP_SYS_ADMIN: u32 = 21;

/// What the fs helper keeps: file access like the server's own (Landlock still bounds it).
pub const FS_HELPER_KEEPS: &[u32] = &[CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER];

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The calling thread's (effective, permitted) sets as 64-bit masks.
fn current() -> io::Result<(u64, u64)> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two CapData for version 3 into `data`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            std::ptr::addr_of_mut!(header),
            data.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let join = |low: u32, high: u32| u64::from(low) | (u64::from(high) << 32);
    Ok((
        join(data[0].effective, data[1].effective),
        join(data[0].permitted, data[1].permitted),
    ))
}

/// Whether `cap` is in the calling thread's effective set.
pub fn has_effective(cap: u32) -> bool {
    current().is_ok_and(|(effective, _)| cap < 64 && effective & (1 << cap) != 0)
}

/// The highest capability this kernel knows (`/proc/sys/kernel/cap_last_cap`); read it
/// before Landlock may hide `/proc`. `None` when unreadable.
pub fn last_cap() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|text| text.trim().parse().ok())
}

fn mask(caps: &[u32]) -> u64 {
    caps.iter()
        .filter(|c| **c < 64)
        .fold(0, |mask, c| mask | (1 << c))
}

/// Drops every capability except `keep` from the bounding set (up to `last_cap`, or until
/// the kernel says a number is unknown), clears the ambient set, and leaves `keep` (as far
/// as it was permitted) as the effective and permitted sets with nothing inheritable.
pub fn drop_all_except(keep: &[u32], last_cap: Option<u32>) -> io::Result<()> {
    let keep_mask = mask(keep);
    let (_, permitted_before) = current()?;
    let last = last_cap.unwrap_or(63).min(63);
    for cap in 0..=last {
        if keep_mask & (1 << cap) != 0 {
            continue;
        }
        // SAFETY: PR_CAPBSET_DROP takes integer arguments and affects this thread.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // Past the kernel's last capability.
                Some(libc::EINVAL) => break,
                // Without CAP_SETPCAP the bounding set cannot shrink; it then cannot matter
                // either, as long as nothing is permitted: with no_new_privs, execve grants
                // no capability a process does not already have.
                Some(libc::EPERM) if (permitted_before & !keep_mask) == 0 => break,
                _ => return Err(e),
            }
        }
    }
    // SAFETY: as above. EINVAL: a kernel without ambient capabilities (before 4.3).
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
        return Err(io::Error::last_os_error());
    }
    let kept = keep_mask & permitted_before;
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: kept as u32,
            permitted: kept as u32,
            inheritable: 0,
        },
        CapData {
            effective: (kept >> 32) as u32,
            permitted: (kept >> 32) as u32,
            inheritable: 0,
        },
    ];
    // SAFETY: capset reads two CapData for version 3 from `data`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capset,
            std::ptr::addr_of_mut!(header),
            data.as_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last capability of Linux 5.9; newer kernels know more.
    const CAP_CHECKPOINT_RESTORE: u32 = 40;

    #[test]
    fn masks_and_the_kernels_last_capability() {
        assert_eq!(mask(FS_HELPER_KEEPS), (1 << 1) | (1 << 2) | (1 << 3));
        assert_eq!(mask(&[64, 0]), 1);
        let last = last_cap().expect("/proc/sys/kernel/cap_last_cap is readable");
        assert!(last >= CAP_CHECKPOINT_RESTORE, "{last}");
        assert!(current().is_ok());
    }
}

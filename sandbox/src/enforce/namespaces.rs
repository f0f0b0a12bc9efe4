//! Namespaces of the confined helpers (SANDBOX.md §5.8): the sandbox launcher puts its
//! target into new PID, mount, UTS and IPC namespaces (and a network namespace when the
//! network is restricted), the fs helper into new UTS and IPC namespaces; both add a user
//! namespace when they lack `CAP_SYS_ADMIN`. Where the kernel refuses a combination, weaker
//! ones are tried in a fixed order, and the caller reports what was entered.

use std::io;

use serde::{Deserialize, Serialize};

use super::capabilities;

/// One kind of namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Namespace {
    User,
    Pid,
    Mount,
    Uts,
    Ipc,
    Net,
}

impl Namespace {
    const ALL: [Namespace; 6] = [
        Namespace::User,
        Namespace::Pid,
        Namespace::Mount,
        Namespace::Uts,
        Namespace::Ipc,
        Namespace::Net,
    ];

    fn bit(self) -> u8 {
        1 << (self as u8)
    }

    fn clone_flag(self) -> libc::c_int {
        match self {
            Namespace::User => libc::CLONE_NEWUSER,
            Namespace::Pid => libc::CLONE_NEWPID,
            Namespace::Mount => libc::CLONE_NEWNS,
            Namespace::Uts => libc::CLONE_NEWUTS,
            Namespace::Ipc => libc::CLONE_NEWIPC,
            Namespace::Net => libc::CLONE_NEWNET,
        }
    }

    /// The name in reports and logs.
    pub fn name(self) -> &'static str {
        match self {
            Namespace::User => "user",
            Namespace::Pid => "pid",
            Namespace::Mount => "mount",
            Namespace::Uts => "uts",
            Namespace::Ipc => "ipc",
            Namespace::Net => "net",
        }
    }
}

/// A set of namespaces; on the wire, the list of their names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "Vec<Namespace>", into = "Vec<Namespace>")]
pub struct Namespaces(u8);

impl Namespaces {
    pub const NONE: Namespaces = Namespaces(0);

    pub fn of(namespaces: &[Namespace]) -> Self {
        namespaces.iter().fold(Self::NONE, |set, ns| set.with(*ns))
    }

    pub fn with(self, ns: Namespace) -> Self {
        Self(self.0 | ns.bit())
    }

    pub fn without(self, ns: Namespace) -> Self {
        Self(self.0 & !ns.bit())
    }

    pub fn contains(self, ns: Namespace) -> bool {
        self.0 & ns.bit() != 0
    }

    pub fn iter(self) -> impl Iterator<Item = Namespace> {
        Namespace::ALL
            .into_iter()
            .filter(move |ns| self.contains(*ns))
    }

    fn clone_flags(self) -> libc::c_int {
        self.iter().fold(0, |flags, ns| flags | ns.clone_flag())
    }
}

impl From<Vec<Namespace>> for Namespaces {
    fn from(list: Vec<Namespace>) -> Self {
        Self::of(&list)
    }
}

impl From<Namespaces> for Vec<Namespace> {
    fn from(set: Namespaces) -> Self {
        set.iter().collect()
    }
}

/// Whether a user namespace may be added when the process is privileged anyway (it has
/// `CAP_SYS_ADMIN`) but the kernel refuses the namespaces without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrivilegedUserNamespace {
    /// Allowed: the caller drops every capability anyway (the launcher).
    Allowed,
    /// Not allowed: capabilities kept by the caller would lose their power over files whose
    /// owners the namespace does not map (the fs helper keeps `CAP_DAC_OVERRIDE`).
    Refused,
}

/// The attempts for `wanted`, strongest first: PID and mount namespaces matter most
/// (they hide the server's `/proc`), then the network, then UTS and IPC; without a PID
/// namespace the others are tried again in the same order.
pub(crate) fn attempts(wanted: Namespaces) -> Vec<Namespaces> {
    use Namespace::*;
    let candidates = [
        wanted,
        wanted.without(Net),
        wanted.without(Net).without(Uts).without(Ipc),
        wanted.without(Pid),
        wanted.without(Pid).without(Net),
        wanted.without(Pid).without(Net).without(Uts).without(Ipc),
        Namespaces::NONE,
    ];
    let mut attempts: Vec<Namespaces> = Vec::new();
    for candidate in candidates {
        // A PID namespace without a mount namespace could not get its own /proc.
        let candidate = if candidate.contains(Pid) && !candidate.contains(Mount) {
            candidate.without(Pid)
        } else {
            candidate
        };
        if !attempts.contains(&candidate) {
            attempts.push(candidate);
        }
    }
    attempts
}

/// Enters the strongest combination of `wanted` the kernel allows, adding a user namespace
/// when the process lacks `CAP_SYS_ADMIN` (or, if `privileged_user` allows, when the
/// kernel refuses the namespaces without one). The calling process must be
/// single-threaded. `CLONE_NEWPID` only affects children created afterwards.
///
/// Returns what was entered. An error means a user namespace was entered but its id maps
/// could not be written: the process is then unusable and must not go on.
pub fn enter(
    wanted: Namespaces,
    privileged_user: PrivilegedUserNamespace,
) -> io::Result<Namespaces> {
    let wanted = wanted.without(Namespace::User);
    if wanted == Namespaces::NONE {
        return Ok(Namespaces::NONE);
    }
    let privileged = capabilities::has_effective(capabilities::CAP_SYS_ADMIN);
    for attempt in attempts(wanted) {
        if attempt == Namespaces::NONE {
            break;
        }
        let mut tries = Vec::with_capacity(2);
        if privileged {
            tries.push(attempt);
            if privileged_user == PrivilegedUserNamespace::Allowed {
                tries.push(attempt.with(Namespace::User));
            }
        } else {
            tries.push(attempt.with(Namespace::User));
        }
        for set in tries {
            if unshare(set).is_ok() {
                if set.contains(Namespace::User) {
                    map_ids_to_themselves()?;
                }
                return Ok(set);
            }
        }
    }
    Ok(Namespaces::NONE)
}

fn unshare(set: Namespaces) -> io::Result<()> {
    // SAFETY: unshare takes flags only and affects this (single-threaded) process.
    if unsafe { libc::unshare(set.clone_flags()) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Maps the caller's uid and gid to themselves in the user namespace it just entered
/// (`setgroups` denied first, as the kernel requires of an unprivileged writer).
///
/// The server marks itself non-dumpable, which makes `/proc/self/*` owned by root and
/// unwritable for an unprivileged helper; the helper holds no secrets, so it becomes
/// dumpable for the writes and returns to its previous state after.
fn map_ids_to_themselves() -> io::Result<()> {
    // SAFETY: these calls take integer arguments and act on this process only.
    let (uid, gid, dumpable) = unsafe {
        (
            libc::getuid(),
            libc::getgid(),
            libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0),
        )
    };
    if dumpable != 1 {
        // SAFETY: as above.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    }
    let result = (|| {
        std::fs::write("/proc/self/setgroups", "deny")?;
        std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))
    })();
    if dumpable == 0 {
        // SAFETY: as above.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use Namespace::*;

    #[test]
    fn sets_travel_as_lists_of_names() {
        let set = Namespaces::of(&[Pid, Mount, Net]);
        assert_eq!(
            serde_json::to_string(&set).unwrap(),
            r#"["pid","mount","net"]"#
        );
        let back: Namespaces = serde_json::from_str(r#"["net","mount","pid"]"#).unwrap();
        assert_eq!(back, set);
        assert!(set.contains(Pid) && !set.contains(Uts));
        assert_eq!(
            set.clone_flags(),
            libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWNET
        );
    }

    #[test]
    fn fallbacks_keep_pid_and_mount_longest_and_never_pid_alone() {
        let wanted = Namespaces::of(&[Pid, Mount, Uts, Ipc, Net]);
        assert_eq!(
            attempts(wanted),
            [
                wanted,
                Namespaces::of(&[Pid, Mount, Uts, Ipc]),
                Namespaces::of(&[Pid, Mount]),
                Namespaces::of(&[Mount, Uts, Ipc, Net]),
                Namespaces::of(&[Mount, Uts, Ipc]),
                Namespaces::of(&[Mount]),
                Namespaces::NONE,
            ]
        );
        assert_eq!(
            attempts(Namespaces::of(&[Uts, Ipc])),
            [Namespaces::of(&[Uts, Ipc]), Namespaces::NONE]
        );
        for attempt in attempts(Namespaces::of(&[Pid, Uts])) {
            assert!(!attempt.contains(Pid), "{attempt:?}");
        }
    }
}

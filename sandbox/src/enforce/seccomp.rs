//! The seccomp filter of both helpers (SANDBOX.md §5.3): a deny list of system calls that
//! fail with `EPERM`, everything else allowed, other ABIs killed by the architecture check;
//! and `clone3` answered with `ENOSYS`, so that libc falls back to `clone`, whose flags the
//! filter can inspect (`clone3` passes them in memory).
//!
//! The numbers are tabled per architecture (not taken from `libc::SYS_*`, which only knows
//! the host) so that the rule set of either architecture can be built and tested anywhere;
//! a unit test checks the host's column against `libc`. The program itself is laid out by
//! [`super::bpf`] and installed with seccompiler.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, TargetArch};

pub(crate) use super::bpf::Condition;
use super::bpf::{self, Rule};

/// The rule groups of §5.3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Group {
    /// Network: only when the policy restricts it.
    Network,
    /// Inspection of other processes and io_uring: always.
    Inspection,
    /// Kernel-level escapes for root workloads: always.
    Kernel,
    /// `truncate(2)`: only below Landlock ABI 3, which cannot refuse it on a path.
    Truncate,
    /// What a confined process has no business with: keyrings, mounts, namespaces, the
    /// kernel log, clocks, handles to other processes' files: always.
    Containment,
    /// `sethostname`, `setdomainname`: unless the process has a UTS namespace of its own.
    HostName,
}

/// One denied system call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeniedCall {
    pub name: &'static str,
    pub group: Group,
    pub x86_64: Option<i64>,
    pub aarch64: Option<i64>,
    pub condition: Condition,
}

const fn call(name: &'static str, group: Group, x86_64: i64, aarch64: i64) -> DeniedCall {
    DeniedCall {
        name,
        group,
        x86_64: Some(x86_64),
        aarch64: Some(aarch64),
        condition: Condition::Always,
    }
}

/// The table of §5.3: name, group, x86_64 number, aarch64 number.
pub(crate) const DENIED_CALLS: &[DeniedCall] = &[
    call("connect", Group::Network, 42, 203),
    call("accept", Group::Network, 43, 202),
    call("accept4", Group::Network, 288, 242),
    call("bind", Group::Network, 49, 200),
    call("listen", Group::Network, 50, 201),
    call("getpeername", Group::Network, 52, 205),
    call("getsockname", Group::Network, 51, 204),
    call("shutdown", Group::Network, 48, 210),
    call("sendto", Group::Network, 44, 206),
    call("sendmmsg", Group::Network, 307, 269),
    call("recvmmsg", Group::Network, 299, 243),
    call("getsockopt", Group::Network, 55, 209),
    call("setsockopt", Group::Network, 54, 208),
    DeniedCall {
        condition: Condition::UnlessUnixStream,
        ..call("socket", Group::Network, 41, 198)
    },
    DeniedCall {
        condition: Condition::UnlessUnixStream,
        ..call("socketpair", Group::Network, 53, 199)
    },
    call("ptrace", Group::Inspection, 101, 117),
    call("process_vm_readv", Group::Inspection, 310, 270),
    call("process_vm_writev", Group::Inspection, 311, 271),
    call("io_uring_setup", Group::Inspection, 425, 425),
    call("io_uring_enter", Group::Inspection, 426, 426),
    call("io_uring_register", Group::Inspection, 427, 427),
    call("init_module", Group::Kernel, 175, 105),
    call("finit_module", Group::Kernel, 313, 273),
    call("delete_module", Group::Kernel, 176, 106),
    call("kexec_load", Group::Kernel, 246, 104),
    call("kexec_file_load", Group::Kernel, 320, 294),
    call("bpf", Group::Kernel, 321, 280),
    call("perf_event_open", Group::Kernel, 298, 241),
    call("open_by_handle_at", Group::Kernel, 304, 265),
    call("reboot", Group::Kernel, 169, 142),
    call("swapon", Group::Kernel, 167, 224),
    call("swapoff", Group::Kernel, 168, 225),
    DeniedCall {
        aarch64: None,
        ..call("iopl", Group::Kernel, 172, 0)
    },
    DeniedCall {
        aarch64: None,
        ..call("ioperm", Group::Kernel, 173, 0)
    },
    call("truncate", Group::Truncate, 76, 45),
    call("keyctl", Group::Containment, 250, 219),
    call("add_key", Group::Containment, 248, 217),
    call("request_key", Group::Containment, 249, 218),
    call("mount", Group::Containment, 165, 40),
    call("umount2", Group::Containment, 166, 39),
    call("pivot_root", Group::Containment, 155, 41),
    call("move_mount", Group::Containment, 429, 429),
    call("open_tree", Group::Containment, 428, 428),
    call("fsopen", Group::Containment, 430, 430),
    call("fsconfig", Group::Containment, 431, 431),
    call("fsmount", Group::Containment, 432, 432),
    call("fspick", Group::Containment, 433, 433),
    call("mount_setattr", Group::Containment, 442, 442),
    call("setns", Group::Containment, 308, 268),
    call("unshare", Group::Containment, 272, 97),
    call("syslog", Group::Containment, 103, 116),
    call("acct", Group::Containment, 163, 89),
    call("quotactl", Group::Containment, 179, 60),
    call("userfaultfd", Group::Containment, 323, 282),
    call("settimeofday", Group::Containment, 164, 170),
    call("clock_settime", Group::Containment, 227, 112),
    call("clock_adjtime", Group::Containment, 305, 266),
    call("adjtimex", Group::Containment, 159, 171),
    call("vhangup", Group::Containment, 153, 58),
    call("pidfd_getfd", Group::Containment, 438, 438),
    call("kcmp", Group::Containment, 312, 272),
    call("fanotify_init", Group::Containment, 300, 262),
    call("name_to_handle_at", Group::Containment, 303, 264),
    DeniedCall {
        condition: Condition::NewUserNamespace,
        ..call("clone", Group::Containment, 56, 220)
    },
    call("sethostname", Group::HostName, 170, 161),
    call("setdomainname", Group::HostName, 171, 162),
];

/// `clone3`, answered with `ENOSYS` (group C).
pub(crate) const CLONE3: DeniedCall = call("clone3", Group::Containment, 435, 435);

/// Bit that marks an x32 system call number on x86_64.
const X32_SYSCALL_BIT: i64 = 0x4000_0000;

/// x32-only numbers of denied calls whose x32 entry differs from the x86_64 one.
const X32_ONLY: &[(&str, i64)] = &[
    ("ptrace", 521),
    ("kexec_load", 528),
    ("recvmmsg", 537),
    ("sendmmsg", 538),
    ("process_vm_readv", 539),
    ("process_vm_writev", 540),
    ("setsockopt", 541),
    ("getsockopt", 542),
];

/// Which groups apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FilterScope {
    pub network: NetworkFilter,
    /// The effective Landlock ABI (0 when unavailable).
    pub landlock_abi: i32,
    /// The process has a UTS namespace of its own: renaming the host is harmless there.
    pub private_uts: bool,
}

/// What the filter does about the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NetworkFilter {
    /// Nothing: the process has the host's network.
    Open,
    /// The §5.3 network calls are denied; only UNIX stream sockets can be made.
    Restricted,
    /// The managed network (CODEX-NETWORK.md §3.5): the process's own network namespace,
    /// where only the proxy listens, is the confinement. IP sockets may be made and used
    /// there; UNIX sockets may not be made (only `socketpair`'s stream kind), since one
    /// reaches host sockets by path.
    Managed,
}

impl FilterScope {
    fn includes(self, group: Group) -> bool {
        match group {
            Group::Network => self.network == NetworkFilter::Restricted,
            Group::Inspection | Group::Kernel | Group::Containment => true,
            Group::Truncate => self.landlock_abi < 3,
            Group::HostName => !self.private_uts,
        }
    }
}

/// The architecture the helpers run on, if it has a table.
pub(crate) fn host_arch() -> Option<TargetArch> {
    match std::env::consts::ARCH {
        "x86_64" => Some(TargetArch::x86_64),
        "aarch64" => Some(TargetArch::aarch64),
        _ => None,
    }
}

/// The number of `call` on `arch`, if it exists there.
fn number(call: &DeniedCall, arch: TargetArch) -> Option<i64> {
    match arch {
        TargetArch::x86_64 => call.x86_64,
        TargetArch::aarch64 => call.aarch64,
        _ => None,
    }
}

/// `number` and, on x86_64, every x32 number of the same call.
fn numbers(call: &DeniedCall, arch: TargetArch, number: i64) -> Vec<i64> {
    let mut numbers = vec![number];
    if arch == TargetArch::x86_64 {
        numbers.push(X32_SYSCALL_BIT | number);
        for (_, x32) in X32_ONLY.iter().filter(|(name, _)| *name == call.name) {
            numbers.push(X32_SYSCALL_BIT | x32);
        }
    }
    numbers
}

/// The denied numbers with their conditions, for `arch` (without `clone3`).
pub(crate) fn rules(arch: TargetArch, scope: FilterScope) -> BTreeMap<i64, Condition> {
    let mut rules = BTreeMap::new();
    let mut add = |denied: &DeniedCall| {
        let Some(number) = number(denied, arch) else {
            return;
        };
        for number in numbers(denied, arch, number) {
            rules.insert(number, denied.condition);
        }
    };
    DENIED_CALLS
        .iter()
        .filter(|d| scope.includes(d.group))
        .for_each(&mut add);
    if scope.network == NetworkFilter::Managed {
        MANAGED_NETWORK_CALLS.iter().for_each(&mut add);
    }
    rules
}

/// The socket calls limited under the managed network: `socket` to IP, `socketpair` to
/// UNIX streams.
const MANAGED_NETWORK_CALLS: &[DeniedCall] = &[
    DeniedCall {
        condition: Condition::UnlessInet,
        ..call("socket", Group::Network, 41, 198)
    },
    DeniedCall {
        condition: Condition::UnlessUnixStream,
        ..call("socketpair", Group::Network, 53, 199)
    },
];

/// The numbers of `clone3` on `arch`.
pub(crate) fn clone3_numbers(arch: TargetArch) -> Vec<i64> {
    number(&CLONE3, arch)
        .map(|n| numbers(&CLONE3, arch, n))
        .unwrap_or_default()
}

/// `AUDIT_ARCH_*` of `arch`.
pub(crate) fn audit_arch(arch: TargetArch) -> Option<u32> {
    match arch {
        TargetArch::x86_64 => Some(0xc000_003e),
        TargetArch::aarch64 => Some(0xc000_00b7),
        _ => None,
    }
}

/// Compiles the filter for `arch`.
pub(crate) fn compile(arch: TargetArch, scope: FilterScope) -> Result<BpfProgram, String> {
    let audit = audit_arch(arch).ok_or("no seccomp filter table for this architecture")?;
    let as_number = |n: i64| u32::try_from(n).map_err(|_| format!("bad system call number {n}"));
    let mut denied = Vec::new();
    for (number, condition) in rules(arch, scope) {
        denied.push(Rule {
            number: as_number(number)?,
            condition,
            errno: libc::EPERM,
        });
    }
    for number in clone3_numbers(arch) {
        denied.push(Rule {
            number: as_number(number)?,
            condition: Condition::Always,
            errno: libc::ENOSYS,
        });
    }
    bpf::program(audit, &denied)
}

/// Installs the filter on the calling thread (`no_new_privs` must already be set).
pub(crate) fn install(scope: FilterScope) -> Result<(), String> {
    let arch = host_arch()
        .ok_or_else(|| format!("no seccomp filter table for {}", std::env::consts::ARCH))?;
    let program = compile(arch, scope)?;
    seccompiler::apply_filter(&program).map_err(|e| e.to_string())
}

#[cfg(test)]
#[path = "seccomp_tests.rs"]
mod tests;

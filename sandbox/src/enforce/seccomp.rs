//! The seccomp filter of both helpers (SANDBOX.md §5.3): a deny list of system calls that
//! fail with `EPERM`, everything else allowed, other ABIs killed by the architecture check.
//!
//! The numbers are tabled per architecture (not taken from `libc::SYS_*`, which only knows
//! the host) so that the rule set of either architecture can be built and tested anywhere;
//! a unit test checks the host's column against `libc`.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

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
}

/// One denied system call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeniedCall {
    pub name: &'static str,
    pub group: Group,
    pub x86_64: Option<i64>,
    pub aarch64: Option<i64>,
    /// Denied only when argument 0 (the socket domain) is not `AF_UNIX`.
    pub unless_af_unix: bool,
}

const fn call(name: &'static str, group: Group, x86_64: i64, aarch64: i64) -> DeniedCall {
    DeniedCall {
        name,
        group,
        x86_64: Some(x86_64),
        aarch64: Some(aarch64),
        unless_af_unix: false,
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
        unless_af_unix: true,
        ..call("socket", Group::Network, 41, 198)
    },
    DeniedCall {
        unless_af_unix: true,
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
];

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
    pub network_restricted: bool,
    /// The effective Landlock ABI (0 when unavailable).
    pub landlock_abi: i32,
}

impl FilterScope {
    fn includes(self, group: Group) -> bool {
        match group {
            Group::Network => self.network_restricted,
            Group::Inspection | Group::Kernel => true,
            Group::Truncate => self.landlock_abi < 3,
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

/// The denied numbers with their conditions, for `arch`.
pub(crate) fn rules(arch: TargetArch, scope: FilterScope) -> BTreeMap<i64, Vec<SeccompRule>> {
    let mut rules = BTreeMap::new();
    for denied in DENIED_CALLS.iter().filter(|d| scope.includes(d.group)) {
        let number = match arch {
            TargetArch::x86_64 => denied.x86_64,
            TargetArch::aarch64 => denied.aarch64,
            _ => None,
        };
        let Some(number) = number else { continue };
        let chain = || {
            if denied.unless_af_unix {
                vec![not_af_unix()]
            } else {
                Vec::new()
            }
        };
        rules.insert(number, chain());
        if arch == TargetArch::x86_64 {
            rules.insert(X32_SYSCALL_BIT | number, chain());
            for (_, x32) in X32_ONLY.iter().filter(|(name, _)| *name == denied.name) {
                rules.insert(X32_SYSCALL_BIT | x32, chain());
            }
        }
    }
    rules
}

/// Matches when argument 0, as a 32-bit value, is not `AF_UNIX`.
fn not_af_unix() -> SeccompRule {
    let condition = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Ne,
        libc::AF_UNIX as u64,
    )
    .expect("argument 0 is a valid argument index");
    SeccompRule::new(vec![condition]).expect("a rule with one condition is valid")
}

/// Compiles the filter for `arch`.
pub(crate) fn compile(arch: TargetArch, scope: FilterScope) -> Result<BpfProgram, String> {
    let filter = SeccompFilter::new(
        rules(arch, scope),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    BpfProgram::try_from(filter).map_err(|e| e.to_string())
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

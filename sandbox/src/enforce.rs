//! Enforcement inside the helpers (SANDBOX.md §5.1–§5.4, §5.8, §6.2): `no_new_privs`, the
//! seccomp filter, the Landlock ruleset and the capability drop, applied in that order on
//! the helper's only thread; and the server's cached capability probe.
//!
//! * `seccomp` — the deny list per architecture and its installation (§5.3);
//! * `bpf` — the compact BPF program of a deny list;
//! * `ruleset` — the Landlock ruleset (§5.4);
//! * [`namespaces`] — the namespaces the helpers enter before these layers (§5.8);
//! * [`capabilities`] — the capability drop (§5.8).

use std::sync::OnceLock;

use crate::policy::{Enforcement, Network, SandboxPolicy};

#[cfg(target_os = "linux")]
pub(crate) mod bpf;
#[cfg(target_os = "linux")]
pub mod capabilities;
#[cfg(target_os = "linux")]
pub mod namespaces;
#[cfg(target_os = "linux")]
pub(crate) mod ruleset;
#[cfg(target_os = "linux")]
pub(crate) mod seccomp;

#[cfg(target_os = "linux")]
pub use namespaces::{Namespace, Namespaces};
#[cfg(target_os = "linux")]
pub use ruleset::LandlockState;

/// How far Landlock is in force (non-Linux hosts never enforce it).
#[cfg(not(target_os = "linux"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockState {
    FullyEnforced,
    PartiallyEnforced,
    NotEnforced,
}

/// Which helper enforces: they differ in device rules and the network (§5.4.3, §8.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelperKind {
    /// The fs helper: network always restricted, `/dev/null` only.
    FsHelper,
    /// The sandbox launcher of `process/start`.
    Launcher,
}

/// What the enforcement achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnforcementReport {
    pub no_new_privs: bool,
    pub seccomp: bool,
    pub landlock: LandlockState,
    /// The kernel's Landlock ABI (0: unavailable).
    pub landlock_abi: i32,
    /// The capabilities were dropped (all, or all but the fs helper's file access).
    pub capabilities_dropped: bool,
    /// What could not be applied, for the best-effort warning.
    pub missing: Vec<String>,
}

impl EnforcementReport {
    /// True when every layer is in force.
    pub fn is_complete(&self) -> bool {
        self.missing.is_empty()
    }

    /// Landlock holds the filesystem boundary.
    pub fn landlock_enforced(&self) -> bool {
        self.landlock != LandlockState::NotEnforced
    }
}

/// In `require` mode some layer could not be applied; the request fails closed (§6.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unenforceable {
    pub report: EnforcementReport,
}

/// Applies §5.1 steps 1–3 and the capability drop of §5.8 to the calling thread. In
/// `require` mode any missing layer is an error; in `best-effort` mode whatever works is
/// applied and the rest is reported. `private_uts` says whether the caller entered a UTS
/// namespace of its own (then renaming the host name is harmless and allowed).
/// `managed_ports` (the launcher of a managed-network process, in its own network
/// namespace): IP sockets are allowed and TCP connects only to these ports, the proxy's.
///
/// The caller must be single-threaded: threads that already exist escape both seccomp and
/// Landlock.
pub fn apply(
    policy: &SandboxPolicy,
    kind: HelperKind,
    enforcement: Enforcement,
    private_uts: bool,
    managed_ports: &[u16],
) -> Result<EnforcementReport, Unenforceable> {
    let report = apply_layers(policy, kind, private_uts, managed_ports);
    if enforcement == Enforcement::Require && !report.is_complete() {
        return Err(Unenforceable { report });
    }
    Ok(report)
}

#[cfg(target_os = "linux")]
fn apply_layers(
    policy: &SandboxPolicy,
    kind: HelperKind,
    private_uts: bool,
    managed_ports: &[u16],
) -> EnforcementReport {
    let mut missing = Vec::new();
    // Read while /proc is certainly still visible (Landlock may hide it).
    let last_cap = capabilities::last_cap();
    let no_new_privs = set_no_new_privs();
    if !no_new_privs {
        missing.push("no_new_privs".to_owned());
    }
    // The filter is installed before the ruleset, so the ABI comes from the version query.
    let landlock_abi = landlock_abi_query();
    let network = match (kind, policy.network) {
        (HelperKind::Launcher, Network::Restricted) if !managed_ports.is_empty() => {
            seccomp::NetworkFilter::Managed
        }
        (HelperKind::Launcher, Network::Enabled) => seccomp::NetworkFilter::Open,
        _ => seccomp::NetworkFilter::Restricted,
    };
    let seccomp = no_new_privs
        && seccomp::install(seccomp::FilterScope {
            network,
            landlock_abi,
            private_uts,
        })
        .map_err(|e| missing.push(format!("seccomp filter ({e})")))
        .is_ok();
    if !no_new_privs {
        missing.push("seccomp filter (needs no_new_privs)".to_owned());
    }
    let outcome = ruleset::restrict_self(policy, kind, managed_ports);
    if let Some(reason) = outcome.reason {
        missing.push(format!("Landlock ({reason})"));
    }
    let keep: &[u32] = match kind {
        HelperKind::FsHelper => capabilities::FS_HELPER_KEEPS,
        HelperKind::Launcher => &[],
    };
    let capabilities_dropped = capabilities::drop_all_except(keep, last_cap)
        .map_err(|e| missing.push(format!("capability drop ({e})")))
        .is_ok();
    EnforcementReport {
        no_new_privs,
        seccomp,
        landlock: outcome.state,
        landlock_abi,
        capabilities_dropped,
        missing,
    }
}

#[cfg(not(target_os = "linux"))]
fn apply_layers(
    _policy: &SandboxPolicy,
    _kind: HelperKind,
    _private_uts: bool,
    _managed_ports: &[u16],
) -> EnforcementReport {
    EnforcementReport {
        no_new_privs: false,
        seccomp: false,
        landlock: LandlockState::NotEnforced,
        landlock_abi: 0,
        capabilities_dropped: false,
        missing: vec![format!("every layer (not Linux: {})", std::env::consts::OS)],
    }
}

#[cfg(target_os = "linux")]
fn set_no_new_privs() -> bool {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only and affects this thread.
    unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 }
}

/// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`: the kernel's ABI,
/// 0 when Landlock is missing, disabled or its system calls are blocked.
#[cfg(target_os = "linux")]
pub fn landlock_abi_query() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer and size 0 the call only returns the version.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(abi.max(0)).unwrap_or(i32::MAX)
}

#[cfg(not(target_os = "linux"))]
pub fn landlock_abi_query() -> i32 {
    0
}

/// The server's capability probe (§6.2): the Landlock ABI, queried once per process.
pub fn landlock_abi() -> i32 {
    static ABI: OnceLock<i32> = OnceLock::new();
    *ABI.get_or_init(landlock_abi_query)
}

/// Whether this host has a seccomp filter table for its architecture.
pub fn seccomp_supported() -> bool {
    #[cfg(target_os = "linux")]
    {
        seccomp::host_arch().is_some()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// What the probe says is missing on this host (empty: everything can be enforced).
pub fn probe_missing() -> Vec<String> {
    let mut missing = Vec::new();
    if !cfg!(target_os = "linux") {
        missing.push(format!("every layer (not Linux: {})", std::env::consts::OS));
        return missing;
    }
    if !seccomp_supported() {
        missing.push(format!(
            "seccomp filter (no table for {})",
            std::env::consts::ARCH
        ));
    }
    if landlock_abi() == 0 {
        missing.push("Landlock (not available in this kernel)".to_owned());
    }
    missing
}

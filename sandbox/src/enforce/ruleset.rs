//! The Landlock ruleset of both helpers (SANDBOX.md §5.4): every filesystem right of the
//! newest ABI this crate knows is handled (best effort, so a kernel with an older ABI drops
//! what it lacks), read and write roots from the policy, fixed device rules, and — when the
//! network is restricted — TCP rights and the abstract-socket scope; the signal scope always.

use std::borrow::Cow;
use std::path::Path;

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, LandlockStatus, NetPort,
    PathBeneath, PathFd, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use super::HelperKind;
use crate::policy::{Network, Readable, SandboxPolicy};

/// Newest ABI the pinned crate knows; bumped deliberately.
const TARGET: ABI = ABI::V9;

/// How far Landlock is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockState {
    FullyEnforced,
    PartiallyEnforced,
    NotEnforced,
}

/// The outcome of [`restrict_self`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LandlockOutcome {
    pub state: LandlockState,
    /// Why it is not enforced, when it is not.
    pub reason: Option<&'static str>,
}

fn read_rights() -> BitFlags<AccessFs> {
    AccessFs::Execute | AccessFs::ReadFile | AccessFs::ReadDir
}

fn write_rights() -> BitFlags<AccessFs> {
    AccessFs::from_all(TARGET) & !(AccessFs::MakeChar | AccessFs::MakeBlock)
}

/// Every rule of the ruleset: a path and the rights on it (before the file-only cut).
pub(crate) fn rules(
    policy: &SandboxPolicy,
    kind: HelperKind,
) -> Vec<(Cow<'_, Path>, BitFlags<AccessFs>)> {
    let mut read = read_rights();
    if kind == HelperKind::Launcher && policy.network == Network::Enabled {
        read |= AccessFs::ResolveUnix;
    }
    let fixed = |path: &'static str| Cow::Borrowed(Path::new(path));
    let mut rules: Vec<(Cow<'_, Path>, BitFlags<AccessFs>)> = match &policy.readable {
        Readable::All => vec![(fixed("/"), read)],
        Readable::Roots(roots) => roots
            .iter()
            .map(|r| (Cow::from(r.as_path()), read))
            .collect(),
    };
    rules.extend(
        policy
            .writable
            .iter()
            .map(|w| (Cow::from(w.as_path()), write_rights())),
    );
    let read_write_device =
        AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
    rules.push((fixed("/dev/null"), read_write_device));
    if kind == HelperKind::Launcher {
        for device in ["/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"] {
            rules.push((fixed(device), AccessFs::ReadFile.into()));
        }
        let terminal = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
        rules.push((fixed("/dev/tty"), terminal));
        rules.push((fixed("/dev/ptmx"), terminal));
        // Only the process's own terminal: `/dev/pts` as a whole holds every other
        // session's terminals (and the host's), which it could read and write.
        if let Some(own) = crate::narrow::own_terminal_name() {
            rules.push((Cow::Owned(Path::new("/dev/pts").join(own)), terminal));
        }
        // Only a private `/dev/shm` (`narrow::mount_minimal_dev` makes one): the host's is
        // shared with every other process.
        if crate::narrow::has_private_shm() {
            rules.push((fixed("/dev/shm"), write_rights()));
        }
    }
    rules
}

/// Builds the ruleset and restricts the calling thread. Paths that do not exist are
/// skipped; an error or an unsupported kernel is reported as not enforced.
/// With `managed_ports`, TCP connects are allowed to those ports only (the managed
/// network's proxy).
pub(crate) fn restrict_self(
    policy: &SandboxPolicy,
    kind: HelperKind,
    managed_ports: &[u16],
) -> LandlockOutcome {
    match try_restrict_self(policy, kind, managed_ports) {
        Ok(outcome) => outcome,
        Err(_) => LandlockOutcome {
            state: LandlockState::NotEnforced,
            reason: Some("the Landlock ruleset could not be applied"),
        },
    }
}

fn try_restrict_self(
    policy: &SandboxPolicy,
    kind: HelperKind,
    managed_ports: &[u16],
) -> Result<LandlockOutcome, landlock::RulesetError> {
    let restrict_network = policy.network == Network::Restricted;
    let mut ruleset = landlock::Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(TARGET))?;
    if restrict_network {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(TARGET))?
            .scope(Scope::AbstractUnixSocket)?;
    }
    ruleset = ruleset.scope(Scope::Signal)?;
    let mut created = ruleset.create()?;
    for (path, rights) in rules(policy, kind) {
        let Ok(fd) = PathFd::new(&path) else {
            // It may be created later by an allowed parent.
            continue;
        };
        let rights = if std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            rights
        } else {
            rights & AccessFs::from_file(TARGET)
        };
        created = created.add_rule(PathBeneath::new(fd, rights))?;
    }
    if restrict_network {
        for port in managed_ports {
            created = created.add_rule(NetPort::new(*port, AccessNet::ConnectTcp))?;
        }
    }
    let status = created.restrict_self()?;
    let state = match status.ruleset {
        RulesetStatus::FullyEnforced => LandlockState::FullyEnforced,
        RulesetStatus::PartiallyEnforced => LandlockState::PartiallyEnforced,
        RulesetStatus::NotEnforced => LandlockState::NotEnforced,
    };
    Ok(match (state, status.no_new_privs, status.landlock) {
        (LandlockState::NotEnforced, _, LandlockStatus::NotEnabled) => LandlockOutcome {
            state,
            reason: Some("Landlock is not enabled in this kernel"),
        },
        (LandlockState::NotEnforced, _, _) => LandlockOutcome {
            state,
            reason: Some("Landlock is not supported by this kernel"),
        },
        (_, false, _) => LandlockOutcome {
            state: LandlockState::NotEnforced,
            reason: Some("no_new_privs is not set"),
        },
        (state, true, _) => LandlockOutcome {
            state,
            reason: None,
        },
    })
}

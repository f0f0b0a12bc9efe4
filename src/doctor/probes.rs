//! The host checks of `doctor`: kernel facilities the sandbox uses, the limits the server
//! runs under, and the clock.

use std::os::unix::process::CommandExt;
use std::process::Command;

use exec_server_sandbox::enforce::{landlock_abi_query, seccomp_supported};
use rustix::thread::UnshareFlags;

use super::Finding;

/// The Landlock ABI with every feature the sandbox uses (scoped signals and abstract
/// sockets arrived in 6).
const FULL_LANDLOCK_ABI: i32 = 6;
/// The descriptor limit the operations guide recommends (`LimitNOFILE=`).
const RECOMMENDED_NOFILE: u64 = 65_536;

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|text| text.trim().to_owned())
}

pub(super) fn kernel() -> Finding {
    let release = read("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into());
    Finding::ok(
        "kernel",
        format!("Linux {release} on {}", std::env::consts::ARCH),
    )
}

pub(super) fn landlock(require: bool) -> Finding {
    let abi = landlock_abi_query();
    match abi {
        0 => Finding::missing_layer(
            "landlock",
            "not available: files are not confined by the kernel. Fix: Linux 5.13 or later with CONFIG_SECURITY_LANDLOCK, and `landlock` in the lsm= boot parameter".into(),
            require,
        ),
        abi if abi < FULL_LANDLOCK_ABI => Finding::warn(
            "landlock",
            format!("ABI {abi}: files are confined, but features of later ABIs are missing (6 scopes signals and abstract sockets to the sandbox). Fix: a newer kernel"),
        ),
        abi => Finding::ok(
            "landlock",
            format!("ABI {abi}: reads, writes, device ioctls, signals and abstract sockets are confined"),
        ),
    }
}

pub(super) fn seccomp(require: bool) -> Finding {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let in_kernel = status.lines().any(|l| l.starts_with("Seccomp:"));
    if seccomp_supported() && in_kernel {
        Finding::ok(
            "seccomp",
            "filters available: sandboxed processes and helpers get the system-call filter",
        )
    } else {
        Finding::missing_layer(
            "seccomp",
            format!(
                "not available (kernel support: {in_kernel}, filter table for {}: {})",
                std::env::consts::ARCH,
                seccomp_supported()
            ),
            require,
        )
    }
}

/// The namespaces a sandboxed process gets, each tried in a short-lived child (as root
/// directly, otherwise inside a new user namespace, as the launcher does).
pub(super) fn namespaces(require: bool) -> Vec<Finding> {
    let root = rustix::process::geteuid().is_root();
    let kinds = [
        (
            "userns",
            UnshareFlags::NEWUSER,
            "an unprivileged user of its own",
        ),
        (
            "pidns",
            UnshareFlags::NEWPID,
            "its own process tree (it cannot see or signal the host's)",
        ),
        (
            "mountns",
            UnshareFlags::NEWNS,
            "its own mount table (denied paths are hidden)",
        ),
        (
            "netns",
            UnshareFlags::NEWNET,
            "no network unless the policy grants it",
        ),
    ];
    kinds
        .into_iter()
        .map(|(name, flag, gives)| {
            let flags = if root || flag == UnshareFlags::NEWUSER {
                flag
            } else {
                flag | UnshareFlags::NEWUSER
            };
            match try_unshare(flags) {
                Ok(()) => Finding::ok(name, format!("available: a sandboxed process gets {gives}")),
                Err(error) => Finding::missing_layer(
                    name,
                    format!("refused ({error}){}", why_refused()),
                    require,
                ),
            }
        })
        .collect()
}

/// `unshare(flags)` in a child that then runs `/bin/true`: the error of the child's
/// `unshare`, if it failed.
fn try_unshare(flags: UnshareFlags) -> std::io::Result<()> {
    let mut child = Command::new("/bin/true");
    // SAFETY: the hook runs in the forked child before exec and only makes the unshare
    // system call, which allocates nothing and takes no lock.
    unsafe {
        child.pre_exec(move || rustix::thread::unshare_unsafe(flags).map_err(std::io::Error::from));
    }
    child.status().map(drop)
}

/// The host settings that refuse unprivileged namespaces, when one of them is set.
fn why_refused() -> String {
    let knobs = [
        ("/proc/sys/kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone = 0"),
        ("/proc/sys/user/max_user_namespaces", "0", "user.max_user_namespaces = 0"),
        ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1", "kernel.apparmor_restrict_unprivileged_userns = 1 (an AppArmor profile for exec-server allows it)"),
    ];
    let set: Vec<&str> = knobs
        .iter()
        .filter(|(path, value, _)| read(path).as_deref() == Some(*value))
        .map(|(_, _, text)| *text)
        .collect();
    if set.is_empty() {
        ". A container runtime's seccomp profile may forbid unshare: run with one that allows it"
            .into()
    } else {
        format!(". Fix: {}", set.join("; "))
    }
}

pub(super) fn openat2() -> Finding {
    use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};
    match rustix::fs::openat2(CWD, ".", OFlags::PATH | OFlags::CLOEXEC, Mode::empty(), ResolveFlags::BENEATH) {
        Ok(_) => Finding::ok("openat2", "available: paths are resolved by the kernel beneath their roots"),
        Err(error) => Finding::warn(
            "openat2",
            format!("unavailable ({error}): fs requests that must stay beneath a root are refused. Fix: Linux 5.6 or later"),
        ),
    }
}

pub(super) fn open_files() -> Finding {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    let text = format!(
        "open-file limit {} (hard {})",
        limit.current.map_or("unlimited".into(), |n| n.to_string()),
        limit.maximum.map_or("unlimited".into(), |n| n.to_string())
    );
    if hard < RECOMMENDED_NOFILE {
        Finding::warn("open files", format!("{text}: each connection and process holds descriptors; the server refuses work past the limit. Fix: LimitNOFILE={RECOMMENDED_NOFILE} (systemd) or ulimit -n"))
    } else {
        Finding::ok(
            "open files",
            format!("{text}: room for thousands of connections and processes"),
        )
    }
}

/// The task and memory limits of this process's cgroup (v2), which bound what managed
/// processes start themselves.
pub(super) fn cgroup_limits() -> Vec<Finding> {
    let Some(dir) = own_cgroup() else {
        return vec![Finding::warn("cgroup", "no cgroup v2 path for this process: nothing bounds what managed processes start. Fix: run under systemd with TasksMax= and MemoryMax=")];
    };
    if dir == "/sys/fs/cgroup" {
        return vec![Finding::warn("cgroup", "this process is in the root cgroup, which has no task or memory limit: a fork bomb or a runaway build in a managed process is bounded only by the host. Fix: run it as a unit with TasksMax= and MemoryMax= (deploy/systemd)")];
    }
    [("tasks", "pids.max", "TasksMax="), ("memory", "memory.max", "MemoryMax=")]
        .into_iter()
        .map(|(name, file, setting)| match read(&format!("{dir}/{file}")) {
            Some(value) if value != "max" => Finding::ok(name, format!("{file} = {value} in {dir}: what managed processes start stops there")),
            Some(_) => Finding::warn(name, format!("{file} unlimited in {dir}: a fork bomb or a runaway build in a managed process is bounded only by the host. Fix: {setting} in the unit (deploy/systemd)")),
            None => Finding::warn(name, format!("{file} not readable in {dir}: the limit cannot be checked")),
        })
        .collect()
}

fn own_cgroup() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = text.lines().find_map(|line| line.strip_prefix("0::"))?;
    Some(format!("/sys/fs/cgroup{}", path.trim_end_matches('/')))
}

/// The clock: signed bearer tokens (`exp`, `nbf`) and the rendezvous's signed URLs depend
/// on it.
pub(super) fn clock() -> Finding {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // 2024-01-01 to 2100-01-01: anything else is a clock that was never set.
    if !(1_704_067_200..4_102_444_800).contains(&now) {
        return Finding::warn("clock", format!("reads {now} s since 1970, which is not now: signed tokens and URLs will be refused. Fix: set the clock (NTP)"));
    }
    match synchronised() {
        Some(false) => Finding::warn("clock", "not synchronised (NTP): signed tokens allow websocket.max_clock_skew_seconds of drift, then fail. Fix: enable timesyncd or chrony"),
        Some(true) => Finding::ok("clock", "set and synchronised: signed tokens and URLs are judged on time"),
        None => Finding::ok("clock", "set (whether NTP keeps it so cannot be asked here)"),
    }
}

/// Whether the kernel's clock discipline says the clock is synchronised (`adjtimex`), or
/// `None` when it cannot be asked.
fn synchronised() -> Option<bool> {
    const STA_UNSYNC: i32 = 0x0040;
    // SAFETY: timex is plain data; modes 0 only reads the kernel's state into it.
    let mut timex: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: a valid, writable timex.
    let state = unsafe { libc::adjtimex(&mut timex) };
    (state >= 0).then_some(timex.status & STA_UNSYNC == 0 && state != libc::TIME_ERROR)
}

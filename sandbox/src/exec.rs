//! The sandbox launcher of `process/start` (SANDBOX.md §8): the server's binary re-executed
//! as `<exe> --exec-server-sandbox-exec --max-request-bytes <n>`, which receives the
//! launch on a control socket (its stdin), does the child-side set-up, enters namespaces,
//! narrows mounts, confines itself and starts the target.
//!
//! With a PID namespace the launcher forks the namespace's init, which confines itself and
//! forks the target; the launcher exits with the target's status (so the server sees the
//! target's exit as the launcher's), while the init lives on as long as descendants do.
//! Without one, the launcher confines itself and `execve`s the target directly.
//!
//! * this module — the control protocol and the launcher's `main` (§8.2, §8.3);
//! * `init` — the PID namespace's init and the launcher's wait for it;
//! * `exchange` — the server's half of the control socket.

use std::collections::BTreeMap;
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use exec_server_proto::path::{parse_path, to_file_uri};
use exec_server_proto::{RpcError, StartErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::enforce::namespaces::{self, PrivilegedUserNamespace};
use crate::enforce::{self, HelperKind, LandlockState, Namespace, Namespaces};
use crate::fs_helper::DEFAULT_MAX_REQUEST_BYTES;
use crate::narrow::{self, MountNamespace, NarrowingOutcome, ProcessNarrowing};
use crate::policy::{AccessKind, Enforcement, Network, SandboxPolicy, DEFAULT_GLOB_SCAN_MAX_DEPTH};

pub mod exchange;
mod fd_passing;
mod init;
mod managed_net;

/// `argv[1]` of the sandbox launcher.
pub const SANDBOX_EXEC_ARG1: &str = "--exec-server-sandbox-exec";

/// Exit status of a launcher whose set-up failed before `execve`.
pub const EXIT_SETUP_FAILED: i32 = 125;
/// Exit status of a launcher whose `execve` failed.
pub const EXIT_EXEC_FAILED: i32 = 127;

/// The launch, sent by the server as one JSON line (§8.2 step 4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchRequest {
    pub version: u32,
    /// The resolved program, as a `file:` URI.
    pub program: String,
    /// The target's argv; `argv[0]` is already what the target should see.
    pub argv: Vec<String>,
    /// The target's complete environment.
    pub env: BTreeMap<String, String>,
    pub tty: bool,
    /// The pid the launcher's parent must have: the process keeper that started it. The
    /// launcher exits without a word if its parent is already someone else.
    pub parent_pid: u32,
    pub narrowing: ProcessNarrowing,
    /// The policy's helper JSON (§4.3); `None` for a start without a sandbox.
    pub policy: Option<Value>,
    /// Bound of deny-glob expansion for mount narrowing (§8.4).
    #[serde(default = "default_glob_depth")]
    pub glob_scan_max_depth: u32,
    /// The managed network (CODEX-NETWORK.md §3.5): ports the launcher listens on inside
    /// the target's network namespace, for the server's proxy; the target may connect to
    /// these and nothing else. Only with a policy that restricts the network.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub managed_ports: Vec<u16>,
}

fn default_glob_depth() -> u32 {
    DEFAULT_GLOB_SCAN_MAX_DEPTH
}

impl LaunchRequest {
    /// A request for `program` (absolute) under `policy`; `parent_pid` is set once the
    /// launcher's parent is known.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        program: &Path,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        tty: bool,
        narrowing: ProcessNarrowing,
        policy: Option<(&SandboxPolicy, crate::policy::Enforcement)>,
    ) -> Self {
        Self {
            version: 1,
            // Read back by the launcher's `parse_path`: byte for byte, no dot segment resolved.
            program: to_file_uri(program),
            argv,
            env,
            tty,
            parent_pid: 0,
            narrowing,
            policy: policy.map(|(policy, enforcement)| {
                serde_json::from_str(&policy.to_helper_json(enforcement))
                    .expect("the helper JSON is JSON")
            }),
            glob_scan_max_depth: policy
                .map_or(DEFAULT_GLOB_SCAN_MAX_DEPTH, |(p, _)| p.glob_scan_max_depth),
            managed_ports: Vec::new(),
        }
    }
}

/// How the sandbox was applied, reported before `execve` (§8.2 step 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchReport {
    pub landlock: LandlockReport,
    pub landlock_abi: i32,
    pub seccomp: bool,
    pub narrowing: NarrowingOutcome,
    /// The namespaces the target runs in (§5.8), besides the server's.
    #[serde(default)]
    pub namespaces: Namespaces,
    /// Which `/proc` the target sees.
    #[serde(default)]
    pub proc: ProcView,
    /// Every capability was dropped (effective, permitted, inheritable, ambient, bounding).
    #[serde(default)]
    pub capabilities_dropped: bool,
}

/// Which `/proc` a sandboxed process sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcView {
    /// A fresh `proc` of its own PID namespace: the server and other sessions' processes
    /// are not there at all.
    Private,
    /// The server's: the processes are listed, but Landlock's ptrace scope keeps their
    /// `environ`, memory and descriptors unreadable.
    #[default]
    Shared,
}

impl LaunchReport {
    /// `sandboxType` is `linuxSeccomp` exactly when Landlock is in force (§8.5).
    pub fn is_enforced(&self) -> bool {
        self.landlock != LandlockReport::NotEnforced
    }

    /// What isolation the launcher could not apply (for the server's warning), given
    /// whether the policy restricts the network.
    pub fn missing_isolation(&self, network_restricted: bool) -> Vec<String> {
        let mut wanted = vec![
            Namespace::Pid,
            Namespace::Mount,
            Namespace::Uts,
            Namespace::Ipc,
        ];
        if network_restricted {
            wanted.push(Namespace::Net);
        }
        let mut missing: Vec<String> = wanted
            .into_iter()
            .filter(|ns| !self.namespaces.contains(*ns))
            .map(|ns| format!("{} namespace", ns.name()))
            .collect();
        if self.proc == ProcView::Shared {
            missing.push("private /proc".to_owned());
        }
        if !self.capabilities_dropped {
            missing.push("capability drop".to_owned());
        }
        missing
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LandlockReport {
    FullyEnforced,
    PartiallyEnforced,
    NotEnforced,
}

impl From<LandlockState> for LandlockReport {
    fn from(state: LandlockState) -> Self {
        match state {
            LandlockState::FullyEnforced => Self::FullyEnforced,
            LandlockState::PartiallyEnforced => Self::PartiallyEnforced,
            LandlockState::NotEnforced => Self::NotEnforced,
        }
    }
}

/// One line on the control socket (launcher → server).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "status", content = "payload", rename_all = "lowercase")]
pub enum LaunchLine {
    Ok(LaunchReport),
    /// Sent before `ok` under the managed network, with the listening sockets of these
    /// ports attached (in this order).
    Listeners(Vec<u16>),
    Error(crate::fs_helper::ErrorPayload),
}

/// The launcher's `main` (§8.3) without the process exit: `args` follow the sentinel.
/// Returns only on failure; success ends in `execve`.
pub fn main(args: &[OsString]) -> i32 {
    let max_request_bytes = match parse_args(args) {
        Ok(n) => n,
        // Nobody reads the launcher's stderr but the target's consumer: stay silent.
        Err(_) => return EXIT_SETUP_FAILED,
    };
    // SAFETY: descriptor 0 is the launcher's end of the control socket, owned from here on.
    let stdin = unsafe { OwnedFd::from_raw_fd(0) };
    let (request, target_stdin) = match read_launch(&stdin, max_request_bytes) {
        Ok(received) => received,
        Err(_) => return EXIT_SETUP_FAILED,
    };
    let control = match move_control_socket(stdin, target_stdin) {
        Ok(control) => control,
        Err(_) => return EXIT_SETUP_FAILED,
    };
    match launch(&control, &request) {
        Ok(never) => match never {},
        Err(Failure::Setup(error)) => {
            let _ = write_line(&control, &LaunchLine::Error(error.into()));
            EXIT_SETUP_FAILED
        }
        Err(Failure::Exec(error)) => {
            let _ = write_line(&control, &LaunchLine::Error(error.into()));
            EXIT_EXEC_FAILED
        }
        Err(Failure::Silent) => EXIT_SETUP_FAILED,
    }
}

enum Failure {
    /// Before the report: answered, exit 125.
    Setup(RpcError),
    /// `execve` failed after the report: answered, exit 127.
    Exec(RpcError),
    /// Nothing can be reported (the server is gone).
    Silent,
}

fn parse_args(args: &[OsString]) -> Result<u64, ()> {
    match args {
        [] => Ok(DEFAULT_MAX_REQUEST_BYTES),
        [flag, value] if flag == "--max-request-bytes" => {
            value.to_str().and_then(|v| v.parse().ok()).ok_or(())
        }
        _ => Err(()),
    }
}

/// Steps 2–6.
fn launch(control: &OwnedFd, request: &LaunchRequest) -> Result<std::convert::Infallible, Failure> {
    let setup = |e: io::Error| Failure::Setup(RpcError::spawn_os_error(&e));
    child_setup(request).map_err(|e| match e {
        SetupError::ParentGone => Failure::Silent,
        SetupError::Os(e) => setup(e),
    })?;
    let program = parse_path(&request.program)
        .map_err(|e| Failure::Setup(RpcError::spawn_failed_other(e.reason())))?;
    let exec = ExecArgs::new(&program, &request.argv, &request.env).map_err(setup)?;

    let Some(policy_json) = &request.policy else {
        let report = LaunchReport {
            landlock: LandlockReport::NotEnforced,
            landlock_abi: 0,
            seccomp: false,
            narrowing: NarrowingOutcome::NotNeeded,
            namespaces: Namespaces::NONE,
            proc: ProcView::Shared,
            capabilities_dropped: false,
        };
        write_line(control, &LaunchLine::Ok(report)).map_err(|_| Failure::Silent)?;
        reset_signal_dispositions();
        let error = exec.exec();
        return Err(Failure::Exec(exec_error(&error, &program, None)));
    };
    let (policy, enforcement) =
        SandboxPolicy::from_helper_json(&policy_json.to_string()).map_err(|e| {
            Failure::Setup(
                RpcError::process_sandbox_prepare(e)
                    .with_start_error_kind(StartErrorKind::SandboxPreparation),
            )
        })?;
    let policy = SandboxPolicy {
        glob_scan_max_depth: request.glob_scan_max_depth,
        ..policy
    };
    let mut wanted = Namespaces::of(&[
        Namespace::Pid,
        Namespace::Mount,
        Namespace::Uts,
        Namespace::Ipc,
    ]);
    if policy.network == Network::Restricted {
        wanted = wanted.with(Namespace::Net);
    }
    // Group signals (`process/signal`) must reach the target, not the launcher or the
    // init: both keep every signal blocked; the target unblocks before `execve`.
    if wanted.contains(Namespace::Pid) {
        block_all_signals();
    }
    let namespaces = namespaces::enter(wanted, PrivilegedUserNamespace::Allowed).map_err(setup)?;
    hand_over_listeners(control, request, namespaces)?;
    if namespaces.contains(Namespace::Mount) {
        narrow::make_root_private().map_err(setup)?;
    }
    let confinement = Confinement {
        policy: &policy,
        enforcement,
        request,
        namespaces,
    };
    if namespaces.contains(Namespace::Pid) {
        init::run(control, &confinement, &exec, &program)
    }
    unblock_all_signals();
    let report = confinement.apply(ProcView::Shared)?;
    write_line(control, &LaunchLine::Ok(report)).map_err(|_| Failure::Silent)?;
    reset_signal_dispositions();
    let error = exec.exec();
    Err(Failure::Exec(exec_error(&error, &program, Some(&policy))))
}

/// The managed network: the proxy's listeners, made in the target's own network namespace
/// and sent to the server. Without that namespace there is nothing to confine the target
/// to, and the start fails closed.
fn hand_over_listeners(
    control: &OwnedFd,
    request: &LaunchRequest,
    namespaces: Namespaces,
) -> Result<(), Failure> {
    if request.managed_ports.is_empty() {
        return Ok(());
    }
    if !namespaces.contains(Namespace::Net) {
        return Err(Failure::Setup(
            RpcError::process_sandbox_prepare(
                "the managed network needs a network namespace of its own, which this host refused",
            )
            .with_start_error_kind(StartErrorKind::SandboxUnavailable),
        ));
    }
    let listeners = managed_net::open_listeners(&request.managed_ports).map_err(|e| {
        Failure::Setup(
            RpcError::process_sandbox_prepare(format!(
                "the managed network could not be set up: {e}"
            ))
            .with_start_error_kind(StartErrorKind::SandboxPreparation),
        )
    })?;
    managed_net::send_listeners(control, &request.managed_ports, &listeners)
        .map_err(|_| Failure::Silent)
}

/// What the launcher (or the init) applies before the target starts.
struct Confinement<'a> {
    policy: &'a SandboxPolicy,
    enforcement: Enforcement,
    request: &'a LaunchRequest,
    /// What [`namespaces::enter`] entered.
    namespaces: Namespaces,
}

impl Confinement<'_> {
    /// Mount narrowing (§8.4), then no_new_privs, seccomp, Landlock and the capability drop.
    fn apply(&self, proc: ProcView) -> Result<LaunchReport, Failure> {
        let unenforceable = || {
            Failure::Setup(
                RpcError::sandbox_intent_unenforceable()
                    .with_start_error_kind(StartErrorKind::SandboxUnavailable),
            )
        };
        let mount_namespace = if self.namespaces.contains(Namespace::Mount) {
            MountNamespace::OwnAndPrivate
        } else {
            MountNamespace::Shared
        };
        if self.namespaces.contains(Namespace::Mount) {
            narrow::mount_minimal_dev()
                .map_err(|e| Failure::Setup(RpcError::spawn_os_error(&e)))?;
        }
        let narrowing = narrow::apply(
            self.policy,
            self.request.narrowing,
            self.enforcement,
            mount_namespace,
        )
        .map_err(|_| unenforceable())?;
        reenter_working_directory().map_err(|e| Failure::Setup(RpcError::spawn_os_error(&e)))?;
        let applied = enforce::apply(
            self.policy,
            HelperKind::Launcher,
            self.enforcement,
            self.namespaces.contains(Namespace::Uts),
            &self.request.managed_ports,
        )
        .map_err(|_| unenforceable())?;
        Ok(LaunchReport {
            landlock: applied.landlock.into(),
            landlock_abi: applied.landlock_abi,
            seccomp: applied.seccomp,
            narrowing,
            namespaces: self.namespaces,
            proc,
            capabilities_dropped: applied.capabilities_dropped,
        })
    }
}

/// Resolves the working directory again, through the mounts narrowing just made.
///
/// The keeper entered it before the launcher ran, so the descriptor behind it still points
/// at the directory as it was: inside a denied directory that is now covered, or on a
/// carve-out that is now read-only, relative paths and `/proc/self/cwd` would reach the
/// real files. Changing to the same path again lands on what the mounts show there (an
/// empty `tmpfs`, a read-only bind), or fails the start if it no longer exists.
fn reenter_working_directory() -> io::Result<()> {
    let cwd = std::env::current_dir()?;
    if !cwd.is_absolute() {
        // getcwd's "(unreachable)" form: the directory is outside our root.
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    std::env::set_current_dir(&cwd)
}

fn signal_mask(how: libc::c_int, fill: bool) {
    // SAFETY: sigset_t is plain data that sigfillset/sigemptyset initialise; only this
    // (single-threaded) process's mask changes.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        if fill {
            libc::sigfillset(&mut set);
        } else {
            libc::sigemptyset(&mut set);
        }
        libc::sigprocmask(how, &set, std::ptr::null_mut());
    }
}

fn block_all_signals() {
    signal_mask(libc::SIG_SETMASK, true);
}

fn unblock_all_signals() {
    signal_mask(libc::SIG_SETMASK, false);
}

/// Every signal back to its default action: `execve` keeps ignored signals ignored, and
/// the Rust runtime of the launcher ignores SIGPIPE. The raw call also reaches the signals
/// glibc reserves for itself (an all-zero kernel `sigaction` is SIG_DFL without flags).
fn reset_signal_dispositions() {
    let default = [0u64; 4];
    for signal in 1..=64 {
        if signal != libc::SIGKILL && signal != libc::SIGSTOP {
            // SAFETY: the kernel reads one kernel `sigaction`; no old action is returned.
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    signal,
                    default.as_ptr(),
                    std::ptr::null_mut::<libc::c_void>(),
                    8usize,
                );
            }
        }
    }
}

/// §8.2: `failed to spawn process: <os error>`, flagged as a sandbox denial when the
/// kernel refused and the policy does not let the program be executed. The kind is the
/// OS error's either way (a denial is `spawnPermissionDenied`), set last because the
/// denial replaces `data`.
fn exec_error(error: &io::Error, program: &Path, policy: Option<&SandboxPolicy>) -> RpcError {
    let spawn = RpcError::spawn_failed(error);
    let refused = matches!(error.raw_os_error(), Some(libc::EACCES | libc::EPERM));
    let spawn = match policy {
        Some(policy)
            if refused
                && !policy.allows(&crate::policy::resolve(program, true), AccessKind::Read) =>
        {
            spawn.with_sandbox_denied()
        }
        _ => spawn,
    };
    spawn.with_start_error_kind(StartErrorKind::of_spawn_error(error))
}

/// Reads the launch line and the descriptor attached to its first byte.
fn read_launch(control: &OwnedFd, max_bytes: u64) -> io::Result<(LaunchRequest, OwnedFd)> {
    let mut line = Vec::new();
    let mut received: Option<OwnedFd> = None;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let (n, fd) = recv_with_fd(control.as_raw_fd(), &mut chunk)?;
        if let Some(fd) = fd {
            received.get_or_insert(fd);
        }
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        line.extend_from_slice(&chunk[..n]);
        if line.len() as u64 > max_bytes {
            return Err(io::Error::other("launch request too large"));
        }
        if line.ends_with(b"\n") {
            break;
        }
    }
    let request: LaunchRequest = serde_json::from_slice(&line)?;
    if request.version != 1 {
        return Err(io::Error::other("unsupported launch request version"));
    }
    let fd = received.ok_or_else(|| io::Error::other("no descriptor attached"))?;
    Ok((request, fd))
}

/// `recvmsg` with room for one `SCM_RIGHTS` descriptor.
fn recv_with_fd(socket: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    // SAFETY: the message header points at live buffers of the stated sizes; a received
    // descriptor is owned by us (MSG_CMSG_CLOEXEC marks it close-on-exec).
    unsafe {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        let mut cmsg_buf = vec![0u8; space];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg_buf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let n = libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut fd = None;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if !cmsg.is_null()
            && (*cmsg).cmsg_level == libc::SOL_SOCKET
            && (*cmsg).cmsg_type == libc::SCM_RIGHTS
        {
            let raw = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
            fd = Some(OwnedFd::from_raw_fd(raw));
        }
        Ok((n as usize, fd))
    }
}

/// Moves the control socket off descriptor 0 (close-on-exec) and puts the target's stdin
/// there.
fn move_control_socket(stdin: OwnedFd, target_stdin: OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: plain descriptor duplication; the results are owned.
    unsafe {
        let moved = libc::fcntl(stdin.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3);
        if moved < 0 {
            return Err(io::Error::last_os_error());
        }
        let control = OwnedFd::from_raw_fd(moved);
        // dup2 onto 0 closes the old control descriptor there; forget our handle to it.
        if libc::dup2(target_stdin.as_raw_fd(), 0) < 0 {
            return Err(io::Error::last_os_error());
        }
        std::mem::forget(stdin);
        drop(target_stdin);
        Ok(control)
    }
}

enum SetupError {
    ParentGone,
    Os(io::Error),
}

/// §8.3 step 2: a session of its own, the terminal, the parent-death signal, and no
/// inherited descriptors beyond 0–2.
fn child_setup(request: &LaunchRequest) -> Result<(), SetupError> {
    let os = |_: ()| SetupError::Os(io::Error::last_os_error());
    // SAFETY: these calls take integer arguments and act on this process only.
    unsafe {
        // The spawner may already have made us a session leader.
        if libc::getsid(0) != libc::getpid() && libc::setsid() < 0 {
            return Err(os(()));
        }
        if request.tty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
            return Err(os(()));
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) < 0 {
            return Err(os(()));
        }
        if libc::getppid() as u32 != request.parent_pid {
            return Err(SetupError::ParentGone);
        }
        const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) < 0 {
            return Err(os(()));
        }
    }
    Ok(())
}

/// `execve`'s arguments, prepared before confinement.
struct ExecArgs {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl ExecArgs {
    fn new(program: &Path, argv: &[String], env: &BTreeMap<String, String>) -> io::Result<Self> {
        let c = |bytes: &[u8]| {
            CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
        };
        Ok(Self {
            program: c(program.as_os_str().as_bytes())?,
            argv: argv
                .iter()
                .map(|a| c(a.as_bytes()))
                .collect::<Result<_, _>>()?,
            envp: env
                .iter()
                .map(|(k, v)| c(format!("{k}={v}").as_bytes()))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Replaces the process; returns only the error. Signals must be unblocked and at
    /// their defaults by then.
    fn exec(&self) -> io::Error {
        let pointers = |strings: &[CString]| -> Vec<*const libc::c_char> {
            strings
                .iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        let argv = pointers(&self.argv);
        let envp = pointers(&self.envp);
        // SAFETY: null-terminated arrays of valid C strings that outlive the call.
        unsafe {
            libc::execve(self.program.as_ptr(), argv.as_ptr(), envp.as_ptr());
        }
        io::Error::last_os_error()
    }
}

fn write_line(control: &OwnedFd, line: &LaunchLine) -> io::Result<()> {
    let mut bytes = serde_json::to_vec(line)?;
    bytes.push(b'\n');
    let mut written = 0;
    while written < bytes.len() {
        // `write`, not `send`: the seccomp filter denies `sendto` when the network is
        // restricted. SIGPIPE is ignored by the Rust runtime, so a closed peer is EPIPE.
        // SAFETY: writes from a live buffer to an owned socket.
        let n = unsafe {
            libc::write(
                control.as_raw_fd(),
                bytes[written..].as_ptr().cast(),
                bytes.len() - written,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        written += n as usize;
    }
    Ok(())
}

/// The first candidate of a program lookup that exists, preferring regular files (the
/// server resolves before the launcher runs, §8.2 step 1).
pub fn resolve_program(candidates: &[PathBuf]) -> io::Result<PathBuf> {
    candidates
        .iter()
        .find(|c| std::fs::metadata(c).is_ok_and(|m| m.is_file()))
        .or_else(|| {
            candidates
                .iter()
                .find(|c| std::fs::symlink_metadata(c).is_ok())
        })
        .cloned()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
}

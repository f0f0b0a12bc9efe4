//! `process/start` (PROTOCOL §4.2): validation in the spec's order, id reservation within
//! the session's process quota, the charge to its descriptor budget, spawn, and hand-over of the child's
//! streams to its [`Pump`].

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use exec_server_core::proto::error::io_error_text;
use exec_server_core::proto::path::parse_path;
use exec_server_core::proto::process::{
    OutputStream, SandboxType, StartParams, StartResult, TerminalSize,
};
use exec_server_core::proto::{RpcError, StartErrorKind};
use exec_server_core::Call;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use exec_server_sandbox::exec::exchange::{exchange, ControlSocket, LaunchOutcome};
use exec_server_sandbox::exec::{resolve_program, LaunchReport, LaunchRequest, SANDBOX_EXEC_ARG1};
use exec_server_sandbox::fs_helper::runner::ENV_ALLOW_LIST;
use exec_server_sandbox::lookalikes;
use exec_server_sandbox::narrow::{NarrowingOutcome, ProcessNarrowing};
use exec_server_sandbox::placeholders::{self, Placeholders};
use exec_server_sandbox::policy::{Network, SandboxDecision, SandboxPolicy};

use crate::admission::{self, DESCRIPTORS_HELD, PROCESSES};
use crate::keepers::LiveKeeper;
use crate::managed::{ManagedProcess, ProcessParts, StdinMode};
use crate::pump::{wait_exit, OutputSource, Pump};
use crate::spawn::{ChildStdio, Command, SpawnError, Spawned, Spawner};
use crate::{environment, network, sys, terminal, ProcessPlugin};

/// Terminal size when `size` is not given (§4.2.1).
const DEFAULT_SIZE: TerminalSize = TerminalSize { rows: 24, cols: 80 };

pub(crate) async fn start(
    plugin: Arc<ProcessPlugin>,
    cx: Call,
    mut params: StartParams,
) -> Result<StartResult, RpcError> {
    let (cwd, size, decision) = validate(&plugin, &params)?;
    let network = network::parse(params.network_proxy.as_ref())?;
    let confines = decision.needs_enforcement()
        && decision
            .policy()
            .is_some_and(|p| p.network == Network::Restricted);
    let plan = network::Plan::decide(network.as_ref(), &params, confines)?;
    let table = crate::table(&plugin, &cx);
    let limit = plugin.config.max_processes_per_session;
    let mut reservation = table.reserve(&params.process_id, || {
        PROCESSES.acquire(cx.session(), limit, 1)
    })?;
    // Charged before anything is opened; the lease shrinks to what the process keeps
    // once it is spawned, and lives with its quota share until the keeper is reaped.
    let mut descriptors = admission::charge_start(cx.session())?;
    // The proxy is the process's from here on: it closes when the process exits, or now if
    // the start fails.
    let mut proxy = match (&network, &plan) {
        (Some(config), Some(network::Plan::Loopback)) => {
            let listeners = network::Listeners::loopback();
            let proxy =
                network::start_proxy(cx.session(), &params.process_id, config, listeners).await?;
            extend_env(&mut params, proxy.child_env());
            Some(network::Held::Proxy(proxy))
        }
        (Some(config), Some(plan)) => {
            extend_env(&mut params, plan.child_env(config));
            None
        }
        _ => None,
    };
    let mut prepared = prepare(&plugin, &params, &cwd, size, decision.policy())
        .map_err(|e| RpcError::spawn_os_error(&e))?;
    let mut launch = prepared.launch.take();
    let namespace_ports = plan.as_ref().and_then(network::Plan::namespace_ports);
    if let (Some(launch), Some(ports)) = (launch.as_mut(), namespace_ports) {
        launch.request.managed_ports = ports.to_vec();
    }
    let placeholders = hold_placeholders(&plugin, launch.as_ref(), decision.policy())?;
    let spawner = Spawner::global().map_err(|e| RpcError::spawn_os_error(&e))?;
    let spawned = tokio::select! {
        biased;
        _ = reservation.cancelled() => {
            // Dropping the spawn request makes the spawner skip it, or kill and reap the
            // child it created.
            return Err(RpcError::start_cancelled(&params.process_id));
        }
        spawned = spawner.spawn(table.spawn_owner, prepared.command) => {
            spawned.map_err(SpawnError::into_rpc)?
        }
    };
    let Spawned {
        pid,
        keeper,
        status,
    } = spawned;
    // From here on the keeper dies with the session and is reaped when it exits; its tree
    // holds the process's share of the quota until then.
    let mut share = reservation.take_share();
    if let Some(share) = share.as_mut() {
        // The child's ends of its pipes are closed in the server once it is spawned.
        descriptors.shrink_to(DESCRIPTORS_HELD);
        share.hold_descriptors(descriptors);
    }
    let keeper = table.keepers.adopt(keeper, share, placeholders);
    let status =
        match sys::set_nonblocking(&status).and_then(|()| register(status, Interest::READABLE)) {
            Ok(status) => status,
            Err(error) => {
                let _ = sys::signal_group(pid, libc::SIGKILL);
                keeper.kill_tree();
                return Err(RpcError::spawn_os_error(&error));
            }
        };

    let sandbox_type = match launch {
        None => SandboxType::None,
        Some(launch) => {
            let (report, listeners) = confine(&plugin, launch, pid, &keeper, &status).await?;
            if let Some(plan) = &plan {
                let served = network::serve_namespace(
                    cx.session(),
                    &params.process_id,
                    network.as_ref(),
                    plan,
                    listeners,
                )
                .await;
                match served {
                    Ok(served) => proxy = proxy.or(served),
                    Err(error) => {
                        let _ = sys::signal_group(pid, libc::SIGKILL);
                        keeper.kill_tree();
                        return Err(error);
                    }
                }
            }
            warn_about_weaker_confinement(&params.process_id, &report, decision.policy());
            cx.audit_note("isolation", || {
                serde_json::to_value(report).unwrap_or(serde_json::Value::Null)
            });
            if let Some(policy) = decision.policy() {
                let enforcement = plugin.sandbox.config().enforcement;
                cx.audit_note("appliedPolicy", || {
                    serde_json::from_str(&policy.to_helper_json(enforcement))
                        .unwrap_or(serde_json::Value::Null)
                });
            }
            if report.is_enforced() {
                SandboxType::LinuxSeccomp
            } else {
                SandboxType::None
            }
        }
    };

    let config = &plugin.config;
    let process = ManagedProcess::new(
        params.process_id.clone(),
        ProcessParts {
            pid,
            keeper: Arc::clone(&keeper),
            stdin_mode: prepared.stdin_mode,
            stdin: prepared.stdin,
            retention: config.retention(),
            write_id_history: config.write_id_history,
            budget: table.output_budget.clone(),
        },
    );
    if let Err(e) = reservation.commit(&process) {
        process.kill_tree();
        return Err(e);
    }
    if let Some(proxy) = proxy {
        let process = Arc::clone(&process);
        network::hold_until(proxy, async move { process.exited().await });
    }
    tracing::debug!(process = ?process.id, pid, "process started");
    cx.audit_note("pid", || pid.into());
    cx.audit_note("sandboxType", || {
        serde_json::to_value(sandbox_type).unwrap_or(serde_json::Value::Null)
    });
    let pump = Pump {
        process,
        session: Arc::clone(cx.session()),
        table,
        primary: prepared.primary,
        secondary: prepared.secondary,
        status: Some(status),
        response_queued: Some(cx.response_queued()),
        chunk_bytes: config.output_chunk_bytes,
        closed_retention: Duration::from_millis(config.closed_retention_ms),
        sandboxed_grace: (sandbox_type == SandboxType::LinuxSeccomp)
            .then(|| Duration::from_millis(plugin.sandbox.config().exit_output_grace_ms)),
        audit: cx.audit_scope(),
        started: std::time::Instant::now(),
        bytes_out: 0,
    };
    pump.spawn();
    Ok(StartResult {
        process_id: params.process_id,
        sandbox_type,
    })
}

/// Sets the proxy variables in the child's environment, over any the client sent.
fn extend_env(params: &mut StartParams, vars: Vec<(&'static str, String)>) {
    params.env.extend(
        vars.into_iter()
            .map(|(name, value)| (name.to_owned(), value)),
    );
}

/// Holds the policy's missing read-only carve-outs for a sandboxed start whose narrowing
/// mounts them ([`placeholders`]).
fn hold_placeholders(
    plugin: &ProcessPlugin,
    launch: Option<&Launch>,
    policy: Option<&SandboxPolicy>,
) -> Result<Placeholders, RpcError> {
    let narrowing = plugin.sandbox.config().process_narrowing;
    match (launch, policy) {
        (Some(_), Some(policy)) if narrowing == ProcessNarrowing::MountNamespace => {
            placeholders::hold(policy).map_err(|e| {
                RpcError::process_sandbox_prepare(format!(
                    "read-only carve-out {} cannot be protected: {}",
                    e.path.display(),
                    io_error_text(&e.error)
                ))
                .with_start_error_kind(StartErrorKind::SandboxPreparation)
            })
        }
        _ => Ok(Placeholders::default()),
    }
}

/// The server's half of a sandboxed start (SANDBOX.md §8.2 steps 4–5): the launch line,
/// then the launcher's report. On failure the launcher is killed if needed, and its exit
/// status collected from its keeper.
async fn confine(
    plugin: &ProcessPlugin,
    mut launch: Launch,
    pid: libc::pid_t,
    keeper: &Arc<LiveKeeper>,
    status: &AsyncFd<OwnedFd>,
) -> Result<(LaunchReport, Vec<OwnedFd>), RpcError> {
    let timeout = plugin.sandbox.helper_timeout();
    launch.request.parent_pid = u32::try_from(keeper.pid).unwrap_or(0);
    let outcome = tokio::task::spawn_blocking(move || {
        exchange(
            &launch.control,
            &launch.request,
            launch.target_stdin.as_fd(),
            timeout,
        )
    })
    .await
    .map_err(RpcError::spawn_failed_other)?;
    // The launcher's work is part of the spawn (PROTOCOL §4.2.3 row 11): a failure that
    // the launcher did not classify closer to its cause is `spawnFailed`.
    let error = match outcome {
        LaunchOutcome::Started(report, listeners) => return Ok((report, listeners)),
        LaunchOutcome::Failed(error) => {
            wait_exit(status).await;
            error
        }
        LaunchOutcome::ExitedSilently => {
            let code = wait_exit(status).await;
            RpcError::launcher_exited(exit_status_text(code))
        }
        LaunchOutcome::TimedOut => {
            let _ = sys::signal_group(pid, libc::SIGKILL);
            keeper.kill_tree();
            wait_exit(status).await;
            RpcError::launcher_timed_out(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX))
        }
    };
    Err(error.or_start_error_kind(StartErrorKind::SpawnFailed))
}

/// Logs, once per server and kind, what the launcher could not apply (SANDBOX.md §5.8,
/// §8.4): never the command, only the process id and what is missing.
fn warn_about_weaker_confinement(
    process_id: &str,
    report: &LaunchReport,
    policy: Option<&SandboxPolicy>,
) {
    if report.narrowing == NarrowingOutcome::Skipped {
        if let Some(policy) = policy {
            if !policy.read_only.is_empty() || !policy.denied_paths.is_empty() {
                tracing::warn!(
                    process = ?process_id,
                    "mount narrowing skipped: carve-outs and deny entries are not enforced for this process"
                );
            }
        }
    }
    let network_restricted = policy.is_some_and(|p| p.network == Network::Restricted);
    let missing = report.missing_isolation(network_restricted);
    if missing.is_empty() {
        return;
    }
    static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let text = missing.join(", ");
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if !warned.contains(&text) {
        tracing::warn!(
            process = ?process_id,
            missing = %text,
            "sandboxed process runs with weaker isolation than intended (the kernel refused it); Landlock still confines it"
        );
        warned.push(text);
    }
}

/// The standard library's wording of an exit status.
fn exit_status_text(code: i32) -> String {
    if code > 128 {
        format!("signal: {}", code - 128)
    } else {
        format!("exit status: {code}")
    }
}

/// Rows 2–9 of §4.2.3, in order. Returns the working directory, the terminal size and
/// the sandbox decision.
fn validate(
    plugin: &ProcessPlugin,
    params: &StartParams,
) -> Result<(PathBuf, TerminalSize, SandboxDecision), RpcError> {
    if params.argv.is_empty() {
        return Err(RpcError::empty_argv());
    }
    let cwd =
        parse_path(&params.cwd).map_err(|e| RpcError::invalid_cwd(&params.cwd, e.reason()))?;
    // A `cwd` spelled like a name that is not UTF-8 could start the process elsewhere
    // than in the directory the client listed.
    if lookalikes::may_be_ambiguous(&params.cwd) && lookalikes::is_ambiguous(&cwd, lookalikes::list)
    {
        return Err(RpcError::ambiguous_path(&params.cwd));
    }
    let size = match params.size {
        Some(size) if params.tty && (size.rows == 0 || size.cols == 0) => {
            return Err(RpcError::zero_start_size())
        }
        Some(size) if params.tty => size,
        _ => DEFAULT_SIZE,
    };
    environment::validate(&params.env, params.env_policy.as_ref())?;
    let decision = plugin
        .sandbox
        .decide_process(params.sandbox.as_ref(), &cwd)?;
    if decision.needs_enforcement() {
        plugin.sandbox.check_process_enforceable()?;
    }
    Ok((cwd, size, decision))
}

/// The spawn request and the server's ends of the child's streams.
struct Prepared {
    command: Command,
    /// For a sandboxed start: what to tell the launcher once it runs.
    launch: Option<Launch>,
    stdin_mode: StdinMode,
    stdin: Option<Arc<AsyncFd<OwnedFd>>>,
    primary: Option<OutputSource>,
    secondary: Option<OutputSource>,
}

/// A sandboxed start's launch: the server's end of the control socket, the request, and
/// the descriptor that becomes the target's stdin.
struct Launch {
    control: OwnedFd,
    request: LaunchRequest,
    target_stdin: OwnedFd,
}

fn prepare(
    plugin: &ProcessPlugin,
    params: &StartParams,
    cwd: &Path,
    size: TerminalSize,
    policy: Option<&SandboxPolicy>,
) -> io::Result<Prepared> {
    let vars = environment::child_environment(
        &params.env,
        params.env_policy.as_ref(),
        std::env::vars_os(),
        plugin.relay_token_env.as_deref(),
    );
    let candidates =
        environment::program_candidates(&params.argv[0], cwd, &vars, std::env::var_os("PATH"));
    let mut argv: Vec<CString> = params.argv.iter().map(c_string).collect::<Result<_, _>>()?;
    if let Some(arg0) = &params.arg0 {
        argv[0] = c_string(arg0)?;
    }
    let envp = environment::envp_entries(&vars)
        .into_iter()
        .map(c_string)
        .collect::<Result<_, _>>()?;
    let paths = candidates;
    let candidates = paths
        .iter()
        .map(|p| c_string(p.as_os_str().as_bytes()))
        .collect::<Result<_, _>>()?;
    let cwd = c_string(OsString::from(cwd).as_bytes())?;

    let (stdio, stdin_mode, stdin, primary, secondary) = if params.tty {
        let pair = terminal::open(size)?;
        sys::set_nonblocking(&pair.master)?;
        let master = Arc::new(register(
            pair.master,
            Interest::READABLE | Interest::WRITABLE,
        )?);
        let primary = OutputSource {
            fd: Arc::clone(&master),
            stream: OutputStream::Pty,
        };
        (
            ChildStdio::Terminal { slave: pair.slave },
            StdinMode::Terminal,
            Some(master),
            Some(primary),
            None,
        )
    } else {
        let (stdin_read, stdin_write) = sys::pipe()?;
        let (stdin_mode, stdin) = if params.pipe_stdin.unwrap_or(false) {
            sys::set_nonblocking(&stdin_write)?;
            let writer = register(stdin_write, Interest::WRITABLE)?;
            (StdinMode::Pipe, Some(Arc::new(writer)))
        } else {
            // Closing the only write end leaves the child's stdin at end-of-file.
            drop(stdin_write);
            (StdinMode::Closed, None)
        };
        let (stdout, stdout_read) = output_pipe(OutputStream::Stdout)?;
        let (stderr, stderr_read) = output_pipe(OutputStream::Stderr)?;
        (
            ChildStdio::Pipes {
                stdin: sys::above_stdio(stdin_read)?,
                stdout,
                stderr,
            },
            stdin_mode,
            stdin,
            Some(stdout_read),
            Some(stderr_read),
        )
    };
    let command = Command {
        candidates,
        argv,
        envp,
        cwd,
        stdio,
    };
    let (command, launch) = match policy {
        None => (command, None),
        Some(policy) => {
            let (command, launch) =
                launcher_command(plugin, params, &vars, &paths, policy, command)?;
            (command, Some(launch))
        }
    };
    Ok(Prepared {
        command,
        launch,
        stdin_mode,
        stdin,
        primary,
        secondary,
    })
}

/// Turns the target's spawn request into the launcher's (SANDBOX.md §8.2 steps 1–3): the
/// program resolved up front, the helper binary with the allow-listed environment, the
/// control socket as its stdin and the target's stdout/stderr (or terminal) as its own.
fn launcher_command(
    plugin: &ProcessPlugin,
    params: &StartParams,
    vars: &std::collections::BTreeMap<OsString, OsString>,
    candidates: &[PathBuf],
    policy: &SandboxPolicy,
    target: Command,
) -> io::Result<(Command, Launch)> {
    let program = resolve_program(candidates)?;
    let control = ControlSocket::new()?;
    let (stdio, target_stdin) = match target.stdio {
        ChildStdio::Pipes {
            stdin,
            stdout,
            stderr,
        } => (
            ChildStdio::Pipes {
                stdin: sys::above_stdio(control.launcher)?,
                stdout,
                stderr,
            },
            stdin,
        ),
        ChildStdio::Terminal { slave } => (
            ChildStdio::Pipes {
                stdin: sys::above_stdio(control.launcher)?,
                stdout: slave.try_clone()?,
                stderr: slave.try_clone()?,
            },
            slave,
        ),
    };
    let sandbox = &plugin.sandbox;
    let mut argv = params.argv.clone();
    if let Some(arg0) = &params.arg0 {
        argv[0] = arg0.clone();
    }
    let env = vars
        .iter()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let request = LaunchRequest::new(
        &program,
        argv,
        env,
        params.tty,
        sandbox.config().process_narrowing,
        Some((policy, sandbox.enforcement())),
    );
    let launcher_argv = [
        sandbox.helper_argv0().as_os_str().as_bytes(),
        SANDBOX_EXEC_ARG1.as_bytes(),
        b"--max-request-bytes",
        sandbox.max_request_bytes().to_string().as_bytes(),
    ]
    .into_iter()
    .map(c_string)
    .collect::<Result<_, _>>()?;
    let envp = ENV_ALLOW_LIST
        .iter()
        .filter_map(|name| std::env::var_os(name).map(|value| (name, value)))
        .map(|(name, value)| {
            let mut entry = name.as_bytes().to_vec();
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            c_string(entry)
        })
        .collect::<Result<_, _>>()?;
    let command = Command {
        candidates: vec![c_string(sandbox.helper_program().as_os_str().as_bytes())?],
        argv: launcher_argv,
        envp,
        cwd: target.cwd,
        stdio,
    };
    let launch = Launch {
        control: control.server,
        request,
        target_stdin,
    };
    Ok((command, launch))
}

/// A pipe for one output stream: the child's write end and the server's registered reader.
fn output_pipe(stream: OutputStream) -> io::Result<(OwnedFd, OutputSource)> {
    let (read, write) = sys::pipe()?;
    sys::set_nonblocking(&read)?;
    let fd = Arc::new(register(read, Interest::READABLE)?);
    Ok((sys::above_stdio(write)?, OutputSource { fd, stream }))
}

fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    sys::register(fd, interest).map_err(|(_, e)| e)
}

fn c_string(bytes: impl AsRef<[u8]>) -> io::Result<CString> {
    CString::new(bytes.as_ref()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "argument, environment or path contains a NUL byte",
        )
    })
}

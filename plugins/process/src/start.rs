//! `process/start` (PROTOCOL §4.2): validation in the spec's order, id reservation, spawn,
//! and hand-over of the child's streams to its [`Pump`].

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use exec_server_core::proto::error::io_error_text;
use exec_server_core::proto::path::parse_path;
use exec_server_core::proto::process::{
    OutputStream, SandboxType, StartParams, StartResult, TerminalSize,
};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::managed::{ManagedProcess, StdinMode};
use crate::pump::{reap, OutputSource, Pump};
use crate::spawn::{ChildStdio, Command, Spawner};
use crate::{environment, sys, terminal, ProcessPlugin};

/// Terminal size when `size` is not given (§4.2.1).
const DEFAULT_SIZE: TerminalSize = TerminalSize { rows: 24, cols: 80 };

pub(crate) async fn start(
    plugin: Arc<ProcessPlugin>,
    cx: Call,
    params: StartParams,
) -> Result<StartResult, RpcError> {
    let (cwd, size) = validate(&params)?;
    let table = crate::table(&cx);
    let reservation = table.reserve(&params.process_id)?;

    let prepared = prepare(&plugin, &params, &cwd, size)
        .map_err(|e| RpcError::spawn_failed(io_error_text(&e)))?;
    let spawner = Spawner::global().map_err(|e| RpcError::spawn_failed(io_error_text(&e)))?;
    let spawned = tokio::select! {
        biased;
        _ = reservation.cancelled() => {
            // Dropping the spawn request makes the spawner kill and reap the child.
            return Err(RpcError::start_cancelled(&params.process_id));
        }
        spawned = spawner.spawn(prepared.command) => {
            spawned.map_err(|e| RpcError::spawn_failed(io_error_text(&e)))?
        }
    };
    let pid = spawned.pid;
    let pidfd = match sys::register(spawned.pidfd, Interest::READABLE) {
        Ok(pidfd) => pidfd,
        Err((pidfd, error)) => {
            let _ = sys::signal_group(pid, libc::SIGKILL);
            tokio::task::spawn_blocking(move || sys::wait_blocking(&pidfd));
            return Err(RpcError::spawn_failed(io_error_text(&error)));
        }
    };

    let config = &plugin.config;
    let process = Arc::new(ManagedProcess::new(
        params.process_id.clone(),
        pid,
        prepared.stdin_mode,
        prepared.stdin,
        config.retention(),
        config.write_id_history,
    ));
    if let Err(e) = reservation.commit(&process) {
        process.kill_group();
        tokio::spawn(async move { reap(&pidfd).await });
        return Err(e);
    }
    tracing::debug!(process = %process.id, pid, "process started");
    let pump = Pump {
        process,
        session: Arc::clone(cx.session()),
        table,
        primary: prepared.primary,
        secondary: prepared.secondary,
        pidfd,
        response_queued: Some(cx.response_queued()),
        chunk_bytes: config.output_chunk_bytes,
        closed_retention: Duration::from_millis(config.closed_retention_ms),
        buffer: BytesMut::new(),
    };
    tokio::spawn(pump.run());
    Ok(StartResult {
        process_id: params.process_id,
        sandbox_type: SandboxType::None,
    })
}

/// Rows 2–9 of §4.2.3, in order. Returns the working directory and the terminal size.
fn validate(params: &StartParams) -> Result<(PathBuf, TerminalSize), RpcError> {
    if params.argv.is_empty() {
        return Err(RpcError::empty_argv());
    }
    let cwd =
        parse_path(&params.cwd).map_err(|e| RpcError::invalid_cwd(&params.cwd, e.reason()))?;
    let size = match params.size {
        Some(size) if params.tty && (size.rows == 0 || size.cols == 0) => {
            return Err(RpcError::zero_start_size())
        }
        Some(size) if params.tty => size,
        _ => DEFAULT_SIZE,
    };
    environment::validate(&params.env, params.env_policy.as_ref())?;
    if params.network_proxy.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(RpcError::unsupported_start_field("networkProxy"));
    }
    if params.enforce_managed_network == Some(true) {
        return Err(RpcError::unsupported_start_field("enforceManagedNetwork"));
    }
    let decision = exec_server_sandbox::policy::decide_process(params.sandbox.as_ref(), &cwd)?;
    if decision.needs_enforcement() {
        return Err(RpcError::sandbox_intent_unenforceable());
    }
    Ok((cwd, size))
}

/// The spawn request and the server's ends of the child's streams.
struct Prepared {
    command: Command,
    stdin_mode: StdinMode,
    stdin: Option<Arc<AsyncFd<OwnedFd>>>,
    primary: Option<OutputSource>,
    secondary: Option<OutputSource>,
}

fn prepare(
    plugin: &ProcessPlugin,
    params: &StartParams,
    cwd: &Path,
    size: TerminalSize,
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
    let candidates = candidates
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
    Ok(Prepared {
        command: Command {
            candidates,
            argv,
            envp,
            cwd,
            stdio,
        },
        stdin_mode,
        stdin,
        primary,
        secondary,
    })
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

//! `exec-server run`: runs a command on a server and behaves like a local one.
//!
//! Output goes to stdout and stderr as it arrives, stdin is forwarded, and the remote exit
//! code becomes the exit code. With `--tty` the command gets a pseudo-terminal sized like
//! the local one (and resized on SIGWINCH) and the local terminal is put in raw mode, so
//! keys — Ctrl-C included — reach the remote terminal as they would a local one. Without
//! `--tty`, SIGINT, SIGTERM, SIGHUP and SIGQUIT received by `run` are forwarded with
//! `process/signal`. A lost WebSocket connection is resumed by the client underneath.
//!
//! Exit codes of `run` itself follow `docker run`: 125 when `run` fails (connection,
//! session lost, request refused), 126 when the command cannot be executed, 127 when it
//! is not found; otherwise the command's own code (128 + N after signal N).

pub(crate) mod sandbox;
pub(crate) mod terminal;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use exec_server_client::{ExecServerClient, ExecServerError, ProcessControl, ProcessEvent};

use crate::server_args::{connect, ServerArgs};
use exec_server_proto::process::{
    EnvInherit, EnvPolicy, OutputStream, Signal, StartParams, TerminalSize, WriteStatus,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{signal, SignalKind};

/// `run` failed before or while running the command.
const EXIT_RUN_FAILED: u8 = 125;
/// The command exists but cannot be executed.
const EXIT_CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
const EXIT_NOT_FOUND: u8 = 127;
/// Local stdout went away (like a local command killed by SIGPIPE).
const EXIT_BROKEN_PIPE: u8 = 128 + 13;

/// Arguments of `exec-server run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Where to run: a server, a command that starts one, or a relay.
    #[command(flatten)]
    pub server: ServerArgs,

    /// Run the command on a pseudo-terminal, with the local terminal in raw mode.
    #[arg(long)]
    pub tty: bool,

    /// Working directory on the server (default: the server's own).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,

    /// Set a variable in the command's environment (repeatable). The command otherwise
    /// gets the server's environment minus variables that look like secrets.
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    pub env: Vec<(String, String)>,

    /// Do not forward stdin: the command's stdin is at end-of-file from the start.
    #[arg(long)]
    pub no_stdin: bool,

    /// Run the command in the server's sandbox (Landlock, seccomp, namespaces; no
    /// network): `read-only`, or `workspace-write` (the working directory, /tmp and
    /// $TMPDIR writable, its .git read-only). docs/PROTOCOL.md "Sandboxes" shows the policy.
    #[arg(long, value_name = "MODE")]
    pub sandbox: Option<sandbox::SandboxMode>,

    /// The program and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    pub command: Vec<String>,
}

fn parse_env(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("expected NAME=VALUE, got `{text}`")),
    }
}

/// Runs the command and returns the exit code for the local process. `config` is the
/// `--config` file, read for the `[relay]` settings of `--remote`.
pub fn main(mut args: RunArgs, config: Option<&Path>) -> ExitCode {
    if let Err(error) = args.server.resolve() {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("exec-server run: failed to start the async runtime: {e}");
            return ExitCode::from(EXIT_RUN_FAILED);
        }
    };
    let outcome = runtime.block_on(run(args, config));
    // A blocking read of local stdin cannot be cancelled; do not wait for it.
    runtime.shutdown_background();
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            // The error may quote the remote server's text: no line of its own.
            let error = exec_server_proto::log_text::printable(&failure.error.to_string());
            match &failure.context {
                Some(context) => eprintln!("exec-server run: {context}: {error}"),
                None => eprintln!("exec-server run: {error}"),
            }
            ExitCode::from(failure.code)
        }
    }
}

struct Failure {
    error: ExecServerError,
    code: u8,
    /// What was being done, when the error alone does not say (which program, where).
    context: Option<String>,
}

impl From<ExecServerError> for Failure {
    fn from(error: ExecServerError) -> Self {
        Self {
            error,
            code: EXIT_RUN_FAILED,
            context: None,
        }
    }
}

/// The exit code for a `process/start` error: spawn failures map like a shell's, and say
/// which program could not be started where (the protocol's text names only the OS error).
fn start_failure(error: ExecServerError, program: &str, cwd: &str) -> Failure {
    let spawn_failed = error
        .rpc()
        .filter(|e| e.message.starts_with("failed to spawn process"));
    let Some(rpc) = spawn_failed else {
        return error.into();
    };
    let code = if rpc.message.contains("(os error 2)") {
        EXIT_NOT_FOUND
    } else {
        EXIT_CANNOT_EXECUTE
    };
    Failure {
        context: Some(format!("cannot start `{program}` in {cwd} on the server")),
        error,
        code,
    }
}

fn connect_failure(error: ExecServerError, args: &ServerArgs) -> Failure {
    Failure {
        context: args.refusal_hint(&error),
        error,
        code: EXIT_RUN_FAILED,
    }
}

async fn run(args: RunArgs, config: Option<&Path>) -> Result<u8, Failure> {
    let client = connect(&args.server, "exec-server run", config)
        .await
        .map_err(|e| connect_failure(e, &args.server))?;
    let cwd = match &args.cwd {
        Some(cwd) => cwd.clone(),
        None => client
            .environment_info()
            .await?
            .cwd
            .unwrap_or_else(|| "/".into()),
    };
    let mut env: BTreeMap<String, String> = args.env.iter().cloned().collect();
    let size = if args.tty {
        if let Ok(term) = std::env::var("TERM") {
            env.entry("TERM".into()).or_insert(term);
        }
        terminal::window_size(0).or_else(|| terminal::window_size(1))
    } else {
        None
    };
    let forward_stdin = !args.no_stdin && !terminal::stdin_is_null();
    let sandbox = args.sandbox.map(|mode| mode.policy(&cwd.to_string()));
    let params = StartParams {
        process_id: ExecServerClient::new_process_id(),
        argv: args.command.clone(),
        cwd,
        env,
        tty: args.tty,
        pipe_stdin: Some(forward_stdin),
        arg0: None,
        env_policy: Some(EnvPolicy {
            inherit: EnvInherit::All,
            ignore_default_excludes: false,
            exclude: Vec::new(),
            set: BTreeMap::new(),
            include_only: Vec::new(),
        }),
        sandbox,
        size: size.map(|(rows, cols)| TerminalSize { rows, cols }),
        network_proxy: None,
        enforce_managed_network: None,
        managed_network: None,
    };
    let program = params.argv.first().cloned().unwrap_or_default();
    let start_cwd = params.cwd.to_string();
    let process = client
        .start_process(params)
        .await
        .map_err(|e| start_failure(e, &program, &start_cwd))?;
    let raw_mode = if args.tty && terminal::is_terminal(0) {
        terminal::RawMode::enable(0).ok()
    } else {
        None
    };
    let (control, mut events) = process.into_parts();
    if forward_stdin {
        tokio::spawn(forward_input(control.clone()));
    }
    tokio::spawn(forward_signals(control.clone(), args.tty));

    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let mut exit_code = None;
    let outcome = loop {
        let Some(event) = events.next_event().await else {
            break Ok(());
        };
        match event {
            Ok(ProcessEvent::Output { stream, bytes, .. }) => {
                let written = match stream {
                    OutputStream::Stderr => write_all(&mut stderr, &bytes).await,
                    OutputStream::Stdout | OutputStream::Pty => {
                        write_all(&mut stdout, &bytes).await
                    }
                };
                if written.is_err() {
                    let _ = control.terminate().await;
                    exit_code = Some(i32::from(EXIT_BROKEN_PIPE));
                    break Ok(());
                }
            }
            Ok(ProcessEvent::Exited {
                exit_code: code, ..
            }) => exit_code = Some(code),
            Ok(ProcessEvent::OutputLost { first, last }) => {
                let line_end = if raw_mode.is_some() { "\r\n" } else { "\n" };
                let warning = format!(
                    "exec-server run: output events {first}-{last} were lost while reconnecting{line_end}"
                );
                let _ = write_all(&mut stderr, warning.as_bytes()).await;
            }
            Ok(ProcessEvent::Closed { .. }) => break Ok(()),
            Err(error) => break Err(error),
        }
    };
    drop(raw_mode);
    outcome?;
    // Done: free the session now rather than leaving it detached until it expires.
    if let Err(error) = client.close_session().await {
        tracing::debug!(%error, "session/close failed");
    }
    Ok(match exit_code {
        Some(code) => u8::try_from(code).unwrap_or(u8::MAX),
        None => EXIT_RUN_FAILED,
    })
}

async fn write_all(out: &mut (impl AsyncWriteExt + Unpin), bytes: &[u8]) -> std::io::Result<()> {
    out.write_all(bytes).await?;
    out.flush().await
}

/// Forwards local stdin until it ends (then the remote stdin is closed too, so `echo hi |
/// exec-server run -- cat` ends) or the remote side stops accepting input.
async fn forward_input(control: ProcessControl) {
    let mut stdin = tokio::io::stdin();
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = match stdin.read(&mut buffer).await {
            Ok(0) => {
                // A terminal has no end of input to forward (its ^D is forwarded as a byte),
                // and a server without the extension answers -32601: nothing more to do.
                if let Err(error) = control.close_stdin().await {
                    tracing::debug!(%error, "process/closeStdin failed");
                }
                return;
            }
            Err(_) => return,
            Ok(n) => n,
        };
        match control.write(&buffer[..n]).await {
            Ok(WriteStatus::Accepted) => {}
            _ => return,
        }
    }
}

/// Forwards terminal size changes and, without a local raw terminal, the signals a user
/// sends to `run` itself.
async fn forward_signals(control: ProcessControl, tty: bool) {
    let (Ok(mut winch), Ok(mut int), Ok(mut term), Ok(mut hup), Ok(mut quit)) = (
        signal(SignalKind::window_change()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
        signal(SignalKind::quit()),
    ) else {
        return;
    };
    let mut interrupted = false;
    loop {
        let forwarded = tokio::select! {
            _ = winch.recv() => {
                if tty {
                    if let Some((rows, cols)) = terminal::window_size(0).or_else(|| terminal::window_size(1)) {
                        let _ = control.resize(rows, cols).await;
                    }
                }
                continue;
            }
            _ = int.recv() => {
                if interrupted {
                    // A second Ctrl-C: the command ignored the first; end its whole group.
                    let _ = control.terminate().await;
                    continue;
                }
                interrupted = true;
                eprintln!("exec-server run: interrupt sent to the remote command; press Ctrl-C again to kill it");
                Signal::Interrupt
            }
            _ = term.recv() => Signal::Terminate,
            _ = hup.recv() => Signal::Hangup,
            _ = quit.recv() => Signal::Quit,
        };
        let _ = control.signal(forwarded).await;
    }
}

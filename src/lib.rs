//! exec-server as a library: everything the `exec-server` binary does, so a host binary can
//! add its own plugins and still be the same server.
//!
//! The binary's `main` is one call, [`main`]. A team's own binary that adds a plugin crate:
//!
//! ```ignore
//! use exec_server_plugin_hello as _; // links the crate, so its plugin registers
//!
//! fn main() -> std::process::ExitCode {
//!     exec_server::main_with_plugins(&[("hello", "exec-server-plugin-hello")])
//! }
//! ```
//!
//! * [`cli`] — the command line.
//! * [`mod@run`] — `exec-server run`: a remote command that behaves like a local one.
//! * [`helpers`] — the hidden helpers a host binary dispatches before anything else.
//! * [`harden_process`] — what [`main_with_plugins`] does before anything else; a host
//!   with its own `main` calls it first.

pub mod cli;
pub mod cp;
pub mod doctor;
pub mod run;
pub mod server_args;

pub use exec_server_core::hygiene::harden_process;

/// Hidden helpers (SANDBOX.md §9): the same binary re-executed with a sentinel `argv[1]`
/// becomes the sandboxed fs helper or the sandbox launcher. [`main`] dispatches them first;
/// a host binary that embeds exec-server calls [`helpers::dispatch_hidden_helper`] (or the
/// entry functions directly) at the very start of its own `main`, before it loads
/// configuration, sets up logging or starts threads.
pub mod helpers {
    pub use exec_server_core::helpers::{dispatch_hidden_helper, hidden_helpers, HiddenHelper};
    pub use exec_server_fs::run_fs_helper_main;
    pub use exec_server_sandbox::{
        run_sandbox_exec_main, SandboxRuntime, FS_HELPER_ARG1, SANDBOX_EXEC_ARG1,
    };
}

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use exec_server_config::core::CONNECTION_TOKEN_ENV;
use exec_server_config::{secret_env, CliOverrides, ConfigSource, CoreConfig};
use exec_server_core::config_section::config_sections;
use exec_server_core::hygiene;
use exec_server_core::router::MethodPlan;
use exec_server_core::server::{
    open_configured_transports, open_listeners, run, shutdown_signal, RunError,
};
use exec_server_core::{plugin, ServerContext, StartupError};

// The inventory caveat: a crate nothing references is not linked and registers nothing.
use exec_server_audit_webhook as _;
use exec_server_capabilities as _;
use exec_server_environment as _;
use exec_server_fs as _;
use exec_server_http as _;
use exec_server_process as _;
use exec_server_relay as _;
use exec_server_rendezvous as _;
use exec_server_search as _;

/// Plugins and configuration sections this library is built with, and the crate that
/// provides each.
pub const BUILT_IN_PLUGINS: &[(&str, &str)] = &[
    ("capabilities", "exec-server-capabilities"),
    ("environment", "exec-server-environment"),
    ("fs", "exec-server-fs"),
    ("http", "exec-server-http"),
    ("process", "exec-server-process"),
    ("relay", "exec-server-relay"),
    ("rendezvous", "exec-server-rendezvous"),
    ("search", "exec-server-search"),
];

/// Exit status of every start-up and configuration error (PROTOCOL §7).
const EXIT_CONFIG: u8 = 2;
/// Exit status when a listener stops for good while serving (a terminal relay registry
/// answer, RELAY §9.1).
const EXIT_LISTENER_FAILED: u8 = 1;

/// Runs exec-server with the built-in plugins: dispatches hidden helpers first, then parses
/// the command line, loads configuration and serves.
pub fn main() -> ExitCode {
    main_with_plugins(&[])
}

/// Like [`main`], for a host binary that links more plugin crates: `extra` names each added
/// plugin and its crate, so start-up fails with the crate's name if it was not linked.
pub fn main_with_plugins(extra: &[(&str, &str)]) -> ExitCode {
    // Hardening comes first, before the hidden-helper dispatch too, so that no code path
    // — helper, subcommand, server — ever runs dumpable or with secrets in its environment.
    // Helpers that must be dumpable re-enable it themselves where they need it.
    harden_process();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = exec_server_core::helpers::dispatch_hidden_helper(&args) {
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let cli = match cli::Cli::parse_from(args) {
        cli::Cli {
            command: Some(cli::Command::Completions { shell }),
            ..
        } => return cli::print_completions(shell),
        cli::Cli {
            command: Some(cli::Command::Man),
            ..
        } => return cli::print_man_page(),
        parsed @ cli::Cli {
            command: Some(cli::Command::Doctor),
            ..
        } => {
            return match parsed.overrides() {
                Ok(overrides) => doctor::main(parsed.config.as_deref(), overrides),
                Err(error) => {
                    eprintln!("{error}");
                    ExitCode::from(EXIT_CONFIG)
                }
            }
        }
        cli::Cli {
            command: Some(cli::Command::Cp(cp)),
            config,
            ..
        } => {
            capture_client_secrets(config.as_deref());
            return cp::main(cp, config.as_deref());
        }
        cli::Cli {
            command: Some(cli::Command::Run(run)),
            config,
            ..
        } => {
            capture_client_secrets(config.as_deref());
            return run::main(run, config.as_deref());
        }
        cli => cli,
    };
    let expected: Vec<(&str, &str)> = BUILT_IN_PLUGINS.iter().chain(extra).copied().collect();
    match start(cli, &expected) {
        Ok(()) => ExitCode::SUCCESS,
        Err(RunError::Startup(error)) => {
            eprintln!("{error}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(RunError::Listener(error)) => {
            tracing::error!("{error}");
            ExitCode::from(EXIT_LISTENER_FAILED)
        }
    }
}

/// For `run` and `cp`, while still single-threaded: takes the variable `relay.token_env`
/// names out of the environment, if the configuration names one (they report
/// configuration errors themselves).
fn capture_client_secrets(config: Option<&std::path::Path>) {
    if let Ok(source) = ConfigSource::load(config, CliOverrides::default()) {
        secret_env::capture_variables_named(&source.secret_variable_names());
    }
}

fn start(cli: cli::Cli, expected: &[(&str, &str)]) -> Result<(), RunError> {
    check_linked_plugins(expected)?;
    let overrides = cli.overrides().map_err(StartupError)?;
    let source =
        ConfigSource::load(cli.config.as_deref(), overrides).map_err(StartupError::from)?;
    // No thread has started yet: the last moment secrets may be taken from the environment.
    secret_env::capture_variables_named(&source.secret_variable_names());
    let core = CoreConfig::from_source(&source, secret_env::secret_variable(CONNECTION_TOKEN_ENV))
        .map_err(StartupError::from)?;
    match cli.command {
        Some(cli::Command::Methods) => Ok(print_methods(&source, &core)?),
        Some(cli::Command::Config) => Ok(print_config(&source, &core)?),
        Some(
            cli::Command::Run(_)
            | cli::Command::Cp(_)
            | cli::Command::Doctor
            | cli::Command::Completions { .. }
            | cli::Command::Man,
        ) => {
            unreachable!("dispatched before start-up")
        }
        Some(cli::Command::Rendezvous {
            listen, public_url, ..
        }) => {
            init_logging();
            prepare_to_listen();
            let args = exec_server_rendezvous::RendezvousArgs {
                listen,
                public_url,
                listener: (&core.listener).into(),
            };
            let runtime = async_runtime()?;
            let served = runtime.block_on(async {
                let signals = shutdown_signal()?;
                exec_server_rendezvous::run(&source, args, signals).await
            });
            runtime.shutdown_background();
            Ok(served?)
        }
        Some(cli::Command::Forward(_)) | None => serve(source, core),
    }
}

/// Logs what the start-up hardening could not do and raises the descriptor limit, which
/// the listeners' reserve is computed from.
fn prepare_to_listen() {
    hygiene::log_deferred_warnings();
    if let Err(e) = hygiene::raise_open_file_limit() {
        tracing::warn!("could not raise the open-file limit: {e}");
    }
}

/// Fails with the crate name when a plugin or configuration section this binary should
/// have is not registered (a crate that is never referenced is not linked, and its
/// `inventory` records vanish with it).
fn check_linked_plugins(expected: &[(&str, &str)]) -> Result<(), StartupError> {
    let registered: Vec<&str> = plugin::plugins()
        .iter()
        .map(|p| p.name)
        .chain(config_sections().iter().map(|s| s.name))
        .collect();
    for (name, krate) in expected {
        if !registered.contains(name) {
            return Err(StartupError(format!(
                "`{name}` is not registered: the crate `{krate}` was not linked into this binary (reference it with `use {} as _;`)",
                krate.replace('-', "_")
            )));
        }
    }
    Ok(())
}

fn print_methods(source: &ConfigSource, core: &CoreConfig) -> Result<(), StartupError> {
    let plan = MethodPlan::new(source, core, &plugin::plugins(), &config_sections())?;
    let width = plan
        .methods
        .iter()
        .map(|m| m.name.len())
        .max()
        .unwrap_or(6)
        .max(6);
    println!(
        "{:width$}  {:12}  {:8}  family",
        "method", "plugin", "enabled"
    );
    for m in &plan.methods {
        let enabled = if m.enabled { "yes" } else { "disabled" };
        println!(
            "{:width$}  {:12}  {:8}  {}",
            m.name, m.plugin, enabled, m.family
        );
    }
    println!();
    for (plugin, enabled) in &plan.plugins {
        let state = if *enabled { "" } else { " (disabled)" };
        println!("plugin {}{state}: {}", plugin.name, plugin.summary);
    }
    for section in config_sections() {
        println!("config section [{}]: {}", section.name, section.summary);
    }
    let mut sentinels: Vec<&str> = exec_server_core::helpers::hidden_helpers()
        .map(|h| h.sentinel)
        .collect();
    sentinels.sort_unstable();
    println!();
    for sentinel in sentinels {
        println!("hidden helper: exec-server {sentinel}");
    }
    Ok(())
}

fn print_config(source: &ConfigSource, core: &CoreConfig) -> Result<(), StartupError> {
    let plan = MethodPlan::new(source, core, &plugin::plugins(), &config_sections())?;
    exec_server_core::server::check_listen_urls(&core.server.listen, core)?;
    let mut effective = core.to_redacted_json();
    for (name, section) in plan.tables {
        effective[name] = section;
    }
    let text = toml::to_string_pretty(&without_nulls(effective))
        .map_err(|e| StartupError(format!("failed to print the configuration: {e}")))?;
    print!("{text}");
    Ok(())
}

/// TOML has no null: unset optional keys are left out.
fn without_nulls(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => map
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k, without_nulls(v)))
            .collect(),
        // Tables in arrays (`[[audit.backends]]`) have unset keys too.
        serde_json::Value::Array(items) => items.into_iter().map(without_nulls).collect(),
        other => other,
    }
}

fn async_runtime() -> Result<tokio::runtime::Runtime, StartupError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| StartupError(format!("failed to start the async runtime: {e}")))
}

fn serve(source: ConfigSource, core: CoreConfig) -> Result<(), RunError> {
    init_logging();
    prepare_to_listen();
    let runtime = async_runtime()?;
    let served = runtime.block_on(async move {
        let mut urls = core.server.listen.clone();
        let server: Arc<ServerContext> = ServerContext::new(&source, core)?;
        let configured = open_configured_transports(&source, &server)?;
        // With no listener and no configured transport (remote mode), listen locally.
        if urls.is_empty() && configured.is_empty() {
            urls.push("ws://127.0.0.1:0".to_owned());
        }
        // Codex refuses an authentication mode that no WebSocket listener would use.
        let authenticated = server.core.websocket.auth.is_some();
        if authenticated && !urls.is_empty() && !urls.iter().any(|u| u.starts_with("ws://")) {
            return Err(RunError::from(StartupError(
                "WebSocket auth requires a WebSocket listener, not stdio".into(),
            )));
        }
        let mut listeners = open_listeners(&urls, &server)?;
        listeners.extend(configured);
        // Handlers are installed before any listener is bound, so a signal that arrives
        // as soon as the address is announced already means "shut down gracefully".
        let signals = shutdown_signal()?;
        run(server, listeners, signals).await
    });
    // What plugins leave for the exit (ending processes that would outlive the server).
    exec_server_core::exit_hooks::run();
    // Plugins may hold blocking threads (process spawner, waiters); do not wait for them:
    // they end with the process.
    runtime.shutdown_background();
    served
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

//! The command line (clap). Parsing has no side effects; `main` derives the rest.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use exec_server_config::CliOverrides;

/// Runs processes and touches files on this machine for a remote harness, speaking the
/// codex exec-server JSON-RPC protocol over stdio, WebSocket or an encrypted relay.
#[derive(Debug, Parser)]
#[command(name = "exec-server", version, about, long_about = None)]
pub struct Cli {
    /// Where to listen: `ws://IP:PORT` (port 0 picks a free port) or `stdio`. Repeatable;
    /// replaces `server.listen` from the config. Default: `ws://127.0.0.1:0`.
    #[arg(long = "listen", value_name = "URL", global = true)]
    pub listen: Vec<String>,

    /// TOML configuration file. Only this file is read; a missing file is an error.
    #[arg(long = "config", value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,

    /// Remote mode: the relay registry base URL (`relay.url`). Needs --environment-id.
    #[arg(long = "remote", value_name = "URL", requires = "environment_id")]
    pub remote: Option<String>,

    /// Remote mode: the environment to serve (`relay.environment_id`).
    #[arg(
        long = "environment-id",
        alias = "executor-id",
        value_name = "ID",
        requires = "remote"
    )]
    pub environment_id: Option<String>,

    /// Remote mode: a display name sent when registering (`relay.name`).
    #[arg(long = "name", value_name = "NAME")]
    pub name: Option<String>,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List every registered method, its plugin, and whether it is enabled.
    Methods,
    /// Print the effective configuration (secrets redacted) as TOML.
    Config,
    /// Run a command on a server as if it were local: live output, stdin forwarded,
    /// `--tty` for a terminal, the remote exit code as the exit code.
    Run(crate::run::RunArgs),
    /// Run the self-hosted relay registry and rendezvous service. `--listen http://IP:PORT`
    /// picks the address (default `http://127.0.0.1:0`); the first stdout line is its URL.
    Rendezvous {
        /// The public base URL handed out and printed (`rendezvous.public_url`).
        #[arg(long = "public-url", value_name = "URL")]
        public_url: Option<String>,
    },
}

impl Cli {
    /// The flags that override configuration keys.
    pub fn overrides(&self) -> CliOverrides {
        let mut overrides = CliOverrides::default();
        let rendezvous = matches!(self.command, Some(Command::Rendezvous { .. }));
        if !self.listen.is_empty() && !rendezvous {
            overrides.set("server.listen", self.listen.clone());
        }
        if let Some(url) = &self.remote {
            overrides.set("relay.url", url.clone());
        }
        if let Some(id) = &self.environment_id {
            overrides.set("relay.environment_id", id.clone());
        }
        if let Some(name) = &self.name {
            overrides.set("relay.name", name.clone());
        }
        overrides
    }
}

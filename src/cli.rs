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

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List every registered method, its plugin, and whether it is enabled.
    Methods,
    /// Print the effective configuration (secrets redacted) as TOML.
    Config,
}

impl Cli {
    /// The flags that override configuration keys.
    pub fn overrides(&self) -> CliOverrides {
        let mut overrides = CliOverrides::default();
        if !self.listen.is_empty() {
            overrides.set("server.listen", self.listen.clone());
        }
        overrides
    }
}

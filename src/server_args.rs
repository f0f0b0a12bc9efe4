//! Where `exec-server run` and `exec-server cp` reach a server: `--url` (with
//! `--token-file`), `--stdio`, `--remote` (with `--environment-id` and `--ca-file`), or a
//! profile of them (`-p`), and the connection itself.

mod profiles;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use exec_server_client::{ClientOptions, ExecServerClient, ExecServerError};
use exec_server_config::core::CONNECTION_TOKEN_ENV;
use exec_server_config::secret::read_token_file;
use exec_server_config::{secret_env, CliOverrides, ConfigSource};
use exec_server_relay::config::RelayConfig;
use exec_server_relay_core::endpoint::check_ws_url;
use exec_server_relay_core::harness::RelayConnectArgs;

/// The flags that say which server to use.
#[derive(Debug, Clone, Args)]
#[command(group(
    clap::ArgGroup::new("server")
        .args(["url", "stdio", "remote"])
        .multiple(false)
))]
pub struct ServerArgs {
    /// Take the server (`url`, `stdio` or `remote` + `environment_id`) and its `token_file`
    /// and `ca_file` from this profile of `~/.config/exec-server/profiles.toml`
    /// ($EXEC_SERVER_PROFILES overrides the file); flags given here win.
    #[arg(short = 'p', long = "profile", value_name = "NAME")]
    pub profile: Option<String>,

    /// WebSocket URL of a running server (`ws://IP:PORT`, or `wss://HOST:PORT` through a
    /// TLS proxy). A bearer token, when the server needs one, is read from `--token-file`
    /// or CODEX_EXEC_SERVER_CONNECTION_TOKEN. Busy answers (503, 429) are retried.
    #[arg(long, value_name = "URL", value_parser = parse_ws_url)]
    pub url: Option<String>,

    /// With --url: a file holding the bearer token, readable by its owner only (the
    /// server's `--ws-token-file`).
    #[arg(long = "token-file", value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// Start a server with this shell command (e.g. `exec-server --listen stdio`) and talk
    /// to it over its stdin and stdout.
    #[arg(long, value_name = "CMD", conflicts_with = "remote")]
    pub stdio: Option<String>,

    /// Reach an executor through the relay registry at this base URL (docs/OPERATIONS.md,
    /// "Remote mode"). The
    /// bearer token and the `[relay]` settings come from the same sources as for the
    /// executor: `relay.token_file`, the variable named by `relay.token_env`
    /// (EXEC_SERVER_RELAY_TOKEN), then CODEX_EXEC_SERVER_REMOTE_BEARER_TOKEN.
    #[arg(long, value_name = "URL")]
    pub remote: Option<String>,

    /// The environment to reach through the relay.
    #[arg(long = "environment-id", alias = "executor-id", value_name = "ID")]
    pub environment_id: Option<String>,

    /// With --remote: a PEM file of CA certificates trusted besides the system's roots for
    /// the `https` registry and its `wss` sockets (`relay.ca_file`,
    /// EXEC_SERVER_RELAY__CA_FILE).
    #[arg(long = "ca-file", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
}

impl ServerArgs {
    /// Applies the profile, if one is named, and checks that one way to reach a server is
    /// left with the flags that belong to it.
    pub fn resolve(&mut self) -> Result<(), String> {
        profiles::apply(self)?;
        check(self)
    }
}

/// The rules clap cannot check before a profile filled the flags in: one way to reach a
/// server, and the flags that belong to it.
fn check(args: &ServerArgs) -> Result<(), String> {
    let ways = [
        args.url.is_some(),
        args.stdio.is_some(),
        args.remote.is_some(),
    ];
    match ways.iter().filter(|set| **set).count() {
        0 => return Err("say which server: `--url ws://IP:PORT` (a running server), `--stdio CMD` (start one), `--remote URL --environment-id ID` (through a relay), or `-p PROFILE` (one of those, from profiles.toml)".into()),
        1 => {}
        _ => return Err("use one of --url, --stdio and --remote".into()),
    }
    if let Some(url) = &args.url {
        parse_ws_url(url).map_err(|e| format!("invalid --url `{url}`: {e}"))?;
    }
    if args.token_file.is_some() && args.url.is_none() {
        return Err("--token-file goes with --url".into());
    }
    if args.remote.is_some() != args.environment_id.is_some() {
        return Err("--remote and --environment-id go together".into());
    }
    if args.ca_file.is_some() && args.remote.is_none() {
        return Err("--ca-file goes with --remote".into());
    }
    Ok(())
}

fn parse_ws_url(text: &str) -> Result<String, String> {
    if text.starts_with("ws://") || text.starts_with("wss://") {
        Ok(text.to_owned())
    } else {
        Err("expected `ws://IP:PORT` (or `wss://HOST:PORT`); for a server started on the spot use `--stdio CMD`, through a relay `--remote URL --environment-id ID`".into())
    }
}

/// Connects to the server `args` name, as `client_name`. `config` is the `--config` file,
/// read for the `[relay]` settings of `--remote`.
pub async fn connect(
    args: &ServerArgs,
    client_name: &str,
    config: Option<&Path>,
) -> Result<ExecServerClient, ExecServerError> {
    let options = ClientOptions {
        client_name: client_name.into(),
        ..ClientOptions::default()
    };
    if let (Some(remote), Some(environment_id)) = (&args.remote, &args.environment_id) {
        let relay_args = relay_args(remote, environment_id, args.ca_file.as_deref(), config)
            .map_err(|e| ExecServerError::InvalidRequest(e.to_string()))?;
        return ExecServerClient::connect_relay(relay_args, options).await;
    }
    match (&args.url, &args.stdio) {
        (Some(url), _) => {
            let token = match &args.token_file {
                Some(path) => Some(
                    read_token_file(path)
                        .map_err(|e| ExecServerError::InvalidRequest(e.describe(path)))?
                        .expose()
                        .to_owned(),
                ),
                // Taken out of the environment at start-up, like every secret variable.
                None => secret_env::secret_variable(CONNECTION_TOKEN_ENV)
                    .map(|token| token.expose().to_owned()),
            };
            if token.is_some() && in_clear_beyond_this_machine(url) {
                eprintln!(
                    "warning: the bearer token travels in clear over ws:// to a host other than this machine; use wss:// (a TLS proxy in front of the server) or an SSH tunnel"
                );
            }
            ExecServerClient::connect_websocket(url, token, options).await
        }
        (None, Some(command_line)) => {
            let mut command = tokio::process::Command::new("sh");
            command.arg("-c").arg(command_line);
            // Its own process group: a Ctrl-C at the local terminal is for the remote
            // command, not for the server that runs it.
            command.process_group(0);
            if std::env::var_os("RUST_LOG").is_none() {
                command.env("RUST_LOG", "warn");
            }
            ExecServerClient::connect_stdio(command, options).await
        }
        (None, None) => Err(ExecServerError::InvalidRequest(
            "one of --url, --stdio or --remote is required".into(),
        )),
    }
}

/// Whether a token sent to `url` crosses a network in clear: `ws://` to a host that is not
/// this machine (the relay's rule for its own sockets).
fn in_clear_beyond_this_machine(url: &str) -> bool {
    check_ws_url(url, false).is_err()
}

/// The relay settings for `--remote`: the `[relay]` keys (file, then environment) and the
/// executor's token sources.
fn relay_args(
    remote: &str,
    environment_id: &str,
    ca_file: Option<&Path>,
    config: Option<&Path>,
) -> Result<RelayConnectArgs, String> {
    let mut overrides = CliOverrides::default();
    if let Some(path) = ca_file {
        overrides.set("relay.ca_file", path.display().to_string());
    }
    let source = ConfigSource::load(config, overrides).map_err(|e| e.to_string())?;
    let relay = RelayConfig::load(&source).map_err(|e| e.to_string())?;
    let token = relay.bearer_token().map_err(|e| e.to_string())?;
    let mut args = RelayConnectArgs::new(remote, environment_id, token);
    args.request_timeout = Duration::from_millis(relay.request_timeout_ms);
    args.connect_timeout = Duration::from_millis(relay.connect_timeout_ms);
    args.handshake_timeout = Duration::from_millis(relay.handshake_timeout_ms);
    args.resume_grace = Duration::from_millis(relay.resume_grace_ms);
    args.allow_insecure = relay.allow_insecure;
    // Checked here, so a bad file is named before anything is sent.
    relay.tls_trust()?;
    args.ca_file = relay.ca_file;
    Ok(args)
}

impl ServerArgs {
    /// What to do about `error` when it is an upgrade the server refused with a status a
    /// user can fix, naming where the token sent came from.
    pub fn refusal_hint(&self, error: &ExecServerError) -> Option<String> {
        let ExecServerError::Refused { status, .. } = error else {
            return None;
        };
        let token_from = match &self.token_file {
            Some(path) => Some(format!("--token-file {}", path.display())),
            None if secret_env::secret_variable(CONNECTION_TOKEN_ENV).is_some() => {
                Some(CONNECTION_TOKEN_ENV.to_owned())
            }
            None => None,
        };
        hint_for_status(*status, token_from.as_deref())
    }
}

fn hint_for_status(status: u16, token_from: Option<&str>) -> Option<String> {
    match (status, token_from) {
        (401, None) => Some(format!(
            "the server needs a bearer token: pass `--token-file FILE` (owner-only) or set {CONNECTION_TOKEN_ENV}"
        )),
        (401, Some(source)) => Some(format!(
            "the server did not accept the bearer token from {source}"
        )),
        (503 | 429, _) => Some("the server stayed busy through the retries; try again later".into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_in_clear_over_ws_to_another_host() {
        for url in [
            "ws://10.0.0.7:9000",
            "ws://build.example.com:9000",
            "ws://[fe80::1]:1",
        ] {
            assert!(in_clear_beyond_this_machine(url), "{url}");
        }
        for url in [
            "ws://127.0.0.1:9000",
            "ws://localhost:9000",
            "ws://[::1]:9000",
            "ws://[::ffff:127.0.0.1]:9000",
            "wss://build.example.com",
        ] {
            assert!(!in_clear_beyond_this_machine(url), "{url}");
        }
    }
}

//! The command line (clap). Parsing has no side effects; `main` derives the rest.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use exec_server_config::CliOverrides;

/// Runs processes and touches files on this machine for a remote harness, speaking the
/// codex exec-server JSON-RPC protocol over stdio, WebSocket or an encrypted relay.
#[derive(Debug, Parser)]
#[command(name = "exec-server", version, about, long_about = None)]
pub struct Cli {
    /// Where to listen: `ws://IP:PORT` or `ws://localhost:PORT` (port 0 picks a free port) or
    /// `stdio`; off loopback only with `--ws-auth`. Repeatable;
    /// replaces `server.listen` from the config. Default: `ws://127.0.0.1:0`.
    #[arg(long = "listen", value_name = "URL")]
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

    /// Remote mode: read the registry bearer token from the first line of stdin (one
    /// newline-terminated line of at most 16 KiB, as codex's flag; `relay.token_stdin`).
    #[arg(long = "registration-bearer-stdin", requires = "remote")]
    pub registration_bearer_stdin: bool,

    /// Remote mode: a display name sent when registering (`relay.name`).
    #[arg(long = "name", value_name = "NAME")]
    pub name: Option<String>,

    /// WebSocket authentication (`websocket.auth`): `capability-token` or
    /// `signed-bearer-token`.
    #[arg(long = "ws-auth", value_name = "MODE", value_parser = ["capability-token", "signed-bearer-token"])]
    pub ws_auth: Option<String>,

    /// Capability token file, owner-only (`websocket.bearer_token_file`).
    #[arg(long = "ws-token-file", value_name = "PATH")]
    pub ws_token_file: Option<PathBuf>,

    /// SHA-256 of the capability token, 64 hex digits (`websocket.token_sha256`).
    #[arg(long = "ws-token-sha256", value_name = "HEX")]
    pub ws_token_sha256: Option<String>,

    /// HS256 secret file of signed bearer tokens, owner-only, at least 32 bytes
    /// (`websocket.shared_secret_file`).
    #[arg(long = "ws-shared-secret-file", value_name = "PATH")]
    pub ws_shared_secret_file: Option<PathBuf>,

    /// Required `iss` of signed bearer tokens (`websocket.issuer`).
    #[arg(long = "ws-issuer", value_name = "ISSUER")]
    pub ws_issuer: Option<String>,

    /// Required `aud` of signed bearer tokens (`websocket.audience`).
    #[arg(long = "ws-audience", value_name = "AUDIENCE")]
    pub ws_audience: Option<String>,

    /// Clock skew allowed on `exp` and `nbf`, default 30 (`websocket.max_clock_skew_seconds`).
    #[arg(long = "ws-max-clock-skew-seconds", value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(0..=i64::MAX as u64))]
    pub ws_max_clock_skew_seconds: Option<u64>,

    /// Serve a `ws://` listener off loopback with no authentication
    /// (`websocket.dangerously_listen_without_auth`). Refused at start otherwise: anyone who
    /// reaches the address runs commands as this user.
    #[arg(long = "dangerously-listen-without-auth")]
    pub dangerously_listen_without_auth: bool,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List every registered method, its plugin, and whether it is enabled.
    Methods,
    /// Print the effective configuration (secrets redacted) as TOML.
    Config,
    /// Check this host the way the server will use it (sandbox layers, namespaces,
    /// limits, clock, a configured Redis store and TLS files): one line per check with
    /// what it means and the fix; status 1 when something configured cannot work.
    Doctor,
    /// Run a command on a server as if it were local: live output, stdin forwarded,
    /// `--tty` for a terminal, the remote exit code as the exit code.
    Run(crate::run::RunArgs),
    /// Copy one file between this machine and a server, like scp: the server's side is
    /// written `:/PATH` (`exec-server cp -p build ./app.tar :/srv/app.tar`).
    Cp(crate::cp::CpArgs),
    /// Run the self-hosted relay registry and rendezvous service; the first stdout line is
    /// its URL.
    Rendezvous {
        /// Where to listen: `http://IP:PORT` (port 0 picks a free port), or `https://IP:PORT`
        /// with --tls-cert-file and --tls-key-file. Default: `http://127.0.0.1:0`.
        #[arg(long = "listen", value_name = "URL")]
        listen: Option<String>,
        /// PEM certificate chain for in-process TLS (`rendezvous.tls_cert_file`).
        #[arg(long = "tls-cert-file", value_name = "FILE")]
        tls_cert_file: Option<PathBuf>,
        /// PEM private key for in-process TLS, owner-only (`rendezvous.tls_key_file`).
        #[arg(long = "tls-key-file", value_name = "FILE")]
        tls_key_file: Option<PathBuf>,
        /// The public base URL handed out and printed (`rendezvous.public_url`).
        #[arg(long = "public-url", value_name = "URL")]
        public_url: Option<String>,
        /// Accept any bearer token, as one tenant (`rendezvous.insecure_no_auth`): for
        /// trying remote mode on one machine; loopback addresses only.
        #[arg(long = "insecure-no-auth")]
        insecure_no_auth: bool,
        /// Where the registry state lives (`rendezvous.store`): `memory`, or a Redis URL
        /// shared by several nodes, e.g. `redis://10.0.0.5:6379/0`.
        #[arg(long = "store", value_name = "URL")]
        store: Option<String>,
        /// This node's own public URL, where harnesses reach the environments it holds
        /// (`rendezvous.node_url`).
        #[arg(long = "node-url", value_name = "URL")]
        node_url: Option<String>,
    },
    /// Register with a relay registry like `--remote`, and copy each harness stream to its
    /// own WebSocket connection to a local exec-server (`--connect`), as codex's `exec-server
    /// forward`.
    Forward(ForwardArgs),
    /// Print a shell completion script, e.g. `exec-server completions bash >
    /// /etc/bash_completion.d/exec-server`.
    Completions {
        /// The shell: bash, elvish, fish, powershell or zsh.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `exec-server man | man -l -`.
    Man,
}

/// Arguments of `exec-server forward`.
#[derive(Debug, Clone, clap::Args)]
pub struct ForwardArgs {
    /// The relay registry base URL (`relay.url`).
    #[arg(long = "remote", value_name = "URL")]
    pub remote: String,

    /// The environment to serve (`relay.environment_id`).
    #[arg(long = "environment-id", alias = "executor-id", value_name = "ID")]
    pub environment_id: String,

    /// The exec-server every stream is forwarded to: `ws://HOST:PORT` or `wss://…`
    /// (`relay.forward_url`). One WebSocket connection per stream, opened when the stream
    /// starts; a destination that is down closes that stream only.
    #[arg(long = "connect", value_name = "URL")]
    pub connect: String,

    /// Bearer token file (owner-only) for a destination started with `--ws-auth
    /// capability-token` (`relay.forward_bearer_token_file`).
    #[arg(long = "connect-bearer-token-file", value_name = "PATH")]
    pub connect_bearer_token_file: Option<PathBuf>,

    /// Read the registry bearer token from the first line of stdin (`relay.token_stdin`).
    /// Otherwise it comes from `relay.token_file` or EXEC_SERVER_RELAY_TOKEN, as for
    /// `--remote`.
    #[arg(long = "registration-bearer-stdin")]
    pub registration_bearer_stdin: bool,

    /// A display name sent when registering (`relay.name`).
    #[arg(long = "name", value_name = "NAME")]
    pub name: Option<String>,
}

impl ForwardArgs {
    fn overrides(&self, overrides: &mut CliOverrides) -> Result<(), String> {
        exec_server_relay::forward::check_destination(&self.connect).map_err(str::to_owned)?;
        overrides.set("relay.url", self.remote.clone());
        overrides.set("relay.environment_id", self.environment_id.clone());
        overrides.set("relay.forward_url", self.connect.clone());
        if let Some(path) = &self.connect_bearer_token_file {
            overrides.set(
                "relay.forward_bearer_token_file",
                path.display().to_string(),
            );
        }
        if self.registration_bearer_stdin {
            overrides.set("relay.token_stdin", true);
        }
        if let Some(name) = &self.name {
            overrides.set("relay.name", name.clone());
        }
        // A forwarder serves nothing itself: no local listener, whatever the config says.
        overrides.set("server.listen", Vec::<String>::new());
        Ok(())
    }
}

impl Cli {
    /// The flags that override configuration keys. The `--ws-*` flags are checked as
    /// codex checks them first (CODEX-0169 §3.1); the error is codex's text.
    pub fn overrides(&self) -> Result<CliOverrides, String> {
        let mut overrides = CliOverrides::default();
        self.websocket_auth_overrides(&mut overrides)?;
        if let Some(Command::Rendezvous {
            insecure_no_auth,
            tls_cert_file,
            tls_key_file,
            ..
        }) = &self.command
        {
            if *insecure_no_auth {
                overrides.set("rendezvous.insecure_no_auth", true);
            }
            if let Some(path) = tls_cert_file {
                overrides.set("rendezvous.tls_cert_file", path.display().to_string());
            }
            if let Some(path) = tls_key_file {
                overrides.set("rendezvous.tls_key_file", path.display().to_string());
            }
        }
        if let Some(Command::Rendezvous {
            store, node_url, ..
        }) = &self.command
        {
            if let Some(store) = store {
                overrides.set("rendezvous.store", store.clone());
            }
            if let Some(url) = node_url {
                overrides.set("rendezvous.node_url", url.clone());
            }
        }
        if !self.listen.is_empty() {
            overrides.set("server.listen", self.listen.clone());
        }
        if self.dangerously_listen_without_auth {
            overrides.set("websocket.dangerously_listen_without_auth", true);
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
        if self.registration_bearer_stdin {
            if self.listen.iter().any(|l| l.starts_with("stdio")) {
                return Err(
                    "`--registration-bearer-stdin` cannot be combined with `--listen stdio`".into(),
                );
            }
            overrides.set("relay.token_stdin", true);
        }
        if let Some(Command::Forward(forward)) = &self.command {
            if !self.listen.is_empty() {
                return Err("`forward` does not listen locally; drop `--listen`".into());
            }
            forward.overrides(&mut overrides)?;
        }
        Ok(overrides)
    }

    fn websocket_auth_overrides(&self, overrides: &mut CliOverrides) -> Result<(), String> {
        let blank = |v: &Option<String>| v.as_deref().is_none_or(|v| v.trim().is_empty());
        let token_flags = self.ws_token_file.is_some() || self.ws_token_sha256.is_some();
        let jwt_flags = self.ws_shared_secret_file.is_some()
            || !blank(&self.ws_issuer)
            || !blank(&self.ws_audience)
            || self.ws_max_clock_skew_seconds.is_some();
        let Some(mode) = self.ws_auth.as_deref() else {
            if token_flags || jwt_flags {
                return Err("websocket auth flags require `--ws-auth capability-token` or `--ws-auth signed-bearer-token`".into());
            }
            return Ok(());
        };
        if mode == "capability-token" {
            if jwt_flags {
                return Err("`--ws-shared-secret-file`, `--ws-issuer`, `--ws-audience`, and `--ws-max-clock-skew-seconds` require `--ws-auth signed-bearer-token`".into());
            }
            match (&self.ws_token_file, &self.ws_token_sha256) {
                (Some(_), Some(_)) => {
                    return Err("`--ws-token-file` and `--ws-token-sha256` are mutually exclusive".into())
                }
                (None, None) => {
                    return Err("`--ws-token-file` or `--ws-token-sha256` is required when `--ws-auth capability-token` is set".into())
                }
                (Some(file), None) => overrides.set(
                    "websocket.bearer_token_file",
                    file.display().to_string(),
                ),
                (None, Some(hex)) => {
                    if exec_server_config::ws_auth::parse_token_sha256(hex).is_none() {
                        return Err("--ws-token-sha256 must be a 64-character hex SHA-256 digest".into());
                    }
                    overrides.set("websocket.token_sha256", hex.clone());
                }
            }
        } else {
            if token_flags {
                return Err("`--ws-token-file` and `--ws-token-sha256` require `--ws-auth capability-token`, not `signed-bearer-token`".into());
            }
            let Some(secret) = &self.ws_shared_secret_file else {
                return Err("`--ws-shared-secret-file` is required when `--ws-auth signed-bearer-token` is set".into());
            };
            overrides.set("websocket.shared_secret_file", secret.display().to_string());
            if !blank(&self.ws_issuer) {
                overrides.set("websocket.issuer", self.ws_issuer.clone());
            }
            if !blank(&self.ws_audience) {
                overrides.set("websocket.audience", self.ws_audience.clone());
            }
            if let Some(skew) = self.ws_max_clock_skew_seconds {
                overrides.set("websocket.max_clock_skew_seconds", skew);
            }
        }
        overrides.set("websocket.auth", mode);
        Ok(())
    }
}

/// `exec-server completions <shell>`: the completion script, generated from this parser.
pub fn print_completions(shell: clap_complete::Shell) -> std::process::ExitCode {
    use clap::CommandFactory;
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, "exec-server", &mut std::io::stdout());
    std::process::ExitCode::SUCCESS
}

/// `exec-server man`: the manual page, generated from this parser.
pub fn print_man_page() -> std::process::ExitCode {
    use clap::CommandFactory;
    let page = clap_mangen::Man::new(Cli::command());
    match page.render(&mut std::io::stdout()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exec-server man: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

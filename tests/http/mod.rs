//! `http/request` (CODEX-NETWORK.md §2) against loopback origins: each scenario runs on our
//! server and, where the codex CLI is installed, on `codex exec-server` too, and both must
//! answer alike, so each fact of the spec is pinned on both.
//!
//! * `origin` — the hand-written HTTP/1.1 origin the requests go to.
//! * `request` — buffered requests, headers, errors, redirects, decoding, time-outs.
//! * `stream` — streamed bodies (`http/request/bodyDelta`).
//! * `limits` — what `[http]` restricts and bounds (ours only).

mod limits;
pub(crate) mod origin;
mod request;
mod stream;

use crate::codex::{codex_bin, CodexHome};
use crate::util::{config_file, server_command, Client};

/// One of the servers a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Codex,
    Ours,
}

/// The servers a scenario runs on: ours, and codex when it is installed (or required).
pub struct Sides {
    codex: Option<std::path::PathBuf>,
    home: CodexHome,
}

impl Sides {
    pub fn new(test: &str) -> Self {
        Self {
            codex: codex_bin(test),
            home: CodexHome::new(),
        }
    }

    pub fn all(&self) -> Vec<Side> {
        match self.codex {
            Some(_) => vec![Side::Codex, Side::Ours],
            None => vec![Side::Ours],
        }
    }

    /// An initialized stdio client of `side`, whose server process has `env` besides.
    pub async fn client(&self, side: Side, env: &[(&str, &str)]) -> Client {
        let mut cmd = match side {
            Side::Codex => {
                let mut cmd = self.home.command(self.codex.as_ref().unwrap());
                cmd.arg("exec-server");
                cmd
            }
            Side::Ours => server_command(&[]),
        };
        cmd.args(["--listen", "stdio"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .envs(env.iter().copied())
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("ALL_PROXY")
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .env_remove("all_proxy");
        let mut client = Client::stdio_with(cmd);
        client.handshake().await;
        client
    }
}

/// Our server over stdio with `toml` as its configuration; the file lives as long as the
/// returned value.
pub async fn ours_with(toml: &str) -> (Client, tempfile::TempPath) {
    let config = config_file(toml);
    let mut cmd = server_command(&["--config", config.to_str().unwrap()]);
    cmd.args(["--listen", "stdio"]);
    let mut client = Client::stdio_with(cmd);
    client.handshake().await;
    (client, config)
}

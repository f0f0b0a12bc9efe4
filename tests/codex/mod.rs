//! The real codex CLI 0.171.0 against this server: its client driving a whole `codex exec`
//! turn through us (`end_to_end`), and the same protocol checks run against
//! `codex exec-server` and ours side by side (`conformance`). The `codex exec` turn also
//! runs with 0.169.0, the release before, which older clients still use.
//!
//! codex is installed by `scripts/install-codex.sh`; tests find 0.171.0 through `CODEX_BIN`
//! (default `~/.cache/exec-server/codex-0.171.0/node_modules/.bin/codex`) and 0.169.0
//! through `CODEX_BIN_0169` (default `…/codex-0.169.0/…`). Without it they print `SKIP: …`
//! and pass, unless `EXEC_SERVER_REQUIRE_CODEX_TESTS=1`, which makes a missing codex a
//! failure (CI sets it).
//!
//! * `fake_model` — a Responses API endpoint that answers with a shell tool call, then a
//!   final message.
//! * `proxy` — a WebSocket proxy that records every request the codex client sends and
//!   every error it gets back.

mod conformance;
mod end_to_end;
pub(crate) mod fake_model;
mod mcp_http;
mod proxy;

use std::path::PathBuf;

/// The codex release these tests are written against.
pub const CODEX_VERSION: &str = "0.171.0";

/// The release before, kept for older clients: the `codex exec` turn runs with it too.
pub const CODEX_VERSION_0169: &str = "0.169.0";

/// The environment variable that overrides where codex `version` is found.
fn bin_variable(version: &str) -> &'static str {
    if version == CODEX_VERSION_0169 {
        "CODEX_BIN_0169"
    } else {
        "CODEX_BIN"
    }
}

/// The codex binary of [`CODEX_VERSION`], or `None` after printing why the calling test is
/// skipped. Panics instead of skipping when `EXEC_SERVER_REQUIRE_CODEX_TESTS=1`.
pub fn codex_bin(test: &str) -> Option<PathBuf> {
    codex_bin_of(CODEX_VERSION, test)
}

/// The codex binary of `version` (found through [`bin_variable`], else in its
/// `scripts/install-codex.sh` prefix), or `None` as for [`codex_bin`].
pub fn codex_bin_of(version: &str, test: &str) -> Option<PathBuf> {
    let variable = bin_variable(version);
    let bin = std::env::var_os(variable)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home)
                .join(format!(".cache/exec-server/codex-{version}"))
                .join("node_modules/.bin/codex")
        });
    let reported = std::process::Command::new(&bin)
        .arg("--version")
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned());
    let problem = match reported {
        Some(v) if v == format!("codex-cli {version}") => return Some(bin),
        Some(v) => format!("{} is {v:?}, not codex-cli {version}", bin.display()),
        None => format!("{} cannot be run", bin.display()),
    };
    let required = std::env::var("EXEC_SERVER_REQUIRE_CODEX_TESTS").as_deref() == Ok("1");
    assert!(
        !required,
        "{test}: {problem}; run scripts/install-codex.sh or set {variable}"
    );
    println!("SKIP: {test}: {problem} (run scripts/install-codex.sh)");
    None
}

/// The native binary behind codex's npm launcher (`…/@openai/codex/bin/codex.js`), and
/// the launcher's package directory; `None` when `bin` is not that launcher.
fn native_binary(bin: &std::path::Path) -> Option<(PathBuf, PathBuf)> {
    let launcher = std::fs::canonicalize(bin).ok()?;
    let package = launcher.parent()?.parent()?;
    let (suffix, triple) = match std::env::consts::ARCH {
        "x86_64" => ("x64", "x86_64-unknown-linux-musl"),
        "aarch64" => ("arm64", "aarch64-unknown-linux-musl"),
        _ => return None,
    };
    let native = package
        .parent()?
        .join(format!("codex-linux-{suffix}/vendor/{triple}/bin/codex"));
    native.is_file().then(|| (native, package.to_path_buf()))
}

/// A throw-away `HOME` with a `CODEX_HOME` inside it, so codex reads no configuration
/// of the machine's user.
pub struct CodexHome {
    pub dir: tempfile::TempDir,
}

impl CodexHome {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".codex")).unwrap();
        Self { dir }
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    pub fn codex_home(&self) -> PathBuf {
        self.dir.path().join(".codex")
    }

    /// A command for codex with this home and nothing of the caller's codex environment.
    /// The npm launcher is skipped for the native binary it would start, as the launcher
    /// would (its environment included): `kill_on_drop` kills the process it started, and a
    /// killed launcher would leave the binary running.
    pub fn command(&self, bin: &std::path::Path) -> tokio::process::Command {
        let mut cmd = match native_binary(bin) {
            Some((native, package)) => {
                let mut cmd = tokio::process::Command::new(native);
                cmd.env("CODEX_MANAGED_BY_NPM", "1")
                    .env("CODEX_MANAGED_PACKAGE_ROOT", package);
                cmd
            }
            None => tokio::process::Command::new(bin),
        };
        cmd.env("HOME", self.home())
            .env("CODEX_HOME", self.codex_home())
            .env_remove("CODEX_EXEC_SERVER_URL")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("RUST_LOG")
            .env_remove("RUST_BACKTRACE")
            .kill_on_drop(true);
        cmd
    }

    /// Points codex at the fake model endpoint `base_url` (its `config.toml`).
    pub fn use_model(&self, base_url: &str) {
        let config = format!(
            "model = \"gpt-test\"\nmodel_provider = \"fake\"\n\n[model_providers.fake]\nname = \"fake\"\nbase_url = \"{base_url}\"\nwire_api = \"responses\"\nenv_key = \"OPENAI_API_KEY\"\nsupports_websockets = false\n"
        );
        std::fs::write(self.codex_home().join("config.toml"), config).unwrap();
    }

    /// `codex exec` of one turn in `work_dir`, asking for codex's workspace-write sandbox
    /// where this host can enforce it (Landlock) and for none otherwise, so that the turn
    /// runs rather than failing closed; output is captured. The caller adds how codex
    /// reaches its environment.
    pub fn exec_turn(
        &self,
        bin: &std::path::Path,
        work_dir: &std::path::Path,
    ) -> tokio::process::Command {
        let sandbox = if crate::sandbox::landlock_available() {
            "workspace-write"
        } else {
            "danger-full-access"
        };
        let mut cmd = self.command(bin);
        cmd.args([
            "exec",
            "--skip-git-repo-check",
            "--color",
            "never",
            "--sandbox",
            sandbox,
            "write the marker file",
        ])
        .current_dir(work_dir)
        .env("OPENAI_API_KEY", "sk-test")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        cmd
    }
}

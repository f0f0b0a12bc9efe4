//! The processes under test: the exec-server binary (as a server or a rendezvous), codex,
//! and the floor servers, started fresh for each row (or for the soak) and killed when
//! dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The release `exec-server` binary beside this one, built first if it is missing.
pub fn server_binary() -> PathBuf {
    let me = std::env::current_exe().expect("own path");
    let path = me.with_file_name("exec-server");
    if !path.exists() {
        eprintln!("building the exec-server binary…");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let profile_is_release = me.parent().is_some_and(|d| d.ends_with("release"));
        let mut build = std::process::Command::new(cargo);
        build.args(["build", "--bin", "exec-server", "-p", "exec-server"]);
        if profile_is_release {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build");
        assert!(status.success(), "building exec-server failed");
    }
    path
}

/// A started process with a WebSocket address (exec-server or the echo floor).
pub struct WsProcess {
    pub child: Child,
    pub url: String,
    _stdout: BufReader<ChildStdout>,
    /// codex only: its own `HOME`, and its process group (its launcher starts the real
    /// binary as a child, which a kill of the launcher alone would leave running).
    peer: Option<(tempfile_dir::TempHome, i32)>,
}

impl WsProcess {
    /// `exec-server --listen ws://127.0.0.1:0` with extra args.
    pub async fn exec_server(extra: &[&str]) -> Self {
        Self::exec_server_with_env(extra, &[]).await
    }

    /// Like [`WsProcess::exec_server`] with extra environment variables (config overrides).
    pub async fn exec_server_with_env(extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start(Self::exec_server_command(extra, env)).await
    }

    /// The command [`WsProcess::exec_server_with_env`] starts, for a caller that adjusts it
    /// before [`WsProcess::start`] (the soak gives the server a process group of its own).
    pub fn exec_server_command(extra: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(server_binary());
        cmd.args(["--listen", "ws://127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().copied())
            .env("RUST_LOG", server_log());
        cmd
    }

    /// `codex exec-server --listen ws://127.0.0.1:0`, with an empty `HOME` of its own so it
    /// reads no configuration of the machine's user.
    pub async fn codex(bin: &Path) -> Self {
        let home = tempfile_dir::TempHome::new();
        let mut cmd = Command::new(bin);
        cmd.args(["exec-server", "--listen", "ws://127.0.0.1:0"])
            .env("HOME", home.path())
            .env("CODEX_HOME", home.path())
            .env_remove("RUST_LOG")
            .stderr(Stdio::null())
            .process_group(0);
        let mut process = Self::start(cmd).await;
        let group = process.child.id().expect("running") as i32;
        process.peer = Some((home, group));
        process
    }

    /// The bare tokio-tungstenite echo server.
    pub async fn echo_floor() -> Self {
        let mut cmd = Command::new(std::env::current_exe().expect("own path"));
        cmd.arg(crate::floors::WS_ECHO);
        Self::start(cmd).await
    }

    /// A bare tokio-tungstenite forwarder in front of `upstream` (the echo floor): the
    /// least one more WebSocket hop costs.
    pub async fn forward_floor(upstream: &str) -> Self {
        let mut cmd = Command::new(std::env::current_exe().expect("own path"));
        cmd.arg(crate::floors::WS_FORWARD).arg(upstream);
        Self::start(cmd).await
    }

    /// Starts `cmd`, which prints its WebSocket address as its first line.
    pub async fn start(mut cmd: Command) -> Self {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn server");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).await.expect("address line");
        Self {
            child,
            url: line.trim().to_owned(),
            _stdout: stdout,
            peer: None,
        }
    }

    /// The serving process: for codex the deepest descendant of its launcher.
    pub fn pid(&self) -> u32 {
        let mut pid = self.child.id().expect("running");
        if self.peer.is_some() {
            while let Some(child) = first_child(pid) {
                pid = child;
            }
        }
        pid
    }
}

impl Drop for WsProcess {
    fn drop(&mut self) {
        if let Some((_, group)) = &self.peer {
            // SAFETY: signals the process group this value started; no memory involved.
            unsafe { libc::kill(-*group, libc::SIGKILL) };
        }
    }
}

/// The `RUST_LOG` of the servers under test: `BENCH_SERVER_LOG`, else `error`.
fn server_log() -> String {
    std::env::var("BENCH_SERVER_LOG").unwrap_or("error".into())
}

/// The bearer token executors register with, and the one harnesses connect with.
pub const EXECUTOR_TOKEN: &str = "bench-executor-token";
pub const HARNESS_TOKEN: &str = "bench-harness-token";

/// `exec-server rendezvous` on `127.0.0.1:0`, configured to let [`EXECUTOR_TOKEN`] register
/// `env-*` environments and [`HARNESS_TOKEN`] connect to them; killed, and its configuration
/// file removed, when dropped.
pub struct Rendezvous {
    pub child: Child,
    /// Its registry URL (`http://127.0.0.1:PORT`), the first line it prints.
    pub url: String,
    config: PathBuf,
}

impl Rendezvous {
    /// Starts one; `tag` keeps the configuration files of several apart.
    pub async fn start(tag: &str) -> Self {
        Self::start_with(tag, |_| {}).await
    }

    /// Like [`Rendezvous::start`], with `adjust` applied to the command first.
    pub async fn start_with(tag: &str, adjust: impl FnOnce(&mut Command)) -> Self {
        let config = std::env::temp_dir().join(format!(
            "exec-server-bench-rdv-{}-{tag}.toml",
            std::process::id()
        ));
        let hex = |token: &str| -> String {
            exec_server_rendezvous::signing::token_digest(token)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        };
        std::fs::write(
            &config,
            format!(
                "[[rendezvous.tokens]]\nname = \"executors\"\nsha256 = \"{}\"\nrole = \"executor\"\nenvironments = [\"env-*\"]\n\n[[rendezvous.tokens]]\nname = \"harnesses\"\nsha256 = \"{}\"\nrole = \"harness\"\n",
                hex(EXECUTOR_TOKEN),
                hex(HARNESS_TOKEN),
            ),
        )
        .expect("write rendezvous config");
        let mut cmd = Command::new(server_binary());
        cmd.arg("rendezvous")
            .arg("--config")
            .arg(&config)
            .args(["--listen", "http://127.0.0.1:0"])
            .env("RUST_LOG", server_log())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        adjust(&mut cmd);
        let mut child = cmd.spawn().expect("spawn rendezvous");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .await
            .expect("rendezvous URL");
        Self {
            child,
            url: line.trim().to_owned(),
            config,
        }
    }
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

/// `codex exec-server --remote URL --environment-id ID --registration-bearer-stdin`: codex's
/// executor registered with a rendezvous (its token on stdin, which stays open), in a
/// process group of its own that is killed when this is dropped.
pub struct CodexExecutor {
    _child: Child,
    _stdin: ChildStdin,
    _home: tempfile_dir::TempHome,
    group: i32,
}

impl CodexExecutor {
    pub async fn start(bin: &Path, registry: &str, environment: &str, token: &str) -> Self {
        use tokio::io::AsyncWriteExt;
        let home = tempfile_dir::TempHome::new();
        let mut cmd = Command::new(bin);
        cmd.arg("exec-server")
            .args(["--remote", registry, "--environment-id", environment])
            .arg("--registration-bearer-stdin")
            .env("HOME", home.path())
            .env("CODEX_HOME", home.path())
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn codex exec-server --remote");
        let group = child.id().expect("running") as i32;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(format!("{token}\n").as_bytes())
            .await
            .expect("codex reads its token");
        stdin.flush().await.expect("codex reads its token");
        Self {
            _child: child,
            _stdin: stdin,
            _home: home,
            group,
        }
    }
}

impl Drop for CodexExecutor {
    fn drop(&mut self) {
        // SAFETY: signals the process group this value started; no memory involved.
        unsafe { libc::kill(-self.group, libc::SIGKILL) };
    }
}

/// The first child of `pid`, from `/proc/<pid>/task/<pid>/children`.
fn first_child(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A throw-away directory, removed when dropped.
mod tempfile_dir {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    pub struct TempHome(PathBuf);

    impl TempHome {
        pub fn new() -> Self {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "exec-server-bench-codex-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&path).expect("codex home");
            Self(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempHome {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A started process spoken to over its stdin/stdout.
pub struct StdioProcess {
    /// Kept so the process is killed when this is dropped.
    _child: Child,
    pub stdin: ChildStdin,
    pub stdout: BufReader<ChildStdout>,
}

impl StdioProcess {
    pub fn exec_server() -> Self {
        let mut cmd = Command::new(server_binary());
        cmd.args(["--listen", "stdio"]).env("RUST_LOG", "error");
        Self::start(cmd)
    }

    pub fn echo_floor() -> Self {
        let mut cmd = Command::new(std::env::current_exe().expect("own path"));
        cmd.arg(crate::floors::LINE_ECHO);
        Self::start(cmd)
    }

    fn start(mut cmd: Command) -> Self {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn");
        Self {
            stdin: child.stdin.take().expect("stdin"),
            stdout: BufReader::new(child.stdout.take().expect("stdout")),
            _child: child,
        }
    }
}

/// Resident set size of a process in KiB, from `/proc/<pid>/status`.
pub fn rss_kib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// One line describing the machine the numbers came from.
pub fn machine_summary() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    format!("{cores} cores, {cpu}, Linux {kernel}")
}

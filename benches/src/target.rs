//! The processes under test: the exec-server binary and the floor servers, started fresh
//! for each row and killed when dropped.

use std::path::PathBuf;
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
}

impl WsProcess {
    /// `exec-server --listen ws://127.0.0.1:0` with extra args.
    pub async fn exec_server(extra: &[&str]) -> Self {
        Self::exec_server_with_env(extra, &[]).await
    }

    /// Like [`WsProcess::exec_server`] with extra environment variables (config overrides).
    pub async fn exec_server_with_env(extra: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(server_binary());
        cmd.args(["--listen", "ws://127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().copied())
            .env("RUST_LOG", "error");
        Self::start(cmd).await
    }

    /// The bare tokio-tungstenite echo server.
    pub async fn echo_floor() -> Self {
        let mut cmd = Command::new(std::env::current_exe().expect("own path"));
        cmd.arg(crate::floors::WS_ECHO);
        Self::start(cmd).await
    }

    async fn start(mut cmd: Command) -> Self {
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
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
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

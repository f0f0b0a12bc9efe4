//! The server side of the fs helper (SANDBOX.md §4.2, §4.6): one helper process per
//! request, with a cleared environment, `/` as working directory, three pipes, a wall-clock
//! limit, a cap on its output, and a bounded number of helpers alive at once, shared
//! fairly by sessions.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use exec_server_core::FairSlots;
use exec_server_proto::RpcError;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::{HelperRequest, HelperResponse, FS_HELPER_ARG1};
use crate::policy::{Enforcement, SandboxPolicy};

/// Bytes of the helper's stderr quoted in a failure message.
pub const STDERR_CAP: usize = 4096;

/// Variables a helper inherits from the server; nothing else (§4.2).
pub const ENV_ALLOW_LIST: &[&str] = &["PATH", "TMPDIR", "TMP", "TEMP"];

/// Default program of a helper: always the very binary that is running.
pub const SELF_EXE: &str = "/proc/self/exe";

/// How fs helpers are started.
#[derive(Debug, Clone)]
pub struct FsHelperSettings {
    /// The program to run (`sandbox.helper_executable`, else `/proc/self/exe`).
    pub program: PathBuf,
    /// `argv[0]` for `ps` readability: the resolved server executable.
    pub argv0: PathBuf,
    pub timeout: Duration,
    pub max_response_bytes: u64,
    /// Passed as `--max-request-bytes`.
    pub max_request_bytes: u64,
    pub enforcement: Enforcement,
}

/// Runs fs helpers, at most `max_concurrent` at a time and `per_session` for one session.
#[derive(Debug, Clone)]
pub struct FsHelperRunner {
    settings: Arc<FsHelperSettings>,
    /// One slot per live helper (§3.2): bounds the processes a burst of sandboxed
    /// requests can create, and takes turns by session so that one session's burst only
    /// delays itself. Waiting for a slot is not charged to the time-out.
    slots: FairSlots,
}

impl FsHelperRunner {
    pub fn new(settings: FsHelperSettings, max_concurrent: usize, per_session: usize) -> Self {
        Self {
            settings: Arc::new(settings),
            slots: FairSlots::new("fs_helpers", max_concurrent, per_session),
        }
    }

    pub fn settings(&self) -> &FsHelperSettings {
        &self.settings
    }

    /// The helper command for `policy` (§4.1–§4.2); no `pre_exec`, so the standard library
    /// can spawn without `fork`.
    pub fn command(&self, policy: &SandboxPolicy) -> Command {
        let s = &self.settings;
        let mut command = Command::new(&s.program);
        command
            .arg0(&s.argv0)
            .arg(FS_HELPER_ARG1)
            .arg("--policy")
            .arg(policy.to_helper_json(s.enforcement))
            .arg("--max-request-bytes")
            .arg(s.max_request_bytes.to_string())
            .env_clear()
            .envs(
                ENV_ALLOW_LIST
                    .iter()
                    .filter_map(|name| std::env::var_os(name).map(|value| (*name, value))),
            )
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Runs `operation` with `params` for `session` in a helper confined by `policy`; the
    /// answer is the operation's result or its error, or a -32603 about the helper itself
    /// (§4.6).
    pub async fn run(
        &self,
        session: &str,
        operation: &str,
        params: Box<RawValue>,
        policy: &SandboxPolicy,
    ) -> Result<Box<RawValue>, RpcError> {
        let request = HelperRequest {
            operation: operation.to_owned(),
            params,
        };
        let request = serde_json::to_vec(&request).map_err(RpcError::fs_helper_message)?;
        let slot = self.slots.acquire(session).await;
        let mut child = self
            .command(policy)
            .spawn()
            .map_err(RpcError::fs_helper_spawn_failed)?;
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let limit = self.settings.max_response_bytes;
        let exchange = async {
            let write = async move {
                // The helper may answer without reading (e.g. "cannot be enforced"): a
                // broken pipe here is expected.
                let _ = stdin.write_all(&request).await;
                drop(stdin);
            };
            let ((), out, err) =
                tokio::join!(write, read_capped(stdout, limit), read_stderr(stderr));
            (out, err)
        };
        let timeout = self.settings.timeout;
        let (out, err) = match tokio::time::timeout(timeout, exchange).await {
            Ok((Ok(out), err)) => (out, err),
            Ok((Err(Exceeded), _)) => {
                kill_and_reap(&mut child).await;
                return Err(RpcError::fs_helper_response_too_large(limit));
            }
            Err(_) => {
                // A helper stuck in the kernel dies only when its call returns; its slot
                // is taken until it is reaped.
                slot.deadline().missed();
                kill_and_reap(&mut child).await;
                return Err(RpcError::fs_helper_timed_out(millis(timeout)));
            }
        };
        // Both pipes are closed; the helper is exiting. The wait is still bounded.
        let status = match tokio::time::timeout(timeout, child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => return Err(RpcError::fs_helper_message(e)),
            Err(_) => {
                slot.deadline().missed();
                kill_and_reap(&mut child).await;
                return Err(RpcError::fs_helper_timed_out(millis(timeout)));
            }
        };
        drop(slot);
        interpret(operation, status, &out, &err)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn kill_and_reap(child: &mut tokio::process::Child) {
    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// The helper wrote more than the response limit.
#[derive(Debug)]
struct Exceeded;

async fn read_capped(mut pipe: impl AsyncRead + Unpin, limit: u64) -> Result<Vec<u8>, Exceeded> {
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => return Ok(out),
            Ok(n) => {
                if (out.len() + n) as u64 > limit {
                    return Err(Exceeded);
                }
                out.extend_from_slice(&chunk[..n]);
            }
        }
    }
}

/// The first [`STDERR_CAP`] bytes, and whether more followed; the rest is drained so the
/// helper never blocks on a full pipe.
async fn read_stderr(mut pipe: impl AsyncRead + Unpin) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut chunk = [0u8; 4096];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => return (kept, truncated),
            Ok(n) => {
                let room = STDERR_CAP - kept.len();
                kept.extend_from_slice(&chunk[..n.min(room)]);
                truncated |= n > room;
            }
        }
    }
}

/// §4.6: the answer for a helper that finished with `status`.
fn interpret(
    operation: &str,
    status: ExitStatus,
    stdout: &[u8],
    (stderr, truncated): &(Vec<u8>, bool),
) -> Result<Box<RawValue>, RpcError> {
    if !status.success() {
        let mut text = String::from_utf8_lossy(stderr).trim_end().to_owned();
        if *truncated {
            text.push_str(" [stderr truncated]");
        }
        return Err(RpcError::fs_helper_failed(status, &text));
    }
    if stdout.is_empty() {
        return Err(RpcError::fs_helper_no_response());
    }
    let line = stdout.strip_suffix(b"\n").unwrap_or(stdout);
    match serde_json::from_slice::<HelperResponse>(line).map_err(RpcError::fs_helper_message)? {
        HelperResponse::Ok(ok) if ok.operation == operation => Ok(ok.response),
        HelperResponse::Ok(ok) => Err(RpcError::fs_helper_unexpected_response(
            operation,
            &ok.operation,
        )),
        HelperResponse::Error(error) => Err(error.into()),
    }
}

#[cfg(test)]
#[path = "runner_tests.rs"]
mod tests;

//! The server side of the fs helper (SANDBOX.md §4.2, §4.6): helper processes with a
//! cleared environment, `/` as working directory, three pipes, a wall-clock limit per
//! request, a cap on each answer, and a bounded number of helpers at work at once, shared
//! fairly by sessions.
//!
//! A helper answers one request and exits, as §4 describes, unless reuse is on
//! ([`FsHelperSettings::reuse_for`]): then a helper is started with `--serve` and, once it
//! has answered, waits in `idle` for the next request of the same session under the same
//! policy. A helper that failed, timed out, overflowed or wrote anything unexpected is
//! killed, never reused.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use exec_server_core::{descriptors, DescriptorLease, FairSlots, SlotPermit};
use exec_server_proto::RpcError;
use serde_json::value::RawValue;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

use super::idle::{HelperKey, IdleHelpers, Kept};
use super::{HelperRequest, HelperResponse, FS_HELPER_ARG1, SERVE_ARG};
use crate::policy::{Enforcement, SandboxPolicy};

/// Descriptors a helper's spawn opens in the server: its three pipes, both ends, and the
/// pidfd the runtime may wait on. Charged to the session it serves before it is spawned.
const DESCRIPTORS_TO_SPAWN: u64 = 7;
/// Descriptors a running (or kept) helper holds: the server's ends of its pipes and its
/// pidfd.
const DESCRIPTORS_HELD: u64 = 4;

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
    /// `Some`: a helper is kept for this long after it answered, for the next request of
    /// the same session under the same policy; `None`: one helper per request.
    pub reuse_for: Option<Duration>,
}

/// How much longer than the server's reuse window a serving helper waits before it exits
/// on its own: the server never hands a request to a helper that may be leaving.
const IDLE_EXIT_MARGIN: Duration = Duration::from_secs(2);

/// A helper whose request and answer together were larger is not kept: it may hold a heap
/// of that size, and starting one costs little next to moving that many bytes.
const KEEP_AFTER_BYTES_AT_MOST: usize = 1024 * 1024;

/// Runs fs helpers, at most `max_concurrent` at a time and `per_session` for one session.
#[derive(Debug, Clone)]
pub struct FsHelperRunner {
    settings: Arc<FsHelperSettings>,
    /// One slot per live helper (§3.2): bounds the processes a burst of sandboxed
    /// requests can create, and takes turns by session so that one session's burst only
    /// delays itself. Waiting for a slot is not charged to the time-out.
    slots: FairSlots,
    /// Helpers that answered and wait for their session's next request: at most
    /// `max_concurrent` in all and `per_session` for one session.
    idle: Arc<IdleHelpers<ServingHelper>>,
}

impl FsHelperRunner {
    pub fn new(settings: FsHelperSettings, max_concurrent: usize, per_session: usize) -> Self {
        let reuse_for = settings.reuse_for.unwrap_or_default();
        Self {
            settings: Arc::new(settings),
            slots: FairSlots::new("fs_helpers", max_concurrent, per_session),
            idle: IdleHelpers::new(max_concurrent, per_session, reuse_for),
        }
    }

    /// Kills the helpers kept for `session` (it ended).
    pub fn forget_session(&self, session: &str) {
        self.idle.forget_session(session);
    }

    pub fn settings(&self) -> &FsHelperSettings {
        &self.settings
    }

    /// The helper command for `policy` (§4.1–§4.2); no `pre_exec`, so the standard library
    /// can spawn without `fork`.
    pub fn command(&self, policy: &SandboxPolicy) -> Command {
        self.command_for(&policy.to_helper_json(self.settings.enforcement), None)
    }

    /// The helper command for a policy in its helper form, serving requests until idle
    /// for `serve` when that is given.
    fn command_for(&self, policy_json: &str, serve: Option<Duration>) -> Command {
        let s = &self.settings;
        let mut command = Command::new(&s.program);
        command
            .arg0(&s.argv0)
            .arg(FS_HELPER_ARG1)
            .arg("--policy")
            .arg(policy_json)
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
        if let Some(idle) = serve {
            command.arg(SERVE_ARG).arg(millis(idle).to_string());
        }
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
        match self.settings.reuse_for {
            Some(reuse_for) => {
                let key = HelperKey::new(session, policy.to_helper_json(self.settings.enforcement));
                self.run_in_serving_helper(session, key, operation, request, &slot, reuse_for)
                    .await
            }
            None => {
                self.run_in_own_helper(session, operation, request, policy, slot)
                    .await
            }
        }
    }

    /// One helper for this one request (§4).
    async fn run_in_own_helper(
        &self,
        session: &str,
        operation: &str,
        request: Vec<u8>,
        policy: &SandboxPolicy,
        slot: SlotPermit,
    ) -> Result<Box<RawValue>, RpcError> {
        let mut descriptors = charge_spawn(session)?;
        let mut child = self
            .command(policy)
            .spawn()
            .map_err(RpcError::fs_helper_spawn_failed)?;
        descriptors.shrink_to(DESCRIPTORS_HELD);
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
        drop(descriptors);
        interpret(operation, status, &out, &err)
    }

    /// The request in a helper kept for `key` if one waits, else in a new serving helper,
    /// which waits for the key's next request afterwards if it answered cleanly.
    async fn run_in_serving_helper(
        &self,
        session: &str,
        key: HelperKey,
        operation: &str,
        mut request: Vec<u8>,
        slot: &SlotPermit,
        reuse_for: Duration,
    ) -> Result<Box<RawValue>, RpcError> {
        request.push(b'\n');
        let timeout = self.settings.timeout;
        let limit = self.settings.max_response_bytes;
        loop {
            let (mut helper, reused) = match self.idle.take(&key) {
                Some(helper) => (helper, true),
                None => {
                    let command =
                        self.command_for(key.policy(), Some(reuse_for + IDLE_EXIT_MARGIN));
                    (
                        ServingHelper::spawn(command, charge_spawn(session)?)?,
                        false,
                    )
                }
            };
            let answer = match tokio::time::timeout(timeout, helper.exchange(&request, limit)).await
            {
                Ok(answer) => answer,
                Err(_) => {
                    slot.deadline().missed();
                    helper.kill_and_reap().await;
                    return Err(RpcError::fs_helper_timed_out(millis(timeout)));
                }
            };
            match answer {
                Answer::Line(line) => {
                    return match parse_response(operation, &line) {
                        Ok(answer) => {
                            let small = request.len() + line.len() <= KEEP_AFTER_BYTES_AT_MOST;
                            if small && helper.has_nothing_more_to_say() {
                                self.idle.put(key, helper);
                            }
                            answer
                        }
                        // Not a response to this request: the helper no longer follows
                        // the protocol and is not asked again.
                        Err(e) => {
                            helper.kill_and_reap().await;
                            Err(e)
                        }
                    };
                }
                Answer::TooLarge => {
                    helper.kill_and_reap().await;
                    return Err(RpcError::fs_helper_response_too_large(limit));
                }
                Answer::Ended { said, status } => {
                    // A kept helper that ends cleanly without a word has not read this
                    // request (it only exits 0 between requests): a new helper runs it.
                    if reused && said.is_empty() && status.success() {
                        continue;
                    }
                    let stderr = tokio::time::timeout(timeout, helper.stderr())
                        .await
                        .unwrap_or_default();
                    return interpret(operation, status, &said, &stderr);
                }
                Answer::Lost(e) => return Err(RpcError::fs_helper_message(e)),
            }
        }
    }
}

/// Charges a helper's spawn to `session`'s descriptor budget.
fn charge_spawn(session: &str) -> Result<DescriptorLease, RpcError> {
    descriptors::charge(session, DESCRIPTORS_TO_SPAWN, "an fs helper")
}

/// A helper started with `--serve`: its pipes, and its stdout read a line at a time.
#[derive(Debug)]
pub(crate) struct ServingHelper {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: ChildStderr,
    /// Its charge to its session's descriptor budget, kept while it waits to be reused.
    _descriptors: DescriptorLease,
}

/// What a serving helper did with one request.
enum Answer {
    /// One line (without its newline).
    Line(Vec<u8>),
    /// More than the response limit before a newline.
    TooLarge,
    /// Its stdout ended after `said` (no complete line); it exited with `status`.
    Ended { said: Vec<u8>, status: ExitStatus },
    /// It could not be waited for.
    Lost(std::io::Error),
}

impl ServingHelper {
    fn spawn(mut command: Command, mut descriptors: DescriptorLease) -> Result<Self, RpcError> {
        let mut child = command.spawn().map_err(RpcError::fs_helper_spawn_failed)?;
        descriptors.shrink_to(DESCRIPTORS_HELD);
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        Ok(Self {
            child,
            stdin,
            stdout: BufReader::with_capacity(64 * 1024, stdout),
            stderr,
            _descriptors: descriptors,
        })
    }

    /// Sends `request` (one line) and reads the answer, at most `limit` bytes with its
    /// newline.
    async fn exchange(&mut self, request: &[u8], limit: u64) -> Answer {
        let Self {
            child,
            stdin,
            stdout,
            ..
        } = self;
        // A helper that has gone makes the write fail; what it said, if anything, is read
        // all the same.
        let write = async {
            let _ = stdin.write_all(request).await;
        };
        let mut line = Vec::new();
        let mut bounded = (&mut *stdout).take(limit.saturating_add(1));
        let ((), read) = tokio::join!(write, bounded.read_until(b'\n', &mut line));
        if line.last() == Some(&b'\n') && line.len() as u64 <= limit {
            line.pop();
            return Answer::Line(line);
        }
        if line.len() as u64 > limit {
            return Answer::TooLarge;
        }
        if read.is_err() {
            // The pipe failed rather than ended: make sure the helper is gone.
            let _ = child.start_kill();
        }
        match child.wait().await {
            Ok(status) => Answer::Ended { said: line, status },
            Err(e) => Answer::Lost(e),
        }
    }

    /// True when the helper wrote nothing after its answer and is still running: the
    /// only state in which it is asked again.
    fn has_nothing_more_to_say(&mut self) -> bool {
        self.stdout.buffer().is_empty() && self.is_running()
    }

    pub(crate) fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Kept for ServingHelper {
    fn is_running(&mut self) -> bool {
        ServingHelper::is_running(self)
    }
}

impl ServingHelper {
    /// The start of what the helper wrote on stderr (it writes only as it fails).
    async fn stderr(&mut self) -> (Vec<u8>, bool) {
        read_stderr(&mut self.stderr).await
    }

    async fn kill_and_reap(&mut self) {
        kill_and_reap(&mut self.child).await;
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
    parse_response(operation, stdout.strip_suffix(b"\n").unwrap_or(stdout))?
}

/// §4.6: the operation's answer in a helper's response `line` to a request for
/// `operation`; the outer error when the line is no response to that request.
fn parse_response(
    operation: &str,
    line: &[u8],
) -> Result<Result<Box<RawValue>, RpcError>, RpcError> {
    match serde_json::from_slice::<HelperResponse>(line).map_err(RpcError::fs_helper_message)? {
        HelperResponse::Ok(ok) if ok.operation == operation => Ok(Ok(ok.response)),
        HelperResponse::Ok(ok) => Err(RpcError::fs_helper_unexpected_response(
            operation,
            &ok.operation,
        )),
        HelperResponse::Error(error) => Ok(Err(error.into())),
    }
}

#[cfg(test)]
#[path = "runner_tests.rs"]
mod tests;

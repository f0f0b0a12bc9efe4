//! The filesystem helper (SANDBOX.md §4): the server's own binary re-executed as
//! `<exe> --codex-run-as-fs-helper --policy <json> [--max-request-bytes <n>]`, which confines
//! itself, reads one request from stdin, runs it and writes one response line.
//!
//! With `--serve <idle-exit-ms>` (ours, not codex's) the confined helper answers one
//! request per line instead, for as long as the server keeps it: the server reuses it for
//! later requests of the same session under the same policy (see `serve` and `idle`).
//!
//! Without `--policy` (how codex starts its own helper) it confines nothing further: the
//! request runs with exactly the rights the helper was started with, which it never
//! raises (`no_new_privs`), and the answers are those of codex's helper. The server itself
//! always passes `--policy` (see `runner`).
//!
//! * this module — the protocol types and the helper's `main` (§4.1, §4.4–§4.7);
//! * `checks` — the per-operation user-space checks (§5.6) and the denial flag (§7.1);
//! * `serve` — the helper's loop under `--serve`;
//! * `runner` — the server side: spawn, time-out, limits, and every failure answer (§4.2, §4.6);
//! * `idle` — the server's confined helpers waiting for their session's next request.
//!
//! The helper does not know how to perform an operation: the host passes it its decoder
//! (§5.7), which turns a request into the very operation the server would run, reporting
//! the targets the checks approve first; it gives the server's results and error texts
//! while acting only on what the policy approved.

use std::ffi::OsString;
use std::io::{Read, Write};

use exec_server_proto::RpcError;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::enforce::namespaces::{self, PrivilegedUserNamespace};
use crate::enforce::{self, HelperKind, Namespace, Namespaces};
use crate::policy::SandboxPolicy;

mod checks;
mod idle;
pub mod runner;
mod serve;

pub use checks::{precheck, CheckedTarget, Need, Target};

/// `argv[1]` of the fs helper.
pub const FS_HELPER_ARG1: &str = "--codex-run-as-fs-helper";

/// Request size limit of a helper started without `--max-request-bytes` (64 MiB + 64 KiB).
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 67_174_400;

/// Room for the request's envelope on top of `limits.max_message_bytes` (§4.1).
pub const REQUEST_ENVELOPE_BYTES: u64 = 65_536;

/// Exit status of a runtime failure (§4.6).
const EXIT_RUNTIME: i32 = 1;
/// Exit status of a usage error.
const EXIT_USAGE: i32 = 2;

/// The operations the helper runs (§4.4).
pub const OPERATIONS: &[&str] = &[
    "fs/readFile",
    "fs/writeFile",
    "fs/createDirectory",
    "fs/getMetadata",
    "fs/canonicalize",
    "fs/readDirectory",
    "fs/walk",
    "fs/remove",
    "fs/copy",
];

/// One request decoded by the host's filesystem core (§5.7): the operation with every
/// default applied, ready to run.
pub trait HelperOperation: std::fmt::Debug {
    /// The paths the operation will touch and the access it needs at each, checked by
    /// [`precheck`] before [`HelperOperation::run`].
    fn targets(&self) -> Vec<Target>;

    /// Runs the operation synchronously and returns the serialised result. The targets have
    /// passed [`precheck`], but that only refuses early: the operation must resolve and
    /// check every path it touches against `policy` again and act only through descriptors
    /// opened exactly at what it approved ([`crate::anchored`]), never reopen a path.
    fn run(self: Box<Self>, policy: &SandboxPolicy) -> Result<Box<RawValue>, RpcError>;

    /// Runs the operation without a policy, with the rights the helper has, as the server
    /// runs it in-process.
    fn run_unconfined(self: Box<Self>) -> Result<Box<RawValue>, RpcError>;
}

/// The host's decoder: `operation` is the method name, `params` the request's params
/// (with `"sandbox": null`).
pub type FsDecoder =
    fn(operation: &str, params: Value) -> Result<Box<dyn HelperOperation>, RpcError>;

/// The request line (server → helper).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HelperRequest {
    pub operation: String,
    /// Kept as written, so the line is byte-for-byte what the server produced.
    pub params: Box<RawValue>,
}

/// The response line (helper → server).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "status", content = "payload", rename_all = "lowercase")]
pub enum HelperResponse {
    Ok(OkPayload),
    Error(ErrorPayload),
}

#[derive(Debug, Serialize, Deserialize)]
pub struct OkPayload {
    pub operation: String,
    pub response: Box<RawValue>,
}

/// A JSON-RPC error object as it travels through the helper (§4.5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorPayload {
    pub code: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    pub message: String,
}

impl From<RpcError> for ErrorPayload {
    fn from(e: RpcError) -> Self {
        Self {
            code: e.code,
            data: e.data,
            message: e.message,
        }
    }
}

impl From<ErrorPayload> for RpcError {
    fn from(e: ErrorPayload) -> Self {
        Self {
            code: e.code,
            data: e.data,
            message: e.message,
        }
    }
}

/// `argv` flag of a helper that serves requests until it is idle for the given time.
pub const SERVE_ARG: &str = "--serve";

/// The helper's command line.
#[derive(Debug)]
struct HelperArgs {
    /// `None`: run under the confinement the helper was started in.
    policy: Option<String>,
    max_request_bytes: u64,
    /// `--serve <ms>`: answer requests, one per line, until stdin closes or none has
    /// arrived for this long.
    serve: Option<std::time::Duration>,
}

fn parse_args(args: &[OsString]) -> Result<HelperArgs, String> {
    let mut policy = None;
    let mut max_request_bytes = DEFAULT_MAX_REQUEST_BYTES;
    let mut serve = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .and_then(|v| v.to_str())
                .map(str::to_owned)
                .ok_or_else(|| format!("{name} needs a UTF-8 value"))
        };
        match arg.to_str() {
            Some("--policy") => policy = Some(value("--policy")?),
            Some("--max-request-bytes") => {
                let text = value("--max-request-bytes")?;
                max_request_bytes = text
                    .parse()
                    .map_err(|_| format!("invalid --max-request-bytes `{text}`"))?;
            }
            Some(SERVE_ARG) => {
                let text = value(SERVE_ARG)?;
                let millis = text
                    .parse()
                    .map_err(|_| format!("invalid {SERVE_ARG} `{text}`"))?;
                serve = Some(std::time::Duration::from_millis(millis));
            }
            _ => return Err(format!("unexpected argument `{}`", arg.to_string_lossy())),
        }
    }
    if serve.is_some() && policy.is_none() {
        return Err(format!("{SERVE_ARG} needs --policy"));
    }
    Ok(HelperArgs {
        policy,
        max_request_bytes,
        serve,
    })
}

/// The helper's `main` (§4.7) without the process exit: `args` are the arguments after
/// the sentinel; returns the exit status. Single-threaded and synchronous throughout.
pub fn main(args: &[OsString], decoder: FsDecoder) -> i32 {
    set_parent_death_signal();
    let args = match parse_args(args) {
        Ok(args) => args,
        Err(e) => return usage_error(&e),
    };
    let Some(policy) = &args.policy else {
        return run_unconfined(args.max_request_bytes, decoder);
    };
    let (policy, enforcement) = match SandboxPolicy::from_helper_json(policy) {
        Ok(parsed) => parsed,
        Err(e) => return usage_error(&format!("invalid --policy: {e}")),
    };
    let confined = enter_namespaces().and_then(|namespaces| {
        enforce::apply(
            &policy,
            HelperKind::FsHelper,
            enforcement,
            namespaces.contains(Namespace::Uts),
            &[],
        )
        .map_err(|_| ())
    });
    if confined.is_err() {
        // Also under `--serve`: the helper answers this one request and exits, and the
        // server does not use it again.
        return respond(HelperResponse::Error(
            RpcError::fs_sandbox_unenforceable().into(),
        ));
    }
    if let Some(idle_exit) = args.serve {
        return serve::serve(&policy, args.max_request_bytes, idle_exit, decoder);
    }
    let request = match read_request(args.max_request_bytes) {
        Ok(request) => request,
        Err(e) => return runtime_error(&e),
    };
    respond(run_request(request, &policy, decoder))
}

/// The helper started without `--policy`: the request runs with the rights the process
/// has, and `no_new_privs` makes sure nothing it could do raises them.
fn run_unconfined(max_request_bytes: u64, decoder: FsDecoder) -> i32 {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return runtime_error(&format!(
            "cannot set no_new_privs: {}",
            std::io::Error::last_os_error()
        ));
    }
    let request = match read_request(max_request_bytes) {
        Ok(request) => request,
        Err(e) => return runtime_error(&e),
    };
    respond(run_request_unconfined(request, decoder))
}

/// Steps 5–7 for a decoded request, without a policy: no checks, nothing classified as
/// a sandbox denial.
fn run_request_unconfined(request: HelperRequest, decoder: FsDecoder) -> HelperResponse {
    let operation = request.operation;
    let result = decode_params(&request.params)
        .and_then(|params| decoder(&operation, params))
        .and_then(|decoded| decoded.run_unconfined());
    match result {
        Ok(response) => HelperResponse::Ok(OkPayload {
            operation,
            response,
        }),
        Err(e) => HelperResponse::Error(e.into()),
    }
}

/// A request's params, refused if they carry a sandbox: the helper only runs what a
/// caller already decided to run directly.
fn decode_params(params: &RawValue) -> Result<Value, RpcError> {
    let params: Value =
        serde_json::from_str(params.get()).map_err(|e| RpcError::invalid_params(e.to_string()))?;
    if params.get("sandbox").is_some_and(|s| !s.is_null()) {
        return Err(RpcError::direct_operation_with_sandbox());
    }
    Ok(params)
}

/// UTS and IPC namespaces of its own (and a user namespace when unprivileged), so that a
/// root helper cannot rename the host or reach the host's System V IPC objects. Mount and
/// network namespaces are left out: the helper mounts nothing and seccomp already closes
/// the network, and creating them would cost more than the helper's work. Failing to get
/// them is not fatal (the capability drop covers the same ground); only a user namespace
/// whose ids could not be mapped is.
fn enter_namespaces() -> Result<Namespaces, ()> {
    namespaces::enter(
        Namespaces::of(&[Namespace::Uts, Namespace::Ipc]),
        PrivilegedUserNamespace::Refused,
    )
    .map_err(|_| ())
}

/// Steps 5–7 for a decoded request.
fn run_request(
    request: HelperRequest,
    policy: &SandboxPolicy,
    decoder: FsDecoder,
) -> HelperResponse {
    let operation = request.operation;
    let params = match decode_params(&request.params) {
        Ok(params) => params,
        Err(e) => return HelperResponse::Error(e.into()),
    };
    let result = decoder(&operation, params).and_then(|decoded| {
        let targets = precheck(&decoded.targets(), policy)?;
        decoded
            .run(policy)
            .map_err(|e| checks::mark_denial(e, &targets, policy))
    });
    match result {
        Ok(response) => HelperResponse::Ok(OkPayload {
            operation,
            response,
        }),
        Err(e) => HelperResponse::Error(e.into()),
    }
}

fn read_request(max_bytes: u64) -> Result<HelperRequest, String> {
    let mut text = Vec::new();
    std::io::stdin()
        .lock()
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut text)
        .map_err(|e| format!("cannot read the request: {e}"))?;
    if text.len() as u64 > max_bytes {
        return Err(format!("request exceeds {max_bytes} bytes"));
    }
    parse_request(&text)
}

/// One request as read, checked for a known operation.
fn parse_request(text: &[u8]) -> Result<HelperRequest, String> {
    let request: HelperRequest = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    if !OPERATIONS.contains(&request.operation.as_str()) {
        return Err(format!("unsupported operation `{}`", request.operation));
    }
    Ok(request)
}

fn respond(response: HelperResponse) -> i32 {
    let mut line = serde_json::to_vec(&response).expect("a helper response serialises");
    line.push(b'\n');
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(&line).and_then(|()| stdout.flush()) {
        Ok(()) => 0,
        Err(e) => runtime_error(&format!("cannot write the response: {e}")),
    }
}

fn usage_error(error: &str) -> i32 {
    eprintln!("fs sandbox helper usage error: {error}");
    EXIT_USAGE
}

fn runtime_error(error: &str) -> i32 {
    eprintln!("fs sandbox helper failed: {error}");
    EXIT_RUNTIME
}

/// The helper dies with the server (§4.7 step 1).
pub(crate) fn set_parent_death_signal() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_PDEATHSIG takes integer arguments only.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        }
    }
}

#[cfg(test)]
#[path = "fs_helper_tests.rs"]
mod tests;

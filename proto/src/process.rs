//! `process/*` params, results and notifications (PROTOCOL §4).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const START: &str = "process/start";
pub const READ: &str = "process/read";
pub const WRITE: &str = "process/write";
pub const SIGNAL: &str = "process/signal";
pub const RESIZE: &str = "process/resize";
pub const TERMINATE: &str = "process/terminate";
/// [ext] Closes a pipe-mode process's stdin, so it reads end of input.
pub const CLOSE_STDIN: &str = "process/closeStdin";
pub const OUTPUT: &str = "process/output";
pub const EXITED: &str = "process/exited";
pub const CLOSED: &str = "process/closed";

/// Gating family label of every `process/*` method (§2.10).
pub const FAMILY_LABEL: &str = "exec";

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StartParams {
    pub process_id: String,
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    pub tty: bool,
    #[serde(default)]
    pub pipe_stdin: Option<bool>,
    #[serde(default)]
    pub arg0: Option<String>,
    #[serde(default)]
    pub env_policy: Option<EnvPolicy>,
    #[serde(default)]
    pub sandbox: Option<Value>,
    #[serde(default)]
    pub size: Option<TerminalSize>,
    /// A policy proxy of the process's own (§4.13, CODEX-NETWORK §3.1); decoded by the
    /// process plugin, which owns its errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_proxy: Option<Value>,
    /// Confine a sandboxed child whose network is restricted to its proxy: the one
    /// `networkProxy` starts, or else the one the client runs (§4.13).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforce_managed_network: Option<bool>,
    /// A proxy the client runs on the server's loopback (used without `networkProxy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_network: Option<ManagedNetwork>,
}

/// `managedNetwork`: the loopback ports of a proxy the client runs itself.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedNetwork {
    #[serde(default)]
    pub loopback_ports: Vec<u16>,
    #[serde(default)]
    pub allow_local_binding: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub struct TerminalSize {
    pub rows: u16,
    pub cols: u16,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvPolicy {
    pub inherit: EnvInherit,
    pub ignore_default_excludes: bool,
    pub exclude: Vec<String>,
    pub set: BTreeMap<String, String>,
    pub include_only: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvInherit {
    All,
    Core,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SandboxType {
    None,
    LinuxSeccomp,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StartResult {
    pub process_id: String,
    pub sandbox_type: SandboxType,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    Stdout,
    Stderr,
    Pty,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadParams {
    pub process_id: String,
    #[serde(default)]
    pub after_seq: Option<u64>,
    #[serde(default)]
    pub max_bytes: Option<u64>,
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// One retained chunk. `C` is `String` when decoding and [`crate::jsonrpc`]-friendly
/// borrowed base64 (e.g. [`Base64`]) when the server encodes.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ReadChunk<C = String> {
    pub seq: u64,
    pub stream: OutputStream,
    pub chunk: C,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadResult<C = String> {
    pub chunks: Vec<ReadChunk<C>>,
    pub next_seq: u64,
    pub exited: bool,
    pub exit_code: Option<i32>,
    pub closed: bool,
    pub failure: Option<String>,
    pub sandbox_denied: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteParams {
    pub process_id: String,
    pub chunk: String,
    #[serde(default)]
    pub write_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum WriteStatus {
    Accepted,
    UnknownProcess,
    Starting,
    StdinClosed,
}

/// [ext] `process/closeStdin` params.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CloseStdinParams {
    pub process_id: String,
}

/// [ext] `process/closeStdin` result: `accepted` (closed now, after every earlier write),
/// `stdinClosed` (already closed, or started without `pipeStdin`), `unknownProcess`,
/// `starting`.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct CloseStdinResult {
    pub status: WriteStatus,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct WriteResult {
    pub status: WriteStatus,
    /// The G1 member: `status == accepted`.
    pub accepted: bool,
}

impl From<WriteStatus> for WriteResult {
    fn from(status: WriteStatus) -> Self {
        Self {
            status,
            accepted: status == WriteStatus::Accepted,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Signal {
    Interrupt,
    Terminate,
    Kill,
    Hangup,
    Quit,
    User1,
    User2,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalParams {
    pub process_id: String,
    pub signal: Signal,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResizeParams {
    pub process_id: String,
    pub rows: u16,
    pub cols: u16,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminateParams {
    pub process_id: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct TerminateResult {
    pub running: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputNotification<C = String> {
    pub process_id: String,
    pub seq: u64,
    pub stream: OutputStream,
    pub chunk: C,
}

/// The whole `process/output` message for `chunk`, byte for byte what
/// [`crate::jsonrpc::encode_notification`] makes of an [`OutputNotification`] carrying the
/// chunk as base64, but encoded straight into one buffer of its final size: no separate
/// base64 string, no copy of it into the message, no regrowing of the message.
pub fn encode_output_notification(
    process_id: &str,
    seq: u64,
    stream: OutputStream,
    chunk: &[u8],
) -> Result<String, serde_json::Error> {
    let marker = serde_json::value::RawValue::from_string("0".to_owned())?;
    let probe = crate::jsonrpc::encode_notification(
        OUTPUT,
        &OutputNotification {
            process_id: process_id.to_owned(),
            seq,
            stream,
            chunk: marker,
        },
    )?;
    // `chunk` is the last member, so the probe ends with its marker and two closing braces.
    let Some(head) = probe.strip_suffix("0}}") else {
        let notification = OutputNotification {
            process_id: process_id.to_owned(),
            seq,
            stream,
            chunk: crate::bytes::Base64(chunk),
        };
        return crate::jsonrpc::encode_notification(OUTPUT, &notification);
    };
    let mut frame = String::with_capacity(head.len() + chunk.len().div_ceil(3) * 4 + 4);
    frame.push_str(head);
    frame.push('"');
    crate::bytes::append_base64(chunk, &mut frame);
    frame.push_str("\"}}");
    Ok(frame)
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitedNotification {
    pub process_id: String,
    pub seq: u64,
    pub exit_code: i32,
    pub sandbox_denied: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClosedNotification {
    pub process_id: String,
    pub seq: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::encode_base64;

    #[test]
    fn an_output_frame_is_what_serde_makes_of_the_same_notification() {
        let bytes: Vec<u8> = (0..300u32).map(|i| (i * 89) as u8).collect();
        for (id, stream) in [
            ("out", OutputStream::Stdout),
            ("q\"uote\\d\n", OutputStream::Stderr),
            ("", OutputStream::Pty),
        ] {
            for len in [0, 1, 2, 3, 4, 299, 300] {
                let chunk = &bytes[..len];
                let ours = encode_output_notification(id, 42, stream, chunk).unwrap();
                let notification = OutputNotification {
                    process_id: id.to_owned(),
                    seq: 42,
                    stream,
                    chunk: encode_base64(chunk),
                };
                let serde = crate::jsonrpc::encode_notification(OUTPUT, &notification).unwrap();
                assert_eq!(ours, serde);
            }
        }
    }
}

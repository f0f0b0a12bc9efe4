//! Wire types of the exec-server protocol (`PROTOCOL.md`), with no transport dependencies.
//!
//! * [`jsonrpc`] — the codex-dialect JSON-RPC envelope: ids, message classification,
//!   response and notification encoding.
//! * [`bytes`] — base64 in and out, and the empty `{}` result.
//! * [`clock`] — RFC 3339 timestamps in UTC.
//! * [`decode`] — the bounded decoder every inbound message goes through (size, value
//!   count, depth, duplicate keys).
//! * [`error`] — [`RpcError`] and one constructor per error message the spec names.
//! * [`start_errors`] — the `data.kind` of a failed `process/start` (codex 0.171.0).
//! * [`log_text`] — peer text quoted in logs and errors, unable to forge a line.
//! * [`path`] — `file:` URIs and native absolute paths, in both directions.
//! * [`initialize`], [`process`], [`fs`], [`environment`] — params and results of every
//!   method, camelCase on the wire.

pub mod bytes;
pub mod clock;
pub mod decode;
pub mod environment;
pub mod error;
pub mod fs;
pub mod initialize;
pub mod jsonrpc;
pub mod log_text;
pub mod net;
pub mod path;
pub mod process;
pub mod start_errors;

pub use error::RpcError;
pub use jsonrpc::{Incoming, RequestId};
pub use start_errors::StartErrorKind;

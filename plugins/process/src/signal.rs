//! `process/signal` (PROTOCOL §4.8).

use std::sync::Arc;

use exec_server_core::proto::bytes::Empty;
use exec_server_core::proto::error::io_error_text;
use exec_server_core::proto::process::{Signal, SignalParams};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;

use crate::table::Lookup;
use crate::ProcessPlugin;

pub(crate) async fn signal(
    plugin: Arc<ProcessPlugin>,
    cx: Call,
    params: SignalParams,
) -> Result<Empty, RpcError> {
    let Lookup::Started(process) = crate::table(&plugin, &cx).lookup(&params.process_id) else {
        return Ok(Empty {});
    };
    // Until the close, descendants of an exited child may still be in its group.
    if process.is_closed() {
        return Ok(Empty {});
    }
    process
        .signal_group(posix_signal(params.signal))
        .map(|_| Empty {})
        .map_err(|e| RpcError::signal_failed(io_error_text(&e)))
}

fn posix_signal(signal: Signal) -> libc::c_int {
    match signal {
        Signal::Interrupt => libc::SIGINT,
        Signal::Terminate => libc::SIGTERM,
        Signal::Kill => libc::SIGKILL,
        Signal::Hangup => libc::SIGHUP,
        Signal::Quit => libc::SIGQUIT,
        Signal::User1 => libc::SIGUSR1,
        Signal::User2 => libc::SIGUSR2,
    }
}

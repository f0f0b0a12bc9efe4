//! The helper under `--serve`: already confined, it answers requests one line at a time,
//! each exactly as a one-request helper would (the same checks, the same decoder), until
//! the server closes its stdin or no request has come for the idle time.
//!
//! Serving many requests gives a request nothing a fresh helper would not have: the
//! confinement is the one the helper applied before reading anything, for the one policy on
//! its command line, and the server only ever sends it requests of the session it was
//! started for under that policy (see `idle`). Each request is resolved and checked again
//! from scratch; nothing an operation opens outlives it.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsFd;
use std::time::Duration;

use super::{parse_request, respond, run_request, runtime_error, FsDecoder};
use crate::policy::SandboxPolicy;

/// Read size on stdin: one read takes a small request whole.
const INPUT_BUFFER_BYTES: usize = 64 * 1024;

/// Serves requests until stdin ends (exit 0), the helper is idle for `idle_exit` (exit 0)
/// or something fails (the one-request helper's exit statuses, §4.6).
pub(super) fn serve(
    policy: &SandboxPolicy,
    max_request_bytes: u64,
    idle_exit: Duration,
    decoder: FsDecoder,
) -> i32 {
    let mut input = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => BufReader::with_capacity(INPUT_BUFFER_BYTES, File::from(fd)),
        Err(e) => return runtime_error(&format!("cannot read the requests: {e}")),
    };
    loop {
        if input.buffer().is_empty() && !request_arrives_within(idle_exit) {
            return 0;
        }
        let line = match read_line(&mut input, max_request_bytes) {
            Ok(Some(line)) => line,
            Ok(None) => return 0,
            Err(e) => return runtime_error(&e),
        };
        let request = match parse_request(&line) {
            Ok(request) => request,
            Err(e) => return runtime_error(&e),
        };
        let status = respond(run_request(request, policy, decoder));
        if status != 0 {
            return status;
        }
    }
}

/// Waits until stdin has something to read (or has ended); `false` when `idle` passed first.
fn request_arrives_within(idle: Duration) -> bool {
    let timeout = i32::try_from(idle.as_millis()).unwrap_or(i32::MAX);
    let mut stdin = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid `pollfd` for the duration of the call.
        let ready = unsafe { libc::poll(&mut stdin, 1, timeout) };
        match ready {
            0 => return false,
            r if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
            // Readable, ended or an error: the read says which.
            _ => return true,
        }
    }
}

/// The next request line without its newline; `None` when stdin ended between requests.
fn read_line(input: &mut impl BufRead, max_bytes: u64) -> Result<Option<Vec<u8>>, String> {
    let mut line = Vec::new();
    input
        .take(max_bytes.saturating_add(1))
        .read_until(b'\n', &mut line)
        .map_err(|e| format!("cannot read the request: {e}"))?;
    match line.last() {
        None => Ok(None),
        Some(b'\n') => {
            line.pop();
            Ok(Some(line))
        }
        Some(_) if line.len() as u64 > max_bytes => {
            Err(format!("request exceeds {max_bytes} bytes"))
        }
        Some(_) => Err("stdin ended inside a request".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_one_at_a_time_and_bounded() {
        let mut input = &b"{\"a\":1}\n{\"b\":2}\n"[..];
        assert_eq!(read_line(&mut input, 7).unwrap().unwrap(), b"{\"a\":1}");
        assert_eq!(read_line(&mut input, 7).unwrap().unwrap(), b"{\"b\":2}");
        assert_eq!(read_line(&mut input, 7).unwrap(), None);

        let mut input = &b"{\"a\":12}\n"[..];
        assert_eq!(
            read_line(&mut input, 7).unwrap_err(),
            "request exceeds 7 bytes"
        );
        let mut input = &b"{\"a\""[..];
        assert_eq!(
            read_line(&mut input, 7).unwrap_err(),
            "stdin ended inside a request"
        );
    }
}

//! The server's half of the launcher's control socket (SANDBOX.md §8.2 steps 2, 4, 5): a
//! socketpair, the launch line with the target's stdin attached, and the report.
//!
//! The exchange is blocking and bounded by a deadline; callers run it on a blocking
//! thread. Killing and reaping the launcher stays with the caller, which owns its pid.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use exec_server_proto::RpcError;

use super::fd_passing::recv_with_fds;
use super::{LaunchLine, LaunchReport, LaunchRequest};

/// A control socket: the server's end, and the launcher's end (its future stdin).
#[derive(Debug)]
pub struct ControlSocket {
    pub server: OwnedFd,
    pub launcher: OwnedFd,
}

impl ControlSocket {
    /// A UNIX stream socketpair, close-on-exec on both ends (the spawner duplicates the
    /// launcher's end onto descriptor 0).
    pub fn new() -> io::Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair returns.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned here.
        unsafe {
            Ok(Self {
                server: OwnedFd::from_raw_fd(fds[0]),
                launcher: OwnedFd::from_raw_fd(fds[1]),
            })
        }
    }
}

/// What the control socket said.
#[derive(Debug)]
pub enum LaunchOutcome {
    /// Confined and `execve` succeeded (the socket closed on exec); under the managed
    /// network, with the listening sockets of `managed_ports`, in order.
    Started(LaunchReport, Vec<OwnedFd>),
    /// Set-up or `execve` failed; the launcher exits (125 or 127) and must be reaped.
    Failed(RpcError),
    /// End of file without a report: the launcher died; answer with its exit status.
    ExitedSilently,
    /// No answer before the deadline: kill and reap the launcher.
    TimedOut,
}

/// Sends `request` with `target_stdin` attached, then reads the report, all before
/// `timeout` elapses.
pub fn exchange(
    server: &OwnedFd,
    request: &LaunchRequest,
    target_stdin: BorrowedFd<'_>,
    timeout: Duration,
) -> LaunchOutcome {
    let deadline = Instant::now() + timeout;
    let mut line = match serde_json::to_vec(request) {
        Ok(line) => line,
        Err(e) => return LaunchOutcome::Failed(RpcError::spawn_failed(e)),
    };
    line.push(b'\n');
    match send_line(server, &line, target_stdin, deadline) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::TimedOut => return LaunchOutcome::TimedOut,
        // The launcher is gone (broken pipe): whatever it wrote before still counts.
        Err(_) => {}
    }
    read_report(server, deadline, &request.managed_ports)
}

fn send_line(
    socket: &OwnedFd,
    line: &[u8],
    fd: BorrowedFd<'_>,
    deadline: Instant,
) -> io::Result<()> {
    // The first byte carries the descriptor.
    send_with_fd(socket, &line[..1], fd)?;
    let mut written = 1;
    while written < line.len() {
        wait_for(socket, libc::POLLOUT, deadline)?;
        // SAFETY: writes from a live buffer to an owned socket.
        let n = unsafe {
            libc::send(
                socket.as_raw_fd(),
                line[written..].as_ptr().cast(),
                line.len() - written,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ) {
                continue;
            }
            return Err(e);
        }
        written += n as usize;
    }
    Ok(())
}

fn send_with_fd(socket: &OwnedFd, byte: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: the header points at live buffers of the stated sizes; the control message
    // carries one descriptor, which the kernel duplicates into the receiver.
    unsafe {
        let mut iov = libc::iovec {
            iov_base: byte.as_ptr().cast_mut().cast(),
            iov_len: byte.len(),
        };
        let space = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as usize;
        let mut cmsg_buf = vec![0u8; space];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg_buf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd.as_raw_fd());
        if libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Waits until `socket` is ready for `events` or the deadline passes (`TimedOut`).
fn wait_for(socket: &OwnedFd, events: libc::c_short, deadline: Instant) -> io::Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        let mut pfd = libc::pollfd {
            fd: socket.as_raw_fd(),
            events,
            revents: 0,
        };
        let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if rc > 0 {
            return Ok(());
        }
    }
}

/// Reads lines until end of file: `ok` then EOF, `ok` then `error`, or `error` first;
/// under the managed network, `listeners` (with `ports`' sockets attached) before `ok`.
fn read_report(socket: &OwnedFd, deadline: Instant, ports: &[u16]) -> LaunchOutcome {
    let mut report = Report::default();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(outcome) = report.take_lines(ports) {
            return outcome;
        }
        if let Err(e) = wait_for(socket, libc::POLLIN, deadline) {
            return match e.kind() {
                io::ErrorKind::TimedOut => LaunchOutcome::TimedOut,
                _ => LaunchOutcome::Failed(RpcError::spawn_failed(e)),
            };
        }
        match recv_with_fds(socket.as_fd(), &mut chunk) {
            Ok((n, fds)) if n > 0 => {
                report.buffer.extend_from_slice(&chunk[..n]);
                report.received.extend(fds);
                continue;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) =>
            {
                continue
            }
            // End of file (or a reset once the launcher's end closed on exec).
            _ => return report.finish(ports),
        }
    }
}

/// What the launcher said so far.
#[derive(Default)]
struct Report {
    buffer: Vec<u8>,
    report: Option<LaunchReport>,
    /// Descriptors that came with the bytes, not yet claimed by a `listeners` line.
    received: Vec<OwnedFd>,
    listeners: Option<Vec<OwnedFd>>,
}

impl Report {
    /// Handles the complete lines; `Some` once the exchange is decided.
    fn take_lines(&mut self, ports: &[u16]) -> Option<LaunchOutcome> {
        let invalid = || {
            Some(LaunchOutcome::Failed(RpcError::spawn_failed(
                "invalid report from the sandbox launcher",
            )))
        };
        while let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            match serde_json::from_slice::<LaunchLine>(&line) {
                Ok(LaunchLine::Ok(r)) if self.report.is_none() => self.report = Some(r),
                Ok(LaunchLine::Error(e)) => return Some(LaunchOutcome::Failed(e.into())),
                Ok(LaunchLine::Listeners(sent))
                    if sent == ports
                        && self.listeners.is_none()
                        && self.report.is_none()
                        && self.received.len() == ports.len() =>
                {
                    self.listeners = Some(std::mem::take(&mut self.received));
                }
                Ok(_) | Err(_) => return invalid(),
            }
        }
        None
    }

    fn finish(self, ports: &[u16]) -> LaunchOutcome {
        let listeners = self.listeners.unwrap_or_default();
        match self.report {
            Some(_) if listeners.len() != ports.len() => LaunchOutcome::Failed(
                RpcError::spawn_failed("the sandbox launcher sent no managed-network listeners"),
            ),
            Some(report) => LaunchOutcome::Started(report, listeners),
            None => LaunchOutcome::ExitedSilently,
        }
    }
}

//! The launcher's part of the managed network (CODEX-NETWORK.md §3.5): in the target's own
//! network namespace, which has nothing but a loopback device, it brings the loopback up,
//! listens on the proxy's ports there and hands the listening sockets to the server, which
//! serves them with the process's policy proxy. The namespace has no route anywhere else:
//! a connection that ignores the proxy variables finds no listener (loopback) or no route
//! (anything else). The sockets are made before any confinement, and the launcher keeps
//! none of them.

use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use super::fd_passing::send_with_fds;
use super::LaunchLine;

/// Brings up the loopback device and listens on `127.0.0.1:<port>` for each port.
pub(super) fn open_listeners(ports: &[u16]) -> io::Result<Vec<OwnedFd>> {
    loopback_up()?;
    ports
        .iter()
        .map(|port| TcpListener::bind((Ipv4Addr::LOCALHOST, *port)).map(OwnedFd::from))
        .collect()
}

/// Sends the listeners with their line, `{"status":"listeners","payload":[ports]}`.
pub(super) fn send_listeners(
    control: &OwnedFd,
    ports: &[u16],
    listeners: &[OwnedFd],
) -> io::Result<()> {
    let mut line = serde_json::to_vec(&LaunchLine::Listeners(ports.to_vec()))?;
    line.push(b'\n');
    let fds: Vec<_> = listeners.iter().map(AsFd::as_fd).collect();
    let mut sent = send_with_fds(control.as_fd(), &line, &fds)?;
    while sent < line.len() {
        sent += send_with_fds(control.as_fd(), &line[sent..], &[])?;
    }
    Ok(())
}

/// `ifconfig lo up`: a new network namespace starts with its loopback down.
fn loopback_up() -> io::Result<()> {
    let socket = inet_socket()?;
    // SAFETY: `ifreq` is plain data; zeroed is a valid value, and the name is written
    // within its 16 bytes with a terminating NUL.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write the `ifreq` passed, which lives
    // across both calls; the socket is open.
    unsafe {
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) < 0 {
            return Err(io::Error::last_os_error());
        }
        request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn inet_socket() -> io::Result<OwnedFd> {
    use rustix::net::{socket_with, AddressFamily, SocketFlags, SocketType};
    let fd = socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    Ok(fd)
}

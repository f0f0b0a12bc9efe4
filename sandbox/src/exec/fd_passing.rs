//! Descriptors over the control socket (`SCM_RIGHTS`), through rustix's safe wrappers.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// Descriptors one message may carry here: the managed network's listeners (two for a
/// proxy of the server's, up to `exec_server_netproxy::client_proxy::MAX_BRIDGED_PORTS`
/// for one the client runs).
pub(crate) const MAX_FDS: usize = 16;

/// Sends `bytes` with `fds` attached; returns how many bytes went.
pub(crate) fn send_with_fds(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_FDS || !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let sent = sendmsg(
        socket,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(sent)
}

/// Receives into `buf` without waiting (`WouldBlock` when nothing is there), keeping
/// every descriptor that came along (close-on-exec).
pub(crate) fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let flags = RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC;
    let received = recvmsg(socket, &mut [IoSliceMut::new(buf)], &mut control, flags)?;
    let fds = control
        .drain()
        .filter_map(|message| match message {
            RecvAncillaryMessage::ScmRights(fds) => Some(fds),
            _ => None,
        })
        .flatten()
        .collect();
    Ok((received.bytes, fds))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn descriptors_cross_with_their_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        send_with_fds(a.as_fd(), b"x\n", &[listener.as_fd()]).unwrap();
        let mut buf = [0u8; 8];
        let (n, fds) = recv_with_fds(b.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"x\n");
        let received = std::net::TcpListener::from(fds.into_iter().next().unwrap());
        assert_eq!(received.local_addr().unwrap().port(), port);
        let error = recv_with_fds(b.as_fd(), &mut buf).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
    }
}

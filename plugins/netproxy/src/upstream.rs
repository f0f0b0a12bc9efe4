//! Connecting to a checked destination: only to the addresses the policy approved, in
//! order, never by name (so a second DNS answer cannot swap the target).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;

/// Tries each checked address in turn. `own` are the proxy's listeners: connecting to
/// them would loop the proxy into itself.
pub(crate) async fn connect_checked(
    addrs: &[IpAddr],
    port: u16,
    timeout: Duration,
    own: &[SocketAddr],
) -> io::Result<TcpStream> {
    let mut last_error = io::Error::new(io::ErrorKind::AddrNotAvailable, "no checked address");
    for ip in addrs {
        let addr = SocketAddr::new(*ip, port);
        if is_own_listener(addr, own) {
            last_error = io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "refusing to proxy to the proxy itself",
            );
            continue;
        }
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(error)) => last_error = error,
            Err(_) => last_error = io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
        }
    }
    Err(last_error)
}

fn is_own_listener(addr: SocketAddr, own: &[SocketAddr]) -> bool {
    own.iter().any(|listener| {
        listener.port() == addr.port()
            && (listener.ip() == addr.ip()
                || listener.ip().is_unspecified()
                || addr.ip().is_loopback() && listener.ip().is_loopback())
    })
}

//! The bounds of one proxy: how many connections, how large a request head, how long
//! anything may sit idle.

use std::sync::Arc;
use std::time::Duration;

/// Asked for each connection a proxy or bridge accepts, before it is served: what it
/// returns (a charge against the server's descriptor budget, say) is held for as long as
/// the connection is open; `None` closes the connection at once.
pub type Admission = Arc<dyn Fn() -> Option<Box<dyn Send>> + Send + Sync>;

#[derive(Debug, Clone)]
pub struct ProxyLimits {
    /// Open client connections (HTTP and SOCKS5 together); further clients wait in the
    /// listen backlog.
    pub max_connections: usize,
    /// The HTTP request head (request line + headers); larger → 431.
    pub max_request_head_bytes: usize,
    /// Time to receive a request head, and the idle limit of a keep-alive connection.
    pub header_read_timeout: Duration,
    /// Time for the SOCKS5 greeting and request.
    pub handshake_timeout: Duration,
    pub resolve_timeout: Duration,
    pub connect_timeout: Duration,
    /// Time from sending a forwarded request to the upstream's response head.
    pub upstream_response_timeout: Duration,
    /// A CONNECT or SOCKS5 tunnel with no byte in either direction for this long closes.
    pub tunnel_idle_timeout: Duration,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_request_head_bytes: 64 * 1024,
            header_read_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(30),
            resolve_timeout: Duration::from_secs(15),
            connect_timeout: Duration::from_secs(30),
            upstream_response_timeout: Duration::from_secs(300),
            tunnel_idle_timeout: Duration::from_secs(15 * 60),
        }
    }
}

//! A bridge to a proxy the client runs itself (CODEX-NETWORK.md §3.5, `enforceManagedNetwork`
//! without `networkProxy`): each listener, bound inside the child's network namespace,
//! forwards every connection it accepts to one port on the server's loopback, where the
//! client's proxy listens. The bridge decides nothing: the client's proxy does. It only
//! keeps the child from reaching anything but those ports.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::limits::{Admission, ProxyLimits};
use crate::relay::relay;
use crate::server::Admit;

/// The forwarding of one process. Dropping it (or [`Bridge::shutdown`]) closes its
/// listeners and every connection it carries.
pub struct Bridge {
    shutdown: CancellationToken,
    accept_loops: Vec<JoinHandle<()>>,
}

impl Bridge {
    /// Forwards what `listeners` accept: each `(listener, port)` to `127.0.0.1:port`.
    /// `limits.max_connections` bounds the connections of all listeners together, and
    /// `admission` is charged for each.
    pub fn start(
        listeners: Vec<(std::net::TcpListener, u16)>,
        limits: &ProxyLimits,
        admission: Option<Admission>,
    ) -> io::Result<Self> {
        let shutdown = CancellationToken::new();
        let admit = Admit {
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            admission,
        };
        let mut accept_loops = Vec::new();
        for (listener, port) in listeners {
            listener.set_nonblocking(true)?;
            let listener = TcpListener::from_std(listener)?;
            let target = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let forwarding = Forwarding {
                target,
                limits: limits.clone(),
                shutdown: shutdown.clone(),
            };
            let accepting = forwarding.accept_loop(listener, admit.clone());
            let cancelled = shutdown.clone();
            accept_loops.push(tokio::spawn(async move {
                tokio::select! {
                    _ = cancelled.cancelled() => {}
                    _ = accepting => {}
                }
            }));
        }
        Ok(Self {
            shutdown,
            accept_loops,
        })
    }

    /// Stops forwarding and waits until the listeners are closed.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        for accept_loop in std::mem::take(&mut self.accept_loops) {
            let _ = accept_loop.await;
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

#[derive(Clone)]
struct Forwarding {
    target: SocketAddr,
    limits: ProxyLimits,
    shutdown: CancellationToken,
}

impl Forwarding {
    /// Forwards every connection [`Admit::accept`] lets in.
    async fn accept_loop(self, listener: TcpListener, admit: Admit) {
        while let Some((stream, _, admitted)) = admit.accept(&listener).await {
            let forwarding = self.clone();
            tokio::spawn(async move {
                let _admitted = admitted;
                tokio::select! {
                    _ = forwarding.shutdown.cancelled() => {}
                    _ = forwarding.forward(stream) => {}
                }
            });
        }
    }

    /// Joins `child` to the target; a target that is down or slow closes `child`.
    async fn forward(&self, child: TcpStream) {
        let connect = TcpStream::connect(self.target);
        let upstream = match tokio::time::timeout(self.limits.connect_timeout, connect).await {
            Ok(Ok(upstream)) => upstream,
            Ok(Err(error)) => {
                tracing::debug!(target_addr = %self.target, %error, "network bridge: connect failed");
                return;
            }
            Err(_) => {
                tracing::debug!(target_addr = %self.target, "network bridge: connect timed out");
                return;
            }
        };
        relay(child, upstream, self.limits.tunnel_idle_timeout).await;
    }
}

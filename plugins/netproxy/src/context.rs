//! What every connection of one proxy shares: the policy, the event sink, the limits,
//! and the shutdown signal that ends every task the proxy started.

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::event::{report, EventSink, PolicyEvent};
use crate::limits::ProxyLimits;
use crate::policy::{Evaluation, PolicyEngine, Target};
use crate::upstream::connect_checked;

pub(crate) struct ProxyContext {
    pub(crate) engine: PolicyEngine,
    pub(crate) events: EventSink,
    pub(crate) limits: ProxyLimits,
    /// Cancelled when the proxy stops: every task spawned through [`Self::spawn`] ends,
    /// closing its client connection, tunnel or upstream connection.
    pub(crate) shutdown: CancellationToken,
    /// The proxy's own listeners, never a valid destination.
    pub(crate) own_addrs: Vec<SocketAddr>,
}

impl ProxyContext {
    /// Evaluates the policy and reports every decision taken.
    pub(crate) async fn evaluate(&self, target: &Target, client: SocketAddr) -> Evaluation {
        let evaluation = self.engine.evaluate(target).await;
        for decision in &evaluation.decisions {
            report(&self.events, PolicyEvent::new(target, client, decision));
        }
        evaluation
    }

    /// Connects to the addresses the evaluation checked, and to nothing else.
    pub(crate) async fn connect(
        &self,
        target: &Target,
        evaluation: &Evaluation,
    ) -> io::Result<TcpStream> {
        connect_checked(
            &evaluation.addrs,
            target.port,
            self.limits.connect_timeout,
            &self.own_addrs,
        )
        .await
    }

    /// Spawns a task that ends when the proxy stops.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = task => {}
            }
        });
    }
}

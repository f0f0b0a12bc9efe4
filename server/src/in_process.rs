//! A connection with no transport: JSON values in, JSON values out, through the same
//! connection processor every transport uses. For testing plugins and for embedding.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use crate::connection::{serve_connection, ConnectionInfo, Inbound};
use crate::outbound::OutboundDrain;
use crate::server::ServerContext;

/// One in-process connection. Dropping it ends the connection (its session detaches).
pub struct InProcessConnection {
    to_server: mpsc::Sender<Inbound>,
    from_server: OutboundDrain,
}

impl InProcessConnection {
    /// Opens a connection to `server`, served by a task on the current runtime.
    pub fn open(server: &Arc<ServerContext>) -> Self {
        let (to_server, mut inbound) = mpsc::channel(16);
        let (outbound, from_server) = server.outbound_queue(None);
        let info = ConnectionInfo {
            transport: "in-process",
            parse_error_prefix: "failed to parse JSON-RPC message from in-process connection"
                .into(),
            detach_on_close: true,
            drain_on_end: None,
            descriptor: None,
            who: Arc::new(crate::audit::Who {
                transport: "in-process",
                ..Default::default()
            }),
        };
        let stream = Box::pin(futures_util::stream::poll_fn(move |cx| {
            inbound.poll_recv(cx)
        }));
        tokio::spawn(serve_connection(Arc::clone(server), info, stream, outbound));
        Self {
            to_server,
            from_server,
        }
    }

    /// Sends one message (as a client would).
    pub async fn send(&self, message: &Value) {
        let bytes = bytes::Bytes::from(message.to_string());
        // A closed channel means the server is shutting down; the caller sees `recv` end.
        let _ = self.to_server.send(Inbound::Message(bytes)).await;
    }

    /// Sends raw bytes as one message, e.g. to exercise malformed input.
    pub async fn send_raw(&self, bytes: impl Into<bytes::Bytes>) {
        let _ = self.to_server.send(Inbound::Message(bytes.into())).await;
    }

    /// The next message from the server; `None` once the connection is closed.
    pub async fn recv(&mut self) -> Option<Value> {
        let text = self.from_server.recv().await?;
        Some(serde_json::from_str(&text).expect("the server always sends valid JSON"))
    }
}

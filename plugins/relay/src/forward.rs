//! Forward mode (`exec-server forward`, CODEX-0169 §4.8): instead of serving a stream with a
//! local JSON-RPC connection, the executor opens one WebSocket per stream to a destination
//! exec-server and copies messages both ways: each decrypted message becomes one Binary
//! WebSocket message, and each Text or Binary message of the destination becomes one
//! message on the stream.
//!
//! Both directions are bounded: the stream hands over one message at a time, and the
//! destination is not read while the stream cannot take more, so a slow side slows the
//! other instead of filling memory.

use std::time::Duration;

use bytes::Bytes;
use exec_server_core::config::SecretString;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::Connector;

use exec_server_relay_core::endpoint::redact_url;
use exec_server_relay_core::tls::TlsTrust;

/// The error for a destination that is not a WebSocket URL, codex's own text.
pub const NOT_A_WEBSOCKET_URL: &str = "forward destination must be a ws:// or wss:// URL";
/// How long opening the destination socket may take, as codex.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages above this size go out in fragments of this size, as codex sends them, so a
/// destination's per-frame limit (16 MiB by default) never refuses a large message.
const FRAGMENT_BYTES: usize = 8 << 20;
/// How long the Close that ends a destination socket may take to write.
const CLOSE_WRITE: Duration = Duration::from_secs(1);

type DestinationWs =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Where forwarded streams go.
#[derive(Clone)]
pub struct ForwardTarget {
    url: String,
    bearer: Option<SecretString>,
    max_message_bytes: usize,
    /// What a `wss` destination's certificate is checked against: the same trust as the
    /// registry and the rendezvous (the system's roots and `relay.ca_file`).
    trust: TlsTrust,
}

impl std::fmt::Debug for ForwardTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardTarget")
            .field("url", &redact_url(&self.url))
            .field("bearer", &self.bearer.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Checks that `url` names a WebSocket destination (`ws://` or `wss://` with a host);
/// `Err` carries codex's text. Plain `ws` is allowed to any host, as codex allows it: the
/// destination is usually on the same machine.
pub fn check_destination(url: &str) -> Result<(), &'static str> {
    match exec_server_relay_core::endpoint::check_ws_url(url, true) {
        Ok(_) => Ok(()),
        Err(_) => Err(NOT_A_WEBSOCKET_URL),
    }
}

impl ForwardTarget {
    /// `url` must be `ws://` or `wss://`; `bearer` goes in the destination upgrade's
    /// `Authorization` header; messages above `max_message_bytes` are refused both ways;
    /// a `wss` destination must present a certificate `trust` accepts.
    pub fn new(
        url: &str,
        bearer: Option<SecretString>,
        max_message_bytes: usize,
        trust: TlsTrust,
    ) -> Result<Self, &'static str> {
        check_destination(url)?;
        Ok(Self {
            url: url.to_owned(),
            bearer,
            max_message_bytes,
            trust,
        })
    }

    /// The destination without its query, for logs.
    pub fn display_url(&self) -> &str {
        redact_url(&self.url)
    }

    /// Serves one stream: opens the destination and copies messages until either side
    /// ends. The destination's Close (or a failure) drops `from_destination`, so the
    /// stream closes after what it already holds is sent; the stream's end
    /// (`to_destination` closing) sends Close to the destination.
    pub async fn serve(
        &self,
        stream_id: &str,
        mut to_destination: mpsc::Receiver<Bytes>,
        from_destination: mpsc::Sender<String>,
    ) {
        let ws = match self.open().await {
            Ok(ws) => ws,
            Err(e) => {
                tracing::warn!(
                    stream = %stream_id,
                    destination = %self.display_url(),
                    "forward destination unreachable ({e}); closing the stream"
                );
                return;
            }
        };
        tracing::debug!(stream = %stream_id, destination = %self.display_url(), "forwarding stream");
        let (mut sink, mut source) = ws.split();
        let ended = tokio::select! {
            e = upstream(&mut to_destination, &mut sink) => e,
            e = downstream(&mut source, from_destination) => e,
        };
        if !matches!(ended, Ended::Destination) {
            let close = Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "relay stream ended".into(),
            }));
            let _ = tokio::time::timeout(CLOSE_WRITE, sink.send(close)).await;
        }
        match ended {
            Ended::Stream => {
                tracing::debug!(stream = %stream_id, "stream ended; destination closed")
            }
            Ended::Destination => {
                tracing::debug!(stream = %stream_id, "destination closed; stream closing")
            }
            Ended::Failed(e) => tracing::warn!(
                stream = %stream_id,
                destination = %self.display_url(),
                "forwarding stopped: {e}; closing the stream"
            ),
        }
    }

    async fn open(&self) -> Result<DestinationWs, String> {
        let mut request = self
            .url
            .as_str()
            .into_client_request()
            .map_err(|_| NOT_A_WEBSOCKET_URL.to_owned())?;
        if let Some(token) = &self.bearer {
            let mut value = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
                .map_err(|_| "the destination bearer token is not a valid header value")?;
            value.set_sensitive(true);
            request.headers_mut().insert("Authorization", value);
        }
        let config = WebSocketConfig::default()
            .max_message_size(Some(self.max_message_bytes))
            .max_frame_size(Some(self.max_message_bytes));
        let tls = self
            .url
            .get(..6)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("wss://"))
            .then(|| Connector::Rustls(self.trust.client_config()));
        let connect =
            tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, tls);
        match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Err(_) => Err(format!("no answer within {} s", CONNECT_TIMEOUT.as_secs())),
            Ok(Ok((ws, _))) => Ok(ws),
            Ok(Err(WsError::Http(response))) => Err(format!(
                "the upgrade was refused with HTTP {}",
                response.status().as_u16()
            )),
            Ok(Err(e)) => Err(e.to_string()),
        }
    }
}

/// Which side ended a forwarded stream.
#[derive(Debug)]
enum Ended {
    /// The relay stream ended.
    Stream,
    /// The destination closed its socket.
    Destination,
    Failed(String),
}

type DestinationSink = futures_util::stream::SplitSink<DestinationWs, Message>;

/// Stream → destination: one Binary message per JSON-RPC message, until the stream ends.
async fn upstream(from_stream: &mut mpsc::Receiver<Bytes>, sink: &mut DestinationSink) -> Ended {
    while let Some(message) = from_stream.recv().await {
        if let Err(e) = send_binary(sink, message).await {
            return Ended::Failed(format!("writing to the destination: {e}"));
        }
    }
    Ended::Stream
}

/// Sends `message` as one Binary message, in [`FRAGMENT_BYTES`] fragments when larger.
async fn send_binary(sink: &mut DestinationSink, message: Bytes) -> Result<(), WsError> {
    if message.len() <= FRAGMENT_BYTES {
        return sink.send(Message::Binary(message)).await;
    }
    let count = message.len().div_ceil(FRAGMENT_BYTES);
    for index in 0..count {
        let start = index * FRAGMENT_BYTES;
        let chunk = message.slice(start..(start + FRAGMENT_BYTES).min(message.len()));
        let opcode = if index == 0 {
            OpCode::Data(Data::Binary)
        } else {
            OpCode::Data(Data::Continue)
        };
        sink.feed(Message::Frame(Frame::message(
            chunk,
            opcode,
            index + 1 == count,
        )))
        .await?;
    }
    sink.flush().await
}

/// Destination → stream: each Text or Binary message is one JSON-RPC message.
async fn downstream(
    source: &mut futures_util::stream::SplitStream<DestinationWs>,
    to_stream: mpsc::Sender<String>,
) -> Ended {
    loop {
        let text = match source.next().await {
            None | Some(Ok(Message::Close(_))) => return Ended::Destination,
            Some(Err(WsError::ConnectionClosed | WsError::AlreadyClosed)) => {
                return Ended::Destination
            }
            Some(Err(e)) => return Ended::Failed(format!("reading from the destination: {e}")),
            Some(Ok(Message::Text(text))) => text.as_str().to_owned(),
            Some(Ok(Message::Binary(bytes))) => match String::from_utf8(bytes.to_vec()) {
                Ok(text) => text,
                Err(_) => {
                    return Ended::Failed("the destination sent a message that is not UTF-8".into())
                }
            },
            // Pings are answered by the WebSocket layer; nothing else carries messages.
            Some(Ok(_)) => continue,
        };
        if to_stream.send(text).await.is_err() {
            return Ended::Stream;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_websocket_destinations_are_accepted() {
        for good in [
            "ws://127.0.0.1:9000",
            "wss://example.com/exec",
            "WS://127.0.0.1:1",
        ] {
            assert_eq!(check_destination(good), Ok(()), "{good}");
        }
        for bad in [
            "http://127.0.0.1:9000",
            "127.0.0.1:9000",
            "ws://",
            "",
            "stdio",
        ] {
            assert_eq!(check_destination(bad), Err(NOT_A_WEBSOCKET_URL), "{bad}");
        }
    }

    #[test]
    fn the_bearer_never_shows_in_debug_output() {
        let target = ForwardTarget::new(
            "ws://127.0.0.1:1/?sig=secret-query",
            Some(SecretString::new("bearer-secret")),
            1024,
            TlsTrust::system(),
        )
        .unwrap();
        let text = format!("{target:?}");
        assert!(!text.contains("bearer-secret") && !text.contains("secret-query"));
    }
}

//! One physical connection of an endpoint (RELAY §5.11, §6.1): a WebSocket client to the
//! rendezvous (`ws`, or `wss` with the relay's TLS configuration) with the relay's size
//! limits and `TCP_NODELAY`, a writer task that sends
//! frames and Pings, and the Pong deadline that declares the connection dead.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use exec_server_proto::log_text::printable_start;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

use crate::proto::{Body, RelayMessageFrame, MAX_WS_MESSAGE_BYTES};
use crate::tls::TlsTrust;

pub type ClientWs = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Control frames queued towards one physical connection (§6.1).
pub const PHYSICAL_QUEUE: usize = 1_024;
/// Data frames queued towards one physical connection: producers wait for room, so this
/// bounds the records held for a rendezvous that reads slowly to 128 × 61,456 bytes
/// (about 7.5 MiB), still two bursts of [`BURST_FRAMES`] to keep the socket busy.
pub const DATA_QUEUE: usize = 128;

/// Ping interval and Pong deadline.
#[derive(Debug, Clone, Copy)]
pub struct LinkTiming {
    pub ping_interval: Duration,
    pub pong_timeout: Duration,
}

impl Default for LinkTiming {
    fn default() -> Self {
        Self {
            ping_interval: Duration::from_secs(30),
            pong_timeout: Duration::from_secs(60),
        }
    }
}

/// Why opening a rendezvous socket failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The upgrade was answered with this HTTP status, for this reason (the error code and
    /// message of the rendezvous's JSON body, or the start of its text).
    #[error("the rendezvous refused the upgrade with HTTP {status}: {reason}")]
    Status { status: u16, reason: String },
    #[error("the rendezvous upgrade timed out")]
    Timeout,
    #[error("cannot reach the rendezvous: {0}")]
    Other(String),
}

/// Most characters of a refusal's reason kept for a log line.
const REFUSAL_REASON_CHARS: usize = 200;

/// The header in which a rendezvous names why it refused a socket (CODEX-0169 §4.3).
const REJECTION_REASON_HEADER: &str = "x-codex-rendezvous-rejection-reason";

/// Why an upgrade was refused: the rendezvous's rejection-reason header, else `code:
/// message` of a JSON `{"error": {...}}` body, else the start of the text; printable,
/// bounded.
fn refusal_reason(
    headers: &tokio_tungstenite::tungstenite::http::HeaderMap,
    body: &[u8],
) -> String {
    let header = headers
        .get(REJECTION_REASON_HEADER)
        .and_then(|value| value.to_str().ok())
        .filter(|text| !text.trim().is_empty());
    if let Some(reason) = header {
        return printable_start(reason, REFUSAL_REASON_CHARS);
    }
    let error = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|value| value.get("error").cloned());
    let text = match error {
        Some(error) => {
            let field = |name: &str| {
                error
                    .get(name)
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_owned()
            };
            let (code, message) = (field("code"), field("message"));
            match (code.is_empty(), message.is_empty()) {
                (false, false) => format!("{code}: {message}"),
                (false, true) => code,
                _ => message,
            }
        }
        None => String::from_utf8_lossy(body).into_owned(),
    };
    let reason = printable_start(&text, REFUSAL_REASON_CHARS);
    if reason.is_empty() {
        "no reason given".into()
    } else {
        reason
    }
}

/// Opens a rendezvous WebSocket (binary only, 256 KiB limit, no compression, no Nagle),
/// over TLS trusting `trust` for `wss` URLs.
pub async fn open(url: &str, timeout: Duration, trust: &TlsTrust) -> Result<ClientWs, OpenError> {
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_WS_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_WS_MESSAGE_BYTES));
    let tls = url
        .get(..6)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("wss://"))
        .then(|| Connector::Rustls(trust.client_config()));
    let connect = tokio_tungstenite::connect_async_tls_with_config(url, Some(config), true, tls);
    match tokio::time::timeout(timeout, connect).await {
        Err(_) => Err(OpenError::Timeout),
        Ok(Ok((ws, _))) => Ok(ws),
        Ok(Err(WsError::Http(response))) => Err(OpenError::Status {
            status: response.status().as_u16(),
            reason: refusal_reason(
                response.headers(),
                response.body().as_deref().unwrap_or_default(),
            ),
        }),
        Ok(Err(e)) => Err(OpenError::Other(e.to_string())),
    }
}

/// The two queues of a physical connection's writer (§6.1): control frames (handshake,
/// reset, resume, standalone acks) are written ahead of data frames. Data producers wait
/// for room in their bounded queue; the writer never lets data overtake a queued control
/// frame. Producers waiting for room are served in the order they started waiting, so
/// streams with data ready take turns.
#[derive(Clone)]
pub struct FrameQueues {
    pub data: mpsc::Sender<Bytes>,
    pub control: mpsc::Sender<Bytes>,
}

impl FrameQueues {
    /// The queue a frame of this kind belongs to.
    pub fn for_frame(&self, frame: &RelayMessageFrame) -> &mpsc::Sender<Bytes> {
        match frame.body {
            Some(Body::Data(_)) => &self.data,
            _ => &self.control,
        }
    }
}

/// The writer side of a physical connection and what controls it.
#[derive(Clone)]
pub struct LinkHandle {
    pub frames: FrameQueues,
    close_code: Arc<Mutex<Option<u16>>>,
    /// Cancelled when the connection is finished (closed by us, dead, or ended).
    pub dead: CancellationToken,
    /// Cancelled once the writer has written what was queued and the close frame.
    written: CancellationToken,
    last_pong: Arc<Mutex<Instant>>,
}

impl LinkHandle {
    /// Closes the connection with `code` once queued frames are written.
    pub fn close(&self, code: u16) {
        *self.close_code.lock().unwrap_or_else(|e| e.into_inner()) = Some(code);
        self.dead.cancel();
    }

    /// Resolves once the writer has finished (after [`LinkHandle::close`] or a dead link).
    pub async fn finished(&self) {
        self.written.cancelled().await
    }

    pub fn pong_received(&self) {
        *self.last_pong.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }
}

/// Splits a socket: spawns the writer and returns its handle and the read half.
pub fn start(ws: ClientWs, timing: LinkTiming) -> (LinkHandle, SplitStream<ClientWs>) {
    let (sink, stream) = ws.split();
    let (data, data_rx) = mpsc::channel(DATA_QUEUE);
    let (control, control_rx) = mpsc::channel(PHYSICAL_QUEUE);
    let handle = LinkHandle {
        frames: FrameQueues { data, control },
        close_code: Arc::new(Mutex::new(None)),
        dead: CancellationToken::new(),
        written: CancellationToken::new(),
        last_pong: Arc::new(Mutex::new(Instant::now())),
    };
    tokio::spawn(write_loop(
        sink,
        control_rx,
        data_rx,
        handle.clone(),
        timing,
    ));
    (handle, stream)
}

/// What a read produced.
pub enum Incoming {
    Binary(Bytes),
    /// A text message: a protocol violation (close 1003).
    Text,
    /// The connection ended (close, error, too big, dead).
    Ended(Option<u16>),
}

/// Reads the next relevant message, answering Pongs and ignoring Pings (the WebSocket
/// layer answers them).
pub async fn read(stream: &mut SplitStream<ClientWs>, handle: &LinkHandle) -> Incoming {
    loop {
        let next = tokio::select! {
            _ = handle.dead.cancelled() => return Incoming::Ended(None),
            next = stream.next() => next,
        };
        match next {
            Some(Ok(Message::Binary(bytes))) => return Incoming::Binary(bytes),
            Some(Ok(Message::Text(_))) => return Incoming::Text,
            Some(Ok(Message::Pong(_))) => handle.pong_received(),
            Some(Ok(Message::Close(frame))) => {
                return Incoming::Ended(frame.map(|f| u16::from(f.code)))
            }
            Some(Ok(_)) => {}
            Some(Err(WsError::Capacity(_))) => {
                handle.close(1009);
                return Incoming::Ended(Some(1009));
            }
            Some(Err(_)) | None => return Incoming::Ended(None),
        }
    }
}

/// Frames written with one flush at most: enough to fill the socket in a burst, few
/// enough that Pings and the Pong deadline are never held up for long.
const BURST_FRAMES: usize = 64;

/// Writes `first` and the frames already queued behind it (control frames first), then
/// flushes once: a burst of records costs one write to the socket, not one per frame.
async fn write_burst(
    sink: &mut SplitSink<ClientWs, Message>,
    first: Bytes,
    control: &mut mpsc::Receiver<Bytes>,
    data: &mut mpsc::Receiver<Bytes>,
) -> Result<(), WsError> {
    sink.feed(Message::Binary(first)).await?;
    for _ in 1..BURST_FRAMES {
        let Ok(next) = control.try_recv().or_else(|_| data.try_recv()) else {
            break;
        };
        sink.feed(Message::Binary(next)).await?;
    }
    sink.flush().await
}

async fn write_loop(
    mut sink: SplitSink<ClientWs, Message>,
    mut control: mpsc::Receiver<Bytes>,
    mut data: mpsc::Receiver<Bytes>,
    handle: LinkHandle,
    timing: LinkTiming,
) {
    let mut ping =
        tokio::time::interval_at(Instant::now() + timing.ping_interval, timing.ping_interval);
    let mut unanswered: Option<Instant> = None;
    loop {
        let pong_deadline = unanswered.map(|t| t + timing.pong_timeout);
        tokio::select! {
            biased;
            _ = handle.dead.cancelled() => break,
            Some(bytes) = control.recv() => {
                let burst = write_burst(&mut sink, bytes, &mut control, &mut data);
                if !written_in_time(burst, timing).await {
                    break;
                }
            }
            frame = data.recv() => match frame {
                Some(bytes) => {
                    let burst = write_burst(&mut sink, bytes, &mut control, &mut data);
                    if !written_in_time(burst, timing).await {
                        break;
                    }
                }
                None => break,
            },
            _ = ping.tick() => {
                let pong = *handle.last_pong.lock().unwrap_or_else(|e| e.into_inner());
                if unanswered.is_some_and(|t| pong >= t) {
                    unanswered = None;
                }
                if unanswered.is_none() {
                    unanswered = Some(Instant::now());
                }
                if !written_in_time(sink.send(Message::Ping(Bytes::new())), timing).await {
                    break;
                }
            }
            _ = async { tokio::time::sleep_until(pong_deadline.unwrap_or_else(Instant::now)).await }, if pong_deadline.is_some() => {
                let pong = *handle.last_pong.lock().unwrap_or_else(|e| e.into_inner());
                if unanswered.is_some_and(|t| pong >= t) {
                    unanswered = None;
                } else {
                    tracing::warn!("relay connection lost: pong_timeout");
                    break;
                }
            }
        }
    }
    // Write what is queued (control frames first), then close with the requested code;
    // a peer that takes nothing gets nothing more.
    let drain = drain_and_close(&mut sink, &mut control, &mut data, &handle);
    let _ = tokio::time::timeout(timing.pong_timeout, drain).await;
    handle.dead.cancel();
    handle.written.cancel();
}

/// Whether `write` finished without error before the Pong deadline: a peer that takes no
/// data (its TCP window stays full) is as dead as one that answers no Ping, and the writer
/// must not wait on it forever while its queues hold frames for it.
async fn written_in_time(
    write: impl std::future::Future<Output = Result<(), WsError>>,
    timing: LinkTiming,
) -> bool {
    match tokio::time::timeout(timing.pong_timeout, write).await {
        Ok(result) => result.is_ok(),
        Err(_) => {
            tracing::warn!(
                "relay connection lost: the rendezvous took no data for the pong timeout"
            );
            false
        }
    }
}

/// Writes what is queued (control frames first), then the close frame with the code
/// [`LinkHandle::close`] asked for.
async fn drain_and_close(
    sink: &mut SplitSink<ClientWs, Message>,
    control: &mut mpsc::Receiver<Bytes>,
    data: &mut mpsc::Receiver<Bytes>,
    handle: &LinkHandle,
) {
    'drain: for queue in [control, data] {
        while let Ok(bytes) = queue.try_recv() {
            if sink.send(Message::Binary(bytes)).await.is_err() {
                break 'drain;
            }
        }
    }
    let code = handle
        .close_code
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    let frame = code.map(|c| CloseFrame {
        code: CloseCode::from(c),
        reason: "".into(),
    });
    let _ = sink.send(Message::Close(frame)).await;
    let _ = sink.close().await;
}

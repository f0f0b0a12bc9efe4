//! A minimal JSON-RPC client for measurements: raw text out, raw text in, no framework.

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

use crate::target::StdioProcess;

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub async fn ws_connect(url: &str) -> Ws {
    let (ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("websocket connect");
    ws
}

pub async fn ws_send(ws: &mut Ws, text: &str) {
    ws.send(Message::Text(text.to_owned().into()))
        .await
        .expect("send");
}

/// The next text message.
pub async fn ws_recv(ws: &mut Ws) -> String {
    loop {
        match ws.next().await.expect("connection open").expect("read") {
            Message::Text(text) => return text.to_string(),
            Message::Binary(bytes) => return String::from_utf8_lossy(&bytes).into_owned(),
            _ => continue,
        }
    }
}

/// One round trip: send, then wait for the message whose `id` matches.
pub async fn ws_round_trip(ws: &mut Ws, text: &str, id: i64) -> Value {
    ws_send(ws, text).await;
    loop {
        let reply: Value = serde_json::from_str(&ws_recv(ws).await).expect("JSON");
        if reply["id"] == id {
            return reply;
        }
    }
}

/// `initialize` + `initialized` over a WebSocket.
pub async fn ws_handshake(ws: &mut Ws) {
    ws_round_trip(
        ws,
        r#"{"id":0,"method":"initialize","params":{"clientName":"bench"}}"#,
        0,
    )
    .await;
    ws_send(ws, r#"{"method":"initialized"}"#).await;
}

pub async fn line_send(p: &mut StdioProcess, text: &str) {
    p.stdin.write_all(text.as_bytes()).await.expect("write");
    p.stdin.write_all(b"\n").await.expect("write");
    p.stdin.flush().await.expect("flush");
}

pub async fn line_recv(p: &mut StdioProcess) -> String {
    let mut line = String::new();
    p.stdout.read_line(&mut line).await.expect("read");
    line
}

/// `initialize` + `initialized` over stdio.
pub async fn line_handshake(p: &mut StdioProcess) {
    line_send(
        p,
        r#"{"id":0,"method":"initialize","params":{"clientName":"bench"}}"#,
    )
    .await;
    line_recv(p).await;
    line_send(p, r#"{"method":"initialized"}"#).await;
}

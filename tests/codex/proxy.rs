//! A WebSocket proxy between the codex client and the server under test that records, per
//! connection, every request's method and every error answer's code, so a test can say
//! what codex called and what it was told.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

/// One request the client sent, and the error code it got back (if any).
#[derive(Debug, Clone)]
pub struct Exchange {
    pub method: String,
    pub params: Value,
    pub error: Option<(i64, String)>,
    pub answered: bool,
}

#[derive(Default)]
struct Log {
    /// Per connection: request id (as JSON text) → index in `exchanges`.
    pending: HashMap<(usize, String), usize>,
    exchanges: Vec<Exchange>,
    notifications_to_client: Vec<String>,
}

pub struct RecordingProxy {
    /// `ws://127.0.0.1:PORT` for the client.
    pub url: String,
    log: Arc<Mutex<Log>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RecordingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RecordingProxy {
    /// Forwards every connection to `upstream` (a `ws://` URL).
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Log::default()));
        let upstream = upstream.to_owned();
        let shared = Arc::clone(&log);
        let task = tokio::spawn(async move {
            let mut connection = 0usize;
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                connection += 1;
                tokio::spawn(relay(
                    stream,
                    upstream.clone(),
                    Arc::clone(&shared),
                    connection,
                ));
            }
        });
        Self { url, log, task }
    }

    /// Every request seen so far, in arrival order.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.log.lock().unwrap().exchanges.clone()
    }

    /// Methods of the notifications the server sent the client.
    pub fn notifications(&self) -> Vec<String> {
        self.log.lock().unwrap().notifications_to_client.clone()
    }
}

async fn relay(
    stream: tokio::net::TcpStream,
    upstream: String,
    log: Arc<Mutex<Log>>,
    connection: usize,
) {
    let Ok(client) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    let Ok((server, _)) = tokio_tungstenite::connect_async(&upstream).await else {
        return;
    };
    let (mut client_tx, mut client_rx) = client.split();
    let (mut server_tx, mut server_rx) = server.split();
    let up_log = Arc::clone(&log);
    let up = async move {
        while let Some(Ok(message)) = client_rx.next().await {
            if let Some(text) = text_of(&message) {
                record_request(&up_log, connection, &text);
            }
            let closing = message.is_close();
            if server_tx.send(message).await.is_err() || closing {
                break;
            }
        }
        let _ = server_tx.close().await;
    };
    let down = async move {
        while let Some(Ok(message)) = server_rx.next().await {
            if let Some(text) = text_of(&message) {
                record_answer(&log, connection, &text);
            }
            let closing = message.is_close();
            if client_tx.send(message).await.is_err() || closing {
                break;
            }
        }
        let _ = client_tx.close().await;
    };
    tokio::join!(up, down);
}

fn text_of(message: &Message) -> Option<String> {
    match message {
        Message::Text(text) => Some(text.to_string()),
        Message::Binary(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        _ => None,
    }
}

fn record_request(log: &Mutex<Log>, connection: usize, text: &str) {
    let Ok(message) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let (Some(method), Some(id)) = (message["method"].as_str(), message.get("id")) else {
        return;
    };
    let mut log = log.lock().unwrap();
    let index = log.exchanges.len();
    log.exchanges.push(Exchange {
        method: method.to_owned(),
        params: message["params"].clone(),
        error: None,
        answered: false,
    });
    log.pending.insert((connection, id.to_string()), index);
}

fn record_answer(log: &Mutex<Log>, connection: usize, text: &str) {
    let Ok(message) = serde_json::from_str::<Value>(text) else {
        return;
    };
    let mut log = log.lock().unwrap();
    if let (Some(method), None) = (message["method"].as_str(), message.get("id")) {
        log.notifications_to_client.push(method.to_owned());
        return;
    }
    let Some(id) = message.get("id") else {
        return;
    };
    let Some(index) = log.pending.remove(&(connection, id.to_string())) else {
        return;
    };
    let exchange = &mut log.exchanges[index];
    exchange.answered = true;
    if let Some(error) = message.get("error") {
        exchange.error = Some((
            error["code"].as_i64().unwrap_or_default(),
            error["message"].as_str().unwrap_or_default().to_owned(),
        ));
    }
}

//! The floors: the least a server could do for the same traffic. This binary re-executes
//! itself with a sentinel argument to become one, so floors run as separate processes on
//! the same runtime settings as exec-server.

use std::io::{BufRead, Write};

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

/// Sentinel: a WebSocket server that echoes every message (prints its `ws://` line).
pub const WS_ECHO: &str = "--floor-ws-echo";
/// Sentinel: a process that echoes every stdin line to stdout.
pub const LINE_ECHO: &str = "--floor-line-echo";
/// Sentinel: a WebSocket server that forwards each connection, message by message, to
/// a new connection to the `ws://` URL after it, and back: the one hop a relay adds.
pub const WS_FORWARD: &str = "--floor-ws-forward";

/// Runs a floor server if `args[1]` asks for one; returns its exit code.
pub fn dispatch(args: &[String]) -> Option<i32> {
    match args.get(1).map(String::as_str) {
        Some(WS_ECHO) => Some(ws_echo()),
        Some(LINE_ECHO) => Some(line_echo()),
        Some(WS_FORWARD) => Some(ws_forward(args.get(2).expect("the upstream URL").clone())),
        _ => None,
    }
}

fn ws_echo() -> i32 {
    serve_websockets(|mut ws| async move {
        while let Some(Ok(message)) = ws.next().await {
            if matches!(message, Message::Text(_) | Message::Binary(_))
                && ws.send(message).await.is_err()
            {
                return;
            }
        }
    })
}

fn ws_forward(upstream: String) -> i32 {
    serve_websockets(move |downstream| {
        let upstream = upstream.clone();
        async move {
            let Ok((upstream, _)) = tokio_tungstenite::connect_async(&upstream).await else {
                return;
            };
            let (mut down_tx, mut down_rx) = downstream.split();
            let (mut up_tx, mut up_rx) = upstream.split();
            let forward = async {
                while let Some(Ok(message)) = down_rx.next().await {
                    if up_tx.send(message).await.is_err() {
                        break;
                    }
                }
            };
            let back = async {
                while let Some(Ok(message)) = up_rx.next().await {
                    if down_tx.send(message).await.is_err() {
                        break;
                    }
                }
            };
            tokio::select! {
                () = forward => {}
                () = back => {}
            }
        }
    })
}

/// Listens on `127.0.0.1:0`, prints its `ws://` line and runs `serve` on every WebSocket
/// accepted, each in a task of its own, on a runtime like exec-server's.
fn serve_websockets<F, Fut>(serve: F) -> i32
where
    F: Fn(tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let serve = std::sync::Arc::new(serve);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        println!("ws://{}", listener.local_addr().expect("address"));
        std::io::stdout().flush().expect("flush");
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let serve = std::sync::Arc::clone(&serve);
            tokio::spawn(async move {
                if let Ok(ws) = tokio_tungstenite::accept_async(tcp).await {
                    serve(ws).await;
                }
            });
        }
    })
}

fn line_echo() -> i32 {
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    let mut line = String::new();
    let mut input = stdin.lock();
    loop {
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) | Err(_) => return 0,
            Ok(_) => {
                if stdout
                    .write_all(line.as_bytes())
                    .and_then(|_| stdout.flush())
                    .is_err()
                {
                    return 0;
                }
            }
        }
    }
}

//! JSON-RPC input: each input is one connection's messages, one per line, sent through
//! the real connection processor, router and every plugin's typed params to a server with
//! its plugins installed ([`world`]). The first byte chooses how they arrive:
//! * `#`: as stdio bytes, cut into messages by the stdio transport's own line reader
//!   (carriage returns, blank and oversized lines included), after the handshake;
//! * `!`: each line as one message (as a WebSocket message is), with no handshake;
//! * anything else: each line as one message, after the `initialize` handshake, so the
//!   fuzzer spends most of its time in the methods.
//!
//! Checked for every input:
//! * every message the server sends is valid JSON-RPC in the codex dialect: an answer
//!   (`id` with exactly one of `result` or an `error` with an integer `code` and a string
//!   `message`), a notification or a request of the server's (`method`);
//! * no request is answered more often than it was sent (the ids of requests that did not
//!   parse are answered with the untied id, which is counted apart);
//! * nothing panics (the fuzzer's panic hook aborts, in any task or thread).
//!
//! `$W` in a message stands for the world's directory, so that seeds can name its files.

#![no_main]

mod world;

use std::collections::HashMap;
use std::time::Duration;

use exec_server_core::connection::{serve_connection, ConnectionInfo};
use exec_server_core::transport::stdio::LineReader;
use exec_server_core::InProcessConnection;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// Most messages of one input.
const MAX_MESSAGES: usize = 32;
/// How long one input's answers are waited for. Requests that wait on purpose (a
/// `process/read` with `waitMs`, a search of a big tree) may still be running then.
const ANSWER_WAIT: Duration = Duration::from_millis(500);

fuzz_target!(|data: &[u8]| {
    let world = world::get();
    world.runtime.block_on(run_input(world, data));
});

const INITIALIZE: &[u8] =
    br#"{"id":"fuzz-init","method":"initialize","params":{"clientName":"fuzz"}}"#;
const INITIALIZED: &[u8] = br#"{"method":"initialized"}"#;

async fn run_input(world: &world::World, data: &[u8]) {
    let (raw, data) = match data.split_first() {
        Some((b'#', rest)) => return run_stdio(world, rest).await,
        Some((b'!', rest)) => (true, rest),
        _ => (false, data),
    };
    let mut connection = InProcessConnection::open(&world.server);
    let mut ledger = Ledger::default();
    if !raw {
        handshake(&mut connection, &mut ledger).await;
    }
    for line in data.split(|b| *b == b'\n').take(MAX_MESSAGES) {
        let line = world.expand(line);
        ledger.sent(&line);
        connection.send_raw(line).await;
    }
    let deadline = tokio::time::Instant::now() + ANSWER_WAIT;
    while !ledger.all_answered() {
        match tokio::time::timeout_at(deadline, connection.recv()).await {
            Ok(Some(message)) => ledger.received(&message),
            Ok(None) | Err(_) => break,
        }
    }
}

/// The stdio transport's line reader over the input's bytes, then the same connection
/// processor, configured as stdio configures it (the session ends with the input).
async fn run_stdio(world: &world::World, data: &[u8]) {
    let mut input = [INITIALIZE, b"\n", INITIALIZED, b"\n"].concat();
    input.extend(world.expand(data));
    let mut ledger = Ledger::default();
    for line in input.split(|b| *b == b'\n') {
        ledger.sent(line);
    }
    let server = &world.server;
    let (outbound, mut drain) = server.outbound_queue(None);
    let lines = LineReader::new(
        std::io::Cursor::new(input),
        server.core.limits.max_message_bytes,
    );
    let info = ConnectionInfo {
        transport: "stdio",
        parse_error_prefix: "failed to parse JSON-RPC message from exec-server stdio".into(),
        detach_on_close: false,
        drain_on_end: Some(Duration::from_millis(200)),
        descriptor: None,
        who: std::sync::Arc::new(exec_server_core::audit::Who {
            transport: "stdio",
            ..Default::default()
        }),
    };
    let connection = tokio::spawn(serve_connection(
        std::sync::Arc::clone(server),
        info,
        Box::pin(lines.into_stream()),
        outbound,
    ));
    while let Ok(Some(text)) = tokio::time::timeout(ANSWER_WAIT, drain.recv()).await {
        let message: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("the server sent what is not JSON ({e}): {text}"));
        ledger.received(&message);
    }
    connection.abort();
}

async fn handshake(connection: &mut InProcessConnection, ledger: &mut Ledger) {
    ledger.sent(INITIALIZE);
    connection.send_raw(INITIALIZE.to_vec()).await;
    while !ledger.all_answered() {
        let Some(message) = connection.recv().await else {
            panic!("the server closed the connection during initialize");
        };
        ledger.received(&message);
    }
    connection.send_raw(INITIALIZED.to_vec()).await;
}

/// Requests sent and answers received, by id.
#[derive(Default)]
struct Ledger {
    /// Requests sent per id (its JSON text), less the answers received for it.
    unanswered: HashMap<String, i64>,
}

impl Ledger {
    /// Counts `line` if it is a request the server will answer with its own id.
    fn sent(&mut self, line: &[u8]) {
        let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(line) else {
            return;
        };
        if !message.contains_key("method") {
            return;
        }
        if let Some(id) = message.get("id").filter(|id| is_request_id(id)) {
            *self.unanswered.entry(id.to_string()).or_default() += 1;
        }
    }

    fn received(&mut self, message: &Value) {
        let object = message
            .as_object()
            .unwrap_or_else(|| panic!("not a JSON-RPC message: {message}"));
        let has = |key| object.contains_key(key);
        if has("method") {
            assert!(
                object["method"].is_string(),
                "a method that is not a string: {message}"
            );
            assert!(
                !has("result") && !has("error"),
                "a request with an answer: {message}"
            );
            return;
        }
        assert!(
            has("result") != has("error"),
            "an answer needs exactly one of result and error: {message}"
        );
        if let Some(error) = object.get("error") {
            assert!(
                error["code"].is_i64() && error["message"].is_string(),
                "an error without an integer code and a message: {message}"
            );
        }
        let id = object
            .get("id")
            .unwrap_or_else(|| panic!("an answer without an id: {message}"));
        if !is_request_id(id) || *id == Value::from(-1) {
            // Answers to what could not be read as a request carry the untied id.
            return;
        }
        let left = self.unanswered.entry(id.to_string()).or_default();
        *left -= 1;
        assert!(
            *left >= 0,
            "request {id} answered more often than it was sent: {message}"
        );
    }

    fn all_answered(&self) -> bool {
        self.unanswered.values().all(|left| *left <= 0)
    }
}

/// Ids the server echoes: strings and integers that fit `i64` (PROTOCOL §2.1).
fn is_request_id(id: &Value) -> bool {
    id.is_string() || id.is_i64()
}

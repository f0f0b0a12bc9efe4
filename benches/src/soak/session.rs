//! One soak client's session: a JSON-RPC connection over a WebSocket or a relay stream that
//! keeps the notifications it is not asked about yet, fails (never panics) on an error
//! answer, a lost connection or a silence longer than [`STEP_TIMEOUT`], and can drop its
//! connection and take the session over from a new one (PROTOCOL §3.4).

use std::collections::VecDeque;
use std::time::Duration;

use exec_server_relay_core::harness::{RelayConnectArgs, RelayConnection};
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::{Failure, Tally};
use crate::wire::{self, Rpc, Ws};

/// The longest wait for any one message. Generous: the machine may be shared with other
/// work, and a stall this long is a failure (lost output, a request never answered).
pub(super) const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a resume keeps retrying while the server has not yet seen the old connection
/// end (-32010); well inside the soak's 10 s detach window.
const RESUME_DEADLINE: Duration = Duration::from_secs(8);

/// The extensions whose notifications the workload uses (`search/*`, `fs/changed`).
const EXTENSIONS: [&str; 2] = ["search", "fsWatch"];

/// How a client reaches the server.
#[derive(Clone)]
pub(super) enum Dial {
    /// The server's WebSocket listener.
    Ws(String),
    /// A relay stream through the rendezvous (its bundles may route through a
    /// [`super::cut::Cutter`]).
    Relay(Box<RelayConnectArgs>),
}

impl Dial {
    async fn connect(&self) -> Result<Link, Failure> {
        match self {
            Dial::Ws(url) => Ok(Link::Ws(Box::new(wire::ws_connect(url).await))),
            Dial::Relay(args) => wire::relay_connect((**args).clone())
                .await
                .map(Link::Relay)
                .map_err(Failure::new),
        }
    }
}

/// One open connection.
enum Link {
    Ws(Box<Ws>),
    Relay(RelayConnection),
}

impl Rpc for Link {
    async fn try_send_text(&mut self, text: String) -> Result<(), String> {
        match self {
            Link::Ws(ws) => ws.try_send_text(text).await,
            Link::Relay(relay) => relay.try_send_text(text).await,
        }
    }

    async fn try_recv_text(&mut self) -> Result<Utf8Bytes, String> {
        match self {
            Link::Ws(ws) => ws.try_recv_text().await,
            Link::Relay(relay) => relay.try_recv_text().await,
        }
    }
}

/// A session and its current connection.
pub(super) struct Session {
    dial: Dial,
    link: Option<Link>,
    /// The server's id for the session, for resumes.
    id: String,
    next_id: i64,
    /// Notifications received while waiting for something else, oldest first.
    inbox: VecDeque<Value>,
    tally: Tally,
}

impl Session {
    /// Connects and initializes a new session.
    pub(super) async fn open(dial: Dial, tally: Tally) -> Result<Self, Failure> {
        let mut session = Self {
            link: Some(dial.connect().await?),
            dial,
            id: String::new(),
            next_id: 1,
            inbox: VecDeque::new(),
            tally,
        };
        let result = session
            .call(
                "initialize",
                json!({"clientName": "soak", "extensions": EXTENSIONS}),
            )
            .await?;
        session.id = result["sessionId"]
            .as_str()
            .ok_or_else(|| Failure::new(format!("initialize answered no sessionId: {result}")))?
            .to_owned();
        session.notify("initialized", json!({})).await?;
        Ok(session)
    }

    fn link(&mut self) -> Result<&mut Link, Failure> {
        self.link
            .as_mut()
            .ok_or_else(|| Failure::new("the session has no connection"))
    }

    async fn send(&mut self, message: Value) -> Result<(), Failure> {
        self.link()?
            .try_send_text(message.to_string())
            .await
            .map_err(Failure::new)
    }

    /// The next message, within [`STEP_TIMEOUT`].
    async fn receive(&mut self, waiting_for: &str) -> Result<Value, Failure> {
        let link = self.link()?;
        let text = tokio::time::timeout(STEP_TIMEOUT, link.try_recv_text())
            .await
            .map_err(|_| {
                Failure::new(format!(
                    "nothing arrived for {} s while waiting for {waiting_for}",
                    STEP_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| Failure::new(format!("{e} (while waiting for {waiting_for})")))?;
        serde_json::from_str(&text)
            .map_err(|e| Failure::new(format!("the server sent invalid JSON ({e}): {text}")))
    }

    async fn notify(&mut self, method: &str, params: Value) -> Result<(), Failure> {
        self.send(json!({"method": method, "params": params})).await
    }

    /// Sends a request and returns its answer: `Ok(Ok(result))` or `Ok(Err(error))`;
    /// notifications that arrive meanwhile are kept for [`Session::notification`].
    pub(super) async fn request(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<Result<Value, Value>, Failure> {
        let id = self.next_id;
        self.next_id += 1;
        self.tally.request(method);
        self.send(json!({"id": id, "method": method, "params": params}))
            .await?;
        let waiting_for = format!("the answer to {method}");
        loop {
            let mut message = self.receive(&waiting_for).await?;
            if message["id"] == id {
                return Ok(match message.get_mut("error") {
                    Some(error) => Err(error.take()),
                    None => Ok(message["result"].take()),
                });
            }
            if message.get("method").is_some() && message.get("id").is_none() {
                self.inbox.push_back(message);
            }
            // An answer to another id belongs to a request abandoned with its connection.
        }
    }

    /// A request that must succeed.
    pub(super) async fn call(&mut self, method: &str, params: Value) -> Result<Value, Failure> {
        let shown = brief(&params);
        self.request(method, params)
            .await?
            .map_err(|error| Failure::new(format!("{method} {shown} failed: {error}")))
    }

    /// A request that must fail; returns its error.
    pub(super) async fn call_expecting_error(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<Value, Failure> {
        let shown = brief(&params);
        match self.request(method, params).await? {
            Err(error) => Ok(error),
            Ok(result) => Err(Failure::new(format!(
                "{method} {shown} should have failed, but answered {result}"
            ))),
        }
    }

    /// The first notification (kept or new) that `wanted` accepts; others are kept.
    pub(super) async fn notification(
        &mut self,
        what: &str,
        wanted: impl Fn(&Value) -> bool,
    ) -> Result<Value, Failure> {
        if let Some(at) = self.inbox.iter().position(&wanted) {
            return Ok(self.inbox.remove(at).expect("position is in range"));
        }
        loop {
            let message = self.receive(what).await?;
            if wanted(&message) {
                return Ok(message);
            }
            if message.get("method").is_some() && message.get("id").is_none() {
                self.inbox.push_back(message);
            }
        }
    }

    /// Takes every kept notification that `wanted` accepts, without waiting.
    pub(super) fn take_kept(&mut self, wanted: impl Fn(&Value) -> bool) -> Vec<Value> {
        let (taken, kept): (VecDeque<Value>, VecDeque<Value>) = std::mem::take(&mut self.inbox)
            .into_iter()
            .partition(|message| wanted(message));
        self.inbox = kept;
        taken.into()
    }

    /// Forgets the kept notifications (between operations: late watch events and the like).
    pub(super) fn forget_kept(&mut self) {
        self.inbox.clear();
    }

    /// Drops the connection without a goodbye: a WebSocket's TCP connection just closes,
    /// a relay stream is reset at once. The server detaches the session.
    pub(super) fn disconnect(&mut self) {
        if let Some(Link::Relay(relay)) = &self.link {
            relay.abort();
        }
        self.link = None;
        self.inbox.clear();
    }

    /// Takes the session over from a new connection, retrying while the server has not
    /// yet seen the old one end (-32010). Returns the number of -32010 answers.
    pub(super) async fn resume(&mut self) -> Result<u32, Failure> {
        let deadline = Instant::now() + RESUME_DEADLINE;
        let mut still_attached = 0;
        loop {
            self.link = Some(self.dial.connect().await?);
            let params = json!({"clientName": "soak", "extensions": EXTENSIONS,
                                "resumeSessionId": self.id});
            match self.request("initialize", params).await? {
                Ok(result) if result["sessionId"] == self.id.as_str() => {
                    self.notify("initialized", json!({})).await?;
                    return Ok(still_attached);
                }
                Ok(result) => {
                    return Err(Failure::new(format!(
                        "resuming session {} answered another session: {result}",
                        self.id
                    )))
                }
                Err(error) if error["code"] == -32010 && Instant::now() < deadline => {
                    still_attached += 1;
                    self.link = None;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => {
                    return Err(Failure::new(format!(
                        "resuming session {} failed: {error}",
                        self.id
                    )))
                }
            }
        }
    }

    /// Ends the session (`session/close`): its processes are killed, the connection ends.
    pub(super) async fn close(mut self) -> Result<(), Failure> {
        self.call("session/close", json!({})).await?;
        Ok(())
    }
}

/// `params` for a failure message, cut short (a base64 payload says nothing).
fn brief(params: &Value) -> String {
    let text = params.to_string();
    match text.char_indices().nth(160) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

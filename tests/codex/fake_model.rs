//! A stand-in for the model: an HTTP/1.1 endpoint speaking enough of the OpenAI Responses
//! API (`POST /v1/responses`, streamed as server-sent events) for `codex exec` to run one
//! turn. The first request is answered with one tool call (`exec_command` of a command,
//! or any [`ToolCall`]); once a request carries that call's output, with a final message. Every
//! request body is kept for the test to inspect.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// The call id of the tool call the fake sends.
pub const CALL_ID: &str = "call_exec_1";

/// The final message of the turn.
pub const FINAL_TEXT: &str = "the command ran";

/// Largest request body accepted (codex sends tens of KiB).
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

pub struct FakeModel {
    /// `http://127.0.0.1:PORT/v1`
    pub base_url: String,
    pub requests: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The one tool call the fake asks for: a function name (inside `namespace` for a tool
/// codex offers in a namespace, such as an MCP server's) and its JSON arguments.
#[derive(Debug, Clone)]
pub struct ToolCall {
    pub namespace: Option<String>,
    pub name: String,
    pub arguments: Value,
}

impl FakeModel {
    /// A model that asks for `exec_command` of `command`.
    pub async fn start(command: &str) -> Self {
        let arguments = json!({"cmd": command, "yield_time_ms": 10000});
        Self::start_with(ToolCall {
            namespace: None,
            name: "exec_command".to_owned(),
            arguments,
        })
        .await
    }

    /// A model that asks for `call`.
    pub async fn start_with(call: ToolCall) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let call = Arc::new(call);
        let seen = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let seen = Arc::clone(&seen);
                let command = Arc::clone(&call);
                tokio::spawn(async move {
                    let _ = serve(stream, &seen, &command).await;
                });
            }
        });
        Self {
            base_url,
            requests,
            task,
        }
    }

    /// The request bodies received so far.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

/// The next HTTP/1.1 request of a connection: its request line and its body (by
/// `content-length`); `None` at the end of the connection or past [`MAX_BODY_BYTES`].
pub(super) async fn read_request(
    read: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut request_line = String::new();
    if read.read_line(&mut request_line).await? == 0 {
        return Ok(None);
    }
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        read.read_line(&mut line).await?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    if length > MAX_BODY_BYTES {
        return Ok(None);
    }
    let mut body = vec![0u8; length];
    read.read_exact(&mut body).await?;
    Ok(Some((request_line, body)))
}

/// Serves the requests of one connection (codex keeps connections alive).
async fn serve(
    stream: tokio::net::TcpStream,
    seen: &Mutex<Vec<Value>>,
    command: &ToolCall,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let Some((request_line, body)) = read_request(&mut read).await? else {
            return Ok(());
        };
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let events = if request_line.starts_with("POST ") && request_line.contains("/responses") {
            let answered = carries_call_output(&request);
            seen.lock().unwrap().push(request);
            if answered {
                final_message()
            } else {
                tool_call(command)
            }
        } else {
            let head = "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
            write.write_all(head.as_bytes()).await?;
            continue;
        };
        let body: String = events
            .iter()
            .map(|event| {
                format!(
                    "event: {}\ndata: {event}\n\n",
                    event["type"].as_str().unwrap()
                )
            })
            .collect();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        write.write_all(head.as_bytes()).await?;
        write.write_all(body.as_bytes()).await?;
    }
}

/// Whether `request.input` holds the output of the fake's tool call.
fn carries_call_output(request: &Value) -> bool {
    request["input"].as_array().is_some_and(|items| {
        items
            .iter()
            .any(|item| item["type"] == "function_call_output" && item["call_id"] == CALL_ID)
    })
}

fn completed(id: &str) -> Value {
    json!({"type": "response.completed", "response": {"id": id, "usage": {
        "input_tokens": 1, "input_tokens_details": null, "output_tokens": 1,
        "output_tokens_details": null, "total_tokens": 2}}})
}

fn tool_call(call: &ToolCall) -> Vec<Value> {
    let mut item = json!({"type": "function_call", "id": "fc_1", "call_id": CALL_ID,
        "name": call.name, "arguments": call.arguments.to_string()});
    if let Some(namespace) = &call.namespace {
        item["namespace"] = json!(namespace);
    }
    vec![
        json!({"type": "response.created", "response": {"id": "resp_1"}}),
        json!({"type": "response.output_item.done", "item": item}),
        completed("resp_1"),
    ]
}

fn final_message() -> Vec<Value> {
    vec![
        json!({"type": "response.created", "response": {"id": "resp_2"}}),
        json!({"type": "response.output_item.done", "item": {
            "type": "message", "role": "assistant", "id": "msg_1",
            "content": [{"type": "output_text", "text": FINAL_TEXT}]}}),
        completed("resp_2"),
    ]
}

//! The real codex CLI with an HTTP MCP server that belongs to the executor: the server is in
//! the executor's codex configuration (`mcp_servers.tiny.url`, read by codex through
//! `environmentConfig/read`), so codex reaches it through this server's `http/request`
//! (CODEX-NETWORK.md §1 row 1): it must start, list its tool, and a tool call from the
//! model must reach it, every byte through the executor.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::fake_model::{read_request, FakeModel, ToolCall, FINAL_TEXT};
use super::proxy::RecordingProxy;
use super::{codex_bin, CodexHome};
use crate::util::{server_command, WsServer};

/// A Streamable HTTP MCP server with one tool, `echo`, answering JSON (no SSE); it records
/// every JSON-RPC method it is sent.
struct TinyMcp {
    url: String,
    methods: Arc<Mutex<Vec<String>>>,
    echoed: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TinyMcp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TinyMcp {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let methods = Arc::new(Mutex::new(Vec::new()));
        let echoed = Arc::new(Mutex::new(Vec::new()));
        let (m, e) = (Arc::clone(&methods), Arc::clone(&echoed));
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (m, e) = (Arc::clone(&m), Arc::clone(&e));
                tokio::spawn(async move {
                    let _ = serve_mcp(stream, &m, &e).await;
                });
            }
        });
        Self {
            url,
            methods,
            echoed,
            task,
        }
    }
}

async fn serve_mcp(
    stream: tokio::net::TcpStream,
    methods: &Mutex<Vec<String>>,
    echoed: &Mutex<Vec<Value>>,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let Some((request_line, body)) = read_request(&mut read).await? else {
            return Ok(());
        };
        if !request_line.starts_with("POST /mcp") {
            write
                .write_all(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
                .await?;
            continue;
        }
        let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let method = message["method"].as_str().unwrap_or("").to_owned();
        methods.lock().unwrap().push(method.clone());
        let result = match method.as_str() {
            "initialize" => json!({"protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}}, "serverInfo": {"name": "tiny", "version": "1.0.0"}}),
            "tools/list" => json!({"tools": [{"name": "echo", "description": "Echoes its text.",
                "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                                "required": ["text"]},
                // Read-only and closed-world: codex runs it without asking for approval.
                "annotations": {"readOnlyHint": true, "destructiveHint": false,
                                "openWorldHint": false}}]}),
            "tools/call" => {
                echoed
                    .lock()
                    .unwrap()
                    .push(message["params"]["arguments"].clone());
                let text = message["params"]["arguments"]["text"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned();
                json!({"content": [{"type": "text", "text": format!("echo: {text}")}]})
            }
            _ => Value::Null,
        };
        if message.get("id").is_none() {
            write
                .write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                .await?;
            continue;
        }
        let answer = json!({"jsonrpc": "2.0", "id": message["id"], "result": result}).to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        );
        write.write_all(head.as_bytes()).await?;
        write.write_all(answer.as_bytes()).await?;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_owned_http_mcp_server_works_through_http_request() {
    let Some(codex) = codex_bin("an_executor_owned_http_mcp_server_works_through_http_request")
    else {
        return;
    };
    let mcp = TinyMcp::start().await;
    // The executor's own codex home names the MCP server.
    let executor_home = CodexHome::new();
    let config = format!("[mcp_servers.tiny]\nurl = \"{}\"\n", mcp.url);
    std::fs::write(executor_home.codex_home().join("config.toml"), config).unwrap();
    let mut command = server_command(&["--listen", "ws://127.0.0.1:0"]);
    command
        .env("HOME", executor_home.home())
        .env("CODEX_HOME", executor_home.codex_home());
    let server = WsServer::start_with(command).await;
    let proxy = RecordingProxy::start(&server.url).await;

    let home = CodexHome::new();
    let model = FakeModel::start_with(ToolCall {
        // codex 0.171.0 offers an MCP server's tools in a namespace of its own.
        namespace: Some("mcp__tiny".to_owned()),
        name: "echo".to_owned(),
        arguments: json!({"text": "through the executor"}),
    })
    .await;
    home.use_model(&model.base_url);
    let work = tempfile::tempdir().unwrap();
    let mut cmd = home.exec_turn(&codex, work.path());
    cmd.env("CODEX_EXEC_SERVER_URL", &proxy.url);
    let output = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("codex exec finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let exchanges = proxy.exchanges();
    let methods: Vec<&str> = exchanges.iter().map(|e| e.method.as_str()).collect();
    let mcp_methods = mcp.methods.lock().unwrap().clone();
    let context = format!(
        "stdout:\n{stdout}\nstderr:\n{stderr}\nexecutor methods: {methods:?}\nmcp methods: {mcp_methods:?}"
    );
    assert!(output.status.success(), "codex exec failed\n{context}");
    assert!(stdout.contains(FINAL_TEXT), "{context}");
    // Every MCP message went through the executor's http/request, and none failed.
    let http: Vec<_> = exchanges
        .iter()
        .filter(|e| e.method == "http/request")
        .collect();
    assert!(
        !http.is_empty(),
        "codex never called http/request\n{context}"
    );
    assert!(http.iter().all(|e| e.error.is_none()), "{http:?}");
    for expected in ["initialize", "tools/list", "tools/call"] {
        assert!(
            mcp_methods.iter().any(|m| m == expected),
            "no {expected}\n{context}"
        );
    }
    assert_eq!(
        mcp.echoed.lock().unwrap().clone(),
        [json!({"text": "through the executor"})],
        "{context}"
    );
    // The tool's answer reached the model.
    let answered = model
        .requests()
        .iter()
        .any(|r| r.to_string().contains("echo: through the executor"));
    assert!(answered, "{context}");
}

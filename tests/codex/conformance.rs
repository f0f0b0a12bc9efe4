//! The same protocol checks against `codex exec-server` 0.171.0 and this server, side by
//! side (CODEX-0169 §5.4): the `initialize` members (§2.2, CODEX-0171 §2.1),
//! `environmentConfig/read`'s errors (§2.5), the WebSocket auth answers (§3.4), the wire
//! limits (§2.9) and the `data.kind` of failed `process/start`s (CODEX-0171 §2.2). Where
//! the two must agree the test compares them; the differences that remain are deliberate
//! and listed in docs/PROTOCOL.md ("Differences from codex"), each asserted here as it
//! is, so a change on either side shows up.

use std::process::Stdio;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::Message;

use super::{codex_bin, CodexHome};
use crate::util::{server_command, Client, STEP_TIMEOUT};
use crate::ws_auth::{jwt, now, secret_file, upgrade_answer};

/// One of the two servers under comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Codex,
    Ours,
}

struct Bench {
    codex: std::path::PathBuf,
    home: CodexHome,
}

impl Bench {
    fn new(test: &str) -> Option<Self> {
        Some(Self {
            codex: codex_bin(test)?,
            home: CodexHome::new(),
        })
    }

    fn command(&self, side: Side, args: &[&str]) -> tokio::process::Command {
        let mut cmd = match side {
            Side::Codex => {
                let mut cmd = self.home.command(&self.codex);
                cmd.arg("exec-server");
                cmd
            }
            Side::Ours => {
                let mut cmd = server_command(&[]);
                cmd.env("HOME", self.home.home())
                    .env("CODEX_HOME", self.home.codex_home());
                cmd
            }
        };
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    fn stdio(&self, side: Side) -> Client {
        Client::stdio_with(self.command(side, &["--listen", "stdio"]))
    }

    /// Starts a WebSocket listener; returns the child (kept alive by the caller) and its URL.
    async fn websocket(&self, side: Side, args: &[&str]) -> (tokio::process::Child, String) {
        let mut cmd = self.command(side, &[&["--listen", "ws://127.0.0.1:0"], args].concat());
        let mut child = cmd.spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut line))
            .await
            .expect("the listener announces itself")
            .unwrap();
        let url = line.trim().to_owned();
        assert!(url.starts_with("ws://"), "{side:?}: {line:?}");
        // Keep stdout open for the child's lifetime.
        tokio::spawn(async move {
            let mut rest = String::new();
            while stdout.read_line(&mut rest).await.unwrap_or(0) > 0 {
                rest.clear();
            }
        });
        (child, url)
    }
}

/// The object keys of `value` in wire order (serde_json keeps them sorted, so they are
/// read from the raw text).
fn key_order(raw: &str, value: &Value) -> Vec<String> {
    let mut keys: Vec<(usize, String)> = value
        .as_object()
        .unwrap()
        .keys()
        .map(|k| (raw.find(&format!("\"{k}\":")).unwrap(), k.clone()))
        .collect();
    keys.sort();
    keys.into_iter().map(|(_, k)| k).collect()
}

/// `initialize` over stdio; returns the raw line and the decoded result.
async fn raw_initialize(client: &mut Client) -> (String, Value) {
    client
        .send(json!({"id": 1, "method": "initialize", "params": {"clientName": "conformance"}}))
        .await;
    let answer = client.next_message().await;
    let raw = answer.to_string();
    (raw, answer["result"].clone())
}

#[tokio::test]
async fn initialize_carries_the_same_environment_info_members() {
    let Some(bench) = Bench::new("initialize_carries_the_same_environment_info_members") else {
        return;
    };
    let mut shapes = Vec::new();
    for side in [Side::Codex, Side::Ours] {
        let mut client = bench.stdio(side);
        let (_, result) = raw_initialize(&mut client).await;
        let info = &result["environmentInfo"];
        assert!(result["sessionId"].is_string(), "{side:?}: {result}");
        client
            .send(json!({"method": "initialized", "params": {}}))
            .await;
        let again = client.call("environment/info", json!({})).await;
        assert_eq!(
            &again, info,
            "{side:?}: environment/info equals environmentInfo"
        );
        shapes.push(info.clone());
    }
    let (codex, ours) = (&shapes[0], &shapes[1]);
    let members = |v: &Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    let mut codex_members = members(codex);
    // Deliberate: codex reports its bundled helper directory; we have none, and the
    // member is omitted when empty.
    codex_members.retain(|m| m != "prependPathDirs");
    assert_eq!(codex_members, members(ours));
    assert_eq!(
        members(&codex["capabilities"]),
        members(&ours["capabilities"])
    );
    for same in [
        "shell",
        "cwd",
        "userHomeDir",
        "platformOs",
        "tempDir",
        "temporaryDirectories",
    ] {
        assert_eq!(codex[same], ours[same], "{same}");
    }
    assert_eq!(codex["executorVersion"], super::CODEX_VERSION);
    assert_eq!(ours["executorVersion"], env!("CARGO_PKG_VERSION"));
    for side in [codex, ours] {
        let id = side["providerId"].as_str().unwrap();
        assert!(id.starts_with("sha256:") && id.len() == 71, "{id}");
    }
    // Deliberate: we claim only what we implement.
    let claimed = |v: &Value| -> Vec<String> {
        v["capabilities"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, on)| **on == true)
            .map(|(k, _)| k.clone())
            .collect()
    };
    assert_eq!(claimed(ours), crate::environment::implemented_flags());
    assert_eq!(claimed(codex).len(), 15, "{codex}");
}

#[tokio::test]
async fn member_order_is_the_same_on_the_wire() {
    let Some(bench) = Bench::new("member_order_is_the_same_on_the_wire") else {
        return;
    };
    let mut orders = Vec::new();
    for side in [Side::Codex, Side::Ours] {
        let mut cmd = bench.command(side, &["--listen", "stdio"]);
        let mut child = cmd.spawn().unwrap();
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"{\"id\":1,\"method\":\"initialize\",\"params\":{\"clientName\":\"c\"}}\n")
            .await
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut line))
            .await
            .unwrap()
            .unwrap();
        let value: Value = serde_json::from_str(&line).unwrap();
        let info = &value["result"]["environmentInfo"];
        let mut members = key_order(&line, info);
        members.retain(|m| m != "prependPathDirs");
        let flags = key_order(&line, &info["capabilities"]);
        orders.push((key_order(&line, &value["result"]), members, flags));
    }
    assert_eq!(orders[0], orders[1]);
}

#[tokio::test]
async fn environment_config_read_errors_agree() {
    let Some(bench) = Bench::new("environment_config_read_errors_agree") else {
        return;
    };
    let cases = [
        json!({"cwd": "file:///tmp", "configPaths": [], "requirementsPaths": []}),
        json!({"cwd": "file:///tmp", "configPaths": [["mcp_servers"]], "requirementsPaths": [[]]}),
        json!({"cwd": "file:///tmp", "configPaths": [["mcp_servers"]]}),
        json!({"configPaths": [["mcp_servers"]], "requirementsPaths": []}),
        json!({"cwd": "file:///tmp", "configPaths": [["a"]], "requirementsPaths": []}),
    ];
    let mut answers = Vec::new();
    for side in [Side::Codex, Side::Ours] {
        let mut client = bench.stdio(side);
        client.handshake().await;
        let mut side_answers = Vec::new();
        for params in &cases {
            side_answers.push(
                client
                    .request("environmentConfig/read", params.clone())
                    .await,
            );
        }
        answers.push(side_answers);
    }
    assert_eq!(answers[0], answers[1]);
    // The empty home has no layers: both answer empty stacks with index 0.
    let empty = json!({"layers": [], "cloudInsertionIndex": 0});
    let last = answers[1].last().unwrap().as_ref().unwrap();
    assert_eq!(last["config"], empty);
    assert_eq!(last["requirements"], empty);
}

/// Every §3.4 case, answered alike by both servers.
#[tokio::test]
async fn websocket_auth_answers_agree() {
    let Some(bench) = Bench::new("websocket_auth_answers_agree") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let secret = "0123456789abcdef0123456789abcdef-conformance";
    let secret_path = secret_file(&dir, "jwt", &format!("{secret}\n"));
    let digest: String = {
        use sha2::Digest as _;
        sha2::Sha256::digest(b"cap-tok")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let t = now();
    let claims = |extra: Value| {
        let mut c = json!({"exp": t + 300, "iss": "iss-a", "aud": "aud-a"});
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c
    };
    let bearer = |token: &str| format!("Authorization: Bearer {token}\r\n");
    let modes: [(Vec<&str>, Vec<String>); 2] = [
        (
            vec![
                "--ws-auth",
                "capability-token",
                "--ws-token-sha256",
                &digest,
            ],
            vec![
                String::new(),
                "Authorization: Basic cap-tok\r\n".into(),
                "Authorization: Bearer\r\n".into(),
                bearer("wrong"),
                bearer("cap-tok"),
            ],
        ),
        (
            vec![
                "--ws-auth",
                "signed-bearer-token",
                "--ws-shared-secret-file",
                &secret_path,
                "--ws-issuer",
                "iss-a",
                "--ws-audience",
                "aud-a",
            ],
            vec![
                bearer(&jwt("HS256", &claims(json!({})), secret)),
                bearer(&jwt("HS256", &claims(json!({"exp": t - 20})), secret)),
                bearer(&jwt("HS256", &claims(json!({"exp": t - 120})), secret)),
                bearer(&jwt("HS256", &claims(json!({"exp": null})), secret)),
                bearer(&jwt("HS256", &claims(json!({"nbf": t + 120})), secret)),
                bearer(&jwt("HS256", &claims(json!({"iss": "iss-b"})), secret)),
                bearer(&jwt(
                    "HS256",
                    &claims(json!({"aud": ["x", "aud-a"]})),
                    secret,
                )),
                bearer(&jwt("HS256", &claims(json!({"aud": null})), secret)),
                bearer(&jwt("HS384", &claims(json!({})), secret)),
                bearer("not.a.jwt"),
            ],
        ),
    ];
    for (flags, headers) in modes {
        let mut results = Vec::new();
        for side in [Side::Codex, Side::Ours] {
            let (_child, url) = bench.websocket(side, &flags).await;
            let base = url.replacen("ws://", "http://", 1);
            let mut side_results = Vec::new();
            for header in &headers {
                let (status, _) =
                    crate::util::http_get(&base, "/", &format!("{UPGRADE}{header}")).await;
                let body = if status == 401 {
                    let (_, head, body) = upgrade_answer(&base, "/", header).await;
                    assert!(
                        head.contains("content-type: text/plain; charset=utf-8"),
                        "{side:?} {head}"
                    );
                    body
                } else {
                    String::new()
                };
                side_results.push((status, body));
            }
            // Health probes are never authenticated; Origin wins over auth.
            side_results.push((
                crate::util::http_get(&base, "/readyz", "").await.0,
                String::new(),
            ));
            side_results.push((
                crate::util::http_get(&base, "/", &format!("{UPGRADE}Origin: http://x\r\n"))
                    .await
                    .0,
                String::new(),
            ));
            results.push(side_results);
        }
        assert_eq!(results[0], results[1], "{flags:?}");
    }
}

const UPGRADE: &str = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

/// The start-up error texts of the `--ws-*` flags are codex's (codex prefixes `Error: `
/// and exits 1; we exit 2 like every start-up error, without the prefix).
#[tokio::test]
async fn websocket_auth_startup_errors_agree() {
    let Some(bench) = Bench::new("websocket_auth_startup_errors_agree") else {
        return;
    };
    let cases: [&[&str]; 5] = [
        &["--ws-auth", "capability-token"],
        &["--ws-auth", "signed-bearer-token"],
        &["--ws-token-sha256", "abc"],
        &["--ws-auth", "capability-token", "--ws-token-sha256", "abc"],
        &[
            "--ws-auth",
            "capability-token",
            "--ws-token-sha256",
            &"a".repeat(64),
            "--ws-issuer",
            "x",
        ],
    ];
    for args in cases {
        let mut texts = Vec::new();
        for side in [Side::Codex, Side::Ours] {
            let mut cmd = bench.command(side, &[&["--listen", "ws://127.0.0.1:0"], args].concat());
            cmd.stderr(Stdio::piped());
            let out = tokio::time::timeout(STEP_TIMEOUT, cmd.output())
                .await
                .unwrap()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
            let (code, text) = match side {
                Side::Codex => (
                    1,
                    stderr
                        .lines()
                        .find_map(|l| l.strip_prefix("Error: "))
                        .unwrap_or(&stderr)
                        .to_owned(),
                ),
                Side::Ours => (2, stderr),
            };
            assert_eq!(out.status.code(), Some(code), "{side:?} {args:?}: {text}");
            texts.push(text);
        }
        assert_eq!(texts[0], texts[1], "{args:?}");
    }
}

/// A text message of exactly `len` bytes: an `fs/getMetadata` request (both servers ignore
/// the unknown `pad` member and answer -32004).
fn padded_request(id: i64, len: usize) -> String {
    let head = format!(
        "{{\"id\":{id},\"method\":\"fs/getMetadata\",\"params\":{{\"path\":\"file:///nonexistent-conformance\",\"pad\":\""
    );
    let tail = "\"}}";
    let pad = len - head.len() - tail.len();
    format!("{head}{}{tail}", "x".repeat(pad))
}

/// Sends `text` as one message cut into frames of at most `frame` bytes, then reports
/// whether the server answered it (`true`) or ended the connection (`false`).
async fn answered(url: &str, text: String, frame: usize) -> bool {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    ws.send(Message::Text(
        json!({"id": 1, "method": "initialize", "params": {"clientName": "limits"}})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let _ = ws.next().await;
    ws.send(Message::Text(
        json!({"method": "initialized", "params": {}})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let bytes = text.into_bytes();
    let chunks: Vec<&[u8]> = bytes.chunks(frame).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let opcode = if i == 0 {
            OpCode::Data(Data::Text)
        } else {
            OpCode::Data(Data::Continue)
        };
        let last = i + 1 == chunks.len();
        if ws
            .send(Message::Frame(Frame::message(chunk.to_vec(), opcode, last)))
            .await
            .is_err()
        {
            return false;
        }
    }
    let outcome = tokio::time::timeout(STEP_TIMEOUT, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    assert!(t.contains("\"id\":2"), "{t}");
                    break true;
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break false,
                Some(Ok(_)) => continue,
            }
        }
    })
    .await;
    outcome.expect("the server answers or ends the connection")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_limits_agree() {
    let Some(bench) = Bench::new("wire_limits_agree") else {
        return;
    };
    const MIB: usize = 1024 * 1024;
    let cases = [
        (
            "frame 16 MiB - 200",
            padded_request(2, 16 * MIB - 200),
            16 * MIB,
            true,
        ),
        (
            "frame 16 MiB + 200",
            padded_request(2, 16 * MIB + 200),
            32 * MIB,
            false,
        ),
        (
            "message 64 MiB - 300 in 8 MiB frames",
            padded_request(2, 64 * MIB - 300),
            8 * MIB,
            true,
        ),
        (
            "message 64 MiB + 300 in 8 MiB frames",
            padded_request(2, 64 * MIB + 300),
            8 * MIB,
            false,
        ),
    ];
    for side in [Side::Codex, Side::Ours] {
        let (_child, url) = bench.websocket(side, &[]).await;
        for (name, text, frame, expected) in &cases {
            assert_eq!(
                answered(&url, text.clone(), *frame).await,
                *expected,
                "{side:?}: {name}"
            );
        }
        // Binary messages are accepted and answered in text.
        let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        let init = json!({"id": 1, "method": "initialize", "params": {"clientName": "b"}});
        ws.send(Message::Binary(init.to_string().into_bytes().into()))
            .await
            .unwrap();
        match ws.next().await {
            Some(Ok(Message::Text(text))) => assert!(text.contains("sessionId"), "{side:?}"),
            other => panic!("{side:?}: expected a text answer, got {other:?}"),
        }
    }
}

/// The answers of `stdio` `side` to `requests` (after the handshake), as JSON values.
async fn answers(
    bench: &Bench,
    side: Side,
    requests: &[(&str, Value)],
) -> Vec<Result<Value, Value>> {
    let mut client = bench.stdio(side);
    client.handshake().await;
    let mut out = Vec::new();
    for (method, params) in requests {
        out.push(client.request(method, params.clone()).await);
    }
    out
}

fn write(root: &std::path::Path, relative: &str, text: &str) {
    let path = root.join(relative);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// User and project configuration layers (the system directory is the host's `/etc/codex`
/// for both), selected alike.
#[tokio::test]
async fn environment_config_layers_agree() {
    let Some(bench) = Bench::new("environment_config_layers_agree") else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let repo = std::fs::canonicalize(work.path()).unwrap().join("repo");
    write(&repo, ".git/HEAD", "ref: refs/heads/main\n");
    write(
        &repo,
        ".codex/config.toml",
        "[mcp_servers.repo]\ncommand = \"r\"\nargs = ['x']\n",
    );
    write(
        &repo,
        "a/b/.codex/config.toml",
        "[mcp_servers]\nb = { command = \"b\" }\nmodel = \"m\"\n",
    );
    write(
        &bench.home.codex_home(),
        "config.toml",
        &format!(
            "model = \"x\" # c\n[mcp_servers.home]\ncommand = \"h\"\n[projects.\"{}\"]\ntrust_level = \"trusted\"\n",
            repo.display()
        ),
    );
    let read = |cwd: &std::path::Path, paths: Value| {
        (
            "environmentConfig/read",
            json!({"cwd": format!("file://{}", cwd.display()), "configPaths": paths, "requirementsPaths": [["mcp_servers"]]}),
        )
    };
    let requests = [
        read(&repo.join("a/b"), json!([["mcp_servers"]])),
        read(
            &repo.join("a/b"),
            json!([["model"], ["mcp_servers", "home"]]),
        ),
        read(&repo, json!([["projects"]])),
        read(work.path(), json!([["mcp_servers"]])),
    ];
    let codex = answers(&bench, Side::Codex, &requests).await;
    let ours = answers(&bench, Side::Ours, &requests).await;
    assert_eq!(codex, ours);
    let layers = codex[0].as_ref().unwrap()["config"]["layers"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(layers, 3, "{codex:?}");
}

/// V1 roots and V2 installed plugins and skills, answered byte for byte alike.
#[tokio::test]
async fn discovery_answers_agree() {
    let Some(bench) = Bench::new("discovery_answers_agree") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let skill = |name: &str| format!("---\nname: {name}\ndescription: about {name}\n---\nbody\n");
    write(
        &root,
        "plug/.codex-plugin/plugin.json",
        "{\"name\": \"plug\"}\n",
    );
    write(&root, "plug/.mcp.json", "{\"mcpServers\": {}}\n");
    write(&root, "plug/.app.json", "{}\n");
    write(&root, "plug/skills/a/SKILL.md", &skill("a"));
    write(&root, "plug/skills/a/agents/openai.yaml", "interface: {}\n");
    write(&root, "plug/.hidden/b/SKILL.md", "no front matter\n");
    write(&root, "plug/deep/er/c/SKILL.md", &skill("c"));
    write(&root, "plug/nested/.cursor-plugin/plugin.json", "{}\n");
    write(&root, "bare/x.txt", "x\n");
    write(&root, "file", "x\n");
    let codex_home = bench.home.codex_home();
    let cache = "plugins/cache/market/tool";
    write(
        &codex_home,
        &format!("{cache}/1.2.0/.codex-plugin/plugin.json"),
        "{\"name\":\"tool\",\"version\":\"1.2.0\"}\n",
    );
    write(
        &codex_home,
        &format!("{cache}/1.10.0/.codex-plugin/plugin.json"),
        "{\"name\":\"tool\",\"version\":\"1.10.0\"}\n",
    );
    write(
        &codex_home,
        &format!("{cache}/1.10.0/skills/t/SKILL.md"),
        &skill("t"),
    );
    write(&codex_home, "skills/s1/SKILL.md", "---\nname: s1\ndescription: >-\n  folded\n  line\nmetadata:\n  short-description: short\n---\n");
    write(
        &codex_home,
        "skills/nameless/SKILL.md",
        "---\ndescription: 'quoted'\n---\n",
    );
    write(&codex_home, "skills/broken/SKILL.md", "nothing\n");
    write(&bench.home.home(), ".agents/skills/u/SKILL.md", &skill("u"));
    let uri = |relative: &str| format!("file://{}", root.join(relative).display());
    let requests = [
        (
            "capabilityRoots/discoverV1",
            json!({"roots": [
                {"id": "plug", "path": uri("plug"), "sandbox": null},
                {"id": "bare", "path": uri("bare")},
                {"id": "file", "path": uri("file")},
                {"id": "missing", "path": uri("missing")},
            ]}),
        ),
        ("capabilityRoots/discoverV1", json!({"roots": []})),
        (
            "capabilities/discoverV2",
            json!({"cwd": uri("bare"), "sandbox": null}),
        ),
    ];
    let codex = answers(&bench, Side::Codex, &requests).await;
    let ours = answers(&bench, Side::Ours, &requests).await;
    assert_eq!(codex, ours);
    let v2 = codex[2].as_ref().unwrap();
    assert_eq!(v2["plugins"][0]["version"], "1.10.0", "{v2}");
    assert_eq!(v2["skills"].as_array().unwrap().len(), 3, "{v2}");
}

/// One `process/start` failure as both servers answer it: the same code and `data` (the
/// kind), and each side's message. `codex` and `ours` are `None` where that side starts the
/// process instead (a deliberate difference, docs/PROTOCOL.md).
struct StartRow {
    name: &'static str,
    params: Value,
    codex: Option<(i64, Option<&'static str>, String)>,
    ours: Option<(i64, Option<&'static str>, String)>,
}

/// The rows of CODEX-0171 §2.2 that codex 0.171.0 can run on this host, against both
/// servers. Codes and kinds agree; our spawn messages keep their `failed to spawn process: `
/// prefix and our sandbox path messages their own wording (PROTOCOL §4.2.3, SANDBOX.md
/// §2.7), as before 0.171.0.
#[tokio::test]
async fn process_start_error_kinds_agree() {
    let Some(bench) = Bench::new("process_start_error_kinds_agree") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let file = |name: &str, text: &str, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        let path = root.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let not_executable = file("not-executable", "#!/bin/sh\n", 0o644);
    let not_a_program = file("not-a-program", "garbage\n", 0o755);
    let no_interpreter = file("no-interpreter", "#!/nonexistent/interpreter\n", 0o755);
    // codex requires `windowsSandboxLevel`; we accept it.
    let sandbox = |extra: Value| {
        let mut sandbox = json!({"windowsSandboxLevel": "disabled", "permissions": {
            "type": "managed", "network": "restricted", "file_system": {"type": "restricted",
            "entries": [{"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}]}}});
        for (key, value) in extra.as_object().unwrap() {
            sandbox[key] = value.clone();
        }
        sandbox
    };
    let permission = |path: &str| {
        let mut s = sandbox(json!({}));
        s["permissions"]["file_system"]["entries"]
            .as_array_mut()
            .unwrap()
            .push(json!({"path": {"type": "path", "path": path}, "access": "read"}));
        s
    };
    let spawn = |kind: &'static str, os: &str| {
        (
            Some((-32603, Some(kind), os.to_owned())),
            Some((-32603, Some(kind), format!("failed to spawn process: {os}"))),
        )
    };
    let prepare = |codex: String, ours: String| {
        (
            Some((-32602, Some("sandboxPreparation"), codex)),
            Some((-32602, Some("sandboxPreparation"), ours)),
        )
    };
    let enoent = "No such file or directory (os error 2)";
    let foreign = |uri: &str| format!("'{uri}' is invalid on 'linux'");
    let remote = "invalid path `file://otherhost/x`: file URI host `otherhost` is not supported; only an empty host or localhost";
    let mut rows = vec![
        (
            "argv[0] missing",
            json!({"argv": ["/nonexistent/program"]}),
            spawn("spawnNotFound", enoent),
        ),
        (
            "argv[0] not in PATH",
            json!({"argv": ["no-such-program-xyz"]}),
            spawn("spawnNotFound", enoent),
        ),
        (
            "argv[0] missing, tty",
            json!({"argv": ["/nonexistent/program"], "tty": true}),
            spawn("spawnNotFound", enoent),
        ),
        (
            "argv[0] missing, pipeStdin",
            json!({"argv": ["/nonexistent/program"], "pipeStdin": true}),
            spawn("spawnNotFound", enoent),
        ),
        (
            "cwd missing",
            json!({"cwd": "file:///nonexistent-directory-xyz"}),
            spawn("spawnNotFound", enoent),
        ),
        (
            "#! interpreter missing",
            json!({"argv": [no_interpreter]}),
            spawn("spawnNotFound", enoent),
        ),
        (
            "mode 0644",
            json!({"argv": [not_executable]}),
            spawn("spawnPermissionDenied", "Permission denied (os error 13)"),
        ),
        (
            "a directory",
            json!({"argv": ["/tmp"]}),
            spawn("spawnPermissionDenied", "Permission denied (os error 13)"),
        ),
        (
            "cwd a file",
            json!({"cwd": format!("file://{not_a_program}")}),
            spawn("spawnFailed", "Not a directory (os error 20)"),
        ),
        (
            "not a program",
            json!({"argv": [not_a_program]}),
            spawn("spawnFailed", "Exec format error (os error 8)"),
        ),
        (
            "NUL in an argument",
            json!({"argv": ["/bin/echo", "a\u{0}b"]}),
            (
                Some((
                    -32603,
                    Some("spawnFailed"),
                    "nul byte found in provided data".to_owned(),
                )),
                Some((
                    -32603,
                    Some("spawnFailed"),
                    "failed to spawn process: argument, environment or path contains a NUL byte"
                        .to_owned(),
                )),
            ),
        ),
        (
            "permission path C:",
            json!({"sandbox": permission("file:///C:/x")}),
            prepare(
                format!(
                    "failed to prepare process sandbox: invalid sandbox permission path: {}",
                    foreign("file:///C:/x")
                ),
                format!(
                    "invalid sandbox permission path URI: {}",
                    foreign("file:///C:/x")
                ),
            ),
        ),
        (
            "permission path on another host",
            json!({"sandbox": permission("file://otherhost/x")}),
            prepare(
                format!(
                    "failed to prepare process sandbox: invalid sandbox permission path: {}",
                    foreign("file://otherhost/x")
                ),
                remote.to_owned(),
            ),
        ),
        (
            "sandbox cwd C:",
            json!({"sandbox": sandbox(json!({"cwd": "file:///C:/x"}))}),
            prepare(
                format!(
                    "failed to prepare process sandbox: invalid sandbox policy cwd: {}",
                    foreign("file:///C:/x")
                ),
                format!(
                    "invalid sandbox permission path URI: {}",
                    foreign("file:///C:/x")
                ),
            ),
        ),
        (
            "sandbox cwd on another host",
            json!({"sandbox": sandbox(json!({"cwd": "file://otherhost/x"}))}),
            prepare(
                format!(
                    "failed to prepare process sandbox: invalid sandbox policy cwd: {}",
                    foreign("file://otherhost/x")
                ),
                remote.to_owned(),
            ),
        ),
        (
            "workspace root C:",
            json!({"sandbox": sandbox(json!({"workspaceRoots": ["file:///C:/x"]}))}),
            prepare(
                format!(
                    "failed to prepare process sandbox: invalid sandbox workspace root: {}",
                    foreign("file:///C:/x")
                ),
                format!(
                    "file system sandbox workspace root is not native to this exec-server host: {}",
                    foreign("file:///C:/x")
                ),
            ),
        ),
        (
            "argv empty (no kind)",
            json!({"argv": []}),
            (
                Some((-32602, None, "argv must not be empty".to_owned())),
                Some((-32602, None, "argv must not be empty".to_owned())),
            ),
        ),
        (
            "process cwd C: (no kind)",
            json!({"cwd": "file:///C:/x"}),
            (
                Some((
                    -32602,
                    None,
                    format!(
                        "cwd URI `file:///C:/x` is not valid on this exec-server host: {}",
                        foreign("file:///C:/x")
                    ),
                )),
                Some((
                    -32602,
                    None,
                    format!(
                        "cwd URI `file:///C:/x` is not valid on this exec-server host: {}",
                        foreign("file:///C:/x")
                    ),
                )),
            ),
        ),
    ];
    // Rows that start a sandboxed process on our side need Landlock.
    if crate::sandbox::landlock_available() {
        rows.extend([
            (
                "cwd missing, sandboxed",
                json!({"cwd": "file:///nonexistent-directory-xyz", "sandbox": sandbox(json!({}))}),
                spawn("spawnNotFound", enoent),
            ),
            (
                "windowsSandboxLevel mxc",
                json!({"sandbox": sandbox(json!({"windowsSandboxLevel": "mxc"}))}),
                (
                    Some((
                        -32602,
                        Some("sandboxUnavailable"),
                        "native MXC is unavailable on this executor".to_owned(),
                    )),
                    // Deliberate: the Windows members have no effect on Linux (SANDBOX.md §2.3).
                    None,
                ),
            ),
            (
                "argv[0] missing, sandboxed",
                json!({"argv": ["/nonexistent/program"], "sandbox": sandbox(json!({}))}),
                (
                    // codex starts the sandbox and the program fails inside it.
                    None,
                    Some((
                        -32603,
                        Some("spawnNotFound"),
                        format!("failed to spawn process: {enoent}"),
                    )),
                ),
            ),
        ]);
    }
    let rows: Vec<StartRow> = rows
        .into_iter()
        .map(|(name, params, (codex, ours))| StartRow {
            name,
            params,
            codex,
            ours,
        })
        .collect();
    let requests: Vec<(&str, Value)> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let mut params = json!({"processId": format!("p{i}"), "argv": ["/bin/true"],
                "cwd": "file:///tmp", "env": {"PATH": "/usr/bin:/bin"}, "tty": false});
            for (key, value) in row.params.as_object().unwrap() {
                params[key] = value.clone();
            }
            ("process/start", params)
        })
        .collect();
    for side in [Side::Codex, Side::Ours] {
        let got = answers(&bench, side, &requests).await;
        for (row, answer) in rows.iter().zip(got) {
            let expected = match side {
                Side::Codex => &row.codex,
                Side::Ours => &row.ours,
            };
            match (expected, answer) {
                (None, Ok(result)) => assert_eq!(
                    result["sandboxType"], "linuxSeccomp",
                    "{side:?} {}",
                    row.name
                ),
                (Some((code, kind, message)), Err(error)) => {
                    let data = kind.map(|kind| json!({"kind": kind}));
                    assert_eq!(
                        (&error["code"], error.get("data"), &error["message"]),
                        (&json!(code), data.as_ref(), &json!(message)),
                        "{side:?} {}: {error}",
                        row.name
                    );
                }
                (expected, answer) => panic!(
                    "{side:?} {}: expected {:?}, got {answer:?}",
                    row.name,
                    expected.as_ref().map(|e| &e.2)
                ),
            }
        }
    }
}

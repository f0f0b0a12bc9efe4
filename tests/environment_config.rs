//! `environmentConfig/read` end to end (CODEX-0169 §2.5): the layers of a codex
//! configuration laid out in temporary directories, read through the real server over
//! stdio and WebSocket, with codex 0.169.0's sources, order and error texts.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::util::{assert_error, server_command, Client, WsServer};

/// A host layout: `home/.codex`, a system directory, and a git repository with project
/// layers, all under one temporary directory.
struct Layout {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Layout {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        for sub in [
            "home/.codex",
            "etc",
            "repo/.git",
            "repo/.codex",
            "repo/sub/.codex",
        ] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        std::fs::write(root.join("repo/.git/HEAD"), "ref: refs/heads/main\n").unwrap();
        let layout = Self { _dir: dir, root };
        layout.write(
            "home/.codex/config.toml",
            &format!(
                "model = \"x\"\n# comment\n[mcp_servers.home]\ncommand = \"h\"   # c\nargs = [\"a\", 'b']\n\n[projects.\"{}\"]\ntrust_level = \"trusted\"\n",
                layout.path("repo").display()
            ),
        );
        layout.write("etc/config.toml", "[mcp_servers.sys]\ncommand = \"s\"\n");
        layout.write(
            "etc/requirements.toml",
            "[mcp_servers.req]\nidentity = { command = \"q\" }\n",
        );
        layout.write(
            "etc/managed_config.toml",
            "[mcp_servers.managed]\ncommand = \"m\"\n",
        );
        layout.write(
            "repo/.codex/config.toml",
            "[mcp_servers.repo]\ncommand = \"r\"\n",
        );
        layout.write("repo/sub/.codex/config.toml", "model = \"sub\"\n");
        layout
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    fn uri(&self, relative: &str) -> String {
        format!("file://{}", self.path(relative).display())
    }

    fn write(&self, relative: &str, text: &str) {
        std::fs::write(self.path(relative), text).unwrap();
    }

    /// The server's command with this layout's home and system directory.
    fn command(&self, listen: &str) -> tokio::process::Command {
        let mut cmd = server_command(&["--listen", listen]);
        cmd.env("HOME", self.path("home"))
            .env_remove("CODEX_HOME")
            .env(
                "EXEC_SERVER_ENVIRONMENT__CODEX_SYSTEM_DIR",
                self.path("etc"),
            );
        cmd
    }
}

fn params(cwd: &str, config: Value, requirements: Value) -> Value {
    json!({"cwd": cwd, "configPaths": config, "requirementsPaths": requirements})
}

fn layer(source: String, base: &Path, toml: &str) -> Value {
    json!({"source": source, "baseDir": format!("file://{}", base.display()), "toml": toml})
}

async fn check_layers(mut client: Client, layout: &Layout) {
    client.handshake().await;
    let info = client.call("environment/info", json!({})).await;
    assert_eq!(
        info["capabilities"]["environmentConfigRead"], true,
        "{info}"
    );

    let result = client
        .call(
            "environmentConfig/read",
            params(
                &layout.uri("repo/sub"),
                json!([["mcp_servers"]]),
                json!([["mcp_servers"]]),
            ),
        )
        .await;
    let etc = layout.path("etc");
    let home = layout.path("home/.codex");
    assert_eq!(result["userHomeDir"], layout.uri("home"));
    assert_eq!(result["codexHomeDir"], layout.uri("home/.codex"));
    assert!(result["hostname"].is_string(), "{result}");
    assert_eq!(
        result["config"],
        json!({
            "layers": [
                layer(format!("system ({}/config.toml)", etc.display()), &etc, "[mcp_servers.sys]\ncommand = \"s\"\n"),
                layer(format!("user ({}/config.toml)", home.display()), &home, "[mcp_servers.home]\ncommand = \"h\"\nargs = [\"a\", \"b\"]\n"),
                layer(
                    format!("project ({}/config.toml)", layout.path("repo/.codex").display()),
                    &layout.path("repo/.codex"),
                    "[mcp_servers.repo]\ncommand = \"r\"\n"
                ),
                layer(
                    format!("legacy managed_config.toml ({}/managed_config.toml)", etc.display()),
                    &etc,
                    "[mcp_servers.managed]\ncommand = \"m\"\n"
                ),
            ],
            "cloudInsertionIndex": 1
        })
    );
    assert_eq!(
        result["requirements"],
        json!({
            "layers": [layer(
                format!("{}/requirements.toml", etc.display()),
                &etc,
                "[mcp_servers.req.identity]\ncommand = \"q\"\n"
            )],
            "cloudInsertionIndex": 1
        })
    );

    // Only layers with a selected key are listed; the system layer has no `model`, so
    // cloud layers go first.
    let result = client
        .call(
            "environmentConfig/read",
            params(&layout.uri("repo/sub"), json!([["model"]]), json!([])),
        )
        .await;
    let config = &result["config"];
    assert_eq!(config["cloudInsertionIndex"], 0, "{result}");
    let tomls: Vec<&str> = config["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["toml"].as_str().unwrap())
        .collect();
    assert_eq!(tomls, ["model = \"x\"\n", "model = \"sub\"\n"]);

    // Outside the trusted repository there are no project layers.
    let result = client
        .call(
            "environmentConfig/read",
            params(&layout.uri("home"), json!([["model"]]), json!([])),
        )
        .await;
    assert_eq!(result["config"]["layers"].as_array().unwrap().len(), 1);

    for (bad, message) in [
        (
            params(&layout.uri("repo"), json!([]), json!([])),
            "at least one config or requirements path is required",
        ),
        (
            params(&layout.uri("repo"), json!([["mcp_servers"]]), json!([[]])),
            "TOML paths must contain at least one key segment",
        ),
    ] {
        let error = client.call_err("environmentConfig/read", bad).await;
        assert_error(&error, -32602, message);
    }
    let error = client
        .call_err(
            "environmentConfig/read",
            json!({"cwd": layout.uri("repo"), "configPaths": [["a"]]}),
        )
        .await;
    assert_error(&error, -32602, "missing field `requirementsPaths`");
}

#[tokio::test]
async fn layers_over_stdio() {
    let layout = Layout::new();
    let client = Client::stdio_with(layout.command("stdio"));
    check_layers(client, &layout).await;
}

#[tokio::test]
async fn layers_over_websocket() {
    let layout = Layout::new();
    let server = WsServer::start_with(layout.command("ws://127.0.0.1:0")).await;
    let client = server.connect().await;
    check_layers(client, &layout).await;
}

#[tokio::test]
async fn broken_layers_fail_with_codex_texts() {
    let layout = Layout::new();
    let mut client = Client::stdio_with(layout.command("stdio"));
    client.handshake().await;
    let read = params(&layout.uri("repo"), json!([["model"]]), json!([["x"]]));

    let cases = [
        (
            "etc/config.toml",
            "zeta = \n",
            format!(
                "failed to load executor-local config: {}:1:8: string values must be quoted, expected literal string",
                layout.path("etc/config.toml").display()
            ),
        ),
        (
            "repo/.codex/config.toml",
            "[[[",
            format!(
                "failed to load executor-local config: Error parsing project config file {}: TOML parse error at line 1, column 3\n  |\n1 | [[[\n  |   ^\nunquoted keys cannot be empty, expected letters, numbers, `-`, `_`\n",
                layout.path("repo/.codex/config.toml").display()
            ),
        ),
        (
            "etc/requirements.toml",
            "x = \n",
            format!(
                "failed to load executor-local config: failed to parse requirements layer {}: TOML parse error at line 1, column 5\n  |\n1 | x = \n  |     ^\nstring values must be quoted, expected literal string\n",
                layout.path("etc/requirements.toml").display()
            ),
        ),
    ];
    for (file, broken, message) in cases {
        let good = std::fs::read_to_string(layout.path(file)).unwrap();
        layout.write(file, broken);
        let error = client
            .call_err("environmentConfig/read", read.clone())
            .await;
        assert_error(&error, -32603, &message);
        layout.write(file, &good);
    }

    // A layer that is a directory, and one above the size limit.
    let user = layout.path("home/.codex/config.toml");
    let saved = std::fs::read_to_string(&user).unwrap();
    std::fs::remove_file(&user).unwrap();
    std::fs::create_dir(&user).unwrap();
    let error = client
        .call_err("environmentConfig/read", read.clone())
        .await;
    assert_error(
        &error,
        -32603,
        &format!(
            "failed to load executor-local config: Failed to read config file {0}: path `{0}` is not a file",
            user.display()
        ),
    );
    std::fs::remove_dir(&user).unwrap();
    std::fs::write(&user, saved).unwrap();
    // A FIFO in a project directory (which others may write) is refused, never waited on.
    let fifo = layout.path("repo/.codex/config.toml");
    std::fs::remove_file(&fifo).unwrap();
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path, which outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let error = client
        .call_err("environmentConfig/read", read.clone())
        .await;
    assert_error(
        &error,
        -32603,
        &format!(
            "failed to load executor-local config: Failed to read project config file {0}: path `{0}` is not a file",
            fifo.display()
        ),
    );
    std::fs::remove_file(&fifo).unwrap();
    let result = client.call("environmentConfig/read", read.clone()).await;
    assert_eq!(result["config"]["layers"][0]["toml"], "model = \"x\"\n");
}

#[tokio::test]
async fn size_limit_and_codex_home() {
    let layout = Layout::new();
    layout.write(
        "etc/config.toml",
        &format!("pad = \"{}\"\n", "x".repeat(200)),
    );
    let mut cmd = layout.command("stdio");
    cmd.env("EXEC_SERVER_ENVIRONMENT__CONFIG_MAX_FILE_BYTES", "100");
    let mut client = Client::stdio_with(cmd);
    client.handshake().await;
    let read = params(&layout.uri("repo"), json!([["model"]]), json!([]));
    let error = client
        .call_err("environmentConfig/read", read.clone())
        .await;
    assert_error(
        &error,
        -32603,
        &format!(
            "failed to load executor-local config: Failed to read config file {}: file is larger than the limit of 100 bytes (environment.config_max_file_bytes)",
            layout.path("etc/config.toml").display()
        ),
    );

    // CODEX_HOME wins over ~/.codex and must exist.
    let mut cmd = layout.command("stdio");
    cmd.env("CODEX_HOME", layout.path("repo/.codex"));
    let mut client = Client::stdio_with(cmd);
    client.handshake().await;
    let result = client
        .call(
            "environmentConfig/read",
            params(&layout.uri("home"), json!([["mcp_servers"]]), json!([])),
        )
        .await;
    assert_eq!(result["codexHomeDir"], layout.uri("repo/.codex"));
    assert_eq!(
        result["config"]["layers"][0]["source"],
        format!(
            "user ({}/config.toml)",
            layout.path("repo/.codex").display()
        )
    );
    let missing = layout.path("nowhere");
    let mut cmd = layout.command("stdio");
    cmd.env("CODEX_HOME", &missing);
    let mut client = Client::stdio_with(cmd);
    client.handshake().await;
    let error = client.call_err("environmentConfig/read", read).await;
    assert_error(
        &error,
        -32603,
        &format!(
            "failed to find Codex home: CODEX_HOME points to \"{}\", but that path does not exist",
            missing.display()
        ),
    );
}

/// An operator switch turns the method and its capability flag off together.
#[tokio::test]
async fn switched_off_read_clears_its_flag() {
    let file = crate::util::config_file("[methods]\ndisabled = [\"environmentConfig/read\"]\n");
    let mut client = Client::stdio(&["--config", file.to_str().unwrap()]).await;
    let initialize = client
        .call("initialize", json!({"clientName": "tests"}))
        .await;
    assert_eq!(
        initialize["environmentInfo"]["capabilities"]["environmentConfigRead"],
        false
    );
    client
        .send(json!({"method": "initialized", "params": {}}))
        .await;
    let error = client
        .call_err(
            "environmentConfig/read",
            params("file:///", json!([["a"]]), json!([])),
        )
        .await;
    assert_error(
        &error,
        -32601,
        "method `environmentConfig/read` is disabled on this server",
    );
}

/// A `cwd` deep in a trusted repository whose every level has a project layer (here one
/// layer reached through many links) is read within `environment.config_max_total_bytes`:
/// past it the request fails, instead of reading and parsing the same megabytes again for
/// every level (the attack pass's 2,000 levels took 5.8 GB).
#[tokio::test]
async fn layers_are_read_within_a_total_budget() {
    let layout = Layout::new();
    let big = format!("a = [{}0]\n", "0,".repeat(200_000));
    layout.write("repo/.codex/config.toml", &big);
    let mut deep = layout.path("repo");
    for _ in 0..8 {
        deep.push("l");
        std::fs::create_dir_all(&deep).unwrap();
        std::os::unix::fs::symlink(layout.path("repo/.codex"), deep.join(".codex")).unwrap();
    }
    let mut command = layout.command("stdio");
    command.env("EXEC_SERVER_ENVIRONMENT__CONFIG_MAX_TOTAL_BYTES", "2000000");
    let mut client = Client::stdio_with(command);
    client.handshake().await;
    let cwd = format!("file://{}", deep.display());
    let error = client
        .call_err(
            "environmentConfig/read",
            params(&cwd, json!([["a"]]), json!([])),
        )
        .await;
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("(environment.config_max_total_bytes)"),
        "{error}"
    );
    // Within the budget the same layers are read as before.
    let shallow = layout.uri("repo/l");
    let result = client
        .call(
            "environmentConfig/read",
            params(&shallow, json!([["a"]]), json!([])),
        )
        .await;
    assert_eq!(
        result["config"]["layers"].as_array().unwrap().len(),
        2,
        "{result}"
    );
}

/// Many requested paths against a layer of many keys are matched by key, not each path
/// against each key: 50,000 × 50,000 kept both of the method's threads busy for minutes
/// (the attack pass's 130,000 paths against 600,000 keys, half an hour), starving every
/// other session's reads.
#[tokio::test]
async fn many_paths_against_many_keys_are_answered() {
    let layout = Layout::new();
    let keys: String = (0..50_000).map(|i| format!("k{i} = 1\n")).collect();
    layout.write("repo/.codex/config.toml", &keys);
    let mut client = Client::stdio_with(layout.command("stdio"));
    client.handshake().await;
    let mut paths: Vec<Value> = (0..50_000).map(|i| json!([format!("z{i}")])).collect();
    paths.push(json!(["k7"]));
    let result = client
        .call(
            "environmentConfig/read",
            params(&layout.uri("repo"), json!(paths), json!([])),
        )
        .await;
    let layers = result["config"]["layers"].as_array().unwrap();
    let repo = layers.iter().find(|l| l["toml"] == "k7 = 1\n");
    assert!(repo.is_some(), "{result}");
}

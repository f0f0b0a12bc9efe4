//! Capability discovery end to end (CODEX-0169 §2.6, §2.7): plugin and skill layouts on
//! disk, discovered through the real server over stdio and WebSocket, with per-root errors,
//! limits, and each root's sandbox enforced by the fs helper.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::sandbox::{entry, landlock_available, managed};
use crate::util::{assert_error, config_file, server_command, Client, WsServer};

struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Tree {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        Self { _dir: dir, root }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    fn uri(&self, relative: &str) -> String {
        format!("file://{}", self.path(relative).display())
    }

    fn write(&self, relative: &str, text: &str) {
        let path = self.path(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn file(&self, relative: &str) -> Value {
        json!({"path": self.uri(relative), "contents": std::fs::read_to_string(self.path(relative)).unwrap()})
    }
}

fn skill(name: &str, description: &str) -> String {
    format!("---\nname: {name}\ndescription: {description}\n---\nbody of {name}\n")
}

/// A plugin root with skills, metadata, a nested plugin and a symlinked directory.
fn plugin_root(tree: &Tree) {
    tree.write(
        "root/.codex-plugin/plugin.json",
        "{\"name\": \"plug\", \"version\": \"1.2.3\"}\n",
    );
    tree.write("root/.mcp.json", "{\"mcpServers\": {}}\n");
    tree.write("root/skills/alpha/SKILL.md", &skill("alpha", "first"));
    tree.write("root/skills/alpha/agents/openai.yaml", "interface: {}\n");
    tree.write("root/skills/beta/SKILL.md", &skill("beta", "second"));
    tree.write("root/.hidden/x/SKILL.md", "no front matter\n");
    tree.write(
        "root/nested/.claude-plugin/plugin.json",
        "{\"name\": \"inner\"}\n",
    );
    std::os::unix::fs::symlink(
        tree.path("root/skills/beta"),
        tree.path("root/skills/linked"),
    )
    .unwrap();
    tree.write("file-root", "not a directory\n");
}

async fn check_roots(mut client: Client, tree: &Tree) {
    client.handshake().await;
    let info = client.call("environment/info", json!({})).await;
    assert_eq!(info["capabilities"]["capabilityDiscoverySandbox"], true);
    assert_eq!(info["capabilities"]["capabilityDiscoveryV2"], true);
    let result = client
        .call(
            "capabilityRoots/discoverV1",
            json!({"roots": [
                {"id": "a", "path": tree.uri("root"), "sandbox": null},
                {"id": "b", "path": tree.uri("missing")},
                {"id": "c", "path": tree.uri("file-root")},
                {"id": "d", "path": tree.uri("root/skills")},
            ]}),
        )
        .await;
    let roots = result["roots"].as_array().unwrap();
    assert_eq!(
        roots[0],
        json!({
            "id": "a",
            "path": tree.uri("root"),
            "plugin": {
                "manifest": tree.file("root/.codex-plugin/plugin.json"),
                "mcpConfig": tree.file("root/.mcp.json"),
                "appsConfig": null,
            },
            "skills": [
                {"instructions": tree.file("root/.hidden/x/SKILL.md"), "metadata": null},
                {"instructions": tree.file("root/skills/alpha/SKILL.md"), "metadata": tree.file("root/skills/alpha/agents/openai.yaml")},
                {"instructions": tree.file("root/skills/beta/SKILL.md"), "metadata": null},
            ],
            "namespaceManifests": [
                tree.file("root/.codex-plugin/plugin.json"),
                tree.file("root/nested/.claude-plugin/plugin.json"),
            ],
            "warnings": [],
            "error": null,
        })
    );
    // Root-local failures do not fail the siblings.
    assert_eq!(
        roots[1]["error"],
        format!(
            "failed to inspect capability root {}: No such file or directory (os error 2)",
            tree.uri("missing")
        )
    );
    assert_eq!(
        roots[2]["error"],
        format!(
            "capability root {} is not a directory",
            tree.uri("file-root")
        )
    );
    assert_eq!(roots[3]["plugin"], Value::Null);
    assert_eq!(roots[3]["skills"].as_array().unwrap().len(), 2);

    assert_eq!(
        client
            .call("capabilityRoots/discoverV1", json!({"roots": []}))
            .await,
        json!({"roots": []})
    );
    let error = client
        .call_err(
            "capabilityRoots/discoverV1",
            json!({"roots": ["file:///x"]}),
        )
        .await;
    assert_error(
        &error,
        -32602,
        "invalid type: string \"file:///x\", expected struct WireCapabilityRootDiscoverRequest",
    );
    let error = client
        .call_err(
            "capabilityRoots/discoverV1",
            json!({"roots": [{"path": "file:///x"}]}),
        )
        .await;
    assert_error(&error, -32602, "missing field `id`");
}

#[tokio::test]
async fn roots_over_stdio() {
    let tree = Tree::new();
    plugin_root(&tree);
    check_roots(Client::stdio(&[]).await, &tree).await;
}

#[tokio::test]
async fn roots_over_websocket() {
    let tree = Tree::new();
    plugin_root(&tree);
    let server = WsServer::start(&[]).await;
    check_roots(server.connect().await, &tree).await;
}

#[tokio::test]
async fn size_limits_leave_files_out_with_a_warning() {
    let tree = Tree::new();
    plugin_root(&tree);
    tree.write("root/skills/big/SKILL.md", &"x".repeat(300));
    let config = config_file("[capabilities]\nmax_file_bytes = 200\nmax_roots = 2\n");
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    client.handshake().await;
    let result = client
        .call(
            "capabilityRoots/discoverV1",
            json!({"roots": [{"id": "a", "path": tree.uri("root")}]}),
        )
        .await;
    let root = &result["roots"][0];
    assert_eq!(
        root["warnings"],
        json!(["capability discovery size limit reached"])
    );
    let paths: Vec<&str> = root["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["instructions"]["path"].as_str().unwrap())
        .collect();
    assert!(!paths.iter().any(|p| p.contains("/big/")), "{paths:?}");
    let three = json!({"roots": [{"id": "1", "path": "/"}, {"id": "2", "path": "/"}, {"id": "3", "path": "/"}]});
    let error = client.call_err("capabilityRoots/discoverV1", three).await;
    assert_error(
        &error,
        -32602,
        "at most 2 capability roots may be discovered per request",
    );
}

/// `capabilities.max_total_bytes` is the budget of the whole answer, not of each root: a
/// request naming the same large tree many times gets no more than the budget (the old
/// code read the budget again for every root).
#[tokio::test]
async fn the_size_budget_covers_every_root_of_a_request() {
    let tree = Tree::new();
    for i in 0..3 {
        tree.write(&format!("root/skills/s{i}/SKILL.md"), &"y".repeat(600_000));
    }
    let config = config_file("[capabilities]\nmax_total_bytes = 1048576\n");
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    client.handshake().await;
    let roots: Vec<Value> = (0..8)
        .map(|i| json!({"id": i.to_string(), "path": tree.uri("root")}))
        .collect();
    let result = client
        .call("capabilityRoots/discoverV1", json!({"roots": roots}))
        .await;
    let roots = result["roots"].as_array().unwrap();
    let contents: usize = roots
        .iter()
        .flat_map(|root| root["skills"].as_array().unwrap())
        .map(|skill| skill["instructions"]["contents"].as_str().unwrap().len())
        .sum();
    assert_eq!(contents, 600_000, "one skill fits the budget, and only one");
    assert!(roots.iter().all(|root| root["warnings"]
        .as_array()
        .unwrap()
        .contains(&json!("capability discovery size limit reached"))));
}

/// Each root is read under its own sandbox, by the fs helper: what the policy denies is
/// never returned, and a root it does not let us read fails alone.
#[tokio::test]
async fn each_root_is_read_under_its_sandbox() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    plugin_root(&tree);
    tree.write("outside/secret/SKILL.md", &skill("secret", "must not leak"));
    // A link inside the root to a skill outside what the policy grants.
    std::os::unix::fs::symlink(tree.path("outside/secret"), tree.path("root/skills/escape"))
        .unwrap();
    let root = tree.path("root");
    let alpha = tree.path("root/skills/alpha");
    let denying = managed(vec![
        entry(root.to_str().unwrap(), "read"),
        entry(alpha.to_str().unwrap(), "none"),
    ]);
    let narrow = managed(vec![entry(
        tree.path("root/skills").to_str().unwrap(),
        "read",
    )]);
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let result = client
        .call(
            "capabilityRoots/discoverV1",
            json!({"roots": [
                {"id": "denying", "path": tree.uri("root"), "sandbox": denying},
                {"id": "narrow", "path": tree.uri("root"), "sandbox": narrow},
                {"id": "open", "path": tree.uri("root/skills"), "sandbox": null},
            ]}),
        )
        .await;
    let text = result.to_string();
    assert!(!text.contains("must not leak"), "{text}");
    let denying = &result["roots"][0];
    assert_eq!(denying["error"], Value::Null, "{denying}");
    assert_eq!(
        denying["warnings"],
        json!([format!(
            "failed to scan capability path {}: read access to {} is not permitted by the filesystem sandbox",
            tree.uri("root/skills/alpha"),
            alpha.display()
        )])
    );
    let skills: Vec<&str> = denying["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["instructions"]["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        skills,
        [
            tree.uri("root/.hidden/x/SKILL.md"),
            tree.uri("root/skills/beta/SKILL.md")
        ]
    );
    assert_eq!(
        denying["plugin"]["manifest"],
        tree.file("root/.codex-plugin/plugin.json")
    );
    let narrow = &result["roots"][1];
    assert_eq!(
        narrow["error"],
        format!(
            "failed to inspect capability root {}: read access to {} is not permitted by the filesystem sandbox",
            tree.uri("root"),
            root.display()
        )
    );
    // The unsandboxed sibling is unaffected and does not follow the link either.
    assert_eq!(result["roots"][2]["skills"].as_array().unwrap().len(), 2);
}

/// A home laid out as codex lays out installed plugins and skills.
fn codex_home(tree: &Tree) {
    let cache = "home/.codex/plugins/cache/mkt/plug";
    tree.write(
        &format!("{cache}/0.9.0/.codex-plugin/plugin.json"),
        "{\"name\":\"plug\",\"version\":\"0.9.0\"}\n",
    );
    tree.write(
        &format!("{cache}/1.10.0/.codex-plugin/plugin.json"),
        "{\"name\":\"plug\",\"version\":\"1.10.0\",\"interface\":{\"displayName\":\"Plug\"}}\n",
    );
    tree.write(&format!("{cache}/1.10.0/.mcp.json"), "{}\n");
    tree.write(
        &format!("{cache}/1.10.0/skills/ps/SKILL.md"),
        &skill("ps", "plugin skill"),
    );
    tree.write(
        "home/.codex/skills/hs/SKILL.md",
        "---\nname: hs\ndescription: >-\n  home\n  skill\nmetadata:\n  short-description: short hs\n---\n",
    );
    tree.write(
        "home/.codex/skills/noname/SKILL.md",
        "---\ndescription: x\n---\n",
    );
    tree.write("home/.codex/skills/bad/SKILL.md", "no front matter\n");
    tree.write(
        "home/.agents/skills/ua/SKILL.md",
        "---\nname: ua\ndescription: \"user agent\"\n---\n",
    );
}

async fn check_installed(mut client: Client, tree: &Tree) {
    client.handshake().await;
    let result = client
        .call(
            "capabilities/discoverV2",
            json!({"cwd": tree.uri("home"), "sandbox": null, "future": 1}),
        )
        .await;
    let root = tree.path("home/.codex/plugins/cache/mkt/plug/1.10.0");
    let root_uri = format!("file://{}", root.display());
    assert_eq!(
        result["plugins"],
        json!([{
            "id": "plug@mkt",
            "displayName": "Plug",
            "remotePluginId": null,
            "version": "1.10.0",
            "root": root_uri,
            "files": {
                "manifest": tree.file("home/.codex/plugins/cache/mkt/plug/1.10.0/.codex-plugin/plugin.json"),
                "mcpConfig": tree.file("home/.codex/plugins/cache/mkt/plug/1.10.0/.mcp.json"),
                "appsConfig": null,
            },
            "skills": [{
                "name": "plug:ps", "description": "plugin skill", "shortDescription": null,
                "path": format!("{root_uri}/skills/ps/SKILL.md"), "dependencies": null, "policy": null,
            }],
        }])
    );
    let home_root = json!({"id": "codex-home-skills", "path": tree.uri("home/.codex/skills")});
    assert_eq!(
        result["skills"],
        json!([
            {"name": "hs", "description": "home skill", "shortDescription": "short hs",
             "path": tree.uri("home/.codex/skills/hs/SKILL.md"), "discoveryRoot": home_root,
             "dependencies": null, "policy": null},
            {"name": "noname", "description": "x", "shortDescription": null,
             "path": tree.uri("home/.codex/skills/noname/SKILL.md"), "discoveryRoot": home_root,
             "dependencies": null, "policy": null},
            {"name": "ua", "description": "user agent", "shortDescription": null,
             "path": tree.uri("home/.agents/skills/ua/SKILL.md"),
             "discoveryRoot": {"id": "user-agent-skills", "path": tree.uri("home/.agents/skills")},
             "dependencies": null, "policy": null},
        ])
    );
    assert_eq!(
        result["warnings"],
        json!(["some capability metadata could not be loaded; discovery may be incomplete"])
    );
}

fn command_with_home(tree: &Tree, listen: &str) -> tokio::process::Command {
    let mut cmd = server_command(&["--listen", listen]);
    cmd.env("HOME", tree.path("home")).env_remove("CODEX_HOME");
    cmd
}

#[tokio::test]
async fn installed_over_stdio() {
    let tree = Tree::new();
    codex_home(&tree);
    check_installed(Client::stdio_with(command_with_home(&tree, "stdio")), &tree).await;
}

#[tokio::test]
async fn installed_over_websocket() {
    let tree = Tree::new();
    codex_home(&tree);
    let server = WsServer::start_with(command_with_home(&tree, "ws://127.0.0.1:0")).await;
    check_installed(server.connect().await, &tree).await;
}

#[tokio::test]
async fn an_empty_home_has_nothing_installed() {
    let tree = Tree::new();
    std::fs::create_dir_all(tree.path("home")).unwrap();
    let mut client = Client::stdio_with(command_with_home(&tree, "stdio"));
    client.handshake().await;
    let result = client
        .call("capabilities/discoverV2", json!({"cwd": tree.uri("home")}))
        .await;
    assert_eq!(result, json!({"plugins": [], "skills": [], "warnings": []}));
    let error = client.call_err("capabilities/discoverV2", json!({})).await;
    assert_error(&error, -32602, "missing field `cwd`");
}

#[tokio::test]
async fn switching_the_plugin_off_clears_both_flags() {
    let config = config_file("[plugins.capabilities]\nenabled = false\n");
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    let init = client.call("initialize", json!({"clientName": "t"})).await;
    let flags = &init["environmentInfo"]["capabilities"];
    assert_eq!(flags["capabilityDiscoverySandbox"], false);
    assert_eq!(flags["capabilityDiscoveryV2"], false);
}

/// What a plugin's manifest lends every skill (its name, in `<plugin>:<skill>`) counts
/// against the answer's budget: a 200 KB name and 200 empty skills made a 40 MB answer of
/// a 1 MiB budget (the attack pass reached 315 MB, and 3 GB with more skills).
#[tokio::test]
async fn names_a_manifest_lends_its_skills_are_charged() {
    let tree = Tree::new();
    let plugin = "home/.codex/plugins/cache/m/p/1";
    let name = "n".repeat(200_000);
    tree.write(
        &format!("{plugin}/.codex-plugin/plugin.json"),
        &format!("{{\"name\":\"{name}\"}}"),
    );
    for i in 0..200 {
        tree.write(&format!("{plugin}/skills/s{i}/SKILL.md"), "---\n---\n");
    }
    let mut command = command_with_home(&tree, "stdio");
    command.env("EXEC_SERVER_CAPABILITIES__MAX_TOTAL_BYTES", "1048576");
    let mut client = Client::stdio_with(command);
    client.handshake().await;
    let result = client
        .call(
            "capabilities/discoverV2",
            json!({"cwd": tree.uri("home"), "sandbox": null}),
        )
        .await;
    let size = serde_json::to_vec(&result).unwrap().len();
    assert!(size < 1_200_000, "a 1 MiB budget answered {size} bytes");
    let skills = result["plugins"][0]["skills"].as_array().unwrap().len();
    assert!((1..200).contains(&skills), "{skills} skills");
    assert!(result["warnings"]
        .as_array()
        .unwrap()
        .contains(&json!("capability discovery size limit reached")));
}

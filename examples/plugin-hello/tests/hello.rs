//! The hello plugin through its real host binary, over stdio.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

struct Server {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Server {
    fn start(env: &[(&str, &str)], args: &[&str]) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_exec-server-hello"));
        cmd.args(["--listen", "stdio"]).args(args).env("RUST_LOG", "warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self { child, stdin, stdout }
    }

    fn send(&mut self, message: Value) {
        writeln!(self.stdin, "{message}").unwrap();
    }

    fn recv(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    fn handshake(&mut self) {
        self.handshake_with(json!([]));
    }

    /// The handshake, opting in to `extensions`.
    fn handshake_with(&mut self, extensions: Value) {
        let params = json!({"clientName": "t", "extensions": extensions});
        self.send(json!({"id": 0, "method": "initialize", "params": params}));
        assert!(self.recv()["result"]["sessionId"].is_string());
        self.send(json!({"method": "initialized"}));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn greets_counts_per_session_and_notifies_after_the_response() {
    let mut server = Server::start(&[], &[]);
    server.handshake_with(json!(["hello"]));
    server.send(json!({"id": 1, "method": "hello/greet", "params": {"name": "Ada"}}));
    assert_eq!(server.recv(), json!({"id": 1, "result": {"greeting": "Hello, Ada!", "count": 1}}));
    assert_eq!(server.recv(), json!({"method": "hello/greeted", "params": {"count": 1}}));
    server.send(json!({"id": 2, "method": "hello/greet", "params": {"name": "Bo", "shout": true}}));
    assert_eq!(server.recv(), json!({"id": 2, "result": {"greeting": "HELLO, BO!", "count": 2}}));
    assert_eq!(server.recv()["params"]["count"], 2);
    // Typed params: a missing member is -32602 with serde's text.
    server.send(json!({"id": 3, "method": "hello/greet", "params": {}}));
    let reply = server.recv();
    assert_eq!(reply["error"]["code"], -32602);
    assert!(reply["error"]["message"].as_str().unwrap().contains("name"), "{reply}");
    // The built-in families are all there too.
    server.send(json!({"id": 4, "method": "environment/status"}));
    assert_eq!(server.recv(), json!({"id": 4, "result": {"status": "ready"}}));
}

/// The smallest plugin of the crate, `echo`, answers with what it was sent.
#[test]
fn the_smallest_plugin_answers() {
    let mut server = Server::start(&[], &[]);
    server.handshake();
    server.send(json!({"id": 1, "method": "echo/say", "params": {"text": "hi"}}));
    assert_eq!(server.recv(), json!({"id": 1, "result": {"text": "hi"}}));
    server.send(json!({"id": 2, "method": "echo/say", "params": {"words": "hi"}}));
    assert_eq!(server.recv()["error"]["code"], -32602);
}

/// `hello/greeted` is an extension: a client that did not opt in (every codex client) never
/// gets it, so it is never dropped for an unknown notification.
#[test]
fn clients_that_did_not_opt_in_get_no_notification() {
    let mut server = Server::start(&[], &[]);
    server.handshake();
    server.send(json!({"id": 1, "method": "hello/greet", "params": {"name": "Ada"}}));
    assert_eq!(server.recv()["result"]["count"], 1);
    server.send(json!({"id": 2, "method": "environment/status"}));
    assert_eq!(server.recv(), json!({"id": 2, "result": {"status": "ready"}}));
}

#[test]
fn the_config_key_comes_from_every_layer() {
    let mut server = Server::start(&[("EXEC_SERVER_HELLO__GREETING", "Hi")], &[]);
    server.handshake();
    server.send(json!({"id": 1, "method": "hello/greet", "params": {"name": "Ada"}}));
    assert_eq!(server.recv()["result"]["greeting"], "Hi, Ada!");

    let out = Command::new(env!("CARGO_BIN_EXE_exec-server-hello"))
        .arg("config")
        .env("EXEC_SERVER_HELLO__GREETING", "Hey")
        .output()
        .unwrap();
    let printed: toml_like::Table = toml_like::parse(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(printed.get("hello.greeting").map(String::as_str), Some("\"Hey\""));

    let out = Command::new(env!("CARGO_BIN_EXE_exec-server-hello"))
        .env("EXEC_SERVER_HELLO__GREETNG", "typo")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("invalid config: unknown key hello.greetng"), "{stderr}");

    // The plugin's own checks run for `exec-server config` too, not only when serving.
    let out = Command::new(env!("CARGO_BIN_EXE_exec-server-hello"))
        .arg("config")
        .env("EXEC_SERVER_HELLO__GREETING", " ")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("invalid config: hello.greeting must not be empty"), "{stderr}");
}

#[test]
fn operators_can_switch_the_plugin_off() {
    for env in [
        ("EXEC_SERVER_PLUGINS__HELLO__ENABLED", "false"),
        ("EXEC_SERVER_METHODS__DISABLED", "[\"hello/*\"]"),
    ] {
        let mut server = Server::start(&[env], &[]);
        server.handshake();
        server.send(json!({"id": 1, "method": "hello/greet", "params": {"name": "Ada"}}));
        assert_eq!(
            server.recv()["error"],
            json!({"code": -32601, "message": "method `hello/greet` is disabled on this server"})
        );
        let out = Command::new(env!("CARGO_BIN_EXE_exec-server-hello"))
            .arg("methods")
            .env(env.0, env.1)
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&out.stdout);
        let row = listing.lines().find(|l| l.starts_with("hello/greet ")).unwrap();
        assert!(row.contains("disabled"), "{row}");
    }
}

#[test]
fn a_host_that_does_not_link_the_crate_refuses_to_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_exec-server-hello-unlinked"))
        .args(["--listen", "stdio"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "`hello` is not registered: the crate `exec-server-plugin-hello` was not linked"
        ),
        "{stderr}"
    );
}

#[test]
fn the_host_binary_is_hardened_like_the_server() {
    const TOKEN: &str = "host-token-6d1f";
    let mut server = Server::start(
        &[("CODEX_EXEC_SERVER_CONNECTION_TOKEN", TOKEN), ("HOST_MARKER", "visible")],
        &[],
    );
    server.handshake();
    let environ = format!("/proc/{}/environ", server.child.id());
    match std::fs::read(&environ) {
        // Root may read it: the token must be gone from the block itself.
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            assert!(text.contains("HOST_MARKER=visible"), "{text}");
            assert!(!text.contains(TOKEN), "{environ} shows the token");
        }
        // Another user may not; the same user may not either, as the host is non-dumpable.
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}"),
    }

    // Run as an unprivileged user (when root can arrange it), the host's /proc files are
    // root-owned: the kernel's sign that it is not dumpable.
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    if !root {
        return;
    }
    let mut child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_exec-server-hello"))
        .args(["--listen", "stdio"])
        .current_dir("/")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    writeln!(stdin, "{}", json!({"id": 0, "method": "initialize", "params": {"clientName": "t"}}))
        .unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("sessionId"), "{line}");
    use std::os::unix::fs::MetadataExt as _;
    let environ = format!("/proc/{}/environ", child.id());
    let owner = std::fs::metadata(&environ).unwrap().uid();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(owner, 0, "the host running as uid 65534 is dumpable");
}

/// Just enough of TOML for `exec-server config` output: `[table]` and `key = value`.
mod toml_like {
    pub type Table = std::collections::BTreeMap<String, String>;

    pub fn parse(text: &str) -> Table {
        let mut table = String::new();
        let mut out = Table::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                table = name.to_owned();
            } else if let Some((key, value)) = line.split_once(" = ") {
                out.insert(format!("{table}.{key}"), value.to_owned());
            }
        }
        out
    }
}

//! `process/start` with `networkProxy` (CODEX-NETWORK.md §3): the process gets a policy
//! proxy of its own, the proxy variables, a `network/policyDecision` for every decision and,
//! with `policyDecisionTimeoutMs`, a `network/policyRequest` for every allowlist miss. The
//! requests here go through the proxy from the test (the process itself is unsandboxed, so
//! the proxy is on the server's loopback).

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::http::origin::Origin;
use crate::http::Sides;
use crate::util::{b64decode, Client, WsServer};

fn start(id: &str, proxy: Value) -> Value {
    json!({"processId": id, "argv": ["/bin/sh", "-c", "env; sleep 30"], "cwd": "file:///tmp",
           "env": {"PATH": "/usr/bin:/bin"}, "tty": false, "networkProxy": proxy})
}

fn proxy_config(domains: Value, allow_local: bool, decision_timeout: Option<u64>) -> Value {
    let mut config = json!({"proxy": {"enabled": true, "enableSocks5": false, "enableSocks5Udp": false,
        "allowUpstreamProxy": false, "dangerouslyAllowAllUnixSockets": false, "mode": "full",
        "domains": domains, "allowLocalBinding": allow_local}});
    if let Some(ms) = decision_timeout {
        config["policyDecisionTimeoutMs"] = json!(ms);
    }
    config
}

/// The child's environment as it printed it, until the variables are all there.
async fn child_env(client: &mut Client, id: &str) -> String {
    let mut text = String::new();
    while !text.contains("NODE_USE_ENV_PROXY") {
        let output = client.notification("process/output").await;
        if output["processId"] == id {
            text.push_str(&String::from_utf8_lossy(&b64decode(&output["chunk"])));
        }
    }
    text
}

fn var<'a>(env: &'a str, name: &str) -> &'a str {
    env.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name} missing in {env}"))
}

/// One plain-HTTP request through the proxy at `proxy` (`http://host:port`); the answer's
/// status line, headers and body.
async fn via_proxy(proxy: &str, url: &str) -> (String, String) {
    let addr = proxy.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let host = url.trim_start_matches("http://").split('/').next().unwrap();
    let request = format!("GET {url} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (head.to_owned(), body.to_owned())
}

/// Runs on codex 0.171.0 too (unsandboxed: the proxy on the server's loopback), so every
/// fact checked here is codex's as well.
#[tokio::test]
async fn a_process_gets_its_own_proxy_its_variables_and_every_decision() {
    let sides = Sides::new("a_process_gets_its_own_proxy_its_variables_and_every_decision");
    let origin = Origin::start().await;
    for side in sides.all() {
        let mut client = sides.client(side, &[]).await;
        let config = proxy_config(
            json!({"127.0.0.1": "allow", "denied.test": "deny"}),
            false,
            None,
        );
        client.call("process/start", start("p1", config)).await;
        let env = child_env(&mut client, "p1").await;
        let proxy = var(&env, "HTTP_PROXY").to_owned();
        assert!(proxy.starts_with("http://127.0.0.1:"), "{proxy}");
        for name in [
            "HTTPS_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "WS_PROXY",
            "PIP_PROXY",
        ] {
            assert_eq!(var(&env, name), proxy, "{name}");
        }
        assert_eq!(var(&env, "NO_PROXY"), "");
        assert_eq!(var(&env, "CODEX_NETWORK_PROXY_ACTIVE"), "1");
        assert_eq!(var(&env, "CODEX_NETWORK_ALLOW_LOCAL_BINDING"), "0");

        // Allowed exactly (a loopback literal must be): through, and reported.
        let (head, body) = via_proxy(&proxy, &origin.url("/status/201")).await;
        assert!(head.starts_with("HTTP/1.1 201"), "{head}");
        assert_eq!(body, "status");
        let decision = client.notification("network/policyDecision").await;
        assert_eq!(decision["processId"], "p1");
        assert_eq!(decision["decision"], "allow");
        assert_eq!(decision["scope"], "domain");
        assert_eq!(decision["protocol"], "http");
        assert_eq!(decision["host"], "127.0.0.1");
        assert_eq!(decision["method"], "GET");

        // Denied, and not in the allowlist: 403 with codex's header and JSON body.
        let (head, body) = via_proxy(&proxy, "http://denied.test/").await;
        assert!(head.starts_with("HTTP/1.1 403"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("x-proxy-error: blocked-by-denylist"),
            "{head}"
        );
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["reason"], "denied");
        let (head, body) = via_proxy(&proxy, "http://other.test/").await;
        assert!(
            head.to_ascii_lowercase()
                .contains("x-proxy-error: blocked-by-allowlist"),
            "{head}"
        );
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["reason"],
            "not_allowed"
        );
        let denied = client.notification("network/policyDecision").await;
        assert_eq!(
            (denied["decision"].as_str(), denied["reason"].as_str()),
            (Some("deny"), Some("denied"))
        );

        // The proxy is the process's: it closes when the process exits.
        client
            .call("process/terminate", json!({"processId": "p1"}))
            .await;
        let addr = proxy.trim_start_matches("http://").to_owned();
        let mut closed = false;
        for _ in 0..100 {
            if TcpStream::connect(&addr).await.is_err() {
                closed = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(
            closed,
            "the proxy of an exited process still accepts connections"
        );
    }
}

#[tokio::test]
async fn allowlist_misses_are_asked_of_the_client_and_only_allow_lets_them_through() {
    let origin = Origin::start().await;
    let server = WsServer::start(&[]).await;
    let mut client = server.connect_initialized().await;
    // Local addresses allowed, nothing in the allowlist: every request is a miss.
    let config = proxy_config(json!({}), true, Some(10_000));
    client.call("process/start", start("p2", config)).await;
    let env = child_env(&mut client, "p2").await;
    let proxy = var(&env, "HTTP_PROXY").to_owned();

    for (answer, allowed) in [
        (json!({"result": {"decision": {"type": "allow"}}}), true),
        (
            json!({"result": {"decision": {"type": "deny", "reason": "not today"}}}),
            false,
        ),
        (json!({"result": {"decision": "allow"}}), false),
        (json!({"error": {"code": -32000, "message": "no"}}), false),
    ] {
        let url = origin.url("/status/200");
        let through = proxy.clone();
        let request = tokio::spawn(async move { via_proxy(&through, &url).await });
        let asked = next_request(&mut client, "network/policyRequest").await;
        assert_eq!(asked["params"]["processId"], "p2");
        let port: u16 = origin.base.rsplit(':').next().unwrap().parse().unwrap();
        assert_eq!(
            asked["params"]["request"],
            json!({"protocol": "http", "host": "127.0.0.1", "port": port})
        );
        let mut reply = answer.clone();
        reply["id"] = asked["id"].clone();
        client.send(reply).await;
        let (head, _) = request.await.unwrap();
        assert_eq!(
            head.starts_with("HTTP/1.1 200"),
            allowed,
            "{answer}: {head}"
        );
    }
}

/// The next server→client request with `method`, keeping everything else.
async fn next_request(client: &mut Client, method: &str) -> Value {
    loop {
        let message = client.read_wire().await.expect("the connection stays open");
        if message["method"] == method && message.get("id").is_some() {
            return message;
        }
    }
}

#[tokio::test]
async fn an_invalid_network_proxy_is_refused_with_codex_s_text() {
    let sides = Sides::new("an_invalid_network_proxy_is_refused_with_codex_s_text");
    for side in sides.all() {
        let mut client = sides.client(side, &[]).await;
        let mut disabled = proxy_config(json!({}), false, None);
        disabled["proxy"]["enabled"] = json!(false);
        let error = client
            .call_err("process/start", start("p3", disabled))
            .await;
        assert_eq!(error["code"], -32602);
        assert_eq!(
            error["message"],
            "invalid network proxy config: executor-local network proxy launch requires an enabled proxy"
        );
        let zero = proxy_config(json!({}), false, Some(0));
        let error = client.call_err("process/start", start("p3", zero)).await;
        assert_eq!(
            error["message"],
            "network policy decision callback timeout must be nonzero"
        );
        let bad_mode = {
            let mut c = proxy_config(json!({}), false, None);
            c["proxy"]["mode"] = json!("bogus");
            c
        };
        let error = client
            .call_err("process/start", start("p3", bad_mode))
            .await;
        assert_eq!(
            error["message"],
            "unknown variant `bogus`, expected `limited` or `full`"
        );
        // Nothing was left behind: the id is free.
        client
            .call(
                "process/start",
                start("p3", proxy_config(json!({}), false, None)),
            )
            .await;
        client
            .call("process/terminate", json!({"processId": "p3"}))
            .await;
    }
}

/// What a managed child tries, in Python so that each attempt is a plain system call: one
/// request to `argv[1]` through its proxy, then every way around it (`direct` connects to
/// `argv[1]`'s port itself). Prints one `name: outcome` line per attempt, then `done`.
const BYPASS_ATTEMPTS: &str = r#"
import os, socket, sys, urllib.request
origin = sys.argv[1]
host, port = origin.split("//")[1].split(":")
port = int(port)
def attempt(name, f):
    try:
        print(f"{name}: ok {f()}", flush=True)
    except OSError as e:
        print(f"{name}: {e.errno}", flush=True)
    except Exception as e:
        print(f"{name}: {type(e).__name__}", flush=True)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": os.environ["HTTP_PROXY"]}))
attempt("proxied", lambda: opener.open(origin + "/status/201", timeout=10).status)
attempt("direct", lambda: socket.create_connection((host, port), timeout=5).close())
attempt("outside", lambda: socket.create_connection(("192.0.2.1", 80), timeout=5).close())
attempt("ipv6", lambda: socket.create_connection(("::1", port), timeout=5).close())
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"q", ("8.8.8.8", 53)))
attempt("unix", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).close())
attempt("resolve", lambda: socket.getaddrinfo("example.com", 80))
print("done", flush=True)
"#;

/// Starts `params` (a managed child running [`BYPASS_ATTEMPTS`]) and returns what it
/// printed.
async fn run_attempts(client: &mut Client, params: Value) -> String {
    let started = client.call("process/start", params).await;
    assert_eq!(started["sandboxType"], "linuxSeccomp");
    let mut output = String::new();
    while !output.contains("done\n") {
        let chunk = client.notification("process/output").await;
        output.push_str(&String::from_utf8_lossy(&b64decode(&chunk["chunk"])));
    }
    output
}

fn attempt_outcome(output: &str, name: &str) -> String {
    output
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .unwrap_or_else(|| panic!("no {name} in {output}"))
        .to_owned()
}

#[tokio::test]
async fn a_managed_child_reaches_exactly_its_proxy() {
    if !crate::sandbox::landlock_available() {
        return;
    }
    let origin = Origin::start().await;
    let server = WsServer::start(&[]).await;
    let mut client = server.connect_initialized().await;
    let sandbox = crate::sandbox::managed(vec![crate::sandbox::root_read()]);
    let config = proxy_config(json!({"127.0.0.1": "allow"}), false, None);
    let params = json!({"processId": "m1", "argv": ["python3", "-c", BYPASS_ATTEMPTS, origin.base],
        "cwd": "file:///tmp", "env": {"PATH": std::env::var("PATH").unwrap()}, "tty": false,
        "sandbox": sandbox, "networkProxy": config, "enforceManagedNetwork": true});
    let output = run_attempts(&mut client, params).await;
    let outcome = |name: &str| attempt_outcome(&output, name);
    assert_eq!(outcome("proxied"), "ok 201", "{output}");
    // Two layers refuse a connect past the proxy: Landlock lets TCP reach the proxy's
    // port only (EACCES, Linux 6.7+), and below it the child's network namespace has no
    // listener on its loopback but the proxy (ECONNREFUSED) and no route (ENETUNREACH).
    let refused = |errnos: &[i32]| errnos.iter().map(i32::to_string).collect::<Vec<_>>();
    assert!(
        refused(&[libc::EACCES, libc::ECONNREFUSED]).contains(&outcome("direct")),
        "{output}"
    );
    assert!(
        refused(&[libc::EACCES, libc::ENETUNREACH]).contains(&outcome("outside")),
        "{output}"
    );
    assert_ne!(outcome("ipv6").split(' ').next(), Some("ok"), "{output}");
    assert_eq!(outcome("udp"), libc::ENETUNREACH.to_string(), "{output}");
    assert_eq!(outcome("unix"), libc::EPERM.to_string(), "{output}");
    assert!(!outcome("resolve").starts_with("ok"), "{output}");
    let decision = client.notification("network/policyDecision").await;
    assert_eq!(decision["processId"], "m1");
    assert_eq!(decision["decision"], "allow");
}

/// `enforceManagedNetwork` without `networkProxy`: the proxy is the client's own, on the
/// server's loopback (here an origin that answers absolute-form requests itself). The
/// child's namespace gets a listener on the proxy's port that the server forwards to it,
/// and nothing else: the destination's own port is out of reach.
#[tokio::test]
async fn a_managed_child_is_bridged_to_the_client_s_proxy_and_nowhere_else() {
    if !crate::sandbox::landlock_available() {
        return;
    }
    let client_proxy = Origin::start().await;
    let destination = Origin::start().await;
    let server = WsServer::start(&[]).await;
    let mut client = server.connect_initialized().await;
    let sandbox = crate::sandbox::managed(vec![crate::sandbox::root_read()]);
    let params = json!({"processId": "b1",
        "argv": ["python3", "-c", BYPASS_ATTEMPTS, destination.base],
        "cwd": "file:///tmp", "tty": false, "sandbox": sandbox, "enforceManagedNetwork": true,
        "env": {"PATH": std::env::var("PATH").unwrap(), "HTTP_PROXY": client_proxy.base}});
    let output = run_attempts(&mut client, params).await;
    let outcome = |name: &str| attempt_outcome(&output, name);
    assert_eq!(outcome("proxied"), "ok 201", "{output}");
    // The request reached the client's proxy, in proxy form, and not the destination.
    let seen = client_proxy.last();
    assert_eq!(
        seen.request_line,
        format!("GET {}/status/201 HTTP/1.1", destination.base)
    );
    assert!(destination.seen().is_empty());
    let refused = [libc::EACCES, libc::ECONNREFUSED].map(|e| e.to_string());
    assert!(refused.contains(&outcome("direct")), "{output}");
    assert_ne!(outcome("outside").split(' ').next(), Some("ok"), "{output}");
    assert_eq!(outcome("udp"), libc::ENETUNREACH.to_string(), "{output}");
    assert_eq!(outcome("unix"), libc::EPERM.to_string(), "{output}");
}

/// With nothing to bridge to, a confined start fails closed with codex's text; a proxy
/// variable naming a host the bridge cannot reach is refused by name.
#[tokio::test]
async fn a_managed_child_without_a_loopback_proxy_is_refused() {
    if !crate::sandbox::landlock_available() {
        return;
    }
    let server = WsServer::start(&[]).await;
    let mut client = server.connect_initialized().await;
    let sandbox = crate::sandbox::managed(vec![crate::sandbox::root_read()]);
    let start = |id: &str, env: Value| {
        json!({"processId": id, "argv": ["/bin/true"], "cwd": "file:///tmp", "tty": false,
               "sandbox": sandbox, "enforceManagedNetwork": true, "env": env})
    };
    let error = client
        .call_err(
            "process/start",
            start("r1", json!({"PATH": "/usr/bin:/bin"})),
        )
        .await;
    assert_eq!(error["code"], -32602);
    assert_eq!(
        error["message"],
        "failed to prepare host proxy routing bridge: managed proxy mode requires proxy environment variables"
    );
    let env = json!({"PATH": "/usr/bin:/bin", "HTTPS_PROXY": "http://proxy.example:3128"});
    let error = client.call_err("process/start", start("r2", env)).await;
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("HTTPS_PROXY does not name a proxy on 127.0.0.1 or localhost"),
        "{error}"
    );
    // `managedNetwork.loopbackPorts` alone is a proxy to bridge to.
    let mut params = start("r3", json!({"PATH": "/usr/bin:/bin"}));
    params["managedNetwork"] = json!({"loopbackPorts": [43123]});
    let started = client.call("process/start", params).await;
    assert_eq!(started["sandboxType"], "linuxSeccomp");
}

//! WebSocket authentication as codex 0.169.0 does it (CODEX-0169 §3): the
//! `capability-token` and `signed-bearer-token` modes with their flags, start-up errors and
//! 401 answers, against the real server.

use std::os::unix::fs::PermissionsExt as _;
use std::process::Output;

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::util::{http_get, server_bin, server_command, Client, WsServer, STEP_TIMEOUT};

const UPGRADE: &str = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

/// An upgrade with extra headers; returns the status, the (lower-case) head and the body,
/// read up to its `content-length` (a refusal may keep the connection open).
pub async fn upgrade_answer(base: &str, path: &str, headers: &str) -> (u16, String, String) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{UPGRADE}{headers}\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reader = tokio::io::BufReader::new(stream);
    let read = async {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await.unwrap() == 0 || line == "\r\n" {
                break;
            }
            head.push_str(&line.to_ascii_lowercase());
        }
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body).await.unwrap();
        (head, String::from_utf8_lossy(&body).into_owned())
    };
    let (head, body) = tokio::time::timeout(STEP_TIMEOUT, read)
        .await
        .expect("an answer");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head, body)
}

/// Asserts a 401 with codex's `text/plain` body.
#[track_caller]
fn assert_refused(answer: &(u16, String, String), body: &str) {
    assert_eq!(answer.0, 401, "{answer:?}");
    assert!(
        answer.1.contains("content-type: text/plain; charset=utf-8"),
        "{answer:?}"
    );
    assert_eq!(answer.2, body, "{answer:?}");
}

/// An owner-only file holding `contents`.
pub fn secret_file(dir: &tempfile::TempDir, name: &str, contents: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, contents).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_str().unwrap().to_owned()
}

fn sha256_hex(data: &str) -> String {
    Sha256::digest(data.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// HMAC-SHA256 (RFC 2104), written out so tokens are built independently of the server's
/// JWT library.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::digest([pad(0x36), message.to_vec()].concat());
    Sha256::digest([pad(0x5c), inner.to_vec()].concat()).into()
}

/// A JWT with header `{"alg": alg, "typ": "JWT"}` and `claims`, signed with HMAC-SHA256.
pub fn jwt(alg: &str, claims: &Value, secret: &str) -> String {
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let header = b64(json!({"alg": alg, "typ": "JWT"}).to_string().as_bytes());
    let payload = b64(claims.to_string().as_bytes());
    let signing_input = format!("{header}.{payload}");
    let signature = b64(&hmac_sha256(secret.as_bytes(), signing_input.as_bytes()));
    format!("{signing_input}.{signature}")
}

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}\r\n")
}

async fn initialize_with(server: &WsServer, token: &str) -> Value {
    let addr = server.url.trim_start_matches("ws://");
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut client = Client::websocket_over(stream, &server.url, Some(token))
        .await
        .expect("an authenticated upgrade succeeds");
    client
        .call("initialize", json!({"clientName": "ws-auth"}))
        .await
}

#[tokio::test]
async fn capability_token_from_a_file_or_a_digest() {
    let dir = tempfile::tempdir().unwrap();
    let file = secret_file(&dir, "token", "  cap-tok\n");
    let digest = sha256_hex("cap-tok").to_uppercase();
    for flags in [
        vec!["--ws-auth", "capability-token", "--ws-token-file", &file],
        vec![
            "--ws-auth",
            "capability-token",
            "--ws-token-sha256",
            &digest,
        ],
    ] {
        let server = WsServer::start(&flags).await;
        let base = server.http_base();
        assert_refused(
            &upgrade_answer(&base, "/", "").await,
            "missing websocket bearer token",
        );
        // Only the header counts: a token in the query is ignored.
        assert_refused(
            &upgrade_answer(&base, "/?token=cap-tok", "").await,
            "missing websocket bearer token",
        );
        for header in [
            "Authorization: Basic cap-tok\r\n",
            "Authorization: Bearer\r\n",
            "Authorization: cap-tok\r\n",
        ] {
            assert_refused(
                &upgrade_answer(&base, "/", header).await,
                "invalid authorization header",
            );
        }
        assert_refused(
            &upgrade_answer(&base, "/", &bearer("nope")).await,
            "invalid websocket bearer token",
        );
        let (status, _) = http_get(
            &base,
            "/",
            &format!("{UPGRADE}Authorization: bearer   cap-tok  \r\n"),
        )
        .await;
        assert_eq!(status, 101);
        assert!(initialize_with(&server, "cap-tok").await["sessionId"].is_string());
        // Health probes never need the token; /metrics does.
        assert_eq!(http_get(&base, "/readyz", "").await.0, 200);
        assert_eq!(http_get(&base, "/metrics", "").await.0, 401);
        assert_eq!(http_get(&base, "/metrics", &bearer("cap-tok")).await.0, 200);
    }
}

#[tokio::test]
async fn signed_bearer_tokens_are_checked_like_codex() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "0123456789abcdef0123456789abcdef-hs256";
    let file = secret_file(&dir, "jwt-secret", &format!("{secret}\n"));
    let server = WsServer::start(&[
        "--ws-auth",
        "signed-bearer-token",
        "--ws-shared-secret-file",
        &file,
        "--ws-issuer",
        "issuer-a",
        "--ws-audience",
        "aud-a",
    ])
    .await;
    let base = server.http_base();
    let t = now();
    let good = json!({"exp": t + 300, "iss": "issuer-a", "aud": "aud-a", "sub": "x"});
    let with = |changes: Value| {
        let mut claims = good.clone();
        for (k, v) in changes.as_object().unwrap() {
            if v.is_null() {
                claims.as_object_mut().unwrap().remove(k);
            } else {
                claims[k] = v.clone();
            }
        }
        claims
    };

    assert!(initialize_with(&server, &jwt("HS256", &good, secret)).await["sessionId"].is_string());
    // 20 s past `exp` is inside the default 30 s skew; an audience list that contains ours.
    for accepted in [
        with(json!({"exp": t - 20})),
        with(json!({"aud": ["other", "aud-a"]})),
        with(json!({"nbf": t + 10})),
    ] {
        let (status, _) = http_get(
            &base,
            "/",
            &format!("{UPGRADE}{}", bearer(&jwt("HS256", &accepted, secret))),
        )
        .await;
        assert_eq!(status, 101, "{accepted}");
    }
    let cases = [
        (
            jwt("HS256", &with(json!({"exp": t - 120})), secret),
            "expired websocket jwt",
        ),
        (
            jwt("HS256", &with(json!({"exp": null})), secret),
            "invalid websocket jwt",
        ),
        (
            jwt("HS256", &with(json!({"exp": "later"})), secret),
            "invalid websocket jwt",
        ),
        (
            jwt("HS256", &with(json!({"nbf": t + 120})), secret),
            "websocket jwt is not valid yet",
        ),
        (
            jwt("HS256", &with(json!({"iss": "issuer-b"})), secret),
            "websocket jwt issuer mismatch",
        ),
        (
            jwt("HS256", &with(json!({"iss": null})), secret),
            "websocket jwt issuer mismatch",
        ),
        (
            jwt("HS256", &with(json!({"aud": "aud-b"})), secret),
            "websocket jwt audience mismatch",
        ),
        (
            jwt("HS256", &with(json!({"aud": null})), secret),
            "websocket jwt audience mismatch",
        ),
        (jwt("HS384", &good, secret), "invalid websocket jwt"),
        (
            jwt("HS256", &good, "another-secret-another-secret-12"),
            "invalid websocket jwt",
        ),
        ("not.a.jwt".to_owned(), "invalid websocket jwt"),
    ];
    for (token, body) in cases {
        let (status, _) = http_get(&base, "/", &format!("{UPGRADE}{}", bearer(&token))).await;
        assert_eq!(status, 401, "{body}: {token}");
        assert_refused(&upgrade_answer(&base, "/", &bearer(&token)).await, body);
    }
    assert_refused(
        &upgrade_answer(&base, "/", "").await,
        "missing websocket bearer token",
    );
}

fn start(args: &[&str]) -> Output {
    std::process::Command::new(server_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("CODEX_EXEC_SERVER_CONNECTION_TOKEN")
        .output()
        .unwrap()
}

#[test]
fn flag_combinations_fail_with_codex_texts() {
    let dir = tempfile::tempdir().unwrap();
    let token = secret_file(&dir, "token", "tok\n");
    let short = secret_file(&dir, "short", "only-31-bytes-long-secret-value\n");
    let empty = secret_file(&dir, "empty", " \n");
    let long = secret_file(&dir, "long", &"k".repeat(32));
    let digest = sha256_hex("tok");
    let cases: Vec<(Vec<&str>, String)> = vec![
        (vec!["--ws-auth", "capability-token"], "`--ws-token-file` or `--ws-token-sha256` is required when `--ws-auth capability-token` is set".into()),
        (vec!["--ws-auth", "capability-token", "--ws-token-file", &token, "--ws-token-sha256", &digest], "`--ws-token-file` and `--ws-token-sha256` are mutually exclusive".into()),
        (vec!["--ws-auth", "capability-token", "--ws-token-file", &token, "--ws-issuer", "i"], "`--ws-shared-secret-file`, `--ws-issuer`, `--ws-audience`, and `--ws-max-clock-skew-seconds` require `--ws-auth signed-bearer-token`".into()),
        (vec!["--ws-auth", "signed-bearer-token", "--ws-shared-secret-file", &long, "--ws-token-sha256", &digest], "`--ws-token-file` and `--ws-token-sha256` require `--ws-auth capability-token`, not `signed-bearer-token`".into()),
        (vec!["--ws-auth", "signed-bearer-token"], "`--ws-shared-secret-file` is required when `--ws-auth signed-bearer-token` is set".into()),
        (vec!["--ws-token-file", &token], "websocket auth flags require `--ws-auth capability-token` or `--ws-auth signed-bearer-token`".into()),
        (vec!["--ws-auth", "capability-token", "--ws-token-sha256", "abc"], "--ws-token-sha256 must be a 64-character hex SHA-256 digest".into()),
        (vec!["--ws-auth", "capability-token", "--ws-token-file", &token, "--listen", "stdio"], "WebSocket auth requires a WebSocket listener, not stdio".into()),
    ];
    for (args, message) in cases {
        let out = start(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim(),
            message,
            "{args:?}"
        );
    }
    // Secret files: codex's rules (not empty, 32 bytes), plus ours (owner-only).
    for (file, problem) in [
        (
            &short,
            format!("signed websocket bearer secret {short} must be at least 32 bytes"),
        ),
        (
            &empty,
            format!("websocket auth secret {empty} must not be empty"),
        ),
    ] {
        let out = start(&[
            "--ws-auth",
            "signed-bearer-token",
            "--ws-shared-secret-file",
            file,
        ]);
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.starts_with("invalid config: websocket.shared_secret_file "),
            "{stderr}"
        );
        assert!(stderr.contains(&problem), "{stderr}");
    }
    std::fs::set_permissions(&long, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = start(&[
        "--ws-auth",
        "signed-bearer-token",
        "--ws-shared-secret-file",
        &long,
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is readable or writable by group or others (mode 0644)"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(&"k".repeat(32)),
        "the secret never prints: {stderr}"
    );
}

/// The configuration keys behind the flags, and what `exec-server config` prints.
#[test]
fn the_modes_are_configuration_keys_too() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(&dir, "s", &"z".repeat(40));
    let config = crate::util::config_file(&format!(
        "[websocket]\nauth = \"signed-bearer-token\"\nshared_secret_file = \"{secret}\"\naudience = \"a\"\n"
    ));
    let out = start(&["--config", config.to_str().unwrap(), "config"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: toml::Table = String::from_utf8_lossy(&out.stdout).parse().unwrap();
    assert_eq!(
        printed["websocket"]["auth"].as_str(),
        Some("signed-bearer-token")
    );
    assert_eq!(
        printed["websocket"]["max_clock_skew_seconds"].as_integer(),
        Some(30)
    );
    let config = crate::util::config_file("[websocket]\nauth = \"capability-token\"\n");
    let out = start(&["--config", config.to_str().unwrap(), "config"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .starts_with("invalid config: websocket.auth is \"capability-token\", which needs"));
}

/// The JWT secret file is one of the server's secrets: no sandboxed request may read it.
#[tokio::test]
async fn the_jwt_secret_is_denied_to_sandboxes() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(&dir, "jwt", &"s".repeat(40));
    let mut cmd = server_command(&[
        "--listen",
        "stdio",
        "--ws-auth",
        "signed-bearer-token",
        "--ws-shared-secret-file",
        &secret,
        "--listen",
        "ws://127.0.0.1:0",
    ]);
    cmd.stderr(std::process::Stdio::null());
    let mut client = Client::stdio_with(cmd);
    client.handshake().await;
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let sandbox = json!({"permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
        {"path": {"type": "path", "path": root.to_str().unwrap()}, "access": "read"}
    ]}}});
    let error = client
        .call_err("fs/readFile", json!({"path": secret, "sandbox": sandbox}))
        .await;
    assert_eq!(error["data"]["sandboxDenied"], true, "{error}");
}

//! `search/*` end to end: real trees in temporary directories, the real binary, results
//! read as notifications.

use std::path::{Path, PathBuf};
use std::process::Output;

use exec_server_proto::path::to_file_uri;
use serde_json::{json, Value};

use crate::util::{assert_error, config_file, server_bin, Client, WsServer};

// ---- fixtures ------------------------------------------------------------------------

/// A temporary tree under its canonical name, so `file:` URIs compare byte for byte.
fn tree(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    for (name, content) in files {
        let path = root.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    (dir, root)
}

/// `files` files of `lines` lines that all match `needle`: more results than any queue
/// between the search and the client can hold.
fn big_tree(files: usize, lines: usize) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let content: String = (0..lines).map(|i| format!("needle {i}\n")).collect();
    for i in 0..files {
        std::fs::write(root.join(format!("f{i:04}.txt")), &content).unwrap();
    }
    (dir, root)
}

/// A stdio server with the handshake done; `config` is the text of a `--config` file.
async fn started(config: Option<&str>) -> Client {
    let file = config.map(config_file);
    let args = match &file {
        Some(file) => vec!["--config", file.to_str().unwrap()],
        None => vec![],
    };
    let mut client = Client::stdio(&args).await;
    client.opt_in(&["search"]);
    client.handshake().await;
    client
}

fn start_params(id: &str, root: &Path, pattern: &str) -> Value {
    json!({"searchId": id, "path": to_file_uri(root), "pattern": pattern})
}

/// `base` with the members of `extra` added.
fn with(mut base: Value, extra: Value) -> Value {
    for (key, value) in extra.as_object().unwrap() {
        base[key] = value.clone();
    }
    base
}

/// Runs a search to its end: the `search/start` result, its `search/match` params and
/// its `search/done` params. Asserts that no notification precedes the response and
/// that `matches` counts the notifications.
async fn search(client: &mut Client, params: Value) -> (Value, Vec<Value>, Value) {
    let id = params["searchId"].clone();
    let request = client.send_request("search/start", params).await;
    let mut result = None;
    let mut matches = Vec::new();
    loop {
        let message = client.next_message().await;
        if message.get("id") == Some(&json!(request)) {
            assert!(result.is_none());
            result = Some(message["result"].clone());
            assert!(result.as_ref().unwrap().is_object(), "{message}");
            continue;
        }
        let params = &message["params"];
        if params["searchId"] != id {
            continue;
        }
        assert!(result.is_some(), "{message} came before the response");
        match message["method"].as_str() {
            Some("search/match") => matches.push(params.clone()),
            Some("search/done") => {
                assert_eq!(params["matches"], matches.len(), "{params}");
                return (result.unwrap(), matches, params.clone());
            }
            _ => panic!("unexpected {message}"),
        }
    }
}

/// `(file name relative to root, lineNumber, start, end)` of each match.
fn places(root: &Path, matches: &[Value]) -> Vec<(String, u64, u64, u64)> {
    let prefix = format!("{}/", to_file_uri(root));
    matches
        .iter()
        .map(|m| {
            let path = m["path"].as_str().unwrap();
            (
                path.strip_prefix(&prefix).unwrap_or(path).to_owned(),
                m["lineNumber"].as_u64().unwrap(),
                m["start"].as_u64().unwrap(),
                m["end"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Consumes what was received but not yet looked at.
async fn drain_pending(client: &mut Client) {
    while !client.pending().is_empty() {
        client.next_message().await;
    }
}

fn names(root: &Path, matches: &[Value]) -> Vec<String> {
    places(root, matches).into_iter().map(|p| p.0).collect()
}

fn at(name: &str, line: u64, start: u64, end: u64) -> (String, u64, u64, u64) {
    (name.to_owned(), line, start, end)
}

/// Reads until the response to `request`, counting the `search/*` notifications of
/// `search_id` on the way; returns the response and those notifications.
async fn until_response(
    client: &mut Client,
    request: i64,
    search_id: &str,
) -> (Result<Value, Value>, Vec<Value>) {
    let mut seen = Vec::new();
    loop {
        let message = client.next_message().await;
        if message.get("id") == Some(&json!(request)) {
            let answer = match message.get("error") {
                Some(error) => Err(error.clone()),
                None => Ok(message["result"].clone()),
            };
            return (answer, seen);
        }
        if message["params"]["searchId"] == search_id {
            seen.push(message);
        }
    }
}

// ---- matching ------------------------------------------------------------------------

#[tokio::test]
async fn literal_and_regex_matches_with_line_numbers_and_byte_offsets() {
    let (_dir, root) = tree(&[
        ("a.txt", "first line\nprice: a.c and abc\n"),
        ("sub/b.txt", "nothing\n\nÄ a.c\n"),
    ]);
    let mut client = started(None).await;

    let (result, matches, done) = search(&mut client, start_params("lit", &root, "a.c")).await;
    assert_eq!(result, json!({"searchId": "lit"}));
    assert_eq!(
        places(&root, &matches),
        [at("a.txt", 2, 7, 10), at("sub/b.txt", 3, 3, 6)]
    );
    assert_eq!(matches[0]["line"], "price: a.c and abc");
    assert_eq!(matches[0]["path"], to_file_uri(&root.join("a.txt")));
    // Offsets are bytes of the UTF-8 line: "Ä" is two bytes.
    assert_eq!(matches[1]["line"], "Ä a.c");
    assert!(matches[0].get("lineTruncated").is_none());
    assert_eq!(
        done,
        json!({"searchId": "lit", "matches": 2, "truncated": false, "cancelled": false})
    );

    let params = with(start_params("re", &root, "a.c"), json!({"regex": true}));
    let (_, matches, _) = search(&mut client, params).await;
    assert_eq!(
        places(&root, &matches),
        [
            at("a.txt", 2, 7, 10),
            at("a.txt", 2, 15, 18),
            at("sub/b.txt", 3, 3, 6)
        ]
    );

    let params = with(
        start_params("ci", &root, "FIRST|nothing"),
        json!({"regex": true, "caseInsensitive": true}),
    );
    let (_, matches, _) = search(&mut client, params).await;
    assert_eq!(
        places(&root, &matches),
        [at("a.txt", 1, 0, 5), at("sub/b.txt", 1, 0, 7)]
    );

    // A native absolute path works as well as a `file:` URI, and may name one file.
    let params =
        json!({"searchId": "one", "path": root.join("a.txt").to_str().unwrap(), "pattern": "line"});
    let (_, matches, _) = search(&mut client, params).await;
    assert_eq!(places(&root, &matches), [at("a.txt", 1, 6, 10)]);
}

#[tokio::test]
async fn include_and_exclude_globs_choose_the_files() {
    let (_dir, root) = tree(&[
        ("src/main.rs", "x\n"),
        ("src/gen/out.rs", "x\n"),
        ("docs/guide.md", "x\n"),
        ("notes.txt", "x\n"),
    ]);
    let mut client = started(None).await;
    let cases = [
        (
            json!({"include": ["*.rs"]}),
            vec!["src/gen/out.rs", "src/main.rs"],
        ),
        (
            json!({"include": ["*.rs", "*.md"], "exclude": ["gen/"]}),
            vec!["docs/guide.md", "src/main.rs"],
        ),
        (json!({"exclude": ["src", "*.md"]}), vec!["notes.txt"]),
        (
            json!({"include": null, "exclude": null}),
            vec![
                "docs/guide.md",
                "notes.txt",
                "src/gen/out.rs",
                "src/main.rs",
            ],
        ),
    ];
    for (extra, expected) in cases {
        let params = with(start_params("g", &root, "x"), extra.clone());
        let (_, matches, _) = search(&mut client, params).await;
        assert_eq!(names(&root, &matches), expected, "{extra}");
    }
}

#[tokio::test]
async fn gitignore_is_respected_and_ignored_on_request() {
    let (_dir, root) = tree(&[
        (".gitignore", "target/\n*.log\n"),
        ("target/debug/out", "x\n"),
        ("server.log", "x\n"),
        ("src/lib.rs", "x\n"),
        (".git/HEAD", "x\n"),
    ]);
    let mut client = started(None).await;
    let (_, matches, _) = search(&mut client, start_params("a", &root, "x")).await;
    assert_eq!(names(&root, &matches), ["src/lib.rs"]);
    let params = with(
        start_params("b", &root, "x"),
        json!({"respectGitignore": false}),
    );
    let (_, matches, _) = search(&mut client, params).await;
    // The repository's own `.git` is never searched.
    assert_eq!(
        names(&root, &matches),
        ["server.log", "src/lib.rs", "target/debug/out"]
    );
}

#[tokio::test]
async fn binary_and_non_utf8_files() {
    let (_dir, root) = tree(&[("text", "x\n")]);
    std::fs::write(root.join("binary"), b"x\0x\n").unwrap();
    std::fs::write(root.join("latin1"), b"caf\xE9 x\n").unwrap();
    let mut client = started(None).await;
    let (_, matches, _) = search(&mut client, start_params("s", &root, "x")).await;
    assert_eq!(
        places(&root, &matches),
        [at("latin1", 1, 7, 8), at("text", 1, 0, 1)]
    );
    // The invalid byte is sent as U+FFFD; offsets are bytes of that decoded text.
    assert_eq!(matches[0]["line"], "caf\u{FFFD} x");
}

// ---- limits ------------------------------------------------------------------------

#[tokio::test]
async fn max_results_truncates() {
    let (_dir, root) = tree(&[("a", "x x\nx\n"), ("b", "x\n")]);
    let mut client = started(None).await;
    let params = with(start_params("t", &root, "x"), json!({"maxResults": 2}));
    let (_, matches, done) = search(&mut client, params).await;
    assert_eq!(
        places(&root, &matches),
        [at("a", 1, 0, 1), at("a", 1, 2, 3)]
    );
    assert_eq!(done["truncated"], true);
    let params = with(start_params("t", &root, "x"), json!({"maxResults": 4}));
    let (_, _, done) = search(&mut client, params).await;
    assert_eq!(
        (done["matches"].as_u64(), &done["truncated"]),
        (Some(4), &json!(false))
    );
}

#[tokio::test]
async fn configured_limits_apply() {
    let (_dir, root) = tree(&[
        ("a", "x\nx\nx\n"),
        ("long", "0123456789 x\n"),
        ("huge", &"x\n".repeat(100)),
    ]);
    let mut client = started(Some(
        "[search]\nmax_results_default = 2\nmax_results_limit = 5\nmax_line_bytes = 4\nmax_file_bytes = 100\n",
    ))
    .await;
    let (_, matches, done) = search(&mut client, start_params("d", &root, "x")).await;
    assert_eq!(names(&root, &matches), ["a", "a"], "`huge` is skipped");
    assert_eq!(done["truncated"], true);

    let params = with(start_params("l", &root, "x"), json!({"maxResults": 5}));
    let (_, matches, done) = search(&mut client, params).await;
    assert_eq!(done["truncated"], false);
    let long = &matches[3];
    assert_eq!(long["line"], "0123");
    assert_eq!(long["lineTruncated"], true);
    assert_eq!((&long["start"], &long["end"]), (&json!(11), &json!(12)));

    for max in [0, 6] {
        let params = with(start_params("m", &root, "x"), json!({"maxResults": max}));
        let err = client.call_err("search/start", params).await;
        assert_error(&err, -32602, "maxResults must be between 1 and 5");
    }
}

#[tokio::test]
async fn concurrent_searches_are_limited_and_ids_unique_per_session() {
    let (_dir, root) = big_tree(50, 1_000);
    let mut client = started(Some("[search]\nmax_concurrent_searches = 1\n")).await;
    // The first search cannot finish: the client reads nothing more until it has asked
    // again.
    let first = client
        .send_request("search/start", start_params("busy", &root, "needle"))
        .await;
    assert_eq!(
        client.response(first).await.unwrap(),
        json!({"searchId": "busy"})
    );
    let again = client
        .send_request("search/start", start_params("busy", &root, "needle"))
        .await;
    let other = client
        .send_request("search/start", start_params("other", &root, "needle"))
        .await;
    assert_error(
        &client.response(again).await.unwrap_err(),
        -32600,
        "search `busy` is already running in this session",
    );
    assert_error(
        &client.response(other).await.unwrap_err(),
        -32600,
        "session quota reached: at most 1 running searches at once (search.max_concurrent_searches)",
    );
    client
        .call("search/cancel", json!({"searchId": "busy"}))
        .await;
    drain_pending(&mut client).await;
    // The id and the slot are free again.
    let (tiny_dir, tiny) = tree(&[("a", "needle\n")]);
    let (_, matches, _) = search(&mut client, start_params("busy", &tiny, "needle")).await;
    assert_eq!(matches.len(), 1);
    drop(tiny_dir);
}

// ---- cancel ------------------------------------------------------------------------

#[tokio::test]
async fn cancel_mid_stream_ends_with_exactly_one_done() {
    let total = 100 * 400;
    let (_dir, root) = big_tree(100, 400);
    let mut client = started(None).await;
    let params = with(
        start_params("big", &root, "needle"),
        json!({"maxResults": total}),
    );
    let start = client.send_request("search/start", params).await;
    assert_eq!(
        client.response(start).await.unwrap(),
        json!({"searchId": "big"})
    );
    let first = client.notification("search/match").await;
    assert_eq!(first["searchId"], "big");

    let cancel = client
        .send_request("search/cancel", json!({"searchId": "big"}))
        .await;
    let (answer, seen) = until_response(&mut client, cancel, "big").await;
    assert_eq!(answer, Ok(json!({})));
    // `search/done` is queued before the cancel's answer, and only once.
    let done: Vec<&Value> = seen
        .iter()
        .filter(|m| m["method"] == "search/done")
        .collect();
    assert_eq!(done.len(), 1, "{seen:?}");
    assert_eq!(seen.last().unwrap()["method"], "search/done");
    let done = &done[0]["params"];
    assert_eq!(done["cancelled"], true);
    assert_eq!(done["truncated"], false);
    let sent = done["matches"].as_u64().unwrap();
    // The first match, then the rest of `seen` but the done itself.
    assert_eq!(sent, seen.len() as u64, "every counted match arrived");
    assert!(sent < total, "the search was stopped mid-stream: {sent}");

    // Nothing about the search follows.
    let status = client.send_request("environment/status", json!({})).await;
    let (answer, seen) = until_response(&mut client, status, "big").await;
    assert!(answer.is_ok());
    assert_eq!(seen, Vec::<Value>::new());

    // Cancelling again, or an id never started, is not an error.
    for id in ["big", "never"] {
        assert_eq!(
            client.call("search/cancel", json!({"searchId": id})).await,
            json!({})
        );
    }
}

#[tokio::test]
async fn a_detached_search_stops_and_frees_its_id() {
    let (_dir, root) = big_tree(50, 1_000);
    let server = WsServer::start(&[]).await;
    let mut client = server.connect().await;
    client.opt_in(&["search"]);
    let session = client.handshake().await;
    let start = client
        .send_request("search/start", start_params("d", &root, "needle"))
        .await;
    client.response(start).await.unwrap();
    client.notification("search/match").await;
    client.close().await;
    drop(client);

    let mut client = server.connect().await;
    client.opt_in(&["search"]);
    crate::handshake::retry_resume(&mut client, &session).await;
    // Whatever state the old search was in, after the cancel's answer it is gone.
    client.call("search/cancel", json!({"searchId": "d"})).await;
    drain_pending(&mut client).await;
    let (tiny_dir, tiny) = tree(&[("a", "needle\n")]);
    let (_, matches, done) = search(&mut client, start_params("d", &tiny, "needle")).await;
    assert_eq!(matches.len(), 1);
    assert_eq!(done["cancelled"], false);
    drop(tiny_dir);
}

// ---- sandbox -----------------------------------------------------------------------

#[tokio::test]
async fn sandbox_that_needs_enforcement_fails_closed() {
    let (_dir, root) = tree(&[("a", "x\n")]);
    let mut client = started(None).await;
    let restricted = json!({"permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
        {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}
    ]}}});
    for extra in [
        json!({"sandbox": restricted}),
        json!({"sandbox": {"sandboxPolicy": {"type": "read-only"}}}),
        json!({"sandboxPolicy": {"type": "workspace-write"}}),
    ] {
        let err = client
            .call_err("search/start", with(start_params("s", &root, "x"), extra))
            .await;
        assert_error(
            &err,
            -32600,
            "filesystem sandbox cannot be enforced on this executor",
        );
    }
    let err = client
        .call_err(
            "search/start",
            with(start_params("s", &root, "x"), json!({"sandbox": {}})),
        )
        .await;
    assert_eq!(err["code"], -32602, "{err}");

    for sandbox in [
        json!({"sandboxPolicy": {"type": "danger-full-access"}}),
        json!({"permissions": {"type": "disabled"}}),
        Value::Null,
    ] {
        let params = with(start_params("s", &root, "x"), json!({"sandbox": sandbox}));
        let (_, matches, _) = search(&mut client, params).await;
        assert_eq!(matches.len(), 1);
    }
}

// ---- switches and errors -----------------------------------------------------------

fn run_binary(args: &[&str]) -> Output {
    std::process::Command::new(server_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

#[tokio::test]
async fn switched_off_search_answers_disabled() {
    for config in [
        "[plugins.search]\nenabled = false\n",
        "[methods]\ndisabled = [\"search/*\"]\n",
    ] {
        let mut client = started(Some(config)).await;
        for method in ["search/start", "search/cancel"] {
            let err = client.call_err(method, json!({"searchId": "x"})).await;
            assert_error(
                &err,
                -32601,
                &format!("method `{method}` is disabled on this server"),
            );
        }
        let file = config_file(config);
        let out = run_binary(&["methods", "--config", file.to_str().unwrap()]);
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        for method in ["search/start ", "search/cancel "] {
            let row = text.lines().find(|l| l.starts_with(method)).expect(&text);
            assert!(row.contains("disabled") && row.contains("search"), "{row}");
        }
    }
    let out = run_binary(&["methods"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("search/start "))
        .expect(&text);
    assert!(row.contains("yes"), "{row}");
}

#[tokio::test]
async fn bad_params_are_refused() {
    let (_dir, root) = tree(&[("a", "x\n")]);
    let mut client = Client::stdio(&[]).await;
    let err = client
        .call_err("search/start", start_params("s", &root, "x"))
        .await;
    assert_error(
        &err,
        -32600,
        "client must call initialize before using search methods",
    );
    client.opt_in(&["search"]);
    client.handshake().await;

    let uri = to_file_uri(&root);
    let cases = [
        (json!({"searchId": "s", "path": uri}), None),
        (json!({"searchId": "s", "path": uri, "pattern": 7}), None),
        (json!({"path": uri, "pattern": "x"}), None),
        (json!({"searchId": "s", "path": uri, "pattern": "x", "include": "*.rs"}), None),
        (
            json!({"searchId": "s", "path": "src", "pattern": "x"}),
            Some("invalid path `src`: relative paths are not accepted; expected a file: URI or an absolute path"),
        ),
        (
            json!({"searchId": "", "path": uri, "pattern": "x"}),
            Some("searchId must not be empty"),
        ),
        (
            json!({"searchId": "s", "path": uri, "pattern": ""}),
            Some("pattern must not be empty"),
        ),
        (
            json!({"searchId": "s", "path": uri, "pattern": "(", "regex": true}),
            None,
        ),
        (
            json!({"searchId": "s", "path": uri, "pattern": "x", "include": ["a["]}),
            None,
        ),
        (
            json!({"searchId": "s", "path": uri, "pattern": "x", "exclude": ["!a"]}),
            Some("invalid exclude glob `!a`: globs must not start with `!`"),
        ),
    ];
    for (params, message) in cases {
        let err = client.call_err("search/start", params.clone()).await;
        match message {
            Some(message) => assert_error(&err, -32602, message),
            None => assert_eq!(err["code"], -32602, "{params} → {err}"),
        }
    }
    let err = client.call_err("search/cancel", json!({})).await;
    assert_eq!(err["code"], -32602, "{err}");

    let missing = to_file_uri(&root.join("missing"));
    let err = client
        .call_err(
            "search/start",
            json!({"searchId": "s", "path": missing, "pattern": "x"}),
        )
        .await;
    assert_eq!(err["code"], -32004, "{err}");
}

/// Reference clients drop the connection on a notification they do not know, so a
/// connection that did not opt in to `search` at `initialize` is refused instead of being
/// sent `search/match` and `search/done`.
#[tokio::test]
async fn search_needs_the_extension_opt_in() {
    let (_dir, root) = tree(&[("a", "needle\n")]);
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let err = client
        .call_err("search/start", start_params("s", &root, "needle"))
        .await;
    assert_error(
        &err,
        -32600,
        "search/start sends `search/match` and `search/done` notifications, which this connection did not opt in to; list `search` in initialize.params.extensions",
    );
    // Unknown extension names are ignored, and naming `search` among them opts in.
    let mut client = Client::stdio(&[]).await;
    client.opt_in(&["no-such-extension", "search"]);
    client.handshake().await;
    let (_, matches, done) = search(&mut client, start_params("s", &root, "needle")).await;
    assert_eq!(matches.len(), 1);
    assert_eq!(done["matches"], 1);
}

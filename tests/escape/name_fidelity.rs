//! Every name the server returns identifies exactly one file, and names in its log cannot
//! forge lines (docs/SECURITY.md, "Name fidelity").
//!
//! A directory holds `a\xff` (not UTF-8) and a file literally named `a\u{FFFD}`: a lossy
//! listing shows both as `a�`. The listing must mark the lossy one with its byte-exact
//! URI, and a client that uses the lossy text as a path anyway must be refused rather
//! than handed (or made to delete) the other file.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{json, Value};

use crate::sandbox::{entry, landlock_available, managed, root_read};
use crate::util::*;

const LOSSY: &str = "a\u{FFFD}";
const NOT_UTF8_CONTENT: &str = "the file named a\\xff";
const LITERAL_CONTENT: &str = "the file named a\\u{FFFD}";

/// A directory holding both lookalikes; returns it (canonical) and the non-UTF-8 file.
fn lookalikes() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let not_utf8 = root.join(OsString::from_vec(b"a\xff".to_vec()));
    std::fs::write(&not_utf8, NOT_UTF8_CONTENT).unwrap();
    std::fs::write(root.join(LOSSY), LITERAL_CONTENT).unwrap();
    (dir, root, not_utf8)
}

fn text(path: &Path) -> String {
    path.to_str().unwrap().to_owned()
}

/// `file://` + the path, every byte outside ASCII letters, digits and `/._-` encoded.
fn encoded_uri(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file://");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/._-".contains(&b) {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri
}

fn ambiguous(path: &str) -> String {
    format!(
        "ambiguous path {path}: a name that is not UTF-8 reads the same; address it by its file: URI"
    )
}

/// Adds `sandbox` to `params` when there is one.
fn with(sandbox: &Option<Value>, mut params: Value) -> Value {
    if let Some(policy) = sandbox {
        params["sandbox"] = policy.clone();
    }
    params
}

async fn read(client: &mut Client, sandbox: &Option<Value>, path: &str) -> Result<String, Value> {
    let answer = client
        .request("fs/readFile", with(sandbox, json!({"path": path})))
        .await?;
    Ok(String::from_utf8(b64decode(&answer["dataBase64"])).unwrap())
}

/// The reported attack, as the client runs it with `sandbox` (or none).
async fn lookalikes_are_marked_and_refused(sandbox: Option<Value>) {
    let (_dir, root, not_utf8) = lookalikes();
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;

    // The listing: codex's lossy text for both, the non-UTF-8 one marked with its URI,
    // the UTF-8 one exactly as codex sends it.
    let listing = client
        .call(
            "fs/readDirectory",
            with(&sandbox, json!({"path": text(&root)})),
        )
        .await;
    let entries = listing["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{listing}");
    let marked: Vec<&Value> = entries
        .iter()
        .filter(|e| e.get("nameIsExact").is_some())
        .collect();
    assert_eq!(marked.len(), 1, "{listing}");
    assert_eq!(marked[0]["nameIsExact"], false);
    assert_eq!(marked[0]["fileName"], LOSSY);
    let plain = entries
        .iter()
        .find(|e| e.get("nameIsExact").is_none())
        .unwrap();
    assert_eq!(
        plain,
        &json!({"fileName": LOSSY, "isDirectory": false, "isFile": true})
    );
    let uri = marked[0]["uri"].as_str().unwrap().to_owned();
    assert_eq!(uri, encoded_uri(&not_utf8));
    assert_eq!(
        read(&mut client, &sandbox, &uri).await.unwrap(),
        NOT_UTF8_CONTENT
    );

    // The lossy text as a path, native or as a URI with the character itself: refused
    // by every method, and nothing is touched.
    let spelled = format!("{}/{LOSSY}", text(&root));
    let spelled_uri = format!("file://{spelled}");
    for path in [&spelled, &spelled_uri] {
        let error = read(&mut client, &sandbox, path).await.unwrap_err();
        assert_error(&error, -32602, &ambiguous(&spelled));
        for (method, params) in [
            ("fs/remove", json!({"path": path})),
            ("fs/getMetadata", json!({"path": path})),
            (
                "fs/writeFile",
                json!({"path": path, "dataBase64": b64("overwritten")}),
            ),
            (
                "fs/copy",
                json!({"sourcePath": path, "destinationPath": text(&root.join("copy")),
                       "recursive": false}),
            ),
        ] {
            let error = client.call_err(method, with(&sandbox, params)).await;
            assert_error(&error, -32602, &ambiguous(&spelled));
        }
    }
    assert_eq!(
        std::fs::read_to_string(&not_utf8).unwrap(),
        NOT_UTF8_CONTENT
    );
    assert_eq!(
        std::fs::read_to_string(root.join(LOSSY)).unwrap(),
        LITERAL_CONTENT
    );
    assert!(!root.join("copy").exists());

    // The literal name stays reachable byte-exactly: U+FFFD percent-encoded.
    let literal_uri = encoded_uri(&root.join(LOSSY));
    assert_eq!(
        read(&mut client, &sandbox, &literal_uri).await.unwrap(),
        LITERAL_CONTENT
    );

    // Removing by the marked URI removes exactly the non-UTF-8 file; then the name is no
    // longer ambiguous and works as any other.
    client
        .call("fs/remove", with(&sandbox, json!({"path": uri})))
        .await;
    assert!(!not_utf8.exists());
    assert!(root.join(LOSSY).exists());
    assert_eq!(
        read(&mut client, &sandbox, &spelled).await.unwrap(),
        LITERAL_CONTENT
    );
    client
        .call("fs/remove", with(&sandbox, json!({"path": spelled})))
        .await;
    assert!(!root.join(LOSSY).exists());
}

#[tokio::test]
async fn lossy_names_are_marked_and_lookalike_paths_refused() {
    lookalikes_are_marked_and_refused(None).await;
}

#[tokio::test]
async fn lossy_names_are_marked_and_refused_in_the_fs_helper() {
    if !landlock_available() {
        return;
    }
    // The lookalikes are made under the temporary directory, writable here.
    let tmp = std::fs::canonicalize(std::env::temp_dir()).unwrap();
    let policy = managed(vec![root_read(), entry(&text(&tmp), "write")]);
    lookalikes_are_marked_and_refused(Some(policy)).await;
}

#[tokio::test]
async fn streamed_opens_of_a_lookalike_path_are_refused() {
    let (_dir, root, _not_utf8) = lookalikes();
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let spelled = format!("{}/{LOSSY}", text(&root));
    for mode in ["read", "replace"] {
        let error = client
            .call_err(
                "fs/open",
                json!({"path": spelled, "handleId": mode, "mode": mode}),
            )
            .await;
        assert_error(&error, -32602, &ambiguous(&spelled));
    }
    assert_eq!(
        std::fs::read_to_string(root.join(LOSSY)).unwrap(),
        LITERAL_CONTENT
    );
}

/// A client-chosen method name and process id, logged at debug level, with a newline and
/// a forged line after it: the log shows them escaped, on the line they belong to.
#[tokio::test]
async fn client_names_cannot_forge_log_lines() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut command = server_command(&["--listen", "stdio"]);
    command
        .env("RUST_LOG", "debug")
        .stderr(Stdio::from(log.reopen().unwrap()));
    let mut client = Client::stdio_with(command);
    let forged = "FORGED ERROR the server was compromised";
    // The client's name is logged at `info` when its session attaches.
    let mut initialize = client.initialize_params(None);
    initialize["clientName"] = json!(format!("c\n{forged}"));
    client.call("initialize", initialize).await;
    client
        .send(json!({"method": "initialized", "params": {}}))
        .await;
    client
        .call_err(&format!("no/such\n{forged}"), json!({}))
        .await;
    // A failed request's error text quotes the client's path.
    client
        .call_err(
            "fs/readFile",
            json!({"path": format!("/nonexistent\n{forged}")}),
        )
        .await;
    let _ = client
        .request(
            "process/start",
            json!({"processId": format!("p\n{forged}"), "argv": ["true"], "cwd": "file:///tmp",
                   "env": {"PATH": "/usr/bin:/bin"}, "tty": false}),
        )
        .await;
    client.close().await;
    client.child().wait().await.unwrap();
    let written = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        written.contains("FORGED"),
        "the names were not logged: {written}"
    );
    let forged_lines: Vec<&str> = written
        .lines()
        .filter(|line| line.starts_with("FORGED"))
        .collect();
    assert!(forged_lines.is_empty(), "{forged_lines:?}");
}

/// Sandbox deny entries of special kinds the server does not know are logged once per
/// connection: the kind is the client's text, so it is quoted (no forged line), cut short,
/// and a connection's log remembers a bounded number of kinds (no unbounded memory, no
/// log flood), however many a client sends.
#[tokio::test]
async fn ignored_sandbox_kinds_are_quoted_and_bounded() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut command = server_command(&["--listen", "stdio"]);
    command.stderr(Stdio::from(log.reopen().unwrap()));
    let mut client = Client::stdio_with(command);
    client.handshake().await;
    let forged = "FORGED ERROR the server was compromised";
    let kind = |i: usize| format!("k{i}\n{forged}{}", "x".repeat(4096));
    for round in 0..3 {
        let mut entries = vec![root_read()];
        entries.extend((0..100).map(|i| {
            json!({"path": {"type": "special", "value": {"kind": kind(round * 100 + i)}},
                   "access": "deny"})
        }));
        let params = json!({"path": "file:///", "sandbox": managed(entries)});
        let _ = client.request("fs/getMetadata", params).await;
    }
    client.close().await;
    client.child().wait().await.unwrap();
    let written = std::fs::read_to_string(log.path()).unwrap();
    let logged: Vec<&str> = written
        .lines()
        .filter(|line| line.contains("unsupported special path kind \""))
        .collect();
    assert!(!logged.is_empty(), "nothing logged: {written}");
    assert!(logged.len() <= 64, "{} lines logged", logged.len());
    assert!(
        logged.iter().all(|line| line.len() < 1024),
        "a kind was logged whole"
    );
    let forged_lines: Vec<&str> = written
        .lines()
        .filter(|line| line.starts_with("FORGED"))
        .collect();
    assert!(forged_lines.is_empty(), "{forged_lines:?}");
}

/// `process/start` with a working directory spelled like a name that is not UTF-8 is
/// refused, not started in the other directory.
#[tokio::test]
async fn a_process_never_starts_in_a_lookalike_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir(root.join(OsString::from_vec(b"d\xff".to_vec()))).unwrap();
    std::fs::create_dir(root.join("d\u{FFFD}")).unwrap();
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let cwd = format!("{}/d\u{FFFD}", root.to_str().unwrap());
    let params = json!({"processId": "p", "argv": ["/bin/true"], "cwd": cwd,
        "env": {"PATH": "/usr/bin:/bin"}, "tty": false});
    let error = client.call_err("process/start", params).await;
    assert_eq!(error["code"], -32602, "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("ambiguous path"),
        "{error}"
    );
}

/// A tree for the path-crossing attacks: `root/caf\xe9/prod.env` (a directory whose name is
/// not UTF-8), `root/link` → `caf\xe9`, `root/ws/to-other` → `root/other/sub`, and
/// `root/other/x/secret` beside `root/ws/x/secret` with other contents.
struct Crossing {
    _dir: tempfile::TempDir,
    root: PathBuf,
    not_utf8: PathBuf,
}

fn crossing() -> Crossing {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let not_utf8 = root.join(OsString::from_vec(b"caf\xe9".to_vec()));
    std::fs::create_dir(&not_utf8).unwrap();
    std::fs::write(not_utf8.join("prod.env"), "TOKEN=secret-in-prod-env").unwrap();
    std::os::unix::fs::symlink(&not_utf8, root.join("link")).unwrap();
    for (dir, content) in [("ws/x", "lexical"), ("other/x", "through the link")] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
        std::fs::write(root.join(dir).join("secret"), content).unwrap();
    }
    std::fs::create_dir_all(root.join("other/sub")).unwrap();
    std::os::unix::fs::symlink(root.join("other/sub"), root.join("ws/to-other")).unwrap();
    Crossing {
        _dir: dir,
        root,
        not_utf8,
    }
}

/// A deny glob below a directory whose name is not UTF-8 hides its files from sandboxed
/// processes too, whether the glob is an absolute `file:` URI or relative to a working
/// directory reached through a link (its prefix was scanned as lossy text, so nothing was
/// hidden).
#[tokio::test]
async fn deny_globs_below_names_that_are_not_utf8_hold_for_processes() {
    if !landlock_available() {
        return;
    }
    let tree = crossing();
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let absolute = format!("{}/**/*.env", encoded_uri(&tree.not_utf8));
    let cwd_entry = json!({"path": {"type": "special", "value": {"kind": "current_working_directory"}}, "access": "write"});
    for (n, (glob, cwd)) in [
        (absolute.as_str(), text(&tree.root)),
        ("**/*.env", text(&tree.root.join("link"))),
    ]
    .into_iter()
    .enumerate()
    {
        let deny = json!({"path": {"type": "glob_pattern", "pattern": glob}, "access": "deny"});
        let policy = managed(vec![root_read(), cwd_entry.clone(), deny]);
        let id = format!("p{n}");
        let file = format!("{}/link/prod.env", text(&tree.root));
        crate::sandbox::start_sandboxed(&mut client, &id, json!(["/bin/cat", file]), &cwd, &policy)
            .await;
        // Narrowing hides the file (it reads as empty or not at all).
        let (output, _) = crate::sandbox::run_to_exit(&mut client, &id).await;
        assert!(!output.contains("secret-in-prod-env"), "{glob}: {output}");
        // The fs helper refuses the same read.
        let mut fs_policy = policy.clone();
        fs_policy["cwd"] = json!(cwd);
        let error = client
            .call_err("fs/readFile", json!({"path": file, "sandbox": fs_policy}))
            .await;
        assert_eq!(error["data"]["sandboxDenied"], true, "{glob}: {error}");
    }
}

/// A lookalike path spelled through a link and `..` is checked where the kernel resolves
/// it, in the fs helper too: the helper was sent a canonical URI, read its `..` lexically
/// and looked for lookalikes in another directory.
#[tokio::test]
async fn lookalike_checks_in_the_fs_helper_follow_links_like_the_kernel() {
    if !landlock_available() {
        return;
    }
    let tree = crossing();
    let other = tree.root.join("other");
    std::fs::write(other.join(OsString::from_vec(b"a\xff".to_vec())), "x").unwrap();
    std::fs::write(other.join(LOSSY), "the lookalike").unwrap();
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let policy = managed(vec![root_read(), entry(&text(&other), "write")]);
    let spelled = format!("{}/ws/to-other/../{LOSSY}", text(&tree.root));
    let error = client
        .call_err(
            "fs/remove",
            json!({"path": spelled, "recursive": false, "force": false, "sandbox": policy}),
        )
        .await;
    assert_eq!(error["message"], ambiguous(&spelled), "{error}");
    assert!(other.join(LOSSY).exists());
}

/// Names a walk returns read back as the files walked, though its root reaches them
/// through a link and `..` (a URI reader resolves `..` lexically).
#[tokio::test]
async fn walked_names_read_back_as_the_files_walked() {
    let tree = crossing();
    let mut client = Client::stdio(&[]).await;
    client.handshake().await;
    let root = format!("{}/ws/to-other/../x", text(&tree.root));
    let walk = client
        .call(
            "fs/walk",
            json!({"path": root, "options": {"maxDepth": 2, "maxDirectories": 10,
                "maxEntries": 10, "followDirectorySymlinks": false}}),
        )
        .await;
    let entries = walk["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{walk}");
    let uri = entries[0]["path"].as_str().unwrap();
    let read = read(&mut client, &None, uri).await.unwrap();
    assert_eq!(read, "through the link", "{uri}");
}

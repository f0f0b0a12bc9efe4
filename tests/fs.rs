//! `fs/*` end to end (PROTOCOL §5): real files in temporary directories, the real binary.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use exec_server_proto::path::to_file_uri;
use serde_json::{json, Value};

use crate::util::{assert_error, b64, b64decode, config_file, server_bin, Client, WsServer};

// ---- fixtures ------------------------------------------------------------------------

/// The canonical `file:` URI of a path.
fn uri(path: &Path) -> String {
    to_file_uri(path)
}

/// The native form of a (UTF-8) path, as sent by older clients.
fn native(path: &Path) -> String {
    path.to_str().expect("test paths are UTF-8").to_owned()
}

/// Both wire forms of a path.
fn forms(path: &Path) -> [String; 2] {
    [uri(path), native(path)]
}

/// A temporary directory under its canonical name, so results compare byte for byte.
fn temp_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let real = std::fs::canonicalize(dir.path()).unwrap();
    (dir, real)
}

/// A stdio server with the handshake done; `config` is the text of a `--config` file.
async fn started(config: Option<&str>) -> Client {
    let file = config.map(config_file);
    let args = match &file {
        Some(file) => vec!["--config", file.to_str().unwrap()],
        None => vec![],
    };
    let mut client = Client::stdio(&args).await;
    // Once the server answers, it has read the file, which may then go.
    client.handshake().await;
    client
}

fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Asserts an OS error: its code and the `(os error N)` suffix of its message.
#[track_caller]
fn assert_os_error(error: &Value, code: i64, errno: i32) {
    assert_eq!(error["code"], code, "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.ends_with(&format!("(os error {errno})")),
        "expected errno {errno} in {error}"
    );
}

/// Deterministic, non-repeating test bytes.
fn pattern(len: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as u8
        })
        .collect()
}

fn walk_options(max_depth: usize, max_directories: usize, max_entries: usize) -> Value {
    json!({
        "maxDepth": max_depth,
        "maxDirectories": max_directories,
        "maxEntries": max_entries,
        "followDirectorySymlinks": false
    })
}

/// Walk entries as paths relative to `root` (directories end in `/`).
fn walked(root: &Path, result: &Value) -> Vec<String> {
    let prefix = uri(root);
    result["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let path = e["path"].as_str().unwrap();
            let rel = path.strip_prefix(&prefix).unwrap().trim_start_matches('/');
            match e["kind"].as_str().unwrap() {
                "directory" => format!("{rel}/"),
                "file" => rel.to_owned(),
                other => panic!("unknown kind {other}"),
            }
        })
        .collect()
}

// ---- every method over both transports -----------------------------------------------

both_transports!(tour_of_every_method, |mut client: Client| async move {
    client.handshake().await;
    let (_keep, dir) = temp_dir();
    let file = dir.join("greeting.txt");

    let written = client
        .call(
            "fs/writeFile",
            json!({"path": uri(&file), "dataBase64": b64("hello world\n")}),
        )
        .await;
    assert_eq!(written, json!({}));
    let read = client
        .call("fs/readFile", json!({"path": native(&file)}))
        .await;
    assert_eq!(read, json!({"dataBase64": "aGVsbG8gd29ybGQK"}));

    let created = client
        .call(
            "fs/createDirectory",
            json!({"path": uri(&dir.join("a/b/c"))}),
        )
        .await;
    assert_eq!(created, json!({}));
    let meta = client
        .call("fs/getMetadata", json!({"path": uri(&file)}))
        .await;
    assert_eq!(meta["isFile"], true);
    assert_eq!(meta["size"], 12);
    let canonical = client
        .call(
            "fs/canonicalize",
            json!({"path": format!("{}/a/../greeting.txt", native(&dir))}),
        )
        .await;
    assert_eq!(canonical, json!({"path": uri(&file)}));
    let listing = client
        .call("fs/readDirectory", json!({"path": uri(&dir.join("a"))}))
        .await;
    assert_eq!(
        listing,
        json!({"entries": [{"fileName": "b", "isDirectory": true, "isFile": false}]})
    );
    let walk = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir.join("a")), "options": walk_options(8, 100, 1000)}),
        )
        .await;
    assert_eq!(
        walk,
        json!({"entries": [
            {"path": uri(&dir.join("a/b")), "kind": "directory"},
            {"path": uri(&dir.join("a/b/c")), "kind": "directory"}
        ], "errors": [], "truncated": false})
    );
    let copied = client
        .call("fs/copy", json!({"sourcePath": uri(&file), "destinationPath": uri(&dir.join("greeting.bak")), "recursive": false}))
        .await;
    assert_eq!(copied, json!({}));
    assert_eq!(
        std::fs::read(dir.join("greeting.bak")).unwrap(),
        b"hello world\n"
    );

    let opened = client
        .call("fs/open", json!({"handleId": "r1", "path": uri(&file)}))
        .await;
    assert_eq!(opened, json!({"handleId": "r1"}));
    let block = client
        .call(
            "fs/readBlock",
            json!({"handleId": "r1", "offset": 6, "len": 1048576}),
        )
        .await;
    assert_eq!(block, json!({"chunk": b64("world\n"), "eof": true}));
    assert_eq!(
        client.call("fs/close", json!({"handleId": "r1"})).await,
        json!({})
    );

    let removed = client
        .call("fs/remove", json!({"path": uri(&dir.join("a"))}))
        .await;
    assert_eq!(removed, json!({}));
    assert!(!dir.join("a").exists());
});

#[tokio::test]
async fn methods_are_gated_by_the_handshake_and_switchable() {
    let mut client = Client::stdio(&[]).await;
    let error = client
        .call_err("fs/readFile", json!({"path": "/etc/hostname"}))
        .await;
    assert_error(
        &error,
        -32600,
        "client must call initialize before using filesystem methods",
    );

    let config = config_file("[plugins.fs]\nenabled = false\n");
    let mut client = Client::stdio(&["--config", config.to_str().unwrap()]).await;
    client.handshake().await;
    let error = client.call_err("fs/walk", json!({})).await;
    assert_error(
        &error,
        -32601,
        "method `fs/walk` is disabled on this server",
    );
}

#[test]
fn the_fs_table_is_configuration_with_typos_refused() {
    let config = config_file("[fs]\nmax_open_handles = 7\n");
    let out = std::process::Command::new(server_bin())
        .args(["config", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: toml::Table = String::from_utf8_lossy(&out.stdout).parse().unwrap();
    assert_eq!(printed["fs"]["max_open_handles"].as_integer(), Some(7));
    assert_eq!(
        printed["fs"]["max_read_block_bytes"].as_integer(),
        Some(1048576)
    );

    let typo = config_file("[fs]\nmax_open_handle = 7\n");
    let out = std::process::Command::new(server_bin())
        .args(["--listen", "stdio", "--config", typo.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("invalid config: "), "{stderr}");
    assert!(stderr.contains("max_open_handle"), "{stderr}");
}

// ---- paths (§5.1) and error mapping (§5.3) ---------------------------------------------

#[tokio::test]
async fn both_path_forms_localhost_and_percent_encoding() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let file = dir.join("a b#?%é.txt");
    std::fs::write(&file, b"odd name").unwrap();
    let encoded = uri(&file);
    assert!(encoded.ends_with("/a%20b%23%3F%25%C3%A9.txt"), "{encoded}");
    let localhost = encoded.replacen("file://", "FILE://localhost", 1);
    let dotted = format!("file://{}/x/../a%20b%23%3F%25%C3%A9.txt", native(&dir));
    for path in [encoded.clone(), native(&file), localhost, dotted] {
        let read = client.call("fs/readFile", json!({"path": path})).await;
        assert_eq!(b64decode(&read["dataBase64"]), b"odd name", "{path}");
    }
    let canonical = client
        .call("fs/canonicalize", json!({"path": native(&file)}))
        .await;
    assert_eq!(canonical["path"], encoded);
}

#[tokio::test]
async fn unacceptable_paths_are_refused_with_the_spec_codes() {
    let mut client = started(None).await;
    for bad in [
        "src/main.rs",
        "./x",
        "",
        "http://example.com/x",
        "file://host/tmp/x",
        "file:///tmp/x?q",
    ] {
        let error = client
            .call_err("fs/getMetadata", json!({"path": bad}))
            .await;
        assert_eq!(error["code"], -32602, "{bad}: {error}");
        let prefix = format!("invalid path `{bad}`: ");
        assert!(
            error["message"].as_str().unwrap().starts_with(&prefix),
            "{error}"
        );
    }
    let error = client
        .call_err("fs/readFile", json!({"path": "file:///C:/Users/x"}))
        .await;
    assert_error(&error, -32600, "'file:///C:/Users/x' is invalid on 'linux'");
    // Both members of fs/copy are checked.
    let error = client
        .call_err(
            "fs/copy",
            json!({"sourcePath": "/tmp", "destinationPath": "rel", "recursive": true}),
        )
        .await;
    assert_eq!(error["code"], -32602);
}

#[tokio::test]
async fn params_decode_with_defaults_for_null_members() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::write(dir.join("f"), b"x").unwrap();
    let error = client.call_err("fs/readFile", json!({})).await;
    assert_eq!(error["code"], -32602);
    assert!(
        error["message"].as_str().unwrap().contains("path"),
        "{error}"
    );
    let error = client
        .call_err(
            "fs/readFile",
            json!({"path": uri(&dir.join("f")), "followSymlinks": "yes"}),
        )
        .await;
    assert_eq!(error["code"], -32602);
    let error = client
        .call_err("fs/readFile", json!([uri(&dir.join("f"))]))
        .await;
    assert_eq!(error["code"], -32602);
    let read = client
        .call("fs/readFile", json!({"path": uri(&dir.join("f")), "followSymlinks": null, "sandbox": null, "unknown": 1}))
        .await;
    assert_eq!(read["dataBase64"], b64("x"));
    let error = client
        .call_err(
            "fs/readBlock",
            json!({"handleId": "h", "offset": 0, "len": 1.0}),
        )
        .await;
    assert_eq!(error["code"], -32602);
}

#[tokio::test]
async fn os_errors_map_to_not_found_invalid_request_or_internal() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    for path in forms(&dir.join("missing")) {
        let error = client.call_err("fs/readFile", json!({"path": path})).await;
        assert_os_error(&error, -32004, libc::ENOENT);
        assert_eq!(error.get("data"), None);
    }
    // Invalid input: a native path with a NUL byte.
    let error = client
        .call_err(
            "fs/getMetadata",
            json!({"path": format!("{}/a\u{0}b", native(&dir))}),
        )
        .await;
    assert_eq!(error["code"], -32600, "{error}");
    // Anything else: writing onto a directory.
    let error = client
        .call_err("fs/writeFile", json!({"path": uri(&dir), "dataBase64": ""}))
        .await;
    assert_os_error(&error, -32603, libc::EISDIR);
    if !is_root() {
        let secret = dir.join("secret");
        std::fs::write(&secret, b"x").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
        let error = client
            .call_err("fs/readFile", json!({"path": uri(&secret)}))
            .await;
        assert_os_error(&error, -32600, libc::EACCES);
    }
}

// ---- fs/readFile and fs/writeFile (§5.5, §5.6) ----------------------------------------

#[tokio::test]
async fn binary_content_round_trips_in_both_path_forms() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let every_byte: Vec<u8> = (0..=255u8).cycle().take(4099).collect();
    for (i, path) in forms(&dir.join("bin")).into_iter().enumerate() {
        let data = [&every_byte[..], &[i as u8]].concat();
        client
            .call(
                "fs/writeFile",
                json!({"path": path, "dataBase64": b64(&data)}),
            )
            .await;
        assert_eq!(std::fs::read(dir.join("bin")).unwrap(), data);
        let read = client.call("fs/readFile", json!({"path": path})).await;
        assert_eq!(b64decode(&read["dataBase64"]), data);
    }
    // Empty files, and unpadded base64 on input.
    client
        .call(
            "fs/writeFile",
            json!({"path": uri(&dir.join("empty")), "dataBase64": ""}),
        )
        .await;
    let read = client
        .call("fs/readFile", json!({"path": uri(&dir.join("empty"))}))
        .await;
    assert_eq!(read, json!({"dataBase64": ""}));
    client
        .call(
            "fs/writeFile",
            json!({"path": uri(&dir.join("hi")), "dataBase64": "aGk"}),
        )
        .await;
    assert_eq!(std::fs::read(dir.join("hi")).unwrap(), b"hi");
    let read = client
        .call("fs/readFile", json!({"path": uri(&dir.join("hi"))}))
        .await;
    assert_eq!(read, json!({"dataBase64": "aGk="}));
}

#[tokio::test]
async fn write_file_creates_truncates_and_keeps_modes() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let file = dir.join("f");
    std::fs::write(&file, b"a much longer original").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    client
        .call(
            "fs/writeFile",
            json!({"path": uri(&file), "dataBase64": b64("short")}),
        )
        .await;
    assert_eq!(std::fs::read(&file).unwrap(), b"short");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o640);

    let error = client
        .call_err(
            "fs/writeFile",
            json!({"path": uri(&dir.join("no/parent")), "dataBase64": ""}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);

    // Invalid base64 is -32600 and nothing is touched.
    let untouched = dir.join("untouched");
    for bad in ["not base64!", "aG k=", "a"] {
        let error = client
            .call_err(
                "fs/writeFile",
                json!({"path": uri(&untouched), "dataBase64": bad}),
            )
            .await;
        assert_eq!(error["code"], -32600, "{error}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.starts_with("fs/writeFile requires valid base64 dataBase64: "),
            "{message}"
        );
    }
    assert!(!untouched.exists());
    let error = client
        .call_err(
            "fs/writeFile",
            json!({"path": uri(&untouched), "dataBase64": 5}),
        )
        .await;
    assert_eq!(error["code"], -32602);
}

#[tokio::test]
async fn read_file_refuses_non_files_without_blocking_and_honours_the_limit() {
    let mut client = started(Some("[fs]\nmax_read_file_bytes = 10\n")).await;
    let (_keep, dir) = temp_dir();
    let error = client
        .call_err("fs/readFile", json!({"path": uri(&dir)}))
        .await;
    assert_error(
        &error,
        -32600,
        &format!("path `{}` is not a file", native(&dir)),
    );
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let error = client
        .call_err("fs/readFile", json!({"path": native(&fifo)}))
        .await;
    assert_error(
        &error,
        -32600,
        &format!("path `{}` is not a file", native(&fifo)),
    );

    std::fs::write(dir.join("ten"), b"0123456789").unwrap();
    std::fs::write(dir.join("eleven"), b"0123456789A").unwrap();
    let read = client
        .call("fs/readFile", json!({"path": uri(&dir.join("ten"))}))
        .await;
    assert_eq!(b64decode(&read["dataBase64"]), b"0123456789");
    let error = client
        .call_err("fs/readFile", json!({"path": uri(&dir.join("eleven"))}))
        .await;
    assert_error(
        &error,
        -32600,
        "file is too large to read: limit is 10 bytes",
    );
}

#[tokio::test]
async fn file_names_that_are_not_utf8() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let name = OsString::from_vec(b"caf\xe9-\xff.bin".to_vec());
    let file = dir.join(&name);
    let file_uri = format!("{}/caf%E9-%FF.bin", uri(&dir));
    assert_eq!(uri(&file), file_uri);

    client
        .call(
            "fs/writeFile",
            json!({"path": file_uri, "dataBase64": b64([0u8, 0xff, 0x80])}),
        )
        .await;
    assert_eq!(std::fs::read(&file).unwrap(), [0u8, 0xff, 0x80]);
    let read = client.call("fs/readFile", json!({"path": file_uri})).await;
    assert_eq!(b64decode(&read["dataBase64"]), [0u8, 0xff, 0x80]);
    let canonical = client
        .call("fs/canonicalize", json!({"path": file_uri}))
        .await;
    assert_eq!(canonical["path"], file_uri);
    let listing = client
        .call("fs/readDirectory", json!({"path": uri(&dir)}))
        .await;
    assert_eq!(
        listing["entries"][0]["fileName"],
        "caf\u{FFFD}-\u{FFFD}.bin"
    );
    let walk = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(0, 1, 10)}),
        )
        .await;
    assert_eq!(walk["entries"], json!([{"path": file_uri, "kind": "file"}]));
    client.call("fs/copy", json!({"sourcePath": file_uri, "destinationPath": format!("{file_uri}.bak"), "recursive": false})).await;
    assert_eq!(
        std::fs::read(dir.join(OsString::from_vec(b"caf\xe9-\xff.bin.bak".to_vec()))).unwrap(),
        [0u8, 0xff, 0x80]
    );
    client
        .call(
            "fs/remove",
            json!({"path": file_uri, "recursive": false, "force": false}),
        )
        .await;
    assert!(!file.exists());
}

/// Files above 64 MiB come back whole through `fs/readFile` and through
/// `fs/open` + `fs/readBlock`. stdio has no inbound limit on the client side.
#[tokio::test]
async fn large_files_round_trip() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let data = pattern(64 * 1024 * 1024 + 1024 * 1024 + 3);
    let file = dir.join("large.bin");
    std::fs::write(&file, &data).unwrap();

    let read = client
        .call("fs/readFile", json!({"path": uri(&file)}))
        .await;
    assert!(
        b64decode(&read["dataBase64"]) == data,
        "fs/readFile content differs"
    );
    drop(read);

    client
        .call("fs/open", json!({"handleId": "big", "path": uri(&file)}))
        .await;
    let block = 1024 * 1024;
    let mut ids = Vec::new();
    for offset in (0..data.len()).step_by(block) {
        let id = client
            .send_request(
                "fs/readBlock",
                json!({"handleId": "big", "offset": offset, "len": block}),
            )
            .await;
        ids.push((id, offset));
    }
    let mut streamed = vec![0u8; data.len()];
    for (id, offset) in ids {
        let result = client.response(id).await.unwrap();
        let chunk = b64decode(&result["chunk"]);
        let last = offset + block >= data.len();
        assert_eq!(result["eof"], last, "eof at {offset}");
        streamed[offset..offset + chunk.len()].copy_from_slice(&chunk);
    }
    assert!(streamed == data, "streamed content differs");
    let past = client
        .call(
            "fs/readBlock",
            json!({"handleId": "big", "offset": data.len(), "len": 16}),
        )
        .await;
    assert_eq!(past, json!({"chunk": "", "eof": true}));

    // The largest write a 64 MiB message allows comes back intact too.
    let written = pattern(40 * 1024 * 1024);
    let copy = dir.join("written.bin");
    client
        .call(
            "fs/writeFile",
            json!({"path": uri(&copy), "dataBase64": b64(&written)}),
        )
        .await;
    assert!(
        std::fs::read(&copy).unwrap() == written,
        "written content differs"
    );
}

// ---- symbolic links (§5.4) -------------------------------------------------------------

#[tokio::test]
async fn read_and_write_follow_links_unless_told_not_to() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::write(dir.join("target"), b"through the link").unwrap();
    let link = dir.join("link");
    symlink("target", &link).unwrap();
    for path in forms(&link) {
        let read = client.call("fs/readFile", json!({"path": path})).await;
        assert_eq!(b64decode(&read["dataBase64"]), b"through the link");
        let error = client
            .call_err(
                "fs/readFile",
                json!({"path": path, "followSymlinks": false}),
            )
            .await;
        assert_error(
            &error,
            -32600,
            &format!("path `{}` is a symbolic link", native(&link)),
        );
        let error = client
            .call_err(
                "fs/writeFile",
                json!({"path": path, "dataBase64": b64("x"), "followSymlinks": false}),
            )
            .await;
        assert_error(
            &error,
            -32600,
            &format!("path `{}` is a symbolic link", native(&link)),
        );
    }
    assert_eq!(
        std::fs::read(dir.join("target")).unwrap(),
        b"through the link"
    );
    client
        .call(
            "fs/writeFile",
            json!({"path": uri(&link), "dataBase64": b64("rewritten")}),
        )
        .await;
    assert_eq!(std::fs::read(dir.join("target")).unwrap(), b"rewritten");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());

    // A dangling link: written through (creating the target), refused when not following.
    let dangling = dir.join("dangling");
    symlink("created-by-write", &dangling).unwrap();
    let error = client
        .call_err("fs/readFile", json!({"path": uri(&dangling)}))
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    client
        .call(
            "fs/writeFile",
            json!({"path": uri(&dangling), "dataBase64": b64("new")}),
        )
        .await;
    assert_eq!(std::fs::read(dir.join("created-by-write")).unwrap(), b"new");
    // A link into a missing directory cannot be written through.
    symlink("no-such-dir/file", dir.join("deep-dangling")).unwrap();
    let error = client
        .call_err(
            "fs/writeFile",
            json!({"path": uri(&dir.join("deep-dangling")), "dataBase64": ""}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    // Links in earlier components are always resolved.
    std::fs::create_dir(dir.join("real")).unwrap();
    std::fs::write(dir.join("real/inner"), b"inner").unwrap();
    symlink("real", dir.join("dir-link")).unwrap();
    let read = client
        .call(
            "fs/readFile",
            json!({"path": uri(&dir.join("dir-link/inner")), "followSymlinks": false}),
        )
        .await;
    assert_eq!(b64decode(&read["dataBase64"]), b"inner");
}

// ---- fs/createDirectory (§5.7) ---------------------------------------------------------

#[tokio::test]
async fn create_directory_recursive_and_single() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    for path in forms(&dir.join("a/b/c")) {
        assert_eq!(
            client
                .call("fs/createDirectory", json!({"path": path}))
                .await,
            json!({})
        );
        assert!(dir.join("a/b/c").is_dir());
    }
    // recursive: false needs the parent and refuses anything existing.
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": uri(&dir.join("x/y")), "recursive": false}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    client
        .call(
            "fs/createDirectory",
            json!({"path": uri(&dir.join("x")), "recursive": false}),
        )
        .await;
    assert!(dir.join("x").is_dir());
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": uri(&dir.join("x")), "recursive": false}),
        )
        .await;
    assert_error(&error, -32603, "File exists (os error 17)");
    // An existing non-directory on the way.
    std::fs::write(dir.join("file"), b"").unwrap();
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": uri(&dir.join("file"))}),
        )
        .await;
    assert_os_error(&error, -32603, libc::EEXIST);
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": uri(&dir.join("file/sub"))}),
        )
        .await;
    assert_os_error(&error, -32603, libc::ENOTDIR);
}

#[tokio::test]
async fn create_directory_over_a_link() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::create_dir(dir.join("real")).unwrap();
    symlink("real", dir.join("link")).unwrap();
    let link = uri(&dir.join("link"));
    assert_eq!(
        client
            .call("fs/createDirectory", json!({"path": link}))
            .await,
        json!({})
    );
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": link, "followSymlinks": false}),
        )
        .await;
    assert_os_error(&error, -32603, libc::EEXIST);
    let error = client
        .call_err(
            "fs/createDirectory",
            json!({"path": link, "recursive": false}),
        )
        .await;
    assert_os_error(&error, -32603, libc::EEXIST);
    // Through a link in an earlier component.
    client
        .call(
            "fs/createDirectory",
            json!({"path": uri(&dir.join("link/new"))}),
        )
        .await;
    assert!(dir.join("real/new").is_dir());
}

// ---- fs/getMetadata and fs/canonicalize (§5.8, §5.9) ------------------------------------

#[tokio::test]
async fn metadata_of_files_directories_links_and_specials() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let file = dir.join("f");
    std::fs::write(&file, b"12345").unwrap();
    let modified = std::fs::metadata(&file)
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for path in forms(&file) {
        let meta = client.call("fs/getMetadata", json!({"path": path})).await;
        assert_eq!(meta["isFile"], true);
        assert_eq!(meta["isDirectory"], false);
        assert_eq!(meta["isSymlink"], false);
        assert_eq!(meta["size"], 5);
        assert_eq!(meta["modifiedAtMs"], modified);
        assert!(meta["createdAtMs"].as_i64().unwrap() >= 0, "{meta}");
    }
    let meta = client
        .call("fs/getMetadata", json!({"path": uri(&dir)}))
        .await;
    assert_eq!(
        (meta["isDirectory"].as_bool(), meta["isFile"].as_bool()),
        (Some(true), Some(false))
    );

    symlink("f", dir.join("link")).unwrap();
    let followed = client
        .call("fs/getMetadata", json!({"path": uri(&dir.join("link"))}))
        .await;
    assert_eq!(followed["isFile"], true);
    assert_eq!(followed["isSymlink"], true);
    assert_eq!(followed["size"], 5);
    let own = client
        .call(
            "fs/getMetadata",
            json!({"path": uri(&dir.join("link")), "followSymlinks": false}),
        )
        .await;
    assert_eq!(own["isFile"], false);
    assert_eq!(own["isSymlink"], true);
    assert_eq!(own["size"], 1, "the length of the link text");

    symlink("missing", dir.join("dangling")).unwrap();
    let error = client
        .call_err(
            "fs/getMetadata",
            json!({"path": uri(&dir.join("dangling"))}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    let own = client
        .call(
            "fs/getMetadata",
            json!({"path": uri(&dir.join("dangling")), "followSymlinks": false}),
        )
        .await;
    assert_eq!(own["isSymlink"], true);

    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let meta = client
        .call("fs/getMetadata", json!({"path": uri(&fifo)}))
        .await;
    assert_eq!(
        (meta["isDirectory"].as_bool(), meta["isFile"].as_bool()),
        (Some(false), Some(false))
    );
    let error = client
        .call_err("fs/getMetadata", json!({"path": uri(&dir.join("missing"))}))
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
}

#[tokio::test]
async fn canonicalize_resolves_links_and_dots() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::create_dir_all(dir.join("real/sub")).unwrap();
    symlink("real", dir.join("link")).unwrap();
    let result = client
        .call(
            "fs/canonicalize",
            json!({"path": format!("{}/link/./sub/../sub", native(&dir))}),
        )
        .await;
    assert_eq!(result, json!({"path": uri(&dir.join("real/sub"))}));
    let result = client
        .call("fs/canonicalize", json!({"path": uri(&dir.join("link"))}))
        .await;
    assert_eq!(result, json!({"path": uri(&dir.join("real"))}));
    let error = client
        .call_err(
            "fs/canonicalize",
            json!({"path": uri(&dir.join("link/missing"))}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    symlink("missing", dir.join("dangling")).unwrap();
    let error = client
        .call_err(
            "fs/canonicalize",
            json!({"path": uri(&dir.join("dangling"))}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
}

// ---- fs/readDirectory (§5.10) ------------------------------------------------------------

#[tokio::test]
async fn read_directory_types_links_by_target_and_omits_dangling_ones() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("file"), b"").unwrap();
    symlink("sub", dir.join("sub-link")).unwrap();
    symlink("file", dir.join("file-link")).unwrap();
    symlink("missing", dir.join("dangling")).unwrap();
    mkfifo(&dir.join("fifo"));
    for path in forms(&dir) {
        let result = client.call("fs/readDirectory", json!({"path": path})).await;
        let mut entries = result["entries"].as_array().unwrap().clone();
        entries.sort_by_key(|e| e["fileName"].as_str().unwrap().to_owned());
        assert_eq!(
            Value::from(entries),
            json!([
                {"fileName": "fifo", "isDirectory": false, "isFile": false},
                {"fileName": "file", "isDirectory": false, "isFile": true},
                {"fileName": "file-link", "isDirectory": false, "isFile": true},
                {"fileName": "sub", "isDirectory": true, "isFile": false},
                {"fileName": "sub-link", "isDirectory": true, "isFile": false}
            ])
        );
    }
    let error = client
        .call_err(
            "fs/readDirectory",
            json!({"path": uri(&dir.join("missing"))}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    let error = client
        .call_err("fs/readDirectory", json!({"path": uri(&dir.join("file"))}))
        .await;
    assert_os_error(&error, -32603, libc::ENOTDIR);
    // Through a link to a directory.
    let result = client
        .call(
            "fs/readDirectory",
            json!({"path": uri(&dir.join("sub-link"))}),
        )
        .await;
    assert_eq!(result, json!({"entries": []}));
}

#[tokio::test]
async fn read_directory_entry_limit() {
    let mut client = started(Some("[fs]\nmax_directory_entries = 3\n")).await;
    let (_keep, dir) = temp_dir();
    for name in ["a", "b", "c"] {
        std::fs::write(dir.join(name), b"").unwrap();
    }
    let result = client
        .call("fs/readDirectory", json!({"path": uri(&dir)}))
        .await;
    assert_eq!(result["entries"].as_array().unwrap().len(), 3);
    for name in ["d", "e"] {
        std::fs::write(dir.join(name), b"").unwrap();
    }
    let error = client
        .call_err("fs/readDirectory", json!({"path": uri(&dir)}))
        .await;
    assert_error(
        &error,
        -32603,
        "fs/readDirectory returned 4 entries; limit is 3",
    );
}

// ---- fs/walk (§5.11) ---------------------------------------------------------------------

/// root/{Z, a/{d/{z}, y}, b/{x}, c.txt, .hidden/{h}}
fn walk_tree() -> (tempfile::TempDir, PathBuf) {
    let (keep, dir) = temp_dir();
    for d in ["a/d", "b", ".hidden"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    for f in ["Z", "a/d/z", "a/y", "b/x", "c.txt", ".hidden/h"] {
        std::fs::write(dir.join(f), b"").unwrap();
    }
    (keep, dir)
}

#[tokio::test]
async fn walk_is_breadth_first_sorted_and_pruned_on_request() {
    let mut client = started(None).await;
    let (_keep, dir) = walk_tree();
    for path in forms(&dir) {
        let result = client
            .call(
                "fs/walk",
                json!({"path": path, "options": walk_options(8, 100, 100)}),
            )
            .await;
        assert_eq!(
            walked(&dir, &result),
            [
                ".hidden/",
                "Z",
                "a/",
                "b/",
                "c.txt",
                ".hidden/h",
                "a/d/",
                "a/y",
                "b/x",
                "a/d/z"
            ]
        );
        assert_eq!(result["errors"], json!([]));
        assert_eq!(result["truncated"], false);
    }
    let mut prune = walk_options(8, 100, 100);
    prune["pruneHiddenDirectories"] = json!(true);
    let result = client
        .call("fs/walk", json!({"path": uri(&dir), "options": prune}))
        .await;
    assert_eq!(
        walked(&dir, &result),
        [".hidden/", "Z", "a/", "b/", "c.txt", "a/d/", "a/y", "b/x", "a/d/z"]
    );
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(0, 100, 100)}),
        )
        .await;
    assert_eq!(
        walked(&dir, &result),
        [".hidden/", "Z", "a/", "b/", "c.txt"]
    );
    assert_eq!(result["truncated"], false);
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(1, 100, 100)}),
        )
        .await;
    assert_eq!(
        walked(&dir, &result),
        [
            ".hidden/",
            "Z",
            "a/",
            "b/",
            "c.txt",
            ".hidden/h",
            "a/d/",
            "a/y",
            "b/x"
        ]
    );
}

#[tokio::test]
async fn walk_truncates_at_entry_and_directory_limits() {
    let mut client = started(None).await;
    let (_keep, dir) = walk_tree();
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(8, 100, 3)}),
        )
        .await;
    assert_eq!(walked(&dir, &result), [".hidden/", "Z", "a/"]);
    assert_eq!(result["truncated"], true);
    // The root counts as one directory: only `.hidden` is queued, the rest are listed but
    // not descended.
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(8, 2, 100)}),
        )
        .await;
    assert_eq!(
        walked(&dir, &result),
        [".hidden/", "Z", "a/", "b/", "c.txt", ".hidden/h"]
    );
    assert_eq!(result["truncated"], true);
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(8, 1, 100)}),
        )
        .await;
    assert_eq!(
        walked(&dir, &result),
        [".hidden/", "Z", "a/", "b/", "c.txt"]
    );
    assert_eq!(result["truncated"], true);
    // Exactly enough is not truncated.
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(8, 5, 10)}),
        )
        .await;
    assert_eq!(walked(&dir, &result).len(), 10);
    assert_eq!(result["truncated"], false);
}

#[tokio::test]
async fn walk_links_errors_and_roots() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::create_dir_all(dir.join("root/real")).unwrap();
    std::fs::create_dir_all(dir.join("outside/inner")).unwrap();
    std::fs::write(dir.join("root/real/f"), b"").unwrap();
    let root = dir.join("root");
    symlink("../outside", root.join("out")).unwrap();
    symlink("real/f", root.join("file-link")).unwrap();
    symlink("missing", root.join("dangling")).unwrap();
    symlink("..", root.join("real/up")).unwrap();

    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&root), "options": walk_options(8, 100, 100)}),
        )
        .await;
    assert_eq!(walked(&root, &result), ["real/", "real/f"]);
    assert_eq!(
        result["errors"],
        json!([{"path": uri(&root.join("dangling")), "message": "No such file or directory (os error 2)"}])
    );

    let mut follow = walk_options(8, 100, 100);
    follow["followDirectorySymlinks"] = json!(true);
    let result = client
        .call("fs/walk", json!({"path": uri(&root), "options": follow}))
        .await;
    // Followed directories are reported under the link's path; `real/up` leads back to
    // the root, which is listed but not descended again.
    assert_eq!(
        walked(&root, &result),
        ["out/", "real/", "out/inner/", "real/f", "real/up/"]
    );
    assert_eq!(result["errors"].as_array().unwrap().len(), 1);

    // Roots: a file or a non-followed link give an empty walk; a missing root is -32004.
    let empty = json!({"entries": [], "errors": [], "truncated": false});
    let file_root = client
        .call(
            "fs/walk",
            json!({"path": uri(&root.join("real/f")), "options": walk_options(8, 100, 100)}),
        )
        .await;
    assert_eq!(file_root, empty);
    let link_root = client
        .call(
            "fs/walk",
            json!({"path": uri(&root.join("out")), "options": walk_options(8, 100, 100)}),
        )
        .await;
    assert_eq!(link_root, empty);
    let followed_root = client
        .call(
            "fs/walk",
            json!({"path": uri(&root.join("out")), "options": follow}),
        )
        .await;
    assert_eq!(walked(&root.join("out"), &followed_root), ["inner/"]);
    let error = client
        .call_err(
            "fs/walk",
            json!({"path": uri(&dir.join("missing")), "options": walk_options(8, 100, 100)}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
}

#[tokio::test]
async fn walk_limits_are_validated_before_the_root_is_touched() {
    let mut client = started(Some(
        "[fs]\nwalk_max_depth = 2\nwalk_max_directories = 3\nwalk_max_entries = 4\n",
    ))
    .await;
    let missing = "file:///definitely/not/here";
    for options in [walk_options(0, 0, 1), walk_options(0, 1, 0)] {
        let error = client
            .call_err("fs/walk", json!({"path": missing, "options": options}))
            .await;
        assert_error(
            &error,
            -32600,
            "filesystem walk limits must be greater than zero",
        );
    }
    for options in [
        walk_options(3, 1, 1),
        walk_options(0, 4, 1),
        walk_options(0, 1, 5),
    ] {
        let error = client
            .call_err("fs/walk", json!({"path": missing, "options": options}))
            .await;
        assert_error(
            &error,
            -32600,
            "filesystem walk limits exceed maximums: depth=2, directories=3, entries=4",
        );
    }
    let error = client
        .call_err(
            "fs/walk",
            json!({"path": missing, "options": walk_options(2, 3, 4)}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    let error = client.call_err("fs/walk", json!({"path": missing})).await;
    assert_eq!(error["code"], -32602);
    let error = client
        .call_err("fs/walk", json!({"path": missing, "options": {"maxDepth": 1, "maxDirectories": 1, "maxEntries": 1}}))
        .await;
    assert_eq!(error["code"], -32602, "followDirectorySymlinks is required");
}

#[tokio::test]
async fn walk_response_budget_truncates() {
    let (_keep, dir) = temp_dir();
    for name in ["a", "b", "c", "d"] {
        std::fs::write(dir.join(name), b"").unwrap();
    }
    let per_entry = uri(&dir.join("a")).len() + 64;
    let config = format!("[fs]\nwalk_response_budget_bytes = {}\n", 2 * per_entry + 1);
    let mut client = started(Some(&config)).await;
    let result = client
        .call(
            "fs/walk",
            json!({"path": uri(&dir), "options": walk_options(8, 100, 100)}),
        )
        .await;
    assert_eq!(walked(&dir, &result), ["a", "b"]);
    assert_eq!(result["truncated"], true);
}

// ---- fs/remove (§5.12) -------------------------------------------------------------------

#[tokio::test]
async fn remove_files_trees_and_missing_paths() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    for path in forms(&dir.join("f")) {
        std::fs::write(dir.join("f"), b"").unwrap();
        assert_eq!(
            client.call("fs/remove", json!({"path": path})).await,
            json!({})
        );
        assert!(!dir.join("f").exists());
        // Missing: fine by default (force), -32004 without force.
        assert_eq!(
            client.call("fs/remove", json!({"path": path})).await,
            json!({})
        );
        let error = client
            .call_err("fs/remove", json!({"path": path, "force": false}))
            .await;
        assert_os_error(&error, -32004, libc::ENOENT);
    }
    std::fs::create_dir_all(dir.join("tree/a/b")).unwrap();
    std::fs::write(dir.join("tree/a/b/f"), b"").unwrap();
    let error = client
        .call_err(
            "fs/remove",
            json!({"path": uri(&dir.join("tree")), "recursive": false}),
        )
        .await;
    assert_os_error(&error, -32603, libc::ENOTEMPTY);
    client
        .call("fs/remove", json!({"path": uri(&dir.join("tree"))}))
        .await;
    assert!(!dir.join("tree").exists());
    std::fs::create_dir(dir.join("empty")).unwrap();
    client
        .call(
            "fs/remove",
            json!({"path": uri(&dir.join("empty")), "recursive": false, "force": false}),
        )
        .await;
    assert!(!dir.join("empty").exists());
    mkfifo(&dir.join("fifo"));
    client
        .call("fs/remove", json!({"path": uri(&dir.join("fifo"))}))
        .await;
    assert!(std::fs::symlink_metadata(dir.join("fifo")).is_err());
}

#[tokio::test]
async fn remove_takes_the_link_never_the_target() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::create_dir_all(dir.join("target/keep")).unwrap();
    std::fs::write(dir.join("target/keep/f"), b"precious").unwrap();
    for follow in [true, false] {
        symlink("target", dir.join("link")).unwrap();
        client
            .call("fs/remove", json!({"path": uri(&dir.join("link")), "followSymlinks": follow, "recursive": false}))
            .await;
        assert!(std::fs::symlink_metadata(dir.join("link")).is_err());
        assert_eq!(
            std::fs::read(dir.join("target/keep/f")).unwrap(),
            b"precious"
        );
    }
    // Links inside a removed tree are removed, not followed.
    std::fs::create_dir(dir.join("tree")).unwrap();
    symlink(dir.join("target"), dir.join("tree/inner-link")).unwrap();
    client
        .call("fs/remove", json!({"path": uri(&dir.join("tree"))}))
        .await;
    assert!(!dir.join("tree").exists());
    assert_eq!(
        std::fs::read(dir.join("target/keep/f")).unwrap(),
        b"precious"
    );
    // A dangling link is removed too.
    symlink("missing", dir.join("dangling")).unwrap();
    client
        .call(
            "fs/remove",
            json!({"path": uri(&dir.join("dangling")), "force": false}),
        )
        .await;
    assert!(std::fs::symlink_metadata(dir.join("dangling")).is_err());
}

// ---- fs/copy (§5.13) ---------------------------------------------------------------------

#[tokio::test]
async fn copy_files_with_their_permission_bits() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let source = dir.join("script.sh");
    std::fs::write(&source, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o751)).unwrap();
    for (from, destination) in forms(&source).into_iter().zip(forms(&dir.join("copy.sh"))) {
        client
            .call(
                "fs/copy",
                json!({"sourcePath": from, "destinationPath": destination, "recursive": false}),
            )
            .await;
        assert_eq!(std::fs::read(dir.join("copy.sh")).unwrap(), b"#!/bin/sh\n");
        let mode = std::fs::metadata(dir.join("copy.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o751);
    }
    // Overwrites an existing, longer file.
    std::fs::write(dir.join("longer"), b"a much longer existing file").unwrap();
    client
        .call("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": uri(&dir.join("longer")), "recursive": true}))
        .await;
    assert_eq!(std::fs::read(dir.join("longer")).unwrap(), b"#!/bin/sh\n");
    // Onto itself, directly or through a link: the content survives.
    symlink("script.sh", dir.join("self-link")).unwrap();
    for destination in [uri(&source), uri(&dir.join("self-link"))] {
        client
            .call("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": destination, "recursive": false}))
            .await;
        assert_eq!(std::fs::read(&source).unwrap(), b"#!/bin/sh\n");
    }
    let error = client
        .call_err("fs/copy", json!({"sourcePath": uri(&dir.join("missing")), "destinationPath": uri(&dir.join("x")), "recursive": false}))
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    let error = client
        .call_err("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": uri(&dir.join("no/parent")), "recursive": false}))
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
}

#[tokio::test]
async fn copy_trees_keep_links_skip_specials_and_merge() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let source = dir.join("src");
    std::fs::create_dir_all(source.join("nested/deeper")).unwrap();
    std::fs::write(source.join("nested/deeper/f"), b"deep").unwrap();
    std::fs::write(source.join("top"), b"top").unwrap();
    symlink("nested", source.join("dir-link")).unwrap();
    symlink("/nonexistent/target", source.join("dangling")).unwrap();
    mkfifo(&source.join("fifo"));
    let destination = dir.join("dst");
    std::fs::create_dir(&destination).unwrap();
    std::fs::write(destination.join("already-there"), b"kept").unwrap();
    std::fs::write(destination.join("top"), b"overwritten?").unwrap();

    client
        .call("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": native(&destination), "recursive": true}))
        .await;
    assert_eq!(
        std::fs::read(destination.join("nested/deeper/f")).unwrap(),
        b"deep"
    );
    assert_eq!(std::fs::read(destination.join("top")).unwrap(), b"top");
    assert_eq!(
        std::fs::read(destination.join("already-there")).unwrap(),
        b"kept"
    );
    assert_eq!(
        std::fs::read_link(destination.join("dir-link")).unwrap(),
        Path::new("nested")
    );
    assert_eq!(
        std::fs::read_link(destination.join("dangling")).unwrap(),
        Path::new("/nonexistent/target")
    );
    assert!(
        std::fs::symlink_metadata(destination.join("fifo")).is_err(),
        "specials are skipped"
    );

    // A missing destination is created, including missing parents.
    client
        .call("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": uri(&dir.join("new/copy")), "recursive": true}))
        .await;
    assert!(dir.join("new/copy/nested/deeper/f").is_file());

    let error = client
        .call_err("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": uri(&dir.join("x")), "recursive": false}))
        .await;
    assert_error(
        &error,
        -32600,
        "fs/copy requires recursive: true when sourcePath is a directory",
    );
}

#[tokio::test]
async fn copy_into_itself_is_refused() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let source = dir.join("src");
    std::fs::create_dir_all(source.join("nested")).unwrap();
    symlink("src", dir.join("alias")).unwrap();
    for destination in [
        uri(&source),
        native(&source.join("nested/copy")),
        uri(&dir.join("alias/nested/new/deeper")),
        format!("{}/alias/", native(&dir)),
    ] {
        let error = client
            .call_err("fs/copy", json!({"sourcePath": uri(&source), "destinationPath": destination, "recursive": true}))
            .await;
        assert_error(
            &error,
            -32600,
            "fs/copy cannot copy a directory to itself or one of its descendants",
        );
    }
    assert_eq!(
        std::fs::read_dir(source.join("nested")).unwrap().count(),
        0,
        "nothing was copied"
    );
    // A link to the directory is a link source: copied as a link, not refused.
    client
        .call("fs/copy", json!({"sourcePath": uri(&dir.join("alias")), "destinationPath": uri(&dir.join("alias2")), "recursive": false}))
        .await;
    assert_eq!(
        std::fs::read_link(dir.join("alias2")).unwrap(),
        Path::new("src")
    );
}

#[tokio::test]
async fn copy_links_as_links_and_refuses_specials() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::write(dir.join("target"), b"t").unwrap();
    symlink("target", dir.join("link")).unwrap();
    client
        .call("fs/copy", json!({"sourcePath": uri(&dir.join("link")), "destinationPath": uri(&dir.join("link2")), "recursive": false}))
        .await;
    assert_eq!(
        std::fs::read_link(dir.join("link2")).unwrap(),
        Path::new("target")
    );
    let error = client
        .call_err("fs/copy", json!({"sourcePath": uri(&dir.join("link")), "destinationPath": uri(&dir.join("target")), "recursive": false}))
        .await;
    assert_error(&error, -32603, "File exists (os error 17)");
    assert_eq!(std::fs::read(dir.join("target")).unwrap(), b"t");
    // Dangling links copy too.
    symlink("nowhere", dir.join("dangling")).unwrap();
    client
        .call("fs/copy", json!({"sourcePath": uri(&dir.join("dangling")), "destinationPath": uri(&dir.join("dangling2")), "recursive": true}))
        .await;
    assert_eq!(
        std::fs::read_link(dir.join("dangling2")).unwrap(),
        Path::new("nowhere")
    );

    mkfifo(&dir.join("fifo"));
    let error = client
        .call_err("fs/copy", json!({"sourcePath": uri(&dir.join("fifo")), "destinationPath": uri(&dir.join("fifo2")), "recursive": true}))
        .await;
    assert_error(
        &error,
        -32600,
        "fs/copy only supports regular files, directories, and symlinks",
    );
}

// ---- fs/open, fs/readBlock, fs/close (§5.14–§5.16) --------------------------------------

#[tokio::test]
async fn open_read_block_and_close() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let file = dir.join("f");
    std::fs::write(&file, b"0123456789").unwrap();
    for (i, path) in forms(&file).into_iter().enumerate() {
        let id = format!("h{i}");
        let opened = client
            .call("fs/open", json!({"handleId": id, "path": path}))
            .await;
        assert_eq!(opened, json!({"handleId": id}));
        let read = |offset: u64, len: u64| json!({"handleId": id, "offset": offset, "len": len});
        let cases: [(u64, u64, &[u8], bool); 5] = [
            (0, 4, b"0123", false),
            (8, 2, b"89", false),
            (8, 5, b"89", true),
            (10, 1, b"", true),
            (u64::MAX, 1, b"", true),
        ];
        for (offset, len, expected, eof) in cases {
            let block = client.call("fs/readBlock", read(offset, len)).await;
            assert_eq!(
                block,
                json!({"chunk": b64(expected), "eof": eof}),
                "{offset}+{len}"
            );
        }
        assert_eq!(
            client.call("fs/close", json!({"handleId": id})).await,
            json!({})
        );
        // Idempotent.
        assert_eq!(
            client.call("fs/close", json!({"handleId": id})).await,
            json!({})
        );
        let error = client.call_err("fs/readBlock", read(0, 1)).await;
        assert_error(&error, -32004, &format!("unknown file read handle `{id}`"));
    }
    assert_eq!(
        client
            .call("fs/close", json!({"handleId": "never-opened"}))
            .await,
        json!({})
    );
}

#[tokio::test]
async fn handle_ids_and_block_lengths_are_validated() {
    let mut client = started(Some("[fs]\nmax_read_block_bytes = 4\n")).await;
    let (_keep, dir) = temp_dir();
    let file = uri(&dir.join("f"));
    std::fs::write(dir.join("f"), b"0123456789").unwrap();
    let long = "x".repeat(33);
    let longest = "é".repeat(16);
    assert_eq!(longest.len(), 32);
    let too_long = "file read handle ID must not exceed 32 bytes";
    let error = client
        .call_err("fs/open", json!({"handleId": long, "path": file}))
        .await;
    assert_error(&error, -32600, too_long);
    let error = client
        .call_err(
            "fs/readBlock",
            json!({"handleId": long, "offset": 0, "len": 1}),
        )
        .await;
    assert_error(&error, -32600, too_long);
    let error = client.call_err("fs/close", json!({"handleId": long})).await;
    assert_error(&error, -32600, too_long);
    // A multi-byte id of 16 characters is 32 bytes: accepted.
    client
        .call("fs/open", json!({"handleId": longest, "path": file}))
        .await;

    let error = client
        .call_err("fs/open", json!({"handleId": longest, "path": file}))
        .await;
    assert_error(
        &error,
        -32600,
        &format!("file read handle `{longest}` already exists"),
    );
    for len in [0, 5] {
        let error = client
            .call_err(
                "fs/readBlock",
                json!({"handleId": longest, "offset": 0, "len": len}),
            )
            .await;
        assert_error(
            &error,
            -32600,
            "file read block length must be between 1 and 4",
        );
    }
    // The length is checked before the handle.
    let error = client
        .call_err(
            "fs/readBlock",
            json!({"handleId": "unknown", "offset": 0, "len": 0}),
        )
        .await;
    assert_error(
        &error,
        -32600,
        "file read block length must be between 1 and 4",
    );
    let block = client
        .call(
            "fs/readBlock",
            json!({"handleId": longest, "offset": 0, "len": 4}),
        )
        .await;
    assert_eq!(block, json!({"chunk": b64("0123"), "eof": false}));
}

#[tokio::test]
async fn open_refuses_non_files_without_blocking_and_follows_links() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let error = client
        .call_err("fs/open", json!({"handleId": "p", "path": uri(&fifo)}))
        .await;
    assert_error(
        &error,
        -32600,
        &format!("path `{}` is not a file", native(&fifo)),
    );
    let error = client
        .call_err("fs/open", json!({"handleId": "d", "path": native(&dir)}))
        .await;
    assert_error(
        &error,
        -32600,
        &format!("path `{}` is not a file", native(&dir)),
    );
    let error = client
        .call_err(
            "fs/open",
            json!({"handleId": "m", "path": uri(&dir.join("missing"))}),
        )
        .await;
    assert_os_error(&error, -32004, libc::ENOENT);
    // Failed opens leave no handle behind: the ids are free again.
    std::fs::write(dir.join("target"), b"linked").unwrap();
    symlink("target", dir.join("link")).unwrap();
    for id in ["p", "d", "m"] {
        client
            .call(
                "fs/open",
                json!({"handleId": id, "path": uri(&dir.join("link"))}),
            )
            .await;
        let block = client
            .call(
                "fs/readBlock",
                json!({"handleId": id, "offset": 0, "len": 100}),
            )
            .await;
        assert_eq!(block["chunk"], b64("linked"));
    }
}

#[tokio::test]
async fn a_handle_reads_the_file_it_opened() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let file = dir.join("f");
    std::fs::write(&file, b"original").unwrap();
    client
        .call("fs/open", json!({"handleId": "h", "path": uri(&file)}))
        .await;
    std::fs::rename(&file, dir.join("moved")).unwrap();
    std::fs::write(&file, b"replacement").unwrap();
    std::fs::remove_file(dir.join("moved")).unwrap();
    let block = client
        .call(
            "fs/readBlock",
            json!({"handleId": "h", "offset": 0, "len": 100}),
        )
        .await;
    assert_eq!(block, json!({"chunk": b64("original"), "eof": true}));
}

/// The server's own `/proc/self/mem` is a regular file whose first page is unmapped, so
/// reading it at offset 0 fails with `EIO`.
#[tokio::test]
async fn a_failed_read_closes_the_handle() {
    let mut client = started(None).await;
    client
        .call(
            "fs/open",
            json!({"handleId": "mem", "path": "/proc/self/mem"}),
        )
        .await;
    let error = client
        .call_err(
            "fs/readBlock",
            json!({"handleId": "mem", "offset": 0, "len": 16}),
        )
        .await;
    assert_os_error(&error, -32603, libc::EIO);
    let error = client
        .call_err(
            "fs/readBlock",
            json!({"handleId": "mem", "offset": 0, "len": 16}),
        )
        .await;
    assert_error(&error, -32004, "unknown file read handle `mem`");
}

#[tokio::test]
async fn concurrent_reads_on_one_handle() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let data = pattern(64 * 1024);
    std::fs::write(dir.join("f"), &data).unwrap();
    client
        .call(
            "fs/open",
            json!({"handleId": "h", "path": uri(&dir.join("f"))}),
        )
        .await;
    // Sent without waiting, in descending order: positional reads do not interfere.
    let mut sent = Vec::new();
    for i in (0..16).rev() {
        let offset = i * 4096;
        let id = client
            .send_request(
                "fs/readBlock",
                json!({"handleId": "h", "offset": offset, "len": 4096}),
            )
            .await;
        sent.push((id, offset));
    }
    for (id, offset) in sent {
        let block = client.response(id).await.unwrap();
        assert_eq!(b64decode(&block["chunk"]), &data[offset..offset + 4096]);
        assert_eq!(block["eof"], false);
    }
}

#[tokio::test]
async fn open_handle_limit_per_connection() {
    let config = config_file("[fs]\nmax_open_handles = 2\n");
    let server = WsServer::start(&["--config", config.to_str().unwrap()]).await;
    let (_keep, dir) = temp_dir();
    let file = uri(&dir.join("f"));
    std::fs::write(dir.join("f"), b"x").unwrap();
    let mut first = server.connect_initialized().await;
    first
        .call("fs/open", json!({"handleId": "a", "path": file}))
        .await;
    first
        .call("fs/open", json!({"handleId": "b", "path": file}))
        .await;
    let error = first
        .call_err("fs/open", json!({"handleId": "c", "path": file}))
        .await;
    assert_error(
        &error,
        -32600,
        "at most 2 file reads may be open per connection",
    );
    // Check 2 comes before check 3.
    let error = first
        .call_err("fs/open", json!({"handleId": "a", "path": file}))
        .await;
    assert_error(&error, -32600, "file read handle `a` already exists");
    first.call("fs/close", json!({"handleId": "a"})).await;
    first
        .call("fs/open", json!({"handleId": "c", "path": file}))
        .await;

    // Another connection has its own table: same ids, own limit, no access to these.
    let mut second = server.connect_initialized().await;
    let error = second
        .call_err(
            "fs/readBlock",
            json!({"handleId": "b", "offset": 0, "len": 1}),
        )
        .await;
    assert_error(&error, -32004, "unknown file read handle `b`");
    second
        .call("fs/open", json!({"handleId": "b", "path": file}))
        .await;
    second
        .call("fs/open", json!({"handleId": "c", "path": file}))
        .await;
    second.call("fs/close", json!({"handleId": "b"})).await;
    let block = first
        .call(
            "fs/readBlock",
            json!({"handleId": "b", "offset": 0, "len": 1}),
        )
        .await;
    assert_eq!(block["chunk"], b64("x"));
}

/// The server's open descriptors that refer to `path`.
fn open_descriptors(pid: u32, path: &Path) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target == path)
        .count()
}

#[tokio::test]
async fn handles_close_with_their_connection_and_do_not_survive_a_resume() {
    let mut server = WsServer::start(&[]).await;
    let pid = server.child.id().unwrap();
    let (_keep, dir) = temp_dir();
    let file = dir.join("held-open");
    std::fs::write(&file, b"x").unwrap();

    let mut client = server.connect_initialized().await;
    let session = client.session_id.clone().unwrap();
    client
        .call("fs/open", json!({"handleId": "h1", "path": uri(&file)}))
        .await;
    client
        .call("fs/open", json!({"handleId": "h2", "path": uri(&file)}))
        .await;
    assert_eq!(open_descriptors(pid, &file), 2);
    client.call("fs/close", json!({"handleId": "h2"})).await;
    assert_eq!(open_descriptors(pid, &file), 1);

    client.close().await;
    drop(client);
    let deadline = Instant::now() + crate::util::STEP_TIMEOUT;
    while open_descriptors(pid, &file) > 0 {
        assert!(
            Instant::now() < deadline,
            "the handle outlived its connection"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The session resumes; its new connection has no handles.
    let mut resumed = server.connect().await;
    loop {
        match resumed.resume(&session).await {
            Ok(_) => break,
            Err(error) if error["code"] == -32010 => {
                assert!(Instant::now() < deadline, "the session never detached");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("resume failed: {error}"),
        }
    }
    let error = resumed
        .call_err(
            "fs/readBlock",
            json!({"handleId": "h1", "offset": 0, "len": 1}),
        )
        .await;
    assert_error(&error, -32004, "unknown file read handle `h1`");
    let _ = server.child.kill().await;
}

// ---- the sandbox member (§5.2) -----------------------------------------------------------

/// One request of every method that takes `sandbox`, except `fs/open`.
fn sandboxable_requests(dir: &Path) -> Vec<(&'static str, Value)> {
    let file = uri(&dir.join("f"));
    vec![
        ("fs/readFile", json!({"path": file})),
        (
            "fs/writeFile",
            json!({"path": uri(&dir.join("new")), "dataBase64": b64("x")}),
        ),
        (
            "fs/createDirectory",
            json!({"path": uri(&dir.join("new-dir"))}),
        ),
        ("fs/getMetadata", json!({"path": file})),
        ("fs/canonicalize", json!({"path": file})),
        ("fs/readDirectory", json!({"path": uri(dir)})),
        (
            "fs/walk",
            json!({"path": uri(dir), "options": walk_options(1, 10, 10)}),
        ),
        (
            "fs/copy",
            json!({"sourcePath": file, "destinationPath": uri(&dir.join("copy")), "recursive": false}),
        ),
        ("fs/remove", json!({"path": file})),
    ]
}

fn with_members(params: &Value, members: &Value) -> Value {
    let mut params = params.clone();
    for (key, value) in members.as_object().unwrap() {
        params[key] = value.clone();
    }
    params
}

#[tokio::test]
async fn sandboxes_that_need_enforcement_fail_closed() {
    // Where Landlock is unavailable (the server runs under a filter that refuses its
    // system calls), every request that needs enforcement is refused.
    let mut command = crate::sandbox::no_landlock_command(&["--listen", "stdio"]);
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    let mut client = Client::stdio_after_harness_preamble(command).await;
    client.handshake().await;
    let (_keep, dir) = temp_dir();
    std::fs::write(dir.join("f"), b"untouched").unwrap();
    let cwd = uri(&dir);
    let enforcing = [
        json!({"sandbox": {"sandboxPolicy": {"type": "workspace-write", "writable_roots": [cwd]}}}),
        json!({"sandbox": {"sandboxPolicy": {"type": "read-only"}}}),
        json!({"sandbox": {"permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "special", "value": {"kind": "project_roots"}}, "access": "write"}
        ]}, "network": "restricted"}, "cwd": cwd}}),
        json!({"sandboxPolicy": {"type": "workspace-write"}}),
    ];
    for members in &enforcing {
        for (method, params) in sandboxable_requests(&dir) {
            let error = client
                .call_err(method, with_members(&params, members))
                .await;
            assert_error(
                &error,
                -32600,
                "filesystem sandbox cannot be enforced on this executor",
            );
            assert_eq!(error.get("data"), None);
        }
        let open = with_members(
            &json!({"handleId": "h", "path": uri(&dir.join("f"))}),
            members,
        );
        let error = client.call_err("fs/open", open).await;
        assert_error(
            &error,
            -32600,
            "streaming file reads do not support platform sandboxing",
        );
    }
    // Nothing ran.
    assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"untouched");
    for name in ["new", "new-dir", "copy"] {
        assert!(!dir.join(name).exists(), "{name}");
    }
    let error = client
        .call_err(
            "fs/readBlock",
            json!({"handleId": "h", "offset": 0, "len": 1}),
        )
        .await;
    assert_eq!(error["code"], -32004, "the refused open left no handle");
}

#[tokio::test]
async fn sandboxes_without_file_system_restrictions_run_directly() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    let direct = [
        json!({"sandbox": {"sandboxPolicy": {"type": "danger-full-access"}}}),
        json!({"sandboxPolicy": {"type": "danger-full-access"}}),
        json!({"sandbox": {"permissions": {"type": "disabled"}}}),
        json!({"sandbox": {"permissions": {"type": "managed", "file_system": {"type": "unrestricted"}}}}),
        json!({"sandbox": null}),
    ];
    for members in &direct {
        std::fs::write(dir.join("f"), b"data").unwrap();
        for name in ["new", "new-dir", "copy"] {
            let _ = std::fs::remove_dir_all(dir.join(name));
            let _ = std::fs::remove_file(dir.join(name));
        }
        for (method, params) in sandboxable_requests(&dir) {
            client.call(method, with_members(&params, members)).await;
        }
        assert!(
            dir.join("new").is_file() && dir.join("new-dir").is_dir() && dir.join("copy").is_file()
        );
        assert!(!dir.join("f").exists(), "fs/remove ran");
        std::fs::write(dir.join("f"), b"data").unwrap();
        let open = with_members(
            &json!({"handleId": "h", "path": uri(&dir.join("f"))}),
            members,
        );
        client.call("fs/open", open).await;
        client.call("fs/close", json!({"handleId": "h"})).await;
    }
}

#[tokio::test]
async fn sandbox_shape_errors_and_open_check_order() {
    let mut client = started(None).await;
    let (_keep, dir) = temp_dir();
    std::fs::write(dir.join("f"), b"x").unwrap();
    let file = uri(&dir.join("f"));
    let error = client
        .call_err("fs/readFile", json!({"path": file, "sandbox": {}}))
        .await;
    assert_error(
        &error,
        -32602,
        "sandbox must contain either permissions or sandboxPolicy",
    );
    let error = client
        .call_err("fs/getMetadata", json!({"path": file, "sandbox": {"sandboxPolicy": {"type": "read-only"}}, "sandboxPolicy": {"type": "read-only"}}))
        .await;
    assert_error(
        &error,
        -32602,
        "sandbox and sandboxPolicy must not both be present",
    );

    // fs/open: id length, duplicate id and handle limit come before the sandbox.
    let sandbox = json!({"sandboxPolicy": {"type": "read-only"}});
    let error = client
        .call_err(
            "fs/open",
            json!({"handleId": "x".repeat(33), "path": file, "sandbox": sandbox}),
        )
        .await;
    assert_error(
        &error,
        -32600,
        "file read handle ID must not exceed 32 bytes",
    );
    client
        .call("fs/open", json!({"handleId": "taken", "path": file}))
        .await;
    let error = client
        .call_err(
            "fs/open",
            json!({"handleId": "taken", "path": file, "sandbox": sandbox}),
        )
        .await;
    assert_error(&error, -32600, "file read handle `taken` already exists");
    let error = client
        .call_err(
            "fs/open",
            json!({"handleId": "free", "path": file, "sandbox": {}}),
        )
        .await;
    assert_eq!(error["code"], -32602);
}

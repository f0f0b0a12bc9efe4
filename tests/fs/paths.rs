//! Paths (§5.1) and the mapping of OS errors (§5.3).

use serde_json::json;
use std::os::unix::fs::PermissionsExt;

use super::{assert_os_error, forms, native, started, temp_dir, uri};
use crate::util::{assert_error, b64, b64decode};

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
        // A multi-byte character across byte 5, where the `file:` scheme would end.
        "ab😀",
        "file😀",
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

// ---- fixtures of this topic ---------------------------------------------------------

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

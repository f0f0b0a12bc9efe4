//! The `sandbox` member (§5.2) of every method.

use std::path::Path;

use serde_json::{json, Value};

use super::{started, temp_dir, uri, walk_options};
use crate::util::{assert_error, b64, Client};

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
        // A replace handle would write outside any helper: refused the same way.
        let replace = with_members(
            &json!({"handleId": "w", "path": uri(&dir.join("f")), "mode": "replace"}),
            members,
        );
        let error = client.call_err("fs/open", replace).await;
        assert_error(
            &error,
            -32600,
            "streaming file reads do not support platform sandboxing",
        );
    }
    // Nothing ran, and no new version was started.
    assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"untouched");
    assert!(
        std::fs::read_dir(&dir).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".tmp")),
        "a refused replace left a temporary file"
    );
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
    assert_error(&error, -32600, "file handle ID must not exceed 32 bytes");
    client
        .call("fs/open", json!({"handleId": "taken", "path": file}))
        .await;
    let error = client
        .call_err(
            "fs/open",
            json!({"handleId": "taken", "path": file, "sandbox": sandbox}),
        )
        .await;
    assert_error(&error, -32600, "file handle `taken` already exists");
    let error = client
        .call_err(
            "fs/open",
            json!({"handleId": "free", "path": file, "sandbox": {}}),
        )
        .await;
    assert_eq!(error["code"], -32602);
}

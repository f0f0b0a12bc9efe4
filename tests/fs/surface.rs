//! The method table: every method over both transports, handshake gating, the `[fs]` table.

use serde_json::json;

use super::{native, temp_dir, uri, walk_options};
use crate::util::{assert_error, b64, config_file, server_bin, Client};

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

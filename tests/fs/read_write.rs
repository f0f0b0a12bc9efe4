//! `fs/readFile` and `fs/writeFile` (§5.5, §5.6), and symbolic links (§5.4).

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::symlink;
use std::os::unix::fs::PermissionsExt;

use serde_json::json;

use super::{
    assert_os_error, forms, mkfifo, native, pattern, started, temp_dir, uri, walk_options,
};
use crate::util::{assert_error, b64, b64decode};

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

//! `exec-server cp`: files between this machine and a server over the fs methods, byte for
//! byte, both ways, on the WebSocket and stdio transports.

use std::io::Write;

use crate::util::{server_bin, WsServer, STEP_TIMEOUT};

async fn cp(args: &[&str]) -> std::process::Output {
    let mut command = tokio::process::Command::new(server_bin());
    command
        .arg("cp")
        .args(args)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    tokio::time::timeout(STEP_TIMEOUT, command.output())
        .await
        .expect("cp finishes")
        .unwrap()
}

/// Bytes that no block boundary or encoding slip would reproduce: a counter mixed by
/// multiplication, 13 MiB (thirteen 1 MiB blocks and a few bytes more).
fn content() -> Vec<u8> {
    (0u64..13 * 1024 * 1024 + 7)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

#[tokio::test]
async fn a_large_file_goes_up_and_comes_back_byte_exact() {
    let server = WsServer::start(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("big.bin");
    let data = content();
    std::fs::File::create(&local)
        .unwrap()
        .write_all(&data)
        .unwrap();
    let remote_dir = tempfile::tempdir().unwrap();
    let remote = remote_dir.path().join("copy.bin");
    let remote_arg = format!(":{}", remote.display());

    let up = cp(&["--url", &server.url, local.to_str().unwrap(), &remote_arg]).await;
    assert_eq!(
        up.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    assert!(
        std::fs::read(&remote).unwrap() == data,
        "uploaded bytes differ"
    );

    let back = dir.path().join("back.bin");
    let down = cp(&["--url", &server.url, &remote_arg, back.to_str().unwrap()]).await;
    assert_eq!(
        down.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "downloaded bytes differ"
    );

    // Into directories, under the file's own name, and over stdio.
    let stdio = format!("{} --listen stdio", server_bin().display());
    let into = format!(":{}/", remote_dir.path().display());
    let out = cp(&["--stdio", &stdio, local.to_str().unwrap(), &into]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read(remote_dir.path().join("big.bin")).unwrap() == data);
    let local_dir = tempfile::tempdir().unwrap();
    let out = cp(&[
        "--stdio",
        &stdio,
        &remote_arg,
        local_dir.path().to_str().unwrap(),
    ])
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read(local_dir.path().join("copy.bin")).unwrap() == data);
}

#[tokio::test]
async fn mistakes_are_named_and_leave_nothing_behind() {
    let server = WsServer::start(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("never");

    let missing = cp(&[
        "--url",
        &server.url,
        ":/nonexistent/file",
        target.to_str().unwrap(),
    ])
    .await;
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains(":/nonexistent/file") && stderr.contains("No such file"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no partial file"
    );

    let both_local = cp(&[
        "--url",
        &server.url,
        "/etc/hostname",
        target.to_str().unwrap(),
    ])
    .await;
    assert_eq!(both_local.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&both_local.stderr).contains("`:/PATH`"));

    let relative = cp(&["--url", &server.url, "/etc/hostname", ":relative/path"]).await;
    assert_eq!(relative.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&relative.stderr).contains("must be absolute"));
}

#[tokio::test]
async fn a_refused_upgrade_says_what_to_set_as_run_does() {
    let mut command = crate::util::server_command(&["--listen", "ws://127.0.0.1:0"]);
    command.env("CODEX_EXEC_SERVER_CONNECTION_TOKEN", "cp-token");
    let server = WsServer::start_with(command).await;
    let out = cp(&["--url", &server.url, ":/etc/hostname", "/nonexistent-dir/x"]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("HTTP 401") && stderr.contains("--token-file FILE"),
        "{stderr}"
    );
}

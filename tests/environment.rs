//! `environment/*` end to end (PROTOCOL §6).

use serde_json::json;

/// The capability flags in codex 0.171.0's order (CODEX-0169 §2.2, CODEX-0171 §2.1).
pub const FLAG_ORDER: [&str; 16] = [
    "networkProxyLaunch",
    "networkProxyReviewDomains",
    "networkProxyTransparentTcp",
    "credentialMasking",
    "credentialMaskingCustomProviders",
    "capabilityDiscoverySandbox",
    "fsWatchMissing",
    "capabilityDiscoveryV2",
    "environmentConfigRead",
    "httpHeaderEnvVars",
    "sandboxedFileStreaming",
    "fileWriteStreaming",
    "shellSnapshotV2",
    "windowsMxc",
    "linuxRootWritePreservesDevices",
    "linuxApprovedRootWritePreservesRestrictions",
];

/// The members of `environmentInfo`, in codex 0.169.0's order (`prependPathDirs` is
/// omitted when empty, which it is here).
pub const MEMBER_ORDER: [&str; 9] = [
    "shell",
    "executorVersion",
    "providerId",
    "cwd",
    "userHomeDir",
    "platformOs",
    "temporaryDirectories",
    "tempDir",
    "capabilities",
];

/// The flags this build turns on with every plugin enabled.
pub fn implemented_flags() -> &'static [&'static str] {
    &[
        "capabilityDiscoverySandbox",
        "capabilityDiscoveryV2",
        "environmentConfigRead",
        "fileWriteStreaming",
        "fsWatchMissing",
        "httpHeaderEnvVars",
        "networkProxyLaunch",
        "networkProxyReviewDomains",
    ]
}

/// Positions of `names` as object keys in raw JSON `text`, which must be increasing.
#[track_caller]
pub fn assert_key_order(text: &str, names: &[&str]) {
    let positions: Vec<usize> = names
        .iter()
        .map(|name| {
            text.find(&format!("\"{name}\":"))
                .unwrap_or_else(|| panic!("`{name}` missing in {text}"))
        })
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "members out of order in {text}"
    );
}

both_transports!(
    info_and_status,
    |mut client: crate::util::Client| async move {
        let initialize = client
            .call("initialize", json!({"clientName": "tests"}))
            .await;
        client
            .send(json!({"method": "initialized", "params": {}}))
            .await;
        let info = client.call("environment/info", json!(null)).await;
        // `initialize` carries exactly what environment/info answers.
        assert_eq!(initialize["environmentInfo"], info, "{initialize}");
        let shell = info["shell"]["name"].as_str().unwrap();
        assert!(["bash", "zsh", "sh"].contains(&shell), "{info}");
        assert!(info["shell"]["path"].as_str().unwrap().starts_with('/'));
        assert_eq!(info["executorVersion"], env!("CARGO_PKG_VERSION"));
        let provider = info["providerId"].as_str().unwrap();
        assert!(
            provider.starts_with("sha256:") && provider.len() == 71,
            "{provider}"
        );
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(info["cwd"], format!("file://{}", cwd.display()));
        let home = std::env::var("HOME").unwrap();
        assert_eq!(info["userHomeDir"], format!("file://{home}"));
        assert_eq!(info["platformOs"], "linux");
        assert!(info.get("prependPathDirs").is_none(), "{info}");
        assert!(info["tempDir"].as_str().unwrap().starts_with("file:///"));
        let flags = info["capabilities"].as_object().unwrap();
        assert_eq!(flags.len(), FLAG_ORDER.len(), "{info}");
        for name in FLAG_ORDER {
            let on = implemented_flags().contains(&name);
            assert_eq!(flags[name], on, "{name} in {info}");
        }
        // Methods without parameters accept a missing params, null or any object.
        for params in [json!({}), json!({"extra": [1, 2]})] {
            let status = client.call("environment/status", params).await;
            assert_eq!(status, json!({"status": "ready"}));
        }
        client
            .send(json!({"id": 99, "method": "environment/status"}))
            .await;
        assert_eq!(
            client.response(99).await.unwrap(),
            json!({"status": "ready"})
        );
        let err = client.call_err("environment/status", json!([1])).await;
        assert_eq!(err["code"], -32602);
    }
);

/// Member and flag order is codex's, byte for byte on the wire.
#[tokio::test]
async fn members_and_flags_are_in_codex_order() {
    let mut server = crate::util::server_command(&["--listen", "stdio"]);
    let mut child = server.spawn().unwrap();
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"{\"id\":1,\"method\":\"initialize\",\"params\":{\"clientName\":\"t\"}}\n")
        .await
        .unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(crate::util::STEP_TIMEOUT, stdout.read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    assert_key_order(&line, &["sessionId", "environmentInfo"]);
    assert_key_order(&line, &MEMBER_ORDER);
    assert_key_order(&line, &FLAG_ORDER);
}

/// With `environment/info` switched off, `initialize` has no `environmentInfo` (codex
/// clients accept its absence) rather than an object the connection could not ask for.
#[tokio::test]
async fn switched_off_info_leaves_environment_info_out() {
    let file = crate::util::config_file("[methods]\ndisabled = [\"environment/info\"]\n");
    let mut client = crate::util::Client::stdio(&["--config", file.to_str().unwrap()]).await;
    let initialize = client
        .call("initialize", json!({"clientName": "tests"}))
        .await;
    assert!(initialize["sessionId"].is_string());
    assert!(initialize.get("environmentInfo").is_none(), "{initialize}");
}

#[tokio::test]
async fn temporary_directories_follow_tmpdir() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = crate::util::server_command(&["--listen", "stdio"]);
    cmd.env("TMPDIR", dir.path());
    let mut client = crate::util::Client::stdio_with(cmd);
    client.handshake().await;
    let info = client.call("environment/info", json!({})).await;
    let uri = format!("file://{}", dir.path().display());
    assert_eq!(info["temporaryDirectories"], json!([uri]));
    assert_eq!(info["tempDir"], json!(uri));

    let mut cmd = crate::util::server_command(&["--listen", "stdio"]);
    cmd.env_remove("TMPDIR");
    let mut client = crate::util::Client::stdio_with(cmd);
    client.handshake().await;
    let info = client.call("environment/info", json!({})).await;
    // Sent even when empty, as codex 0.169.0 does.
    assert_eq!(info["temporaryDirectories"], json!([]), "{info}");
    assert_eq!(info["tempDir"], "file:///tmp");
}

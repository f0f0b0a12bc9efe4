//! `environment/*` end to end (PROTOCOL §6).

use serde_json::json;

both_transports!(
    info_and_status,
    |mut client: crate::util::Client| async move {
        client.handshake().await;
        let info = client.call("environment/info", json!(null)).await;
        let shell = info["shell"]["name"].as_str().unwrap();
        assert!(["bash", "zsh", "sh"].contains(&shell), "{info}");
        assert!(info["shell"]["path"].as_str().unwrap().starts_with('/'));
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(info["cwd"], format!("file://{}", cwd.display()));
        assert!(info["tempDir"].as_str().unwrap().starts_with("file:///"));
        assert_eq!(
            info["capabilities"],
            json!({
                "networkProxyLaunch": false,
                "capabilityDiscoverySandbox": false,
                "environmentConfigRead": false,
                "httpHeaderEnvVars": false,
                "sandboxedFileStreaming": false,
                "shellSnapshotV2": false
            })
        );
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
    assert!(info.get("temporaryDirectories").is_none(), "{info}");
    assert_eq!(info["tempDir"], "file:///tmp");
}

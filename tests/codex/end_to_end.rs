//! `codex exec` (the real codex CLI, 0.171.0 and the older 0.169.0) with this server as its
//! execution environment (`CODEX_EXEC_SERVER_URL`, plain WebSocket) and a fake model that
//! asks for one shell command: the command's effect must appear on disk, and the recording
//! proxy between codex and the server shows which methods codex called and what they
//! answered.

use std::time::Duration;

use super::fake_model::{FakeModel, FINAL_TEXT};
use super::proxy::RecordingProxy;
use super::{codex_bin_of, CodexHome, CODEX_VERSION, CODEX_VERSION_0169};
use crate::util::WsServer;

/// Whether this server implements `fs/watchMissing` (the fs part of the codex 0.169.0
/// parity work, unchanged in 0.171.0). While it does not, its capability flag `fsWatchMissing` is `false` and
/// codex does not call the method; once it does, codex calls it in every session and it
/// must succeed. FLIP THIS to `true` when `fs/watchMissing` lands.
const FS_WATCH_MISSING_IMPLEMENTED: bool = true;

/// How long the whole `codex exec` run may take before the test gives up.
const RUN_DEADLINE: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_exec_runs_a_shell_command_through_this_server() {
    exec_turn_through_this_server(
        CODEX_VERSION,
        "codex_exec_runs_a_shell_command_through_this_server",
    )
    .await;
}

/// The same turn with the release before, which older clients still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_0169_exec_runs_a_shell_command_through_this_server() {
    exec_turn_through_this_server(
        CODEX_VERSION_0169,
        "codex_0169_exec_runs_a_shell_command_through_this_server",
    )
    .await;
}

/// One `codex exec` turn of codex `version` through this server, checked as described
/// in the module's documentation.
async fn exec_turn_through_this_server(version: &str, test: &str) {
    let Some(codex) = codex_bin_of(version, test) else {
        return;
    };
    let home = CodexHome::new();
    let work = tempfile::tempdir().unwrap();
    let work_dir = std::fs::canonicalize(work.path()).unwrap();
    let marker = work_dir.join("made-by-codex.txt");
    let model = FakeModel::start("printf 'written through exec-server' > made-by-codex.txt").await;
    home.use_model(&model.base_url);
    let server = WsServer::start(&[]).await;
    let proxy = RecordingProxy::start(&server.url).await;

    let mut cmd = home.exec_turn(&codex, &work_dir);
    cmd.env("CODEX_EXEC_SERVER_URL", &proxy.url);
    let output = tokio::time::timeout(RUN_DEADLINE, cmd.output())
        .await
        .expect("codex exec finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let exchanges = proxy.exchanges();
    let methods: Vec<&str> = exchanges.iter().map(|e| e.method.as_str()).collect();
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}\nmethods: {methods:?}");
    println!("codex {version} called, in order: {methods:?}");
    assert!(output.status.success(), "codex exec failed\n{context}");
    assert!(stdout.contains(FINAL_TEXT), "{context}");

    // The command ran on this server's host, in the turn's working directory.
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default(),
        "written through exec-server",
        "{context}"
    );
    assert!(model.requests().len() >= 2, "{context}");

    // What codex called through us.
    let initialize = &exchanges[0];
    assert_eq!(initialize.method, "initialize", "{context}");
    assert_eq!(initialize.params["clientName"], "codex-environment");
    let config_read = exchanges
        .iter()
        .find(|e| e.method == "environmentConfig/read")
        .unwrap_or_else(|| panic!("codex never called environmentConfig/read\n{context}"));
    assert!(
        config_read.answered && config_read.error.is_none(),
        "{config_read:?}"
    );
    assert_eq!(
        config_read.params["configPaths"],
        serde_json::json!([["mcp_servers"]])
    );
    assert!(methods.contains(&"process/start"), "{context}");
    let watch = exchanges.iter().find(|e| e.method == "fs/watchMissing");
    if FS_WATCH_MISSING_IMPLEMENTED {
        let watch =
            watch.unwrap_or_else(|| panic!("codex never called fs/watchMissing\n{context}"));
        assert!(watch.answered && watch.error.is_none(), "{watch:?}");
    } else {
        assert!(
            watch.is_none(),
            "codex calls fs/watchMissing although fsWatchMissing is false: {watch:?}"
        );
    }
    // Nothing codex called is missing here, and it got no notification it does not know.
    let unknown: Vec<&super::proxy::Exchange> = exchanges
        .iter()
        .filter(|e| matches!(e.error, Some((-32601, _))))
        .collect();
    assert!(
        unknown.is_empty(),
        "method not found: {unknown:?}\n{context}"
    );
    // `fs/missingChanged` answers codex's own `fs/watchMissing`: it fires when a watched
    // path appears and also on any change of the mount table (tests running beside this
    // one mount and unmount), after which codex simply discovers again.
    for notification in proxy.notifications() {
        let known = notification.starts_with("process/")
            || (watch.is_some() && notification == "fs/missingChanged");
        assert!(known, "codex was sent `{notification}`: {watch:?}");
    }
}

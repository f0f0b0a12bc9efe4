//! `exec-server run --sandbox MODE`: the presets a user can try the sandbox with, enforced
//! by the kernel on a real server.

use crate::client::{run_command, run_output};
use crate::util::server_bin;

fn stdio_server() -> String {
    format!("{} --listen stdio", server_bin().display())
}

/// A directory `workspace-write` does not grant: not under `/tmp` or `$TMPDIR` (which it
/// grants, and which may hold the checkout itself).
fn outside_every_writable_root() -> tempfile::TempDir {
    let granted = [std::path::PathBuf::from("/tmp"), std::env::temp_dir()];
    let candidates = [
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        std::path::PathBuf::from("/var/tmp"),
        std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default()),
    ];
    candidates
        .iter()
        .filter(|dir| dir.is_absolute() && !granted.iter().any(|g| dir.starts_with(g)))
        .find_map(|dir| tempfile::tempdir_in(dir).ok())
        .expect("a writable directory outside /tmp and $TMPDIR")
}

#[tokio::test]
async fn read_only_writes_nothing_and_workspace_write_writes_only_the_workspace() {
    let outside = outside_every_writable_root();
    let workspace = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (outside_dir, workspace_dir) = (
        outside.path().display().to_string(),
        workspace.path().display().to_string(),
    );
    let script = format!(
        "echo in > {workspace_dir}/made; echo out > {outside_dir}/made; cat {workspace_dir}/made"
    );
    // The script on a fresh stdio server in the workspace, under `sandbox` flags.
    let run_script = |sandbox: &'static [&'static str]| {
        let (server, cwd, script) = (stdio_server(), workspace_dir.clone(), script.clone());
        async move {
            let mut args = vec!["--stdio", &server];
            args.extend(sandbox);
            args.extend(["--cwd", &cwd, "--", "sh", "-c", &script]);
            run_output(&mut run_command(&args)).await
        }
    };

    let read_only = run_script(&["--sandbox", "read-only"]).await;
    assert!(
        !workspace.path().join("made").exists(),
        "read-only wrote the workspace"
    );
    assert!(
        !outside.path().join("made").exists(),
        "read-only wrote outside"
    );
    assert!(
        String::from_utf8_lossy(&read_only.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&read_only.stderr)
    );

    let write = run_script(&["--sandbox", "workspace-write"]).await;
    assert_eq!(String::from_utf8_lossy(&write.stdout), "in\n");
    assert!(workspace.path().join("made").exists());
    assert!(
        !outside.path().join("made").exists(),
        "workspace-write wrote outside"
    );

    // Without --sandbox the same script writes both.
    let open = run_script(&[]).await;
    assert_eq!(open.status.code(), Some(0));
    assert!(outside.path().join("made").exists());
}

#[tokio::test]
async fn an_unknown_mode_is_a_usage_error_that_lists_the_modes() {
    let out = run_output(&mut run_command(&[
        "--stdio",
        "true",
        "--sandbox",
        "strict",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("read-only") && stderr.contains("workspace-write"),
        "{stderr}"
    );
}

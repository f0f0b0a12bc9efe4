//! `exec-server run -p NAME`: the server and its credentials from `profiles.toml`.

use std::os::unix::fs::PermissionsExt;

use crate::client::{run_command, run_output};
use crate::util::{server_bin, server_command, WsServer};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A home directory with a profiles file and an owner-only token file under `~/.config`.
fn home_with(profiles: &str, token: &str) -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join(".config/exec-server");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("profiles.toml"), profiles).unwrap();
    let token_path = dir.join("build.token");
    std::fs::write(&token_path, token).unwrap();
    std::fs::set_permissions(&token_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    home
}

fn run_in(home: &tempfile::TempDir, args: &[&str]) -> tokio::process::Command {
    let mut command = run_command(args);
    command
        .env("HOME", home.path())
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("EXEC_SERVER_PROFILES");
    command
}

#[tokio::test]
async fn a_profile_gives_the_server_and_its_token_and_flags_win() {
    let mut command = server_command(&["--listen", "ws://127.0.0.1:0"]);
    command.env("CODEX_EXEC_SERVER_CONNECTION_TOKEN", "profile-token");
    let guarded = WsServer::start_with(command).await;
    let open = WsServer::start(&[]).await;
    let profiles = format!(
        "[build]\nurl = \"{}\"\ntoken_file = \"~/.config/exec-server/build.token\"\n\n[local]\nstdio = \"{} --listen stdio\"\n",
        guarded.url,
        server_bin().display()
    );
    let home = home_with(&profiles, "profile-token\n");

    let out = run_output(&mut run_in(
        &home,
        &["-p", "build", "--", "echo", "via build"],
    ))
    .await;
    assert_eq!(text(&out.stdout), "via build\n", "{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0));

    let out = run_output(&mut run_in(
        &home,
        &["-p", "local", "--", "echo", "via stdio"],
    ))
    .await;
    assert_eq!(text(&out.stdout), "via stdio\n", "{}", text(&out.stderr));

    // A flag naming another server replaces the profile's, token included.
    let out = run_output(&mut run_in(
        &home,
        &["-p", "build", "--url", &open.url, "--", "echo", "via flag"],
    ))
    .await;
    assert_eq!(text(&out.stdout), "via flag\n", "{}", text(&out.stderr));

    // EXEC_SERVER_PROFILES names another file.
    let elsewhere = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(elsewhere.path(), format!("[x]\nurl = \"{}\"\n", open.url)).unwrap();
    let mut command = run_in(&home, &["-p", "x", "--", "echo", "via variable"]);
    command.env("EXEC_SERVER_PROFILES", elsewhere.path());
    let out = run_output(&mut command).await;
    assert_eq!(text(&out.stdout), "via variable\n", "{}", text(&out.stderr));
}

#[tokio::test]
async fn profile_mistakes_say_what_is_there() {
    let home = home_with(
        "[build]\nurl = \"ws://127.0.0.1:1\"\n[ci]\nstdio = \"true\"\n",
        "t",
    );
    let out = run_output(&mut run_in(&home, &["-p", "nope", "--", "true"])).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("no profile `nope`") && stderr.contains("build, ci"),
        "{stderr}"
    );

    let typo = home_with(
        "[build]\nurl = \"ws://127.0.0.1:1\"\ntoken_fil = \"x\"\n",
        "t",
    );
    let out = run_output(&mut run_in(&typo, &["-p", "build", "--", "true"])).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("profiles.toml") && stderr.contains("token_fil"),
        "{stderr}"
    );

    let bad_url = home_with("[build]\nurl = \"http://127.0.0.1:1\"\n", "t");
    let out = run_output(&mut run_in(&bad_url, &["-p", "build", "--", "true"])).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("expected `ws://IP:PORT`"),
        "{}",
        text(&out.stderr)
    );

    let missing = tempfile::tempdir().unwrap();
    let out = run_output(&mut run_in(&missing, &["-p", "build", "--", "true"])).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("cannot read"),
        "{}",
        text(&out.stderr)
    );
}

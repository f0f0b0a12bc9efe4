//! The files under `deploy/` work as pasted: the systemd units pass `systemd-analyze
//! verify`, the account file `systemd-sysusers --dry-run`, the nginx configurations
//! `nginx -t`, and the configuration files the units name are accepted by the server (the
//! rendezvous one by a rendezvous that starts). Paths under `/etc` and the binary's path
//! are pointed at a temporary directory and the built binary; nothing else is changed.
//!
//! The validators come from Debian's `systemd` and `nginx` packages; `.ci/run` installs
//! them and sets `EXEC_SERVER_REQUIRE_DEPLOY_TESTS=1`, which makes a missing one a failure.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::relay::tls::Pki;
use crate::util::{server_bin, server_command, STEP_TIMEOUT};

fn deploy(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(relative)
}

/// The path of `tool` (found on `PATH`, or in `/usr/sbin` where Debian puts nginx), or
/// `None`: then fails if the deploy tests are required, else says the test is skipped.
fn tool(name: &str, test: &str) -> Option<PathBuf> {
    let runs = |path: &Path| Command::new(path).arg("-h").output().is_ok();
    let found = [PathBuf::from(name), Path::new("/usr/sbin").join(name)]
        .into_iter()
        .find(|path| runs(path));
    if found.is_none() {
        let required = std::env::var("EXEC_SERVER_REQUIRE_DEPLOY_TESTS").as_deref() == Ok("1");
        assert!(!required, "{test}: `{name}` is not installed");
        println!("SKIP: {test}: `{name}` is not installed");
    }
    found
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A stand-in for `/etc/exec-server`: the secret files the configurations name, owner-only.
struct Etc {
    dir: tempfile::TempDir,
}

impl Etc {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for (name, contents) in [
            ("ws.token", &b"deploy-test-websocket-token"[..]),
            ("relay.token", b"deploy-test-relay-token"),
            ("rendezvous.key", &[7u8; 32]),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, contents).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        Self { dir }
    }

    /// `relative` from `deploy/` with `/etc/exec-server/` and the binary's path pointed
    /// here, written to this directory under its own name.
    fn adapt(&self, relative: &str) -> PathBuf {
        let original = std::fs::read_to_string(deploy(relative)).unwrap();
        let adapted = original
            .replace(
                "/etc/exec-server/",
                &format!("{}/", self.dir.path().display()),
            )
            .replace(
                "/usr/local/bin/exec-server",
                &server_bin().display().to_string(),
            );
        let name = Path::new(relative).file_name().unwrap();
        let path = self.dir.path().join(name);
        std::fs::write(&path, adapted).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }
}

#[test]
fn the_systemd_units_and_the_account_pass_systemd_s_own_checks() {
    let test = "deploy::systemd";
    let (Some(analyze), Some(sysusers)) = (
        tool("systemd-analyze", test),
        tool("systemd-sysusers", test),
    ) else {
        return;
    };
    let etc = Etc::new();
    for unit in [
        "systemd/exec-server.service",
        "systemd/exec-server-executor.service",
        "systemd/exec-server-rendezvous.service",
    ] {
        let path = etc.adapt(unit);
        let out = Command::new(&analyze)
            .args(["verify", "--man=no"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{unit}: {}", text(&out));
        // Unknown keys and bad values are warnings with status 0: none is allowed.
        assert!(text(&out).trim().is_empty(), "{unit}: {}", text(&out));
        let original = std::fs::read_to_string(deploy(unit)).unwrap();
        for needed in [
            "Wants=network-online.target",
            "After=network-online.target",
            "User=exec-server",
            "TasksMax=",
            "MemoryMax=",
            "RestartPreventExitStatus=",
            "LimitNOFILE=",
        ] {
            assert!(original.contains(needed), "{unit} lacks {needed}");
        }
    }
    let out = Command::new(&sysusers)
        .arg("--dry-run")
        .arg(deploy("systemd/exec-server.sysusers"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("Creating user 'exec-server'"),
        "{}",
        text(&out)
    );
}

/// The command line of a unit's `ExecStart=`, split on spaces (the units quote nothing).
fn exec_start(unit: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(unit).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart=");
    line.split(' ').skip(1).map(str::to_owned).collect()
}

#[test]
fn the_server_and_executor_units_start_with_configurations_the_server_accepts() {
    let etc = Etc::new();
    etc.adapt("config/exec-server.toml");
    etc.adapt("config/executor.toml");
    for unit in [
        "systemd/exec-server.service",
        "systemd/exec-server-executor.service",
    ] {
        let mut args = exec_start(&etc.adapt(unit));
        args.push("config".into());
        let out = Command::new(server_bin())
            .args(&args)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{unit}: {args:?}: {}",
            text(&out)
        );
    }
}

#[tokio::test]
async fn the_rendezvous_unit_starts_a_rendezvous_with_its_configuration() {
    let etc = Etc::new();
    etc.adapt("config/rendezvous.toml");
    let args = exec_start(&etc.adapt("systemd/exec-server-rendezvous.service"));
    // Port 0 instead of the unit's 8700, which may be taken on a test machine.
    let args: Vec<String> = args
        .into_iter()
        .map(|a| a.replace("127.0.0.1:8700", "127.0.0.1:0"))
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = server_command(&args).spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut line))
        .await
        .expect("the rendezvous announces its URL")
        .unwrap();
    assert_eq!(line.trim(), "https://relay.example.com", "its public URL");
    child.kill().await.unwrap();
}

#[test]
fn the_nginx_configurations_pass_nginx_t() {
    let Some(nginx) = tool("nginx", "deploy::nginx") else {
        return;
    };
    let pki = Pki::issue(&["relay.example.com"]);
    let dir = tempfile::tempdir().unwrap();
    for conf in ["nginx/rendezvous.conf", "nginx/rendezvous-nodes.conf"] {
        let site = std::fs::read_to_string(deploy(conf))
            .unwrap()
            .replace(
                "/etc/ssl/relay.example.com.crt",
                &pki.cert.display().to_string(),
            )
            .replace(
                "/etc/ssl/relay.example.com.key",
                &pki.key.display().to_string(),
            );
        let site_path = dir.path().join("site.conf");
        std::fs::write(&site_path, site).unwrap();
        // The conf.d include of a stock nginx.conf, with its run files kept here.
        let main = format!(
            "pid {d}/nginx.pid;\nerror_log {d}/error.log;\nevents {{}}\nhttp {{\n    access_log off;\n    client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n    include {site};\n}}\n",
            d = dir.path().display(),
            site = site_path.display()
        );
        let main_path = dir.path().join("nginx.conf");
        std::fs::write(&main_path, main).unwrap();
        let out = Command::new(&nginx)
            .arg("-t")
            .arg("-p")
            .arg(dir.path())
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .arg("-c")
            .arg(&main_path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{conf}: {}", text(&out));
        assert!(
            text(&out).contains("test is successful"),
            "{conf}: {}",
            text(&out)
        );
    }
}

/// The lines that matter: comments and blank lines dropped, each line trimmed.
fn significant(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| line.split(" #").next().unwrap_or_default().trim())
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// The guide shows the deploy files, not copies that can drift from them.
#[test]
fn the_operations_guide_shows_the_deploy_files_as_they_are() {
    let guide =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/OPERATIONS.md"))
            .unwrap();
    let blocks: Vec<Vec<String>> = guide
        .split("```")
        .skip(1)
        .step_by(2)
        .map(|block| significant(block.split_once('\n').map_or("", |(_, body)| body)))
        .collect();
    for file in [
        "nginx/rendezvous.conf",
        "nginx/rendezvous-nodes.conf",
        "config/exec-server.toml",
    ] {
        let wanted = significant(&std::fs::read_to_string(deploy(file)).unwrap());
        assert!(
            blocks.contains(&wanted),
            "docs/OPERATIONS.md shows no block equal to deploy/{file}"
        );
    }
    let nginx_blocks = guide.matches("```nginx").count();
    assert_eq!(
        nginx_blocks, 2,
        "every nginx block of the guide is a deploy file"
    );
}

//! `exec-server doctor`: what it says about this machine, and what it says when a feature
//! is taken away (namespaces inside a sandbox, a low descriptor limit, an unreachable
//! Redis store).

use std::process::Output;

use crate::client::{run_command, run_output};
use crate::util::{config_file, server_bin};

fn doctor(args: &[&str]) -> Output {
    std::process::Command::new(server_bin())
        .arg("doctor")
        .args(args)
        .output()
        .unwrap()
}

fn lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The line of check `name`.
fn check<'a>(lines: &'a [String], name: &str) -> &'a str {
    lines
        .iter()
        .find(|line| {
            line.get(6..)
                .is_some_and(|rest| rest.starts_with(&format!("{name} ")))
        })
        .unwrap_or_else(|| panic!("no `{name}` line in {lines:#?}"))
}

#[test]
fn doctor_reports_every_check_on_this_machine() {
    let out = doctor(&[]);
    let lines = lines(&out);
    for name in [
        "kernel",
        "landlock",
        "seccomp",
        "userns",
        "pidns",
        "mountns",
        "netns",
        "openat2",
        "open files",
        "clock",
    ] {
        let line = check(&lines, name);
        assert!(
            ["ok  ", "WARN", "FAIL"]
                .iter()
                .any(|tag| line.starts_with(tag)),
            "{line}"
        );
    }
    // The Landlock line agrees with the kernel.
    let abi = exec_server_sandbox::enforce::landlock_abi_query();
    let landlock = check(&lines, "landlock");
    if abi > 0 {
        assert!(landlock.contains(&format!("ABI {abi}")), "{landlock}");
    } else {
        assert!(landlock.starts_with("FAIL"), "{landlock}");
    }
    // The sandbox tests of this suite need these; here they are all there.
    for name in ["seccomp", "userns", "pidns", "mountns", "netns"] {
        assert!(
            check(&lines, name).starts_with("ok"),
            "{}",
            check(&lines, name)
        );
    }
    assert_eq!(out.status.code(), Some(0), "{lines:#?}");
}

#[tokio::test]
async fn inside_a_sandbox_the_missing_namespaces_fail_with_the_fix() {
    let server = format!("{} --listen stdio", server_bin().display());
    let bin = server_bin().display().to_string();
    let out = run_output(&mut run_command(&[
        "--stdio",
        &server,
        "--sandbox",
        "read-only",
        "--",
        &bin,
        "doctor",
    ]))
    .await;
    let lines = lines(&out);
    for name in ["userns", "pidns", "mountns", "netns"] {
        let line = check(&lines, name);
        assert!(line.starts_with("FAIL"), "{line}");
        assert!(
            line.contains("refused (") && line.contains("sandbox.enforcement"),
            "{line}"
        );
    }
    assert_eq!(
        out.status.code(),
        Some(1),
        "a required layer is missing: {lines:#?}"
    );
}

#[test]
fn a_low_descriptor_limit_and_an_unreachable_store_are_named() {
    let config =
        config_file("[rendezvous]\nstore = \"redis://admin:store-secret@127.0.0.1:1/0\"\n");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 256 && exec {} doctor --config {}",
            server_bin().display(),
            config.to_str().unwrap()
        ))
        .output()
        .unwrap();
    let lines = lines(&out);
    let files = check(&lines, "open files");
    assert!(files.starts_with("WARN"), "{files}");
    assert!(
        files.contains("open-file limit 256 (hard 256)") && files.contains("LimitNOFILE=65536"),
        "{files}"
    );
    let redis = check(&lines, "redis");
    assert!(
        redis.starts_with("FAIL") && redis.contains("unreachable"),
        "{redis}"
    );
    assert!(redis.contains("127.0.0.1:1"), "{redis}");
    let all = String::from_utf8_lossy(&out.stdout);
    assert!(
        !all.contains("store-secret"),
        "the store's password stays out: {all}"
    );
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn a_broken_configuration_is_a_failing_line_not_a_crash() {
    let config = config_file("[sandbox]\nenforcement = \"sometimes\"\n");
    let out = doctor(&["--config", config.to_str().unwrap()]);
    let lines = lines(&out);
    let line = check(&lines, "config");
    assert!(
        line.starts_with("FAIL") && line.contains("sandbox.enforcement"),
        "{line}"
    );
    assert_eq!(out.status.code(), Some(1));
}

/// A store on a unix socket (`unix:///path`, which `rendezvous.store` accepts) is reached
/// there; here by a stand-in that answers PING as Redis does.
#[test]
fn a_store_on_a_unix_socket_is_pinged_there() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("redis.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let answering = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut ping = [0u8; 6];
        stream.read_exact(&mut ping).unwrap();
        assert_eq!(&ping, b"PING\r\n");
        stream.write_all(b"+PONG\r\n").unwrap();
    });
    let config = config_file(&format!(
        "[rendezvous]\nstore = \"unix://{}\"\n",
        socket.display()
    ));
    let out = doctor(&["--config", config.to_str().unwrap()]);
    answering.join().unwrap();
    let lines = lines(&out);
    let redis = check(&lines, "redis");
    assert!(
        redis.starts_with("ok") && redis.contains("answers PING"),
        "{redis}"
    );
}

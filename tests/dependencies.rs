//! Crate layering that reviews cannot see in one file: the client library carries no
//! server code, so a harness that links it gets neither axum nor the rendezvous service.

use std::process::Command;

/// Every package `cargo tree` shows for `package` (normal, build and dev dependencies),
/// one name per entry.
fn dependency_names(package: &str) -> Vec<String> {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--prefix",
            "none",
            "-e",
            "normal,build,dev",
            "-p",
        ])
        .arg(package)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn the_client_library_depends_on_the_relay_core_and_no_server() {
    let names = dependency_names("exec-server-client");
    assert!(
        names.iter().any(|n| n == "exec-server-relay-core"),
        "{names:?}"
    );
    for server in [
        "axum",
        "exec-server-core",
        "exec-server-relay",
        "exec-server-rendezvous",
    ] {
        assert!(
            !names.iter().any(|n| n == server),
            "exec-server-client pulls in {server}"
        );
    }
}

//! Records what identifies this build for `providerId` (CODEX-0169 §2.2): the target
//! triple and, when the source is a git checkout, the commit it was built from.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    Some(text.trim().to_owned()).filter(|t| !t.is_empty())
}

fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    println!("cargo:rustc-env=EXEC_SERVER_BUILD_TARGET={target}");
    println!("cargo:rerun-if-env-changed=EXEC_SERVER_BUILD_COMMIT");
    let commit = std::env::var("EXEC_SERVER_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "HEAD"]));
    if let Some(commit) = commit {
        println!("cargo:rustc-env=EXEC_SERVER_BUILD_COMMIT={commit}");
    }
    // Rebuild when the checked-out commit moves: HEAD, the branch it names, packed refs.
    for path in ["HEAD", "packed-refs"] {
        if let Some(file) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={}", PathBuf::from(file).display());
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(file) = git(&["rev-parse", "--git-path", &branch]) {
            println!("cargo:rerun-if-changed={}", PathBuf::from(file).display());
        }
    }
}

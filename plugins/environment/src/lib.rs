//! The `environment/*` plugin (PROTOCOL §6): `environment/info` describes the host as the
//! server sees it, `environment/status` is a cheap liveness probe.
//!
//! It is written only against the public plugin API, like any third-party family.

use std::ffi::{CStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use exec_server_core::proto::environment::{
    Capabilities, EnvironmentInfo, EnvironmentStatus, ShellInfo,
};
use exec_server_core::proto::path::to_file_uri;
use exec_server_core::proto::RpcError;
use exec_server_core::{Call, Install, InstallError, MethodDecl, NoParams, Plugin};

pub const INFO: &str = "environment/info";
pub const STATUS: &str = "environment/status";

exec_server_core::inventory::submit! {
    Plugin {
        name: "environment",
        summary: "host information (environment/info) and a liveness probe (environment/status)",
        methods: &[
            MethodDecl { name: INFO, family: "environment info" },
            MethodDecl { name: STATUS, family: "environment status" },
        ],
        config: None,
        install,
    }
}

fn install(install: &mut Install<'_>) -> Result<(), InstallError> {
    install.method(INFO, |_: Call, _: NoParams| async {
        Ok::<_, RpcError>(host_info())
    });
    install.method(STATUS, |_: Call, _: NoParams| async {
        Ok::<_, RpcError>(EnvironmentStatus {
            status: "ready".into(),
        })
    });
    Ok(())
}

/// Gathers `environment/info` afresh on every call: the answer is cheap and the host's
/// environment may change under a long-running server.
pub fn host_info() -> EnvironmentInfo {
    let cwd = std::env::current_dir().ok();
    let tmpdir = std::env::var_os("TMPDIR")
        .filter(|v| !v.is_empty())
        .map(|v| absolute(PathBuf::from(v), cwd.as_deref()));
    EnvironmentInfo {
        shell: user_shell(),
        cwd: cwd.as_deref().map(to_file_uri),
        temporary_directories: tmpdir.iter().map(|p| to_file_uri(p)).collect(),
        temp_dir: Some(to_file_uri(tmpdir.as_deref().unwrap_or(Path::new("/tmp")))),
        capabilities: Capabilities::default(),
    }
}

fn absolute(path: PathBuf, cwd: Option<&Path>) -> PathBuf {
    match cwd {
        Some(cwd) if path.is_relative() => cwd.join(path),
        _ => path,
    }
}

const KNOWN_SHELLS: [&str; 3] = ["bash", "zsh", "sh"];

/// `SHELL`, else the login shell from the password database; `sh` at `/bin/sh` unless that
/// is bash, zsh or sh.
fn user_shell() -> ShellInfo {
    let candidate = std::env::var_os("SHELL")
        .filter(|s| !s.is_empty())
        .or_else(login_shell)
        .map(PathBuf::from);
    candidate
        .and_then(|path| {
            let name = path.file_name()?.to_str()?.to_owned();
            let path_text = path.to_str()?.to_owned();
            (KNOWN_SHELLS.contains(&name.as_str()) && path.is_absolute()).then_some(ShellInfo {
                name,
                path: path_text,
            })
        })
        .unwrap_or_else(|| ShellInfo {
            name: "sh".into(),
            path: "/bin/sh".into(),
        })
}

fn login_shell() -> Option<OsString> {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: `passwd` is plain data; getpwuid_r writes into `pwd` and `buf` (whose length
    // we pass) and sets `result` to null or to `&pwd`. We read `pw_shell` only on success,
    // while `buf`, which it points into, is alive.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(
            libc::getuid(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        );
        if rc != 0 || result.is_null() || pwd.pw_shell.is_null() {
            return None;
        }
        Some(OsString::from_vec(
            CStr::from_ptr(pwd.pw_shell).to_bytes().to_vec(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_has_every_always_present_member() {
        let info = host_info();
        assert!(KNOWN_SHELLS.contains(&info.shell.name.as_str()));
        assert!(info.shell.path.starts_with('/'));
        assert!(info.temp_dir.unwrap().starts_with("file:///"));
        assert_eq!(info.capabilities, Capabilities::default());
    }
}

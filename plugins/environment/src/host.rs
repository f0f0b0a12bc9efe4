//! The `environment/info` object (CODEX-0169 §2.2), gathered afresh on every call: the
//! answer is cheap and the host's environment may change under a long-running server.

use std::ffi::{CStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use exec_server_core::proto::environment::{Capabilities, EnvironmentInfo, ShellInfo};
use exec_server_core::proto::path::to_file_uri;
use sha2::{Digest, Sha256};

/// The object `environment/info` answers and `initialize` carries, with `capabilities` as
/// the server computed them from its installed plugins and switches.
pub fn host_info(capabilities: &Capabilities) -> EnvironmentInfo {
    let cwd = std::env::current_dir().ok();
    let tmpdir = std::env::var_os("TMPDIR")
        .filter(|v| !v.is_empty())
        .map(|v| absolute(PathBuf::from(v), cwd.as_deref()));
    EnvironmentInfo {
        shell: user_shell(),
        executor_version: env!("CARGO_PKG_VERSION").to_owned(),
        provider_id: Some(provider_id().to_owned()),
        cwd: cwd.as_deref().map(to_file_uri),
        user_home_dir: user_home().as_deref().map(to_file_uri),
        platform_os: Some(std::env::consts::OS.to_owned()),
        prepend_path_dirs: Vec::new(),
        temporary_directories: tmpdir.iter().map(|p| to_file_uri(p)).collect(),
        temp_dir: Some(to_file_uri(tmpdir.as_deref().unwrap_or(Path::new("/tmp")))),
        capabilities: capabilities.clone(),
    }
}

/// `sha256:` over the release, the target triple and the commit this binary was built
/// from (when built from a git checkout): equal for equal builds, different otherwise. A
/// lookup key for clients, not a checksum of the binary.
pub fn provider_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let identity = format!(
            "exec-server\n{}\n{}\n{}",
            env!("CARGO_PKG_VERSION"),
            env!("EXEC_SERVER_BUILD_TARGET"),
            option_env!("EXEC_SERVER_BUILD_COMMIT").unwrap_or("unknown"),
        );
        let digest = Sha256::digest(identity.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    })
}

/// The host name (`uname -n`), if it can be read.
pub fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`, which we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec())
        .ok()
        .filter(|h| !h.is_empty())
}

/// `HOME`, else the home directory in the password database.
pub fn user_home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
        .or_else(|| passwd_field(|pwd| pwd.pw_dir).map(PathBuf::from))
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
    passwd_field(|pwd| pwd.pw_shell)
}

/// One string field of the current user's password database entry.
fn passwd_field(field: fn(&libc::passwd) -> *mut libc::c_char) -> Option<OsString> {
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: `passwd` is plain data; getpwuid_r writes into `pwd` and `buf` (whose length
    // we pass) and sets `result` to null or to `&pwd`. We read the field only on success,
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
        let value = field(&pwd);
        if rc != 0 || result.is_null() || value.is_null() {
            return None;
        }
        Some(OsString::from_vec(
            CStr::from_ptr(value).to_bytes().to_vec(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_has_every_always_present_member() {
        let info = host_info(&Capabilities::default());
        assert!(KNOWN_SHELLS.contains(&info.shell.name.as_str()));
        assert!(info.shell.path.starts_with('/'));
        assert!(info.temp_dir.unwrap().starts_with("file:///"));
        assert_eq!(info.capabilities, Capabilities::default());
        assert_eq!(info.platform_os.as_deref(), Some("linux"));
        let id = info.provider_id.unwrap();
        assert_eq!(id.len(), "sha256:".len() + 64, "{id}");
        assert_eq!(id, provider_id(), "stable within a build");
    }
}

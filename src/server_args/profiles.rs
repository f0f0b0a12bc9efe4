//! `run -p NAME`: where to run, from `~/.config/exec-server/profiles.toml`, so that
//! `exec-server run -p build -- make` replaces a line of flags.
//!
//! ```toml
//! [build]
//! url = "ws://10.0.0.7:9000"
//! token_file = "~/.config/exec-server/build.token"
//!
//! [ci]
//! remote = "https://relay.example.com"
//! environment_id = "ci-1"
//! ca_file = "~/.config/exec-server/relay-ca.pem"
//! ```
//!
//! The file is `$EXEC_SERVER_PROFILES`, else `$XDG_CONFIG_HOME/exec-server/profiles.toml`,
//! else `~/.config/exec-server/profiles.toml`. A flag on the command line wins over the
//! profile's value; a profile that names another way to reach a server than a flag is used
//! for nothing but what the flag leaves unset of its own way.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::ServerArgs;

/// One profile: a way to reach a server and what it needs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Profile {
    url: Option<String>,
    token_file: Option<String>,
    stdio: Option<String>,
    remote: Option<String>,
    environment_id: Option<String>,
    ca_file: Option<String>,
}

/// Fills what `args` leaves unset from its `--profile`, if it names one.
pub(super) fn apply(args: &mut ServerArgs) -> Result<(), String> {
    let Some(name) = args.profile.clone() else {
        return Ok(());
    };
    let path = profiles_file()
        .ok_or("no profiles file: neither $EXEC_SERVER_PROFILES nor $HOME is set")?;
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("profile `{name}`: cannot read {}: {e}", path.display()))?;
    let mut profiles: BTreeMap<String, Profile> =
        toml::from_str(&text).map_err(|e| format!("{}: {}", path.display(), e.message()))?;
    let profile = profiles.remove(&name).ok_or_else(|| {
        let known: Vec<&str> = profiles.keys().map(String::as_str).collect();
        format!(
            "no profile `{name}` in {} (it has: {})",
            path.display(),
            known.join(", ")
        )
    })?;
    merge(args, profile);
    Ok(())
}

/// The profile's values where the command line has none. A flag that names a way to reach
/// a server (`--url`, `--stdio`, `--remote`) replaces the profile's way entirely.
fn merge(args: &mut ServerArgs, profile: Profile) {
    let flag_way = args.url.is_some() || args.stdio.is_some() || args.remote.is_some();
    if !flag_way {
        args.url = profile.url;
        args.stdio = profile.stdio;
        args.remote = profile.remote;
    }
    if args.url.is_some() && args.token_file.is_none() {
        args.token_file = profile.token_file.map(expand_home);
    }
    if args.remote.is_some() {
        args.environment_id = args.environment_id.take().or(profile.environment_id);
        args.ca_file = args.ca_file.take().or(profile.ca_file.map(expand_home));
    }
}

fn profiles_file() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("EXEC_SERVER_PROFILES").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(config.join("exec-server/profiles.toml"))
}

/// `~/x` as `$HOME/x`; other paths as written.
fn expand_home(path: String) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(path),
    }
}

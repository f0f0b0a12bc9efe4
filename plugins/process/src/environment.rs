//! The child's environment and program lookup (PROTOCOL §4.2.4, §4.2.5).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use exec_server_core::proto::process::{EnvInherit, EnvPolicy};
use exec_server_core::proto::RpcError;

/// Removed from every child environment, whatever the client asked (§4.2.4 step 3).
const SCRUBBED: [&str; 7] = [
    "CODEX_EXEC_SERVER_CONNECTION_TOKEN",
    "CODEX_EXEC_SERVER_EXIT_ON_STDIN_CLOSE",
    "CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN",
    "NODE_REPL_AUTH_TOKEN",
    "OPENAI_FEDERATION_RULE_ID",
    "OPENAI_IDENTITY_TOKEN_FILE",
    "OPENAI_WORKLOAD_IDENTITY_CONTEXT",
];

/// `inherit: "core"` keeps only these (§4.2.5 step 1).
const CORE_VARIABLES: [&str; 11] = [
    "PATH", "SHELL", "TMPDIR", "TEMP", "TMP", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "LOGNAME",
    "USER",
];

/// Prefixes of the server's own configuration, never inherited.
const SERVER_PREFIXES: [&str; 2] = ["EXEC_SERVER_", "CODEX_EXEC_SERVER_"];

/// Secret-looking names dropped unless `ignoreDefaultExcludes` (§4.2.5 step 2).
const DEFAULT_EXCLUDES: [&str; 3] = ["*KEY*", "*SECRET*", "*TOKEN*"];

/// Used for program lookup when neither the child nor the server has a `PATH`.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Checks rows 5 and 6 of §4.2.3: every name first, then every value.
pub(crate) fn validate(
    env: &BTreeMap<String, String>,
    policy: Option<&EnvPolicy>,
) -> Result<(), RpcError> {
    let set = policy.map(|p| &p.set);
    let all = || env.iter().chain(set.into_iter().flatten());
    if let Some((name, _)) = all().find(|(name, _)| !valid_name(name)) {
        return Err(RpcError::invalid_env_name(name));
    }
    if let Some((name, _)) = all().find(|(_, value)| value.contains('\0')) {
        return Err(RpcError::env_value_nul(name));
    }
    Ok(())
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '\0'])
}

/// Builds the child's environment from the request and the server's own variables.
/// `relay_token_env` names the relay token variable, which is never inherited.
pub(crate) fn child_environment(
    env: &BTreeMap<String, String>,
    policy: Option<&EnvPolicy>,
    server_env: impl IntoIterator<Item = (OsString, OsString)>,
    relay_token_env: Option<&str>,
) -> BTreeMap<OsString, OsString> {
    let mut vars: BTreeMap<OsString, OsString> = BTreeMap::new();
    if let Some(policy) = policy {
        vars = inherited(policy, server_env, relay_token_env);
    }
    for (name, value) in env {
        vars.insert(name.into(), value.into());
    }
    vars.retain(|name, _| !SCRUBBED.iter().any(|s| eq_ignore_case(name, s)));
    vars
}

fn inherited(
    policy: &EnvPolicy,
    server_env: impl IntoIterator<Item = (OsString, OsString)>,
    relay_token_env: Option<&str>,
) -> BTreeMap<OsString, OsString> {
    let own_secret = |name: &OsStr| {
        SERVER_PREFIXES
            .iter()
            .any(|prefix| starts_with_ignore_case(name, prefix))
            || relay_token_env.is_some_and(|relay| eq_ignore_case(name, relay))
    };
    let mut vars: BTreeMap<OsString, OsString> = server_env
        .into_iter()
        .filter(|(name, _)| match policy.inherit {
            EnvInherit::All => true,
            EnvInherit::Core => CORE_VARIABLES.iter().any(|c| eq_ignore_case(name, c)),
            EnvInherit::None => false,
        })
        .filter(|(name, _)| !own_secret(name))
        .collect();
    if !policy.ignore_default_excludes {
        vars.retain(|name, _| !DEFAULT_EXCLUDES.iter().any(|p| pattern_matches(p, name)));
    }
    vars.retain(|name, _| !policy.exclude.iter().any(|p| pattern_matches(p, name)));
    for (name, value) in &policy.set {
        vars.insert(name.into(), value.into());
    }
    if !policy.include_only.is_empty() {
        vars.retain(|name, _| policy.include_only.iter().any(|p| pattern_matches(p, name)));
    }
    vars
}

fn eq_ignore_case(name: &OsStr, other: &str) -> bool {
    name.as_bytes().eq_ignore_ascii_case(other.as_bytes())
}

fn starts_with_ignore_case(name: &OsStr, prefix: &str) -> bool {
    let name = name.as_bytes();
    name.len() >= prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// Whole-name, case-insensitive match: `*` is any run of characters, `?` exactly one.
pub(crate) fn pattern_matches(pattern: &str, name: &OsStr) -> bool {
    let fold = |c: char| c.to_lowercase().collect::<String>();
    let pattern: Vec<String> = pattern.chars().map(fold).collect();
    let name: Vec<String> = String::from_utf8_lossy(name.as_bytes())
        .chars()
        .map(fold)
        .collect();
    // Iterative wildcard matching: remember the last `*` and retry from one further on.
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p).map(String::as_str) {
            Some("*") => {
                star = Some((p, n));
                p += 1;
            }
            Some(c) if c == "?" || *c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((star_p, star_n)) => {
                    p = star_p + 1;
                    n = star_n + 1;
                    star = Some((star_p, star_n + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|c| c == "*")
}

/// The paths to try for `argv[0]`, in order (§4.2.4 "Program lookup"): a name with a `/` is
/// a path (relative to `cwd`); anything else is searched in the child's `PATH`, or in the
/// server's when the child has none.
pub(crate) fn program_candidates(
    program: &str,
    cwd: &Path,
    child_env: &BTreeMap<OsString, OsString>,
    server_path: Option<OsString>,
) -> Vec<PathBuf> {
    if program.is_empty() {
        return vec![PathBuf::new()];
    }
    if program.contains('/') {
        return vec![cwd.join(program)];
    }
    let search = child_env
        .get(OsStr::new("PATH"))
        .cloned()
        .or(server_path)
        .unwrap_or_else(|| DEFAULT_PATH.into());
    search
        .as_bytes()
        .split(|b| *b == b':')
        .map(|dir| {
            // An empty entry means the working directory, as in every shell.
            cwd.join(OsStr::from_bytes(dir)).join(program)
        })
        .collect()
}

/// `NAME=VALUE` byte strings for `execve`.
pub(crate) fn envp_entries(vars: &BTreeMap<OsString, OsString>) -> Vec<Vec<u8>> {
    vars.iter()
        .map(|(name, value)| {
            let mut entry = name.clone().into_vec();
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            entry
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn server_env() -> Vec<(OsString, OsString)> {
        [
            ("PATH", "/usr/bin:/bin"),
            ("HOME", "/home/dev"),
            ("Lang", "C.UTF-8"),
            ("EDITOR", "vi"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("GITHUB_TOKEN", "t"),
            ("EXEC_SERVER_RELAY_TOKEN", "r"),
            ("exec_server_websocket__bearer_token", "b"),
            ("CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN", "n"),
            ("MY_RELAY_SECRET_VAR", "m"),
            ("RELAY_PASS", "p"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
    }

    fn policy(inherit: EnvInherit) -> EnvPolicy {
        EnvPolicy {
            inherit,
            ignore_default_excludes: false,
            exclude: vec![],
            set: BTreeMap::new(),
            include_only: vec![],
        }
    }

    fn names(vars: &BTreeMap<OsString, OsString>) -> Vec<&str> {
        vars.keys().map(|k| k.to_str().unwrap()).collect()
    }

    #[test]
    fn patterns_match_whole_names_case_insensitively() {
        let m = |p: &str, n: &str| pattern_matches(p, OsStr::new(n));
        assert!(m("*KEY*", "aws_secret_access_key"));
        assert!(m("*KEY*", "KEY"));
        assert!(!m("KEY", "KEYS"));
        assert!(m("LC_?", "lc_x"));
        assert!(!m("LC_?", "LC_"));
        assert!(!m("LC_?", "LC_AB"));
        assert!(m("a*b*c", "aXXbYYbc"));
        assert!(!m("a*b*c", "aXXbYYbd"));
        assert!(m("*", ""));
        assert!(!m("?", ""));
        assert!(m("**x", "x"));
    }

    #[test]
    fn no_policy_means_exactly_env_minus_the_scrub_list() {
        let env = map(&[("A", "1"), ("node_repl_auth_token", "x"), ("PATH", "/p")]);
        let vars = child_environment(&env, None, server_env(), None);
        assert_eq!(names(&vars), ["A", "PATH"]);
    }

    #[test]
    fn inherit_all_applies_default_excludes_and_never_passes_server_secrets() {
        let vars = child_environment(
            &BTreeMap::new(),
            Some(&policy(EnvInherit::All)),
            server_env(),
            Some("RELAY_PASS"),
        );
        assert_eq!(names(&vars), ["EDITOR", "HOME", "Lang", "PATH"]);

        let mut p = policy(EnvInherit::All);
        p.ignore_default_excludes = true;
        let vars = child_environment(&BTreeMap::new(), Some(&p), server_env(), None);
        assert_eq!(
            names(&vars),
            [
                "AWS_SECRET_ACCESS_KEY",
                "EDITOR",
                "GITHUB_TOKEN",
                "HOME",
                "Lang",
                "MY_RELAY_SECRET_VAR",
                "PATH",
                "RELAY_PASS"
            ]
        );
    }

    #[test]
    fn core_none_exclude_set_and_include_only_apply_in_order() {
        let vars = child_environment(
            &BTreeMap::new(),
            Some(&policy(EnvInherit::Core)),
            server_env(),
            None,
        );
        assert_eq!(names(&vars), ["HOME", "Lang", "PATH"]);

        let vars = child_environment(
            &BTreeMap::new(),
            Some(&policy(EnvInherit::None)),
            server_env(),
            None,
        );
        assert!(vars.is_empty());

        let mut p = policy(EnvInherit::All);
        p.exclude = vec!["ed*".into()];
        p.set = map(&[("GITHUB_TOKEN", "mine"), ("EXTRA", "1")]);
        p.include_only = vec!["*TOKEN".into(), "PATH".into(), "extra".into()];
        let env = map(&[("EXEC_SERVER_OWN", "explicit")]);
        let vars = child_environment(&env, Some(&p), server_env(), None);
        assert_eq!(
            names(&vars),
            ["EXEC_SERVER_OWN", "EXTRA", "GITHUB_TOKEN", "PATH"]
        );
        assert_eq!(vars[OsStr::new("GITHUB_TOKEN")], "mine");
    }

    #[test]
    fn env_overlay_wins_and_the_scrub_applies_to_it() {
        let mut p = policy(EnvInherit::All);
        p.set = map(&[("OPENAI_IDENTITY_TOKEN_FILE", "/f")]);
        let env = map(&[("HOME", "/elsewhere"), ("Openai_Federation_Rule_Id", "x")]);
        let vars = child_environment(&env, Some(&p), server_env(), None);
        assert_eq!(vars[OsStr::new("HOME")], "/elsewhere");
        assert!(!vars.contains_key(OsStr::new("OPENAI_IDENTITY_TOKEN_FILE")));
        assert!(!vars.contains_key(OsStr::new("Openai_Federation_Rule_Id")));
    }

    #[test]
    fn validation_checks_every_name_before_any_value() {
        assert!(validate(&map(&[("A", "1")]), None).is_ok());
        let err = validate(&map(&[("A", "x\0"), ("B=C", "1")]), None).unwrap_err();
        assert_eq!(err.message, "invalid environment variable name `B=C`");
        let err = validate(&map(&[("", "1")]), None).unwrap_err();
        assert_eq!(err.message, "invalid environment variable name ``");
        let mut p = policy(EnvInherit::None);
        p.set = map(&[("S", "a\0b")]);
        let err = validate(&map(&[("A", "1")]), Some(&p)).unwrap_err();
        assert_eq!(err.message, "environment variable `S` contains a NUL byte");
        assert_eq!(err.code, -32602);
    }

    #[test]
    fn program_lookup_follows_the_child_path_then_the_server_path() {
        let cwd = Path::new("/work");
        let child: BTreeMap<OsString, OsString> = [("PATH".into(), "/opt/bin::rel".into())]
            .into_iter()
            .collect();
        assert_eq!(
            program_candidates("tool", cwd, &child, Some("/usr/bin".into())),
            [
                PathBuf::from("/opt/bin/tool"),
                "/work/tool".into(),
                "/work/rel/tool".into()
            ]
        );
        assert_eq!(
            program_candidates("tool", cwd, &BTreeMap::new(), Some("/usr/bin".into())),
            [PathBuf::from("/usr/bin/tool")]
        );
        assert_eq!(
            program_candidates("./x", cwd, &child, None),
            [PathBuf::from("/work/./x")]
        );
        assert_eq!(
            program_candidates("/bin/sh", cwd, &child, None),
            [PathBuf::from("/bin/sh")]
        );
    }
}

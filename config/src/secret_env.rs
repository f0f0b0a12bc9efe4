//! Secrets the process takes from its environment (bearer tokens, the rendezvous signing
//! key). Each is read once, while the process is still single-threaded, kept in memory,
//! removed from the environment — so no child started later inherits it — and erased from
//! the initial environment block, which is what `/proc/<pid>/environ` shows and which
//! `unsetenv` leaves untouched. Afterwards the secrets are only ever read from here.
//!
//! `main` calls [`capture_secret_variables`] first thing, then, once the configuration is
//! loaded and before any thread starts, [`capture_variables_named`] for variables whose
//! name the configuration chooses (`relay.token_env`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::ops::Range;
use std::sync::Mutex;

use crate::secret::SecretString;
pub use crate::variables::{
    config_variable, CONNECTION_TOKEN_ENV, LEGACY_RELAY_TOKEN_ENV, RELAY_TOKEN_ENV,
    RENDEZVOUS_SIGNING_KEY_ENV,
};
use crate::variables::{ENV_PREFIX, ENV_SEPARATOR};

/// Variables that hold a secret under a fixed name.
pub const SECRET_VARIABLES: &[&str] = &[
    CONNECTION_TOKEN_ENV,
    RELAY_TOKEN_ENV,
    LEGACY_RELAY_TOKEN_ENV,
    RENDEZVOUS_SIGNING_KEY_ENV,
];

/// Configuration keys that hold a secret inline; their `EXEC_SERVER_<TABLE>__<KEY>`
/// variables are secrets too.
pub const SECRET_KEYS: &[&str] = &["websocket.bearer_token"];

/// Configuration keys whose value is the name of a variable that holds a secret.
pub const SECRET_VARIABLE_NAME_KEYS: &[&str] = &["relay.token_env"];

/// Largest initial environment block this module will scan; the kernel's own limit on
/// `execve` arguments and environment is far below it.
const MAX_ENVIRONMENT_BLOCK: usize = 64 * 1024 * 1024;

#[derive(Default)]
struct Store {
    /// Captured values by variable name (configuration variables by their upper-case name).
    values: BTreeMap<String, SecretString>,
    /// Problems met while erasing, for `main` to log once logging is set up.
    warnings: Vec<String>,
}

static STORE: Mutex<Store> = Mutex::new(Store {
    values: BTreeMap::new(),
    warnings: Vec::new(),
});

fn store() -> std::sync::MutexGuard<'static, Store> {
    STORE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Takes every secret variable with a fixed name (and the configuration variables of
/// [`SECRET_KEYS`], in any letter case, as the configuration loader matches them).
///
/// Must run while the process has a single thread: it changes the environment, which is
/// not safe while another thread may read it.
pub fn capture_secret_variables() {
    let config_variables: Vec<String> = SECRET_KEYS.iter().map(|k| config_variable(k)).collect();
    let names: Vec<OsString> = std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| {
            let Some(text) = name.to_str() else {
                return false;
            };
            SECRET_VARIABLES.contains(&text)
                || config_variables
                    .iter()
                    .any(|variable| variable.eq_ignore_ascii_case(text))
        })
        .collect();
    capture(&names);
}

/// Takes the variables that the configuration names as holding a secret (the values of
/// [`SECRET_VARIABLE_NAME_KEYS`], from `ConfigSource::secret_variable_names`). Same
/// single-thread rule as [`capture_secret_variables`].
pub fn capture_variables_named(names: &[String]) {
    let names: Vec<OsString> = names
        .iter()
        .filter(|name| !name.is_empty() && !name.contains(['=', '\0']))
        .map(OsString::from)
        .collect();
    capture(&names);
}

fn capture(names: &[OsString]) {
    let mut taken = Vec::new();
    for name in names {
        let Some(value) = std::env::var_os(name) else {
            continue;
        };
        let value = value
            .into_string()
            .unwrap_or_else(|raw| String::from_utf8_lossy(raw.as_encoded_bytes()).into_owned());
        let key = name.to_string_lossy().into_owned();
        let key = if key.len() > ENV_PREFIX.len()
            && key
                .get(..ENV_PREFIX.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(ENV_PREFIX))
            && key.contains(ENV_SEPARATOR)
        {
            key.to_ascii_uppercase()
        } else {
            key
        };
        store().values.insert(key, SecretString::new(value));
        std::env::remove_var(name);
        taken.push(name.as_encoded_bytes().to_vec());
    }
    if taken.is_empty() {
        return;
    }
    if let Err(problem) = erase_from_initial_environment(&taken) {
        store().warnings.push(format!(
            "secret variables were removed from the environment but could not be erased from the initial environment block ({problem}); /proc/{}/environ may still show them to readers allowed to open it",
            std::process::id()
        ));
    }
}

/// The captured value of variable `name`. Secrets are never read from the environment
/// after capture; a variable that was not captured is unset as far as the server knows.
pub fn secret_variable(name: &str) -> Option<SecretString> {
    store().values.get(name).cloned()
}

/// Captured configuration variables as `(dotted key, value)`, for the configuration
/// loader's environment layer.
pub(crate) fn captured_config_values() -> Vec<(String, SecretString)> {
    store()
        .values
        .iter()
        .filter_map(|(name, value)| {
            let rest = name.strip_prefix(ENV_PREFIX)?;
            if !rest.contains(ENV_SEPARATOR) {
                return None;
            }
            let key = rest
                .split(ENV_SEPARATOR)
                .map(str::to_ascii_lowercase)
                .collect::<Vec<_>>()
                .join(".");
            Some((key, value.clone()))
        })
        .collect()
}

/// Problems met while erasing captured variables (emptied by the call), for the caller to
/// log once logging is set up.
pub fn take_warnings() -> Vec<String> {
    std::mem::take(&mut store().warnings)
}

/// Overwrites with zeros every entry `NAME=value` of the initial environment block whose
/// name is one of `names`.
fn erase_from_initial_environment(names: &[Vec<u8>]) -> Result<(), String> {
    let stat = std::fs::read_to_string("/proc/self/stat")
        .map_err(|e| format!("cannot read /proc/self/stat: {e}"))?;
    let block = environment_block_range(&stat)
        .ok_or_else(|| "no environment range in /proc/self/stat".to_owned())?;
    let len = block.end - block.start;
    if len > MAX_ENVIRONMENT_BLOCK {
        return Err(format!("the environment block is {len} bytes"));
    }
    let start = block.start as *mut u8;
    let mut copy = vec![0u8; len];
    // SAFETY: [env_start, env_end) is the environment block execve(2) placed on the initial
    // stack; it stays mapped, readable and writable for the life of the process. The copy
    // does not overlap it.
    unsafe { std::ptr::copy_nonoverlapping(start.cast_const(), copy.as_mut_ptr(), len) };
    for range in entries_named(&copy, names) {
        for offset in range {
            // SAFETY: `offset < len`, inside the block above. The process is single-threaded
            // (the callers' contract) and the erased entries were removed from `environ`
            // first, so nothing reads them while they are overwritten. Volatile, because no
            // Rust code reads these bytes afterwards and the store must not be elided.
            unsafe { std::ptr::write_volatile(start.add(offset), 0) };
        }
    }
    Ok(())
}

/// `env_start..env_end` (fields 50 and 51 of proc(5)) from the text of `/proc/self/stat`.
fn environment_block_range(stat: &str) -> Option<Range<usize>> {
    // The command name (field 2) may contain spaces and parentheses; fields after it are
    // plain numbers, the first of them field 3.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let start: usize = fields.get(50 - 3)?.parse().ok()?;
    let end: usize = fields.get(51 - 3)?.parse().ok()?;
    (start != 0 && end > start).then_some(start..end)
}

/// Byte ranges of the NUL-terminated entries of `block` named `names` (`NAME=…`), each
/// without its terminator.
fn entries_named(block: &[u8], names: &[Vec<u8>]) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let mut offset = 0;
    for entry in block.split(|&b| b == 0) {
        let named = names.iter().any(|name| {
            entry.len() > name.len() && entry.starts_with(name) && entry[name.len()] == b'='
        });
        if named {
            ranges.push(offset..offset + entry.len());
        }
        offset += entry.len() + 1;
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|n| n.as_bytes().to_vec()).collect()
    }

    #[test]
    fn entries_are_found_by_exact_name() {
        let block = b"PATH=/bin\0TOKEN=abc\0TOKEN_X=keep\0XTOKEN=keep\0TOKEN=dup\0TOKEN\0";
        let ranges = entries_named(block, &names(&["TOKEN"]));
        let found: Vec<&[u8]> = ranges.iter().map(|r| &block[r.clone()]).collect();
        assert_eq!(found, [b"TOKEN=abc".as_slice(), b"TOKEN=dup".as_slice()]);
    }

    #[test]
    fn erasing_the_ranges_leaves_other_entries_intact() {
        let mut block = b"A=1\0SECRET=s3cr3t\0B=2\0".to_vec();
        for range in entries_named(&block.clone(), &names(&["SECRET"])) {
            block[range].fill(0);
        }
        assert_eq!(block, b"A=1\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0B=2\0");
        assert!(!block.windows(6).any(|w| w == b"s3cr3t"));
    }

    #[test]
    fn the_environment_range_is_read_past_a_tricky_command_name() {
        let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        fields[50 - 3] = "140737488347000".into();
        fields[51 - 3] = "140737488349000".into();
        let stat = format!("4242 (a) b (c)) {}", fields.join(" "));
        assert_eq!(
            environment_block_range(&stat),
            Some(140_737_488_347_000..140_737_488_349_000)
        );
        assert_eq!(environment_block_range("1 (x) S 0"), None);
    }

    #[test]
    fn this_process_reports_its_environment_block() {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let range = environment_block_range(&stat).expect("env_start/env_end");
        let environ = std::fs::read("/proc/self/environ").unwrap();
        assert_eq!(range.end - range.start, environ.len());
    }

    /// Set in the child copy of this test binary that runs the capture for real.
    const CHILD_MARKER: &str = "EXEC_SERVER_SECRET_ENV_UNIT_CHILD";
    const SECRET: &str = "unit-secret-4f1d9c";

    /// The capture changes the process environment, which is only sound with one thread,
    /// so it runs in a fresh copy of this test binary that runs this one test.
    #[test]
    fn capture_takes_the_value_and_erases_every_trace() {
        if std::env::var_os(CHILD_MARKER).is_some() {
            capture_secret_variables();
            let config_variable = config_variable("websocket.bearer_token");
            assert!(std::env::var_os(RELAY_TOKEN_ENV).is_none());
            assert!(std::env::var_os(&config_variable).is_none());
            assert_eq!(secret_variable(RELAY_TOKEN_ENV).unwrap().expose(), SECRET);
            let captured = captured_config_values();
            assert_eq!(captured.len(), 1);
            assert_eq!(captured[0].0, "websocket.bearer_token");
            assert_eq!(captured[0].1.expose(), "cfg-secret");
            let environ = std::fs::read("/proc/self/environ").unwrap();
            for needle in [SECRET.as_bytes(), b"cfg-secret", b"EXEC_SERVER_RELAY_TOKEN"] {
                assert!(!environ.windows(needle.len()).any(|w| w == needle));
            }
            assert!(environ.windows(9).any(|w| w == b"KEEP=kept"));
            assert!(take_warnings().is_empty());
            return;
        }
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "secret_env::tests::capture_takes_the_value_and_erases_every_trace",
                "--test-threads=1",
            ])
            .env(CHILD_MARKER, "1")
            .env(RELAY_TOKEN_ENV, SECRET)
            .env("exec_server_websocket__bearer_token", "cfg-secret")
            .env("KEEP", "kept")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "the child test failed: {stdout}");
        assert!(
            stdout.contains("1 passed"),
            "the child ran no test: {stdout}"
        );
    }

    #[test]
    fn configuration_variables_are_named_like_the_loader_expects() {
        assert_eq!(
            config_variable("websocket.bearer_token"),
            "EXEC_SERVER_WEBSOCKET__BEARER_TOKEN"
        );
    }
}

//! Configuration layers and provenance: which file, variable or flag set a key.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::de::DeserializeOwned;

pub use crate::secret::REDACTED;
pub use crate::variables::{ENV_PREFIX, ENV_SEPARATOR};

const CLI_SOURCE_NAME: &str = "command line";
/// Names the layer of captured secret variables; `describe` reports it as an environment
/// variable, which is where the value came from.
const CAPTURED_SOURCE_NAME: &str = "captured environment variable";

/// One start-up configuration error: a complete `invalid config: …` line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Values given as command-line flags; they win over every other layer.
#[derive(Debug, Clone, Default)]
pub struct CliOverrides {
    /// Dotted key → value, e.g. `server.listen` → `["stdio"]`.
    pub values: Vec<(String, serde_json::Value)>,
}

impl CliOverrides {
    pub fn set(&mut self, key: &str, value: impl Into<serde_json::Value>) {
        self.values.push((key.to_owned(), value.into()));
    }
}

impl Provider for CliOverrides {
    fn metadata(&self) -> Metadata {
        Metadata::named(CLI_SOURCE_NAME)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        figment::providers::Serialized::defaults(nested(&self.values)).data()
    }
}

/// Dotted key → value pairs as one nested object (one figment layer's data).
fn nested(values: &[(String, serde_json::Value)]) -> serde_json::Value {
    let mut root = serde_json::Map::new();
    for (key, value) in values {
        let mut parts: Vec<&str> = key.split('.').collect();
        let last = parts.pop().unwrap_or_default();
        let mut table = &mut root;
        for part in parts {
            table = table
                .entry(part.to_owned())
                .or_insert_with(|| serde_json::Value::Object(Default::default()))
                .as_object_mut()
                .expect("the keys of one layer never collide with its values");
        }
        table.insert(last.to_owned(), value.clone());
    }
    serde_json::Value::Object(root)
}

/// The configuration variables holding secrets (`EXEC_SERVER_WEBSOCKET__BEARER_TOKEN`),
/// taken out of the environment at start-up ([`crate::secret_env`]): the environment layer
/// no longer sees them, so this layer puts them back at the same precedence. Values are
/// strings, as a token is, even when it looks like a number.
struct CapturedSecretVariables;

impl Provider for CapturedSecretVariables {
    fn metadata(&self) -> Metadata {
        Metadata::named(CAPTURED_SOURCE_NAME)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let values: Vec<(String, serde_json::Value)> = crate::secret_env::captured_config_values()
            .into_iter()
            .map(|(key, value)| (key, value.expose().into()))
            .collect();
        figment::providers::Serialized::defaults(nested(&values)).data()
    }
}

/// The layered configuration sources, before any typed view is taken.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    figment: Figment,
    /// The `--config` file, if one was read: it may hold secrets (tokens), so sandboxes deny
    /// access to it.
    config_file: Option<PathBuf>,
}

impl ConfigSource {
    /// Gathers the layers: the file named by `--config` (if any), the environment, the CLI.
    pub fn load(config_file: Option<&Path>, cli: CliOverrides) -> Result<Self, ConfigError> {
        Self::load_with_env(config_file, cli, true)
    }

    /// Like [`ConfigSource::load`]; `read_env: false` ignores the process environment
    /// (used by unit tests, which cannot own the process environment).
    pub fn load_with_env(
        config_file: Option<&Path>,
        cli: CliOverrides,
        read_env: bool,
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::new();
        if let Some(path) = config_file {
            let table = check_toml_file(path)?;
            check_inline_secrets(path, &table)?;
            figment = figment.merge(Toml::file_exact(path));
        }
        if read_env {
            figment = figment
                .merge(
                    Env::prefixed(ENV_PREFIX)
                        .filter(|key| key.as_str().contains(ENV_SEPARATOR))
                        .split(ENV_SEPARATOR),
                )
                .merge(CapturedSecretVariables);
        }
        figment = figment.merge(cli);
        let config_file =
            config_file.map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()));
        Ok(Self {
            figment,
            config_file,
        })
    }

    /// The configuration file that was read, if any (canonical path).
    pub fn config_file(&self) -> Option<&Path> {
        self.config_file.as_deref()
    }

    /// The string value of `key` if some layer sets it, e.g. a `*_file` setting.
    pub fn string_value(&self, key: &str) -> Option<String> {
        self.figment.extract_inner::<String>(key).ok()
    }

    /// The names of the environment variables that this configuration says hold a secret
    /// (the values of `secret_env::SECRET_VARIABLE_NAME_KEYS`, e.g. `relay.token_env`).
    pub fn secret_variable_names(&self) -> Vec<String> {
        crate::secret_env::SECRET_VARIABLE_NAME_KEYS
            .iter()
            .filter_map(|key| self.string_value(key))
            .collect()
    }

    /// A source made of one TOML text (tests and examples).
    pub fn from_toml_str(toml_text: &str) -> Self {
        Self {
            figment: Figment::new().merge(Toml::string(toml_text)),
            config_file: None,
        }
    }

    /// Top-level tables present in any layer, each with where it was set.
    pub fn tables(&self) -> Vec<(String, String)> {
        let top: BTreeMap<String, Value> = self.figment.extract().unwrap_or_default();
        top.into_keys()
            .map(|table| {
                let origin = self.origin(&table);
                (table, origin)
            })
            .collect()
    }

    /// Extracts one table as `T` (missing keys take `T`'s serde defaults).
    pub fn section<T: DeserializeOwned>(&self, table: &str) -> Result<T, ConfigError> {
        let figment = if self.figment.contains(table) {
            self.figment.clone()
        } else {
            // An absent table decodes as an empty one, so `T`'s defaults apply.
            self.figment
                .clone()
                .merge(figment::providers::Serialized::default(table, Dict::new()))
        };
        figment
            .extract_inner(table)
            .map_err(|e| self.decode_error(table, e))
    }

    /// Whether some layer (file, environment, command line) sets `key`; `false` means its
    /// default applies.
    pub fn is_set(&self, key: &str) -> bool {
        self.figment.contains(key)
    }

    /// ` (from …)` for the layer that set `key`, or ` (default)` if none did. A key inside
    /// an array (`rendezvous.tokens.0.sha256`) is blamed on the layer that set the array:
    /// arrays come whole from one layer.
    pub fn origin(&self, key: &str) -> String {
        let in_array = key
            .split('.')
            .position(|part| part.parse::<usize>().is_ok());
        let owner = match in_array {
            Some(index) => key.split('.').take(index).collect::<Vec<_>>().join("."),
            None => key.to_owned(),
        };
        match self.figment.find_metadata(&owner) {
            Some(metadata) => describe(metadata, &owner),
            None => " (default)".to_owned(),
        }
    }

    /// The `invalid config: <key> <problem>, got <value> (from …)` line for a value that
    /// decoded but failed validation.
    pub fn invalid(&self, key: &str, problem: impl fmt::Display) -> ConfigError {
        ConfigError(format!(
            "invalid config: {key} {problem}{}",
            self.origin(key)
        ))
    }

    /// Refuses zero for limits where zero would make a feature unusable: the first
    /// `(key, value)` that is zero gives `invalid config: <table>.<key> must be greater than
    /// zero, got 0 (from …)`.
    pub fn require_positive(&self, table: &str, values: &[(&str, u64)]) -> Result<(), ConfigError> {
        match values.iter().find(|(_, value)| *value == 0) {
            Some((key, _)) => Err(self.invalid(
                &format!("{table}.{key}"),
                "must be greater than zero, got 0",
            )),
            None => Ok(()),
        }
    }

    fn decode_error(&self, table: &str, error: figment::Error) -> ConfigError {
        let first = error.into_iter().next().expect("an error has one entry");
        // Figment appends the table to the end of the inner path; put it first.
        let table_parts: Vec<String> = table.split('.').map(str::to_owned).collect();
        let mut inner = first.path.clone();
        if inner.ends_with(&table_parts) {
            inner.truncate(inner.len() - table_parts.len());
        }
        let mut path = table_parts;
        path.extend(inner);
        use figment::error::Kind;
        match &first.kind {
            Kind::UnknownField(field, expected) => {
                if path.last() != Some(field) {
                    path.push(field.clone());
                }
                let key = path.join(".");
                let origin = self.origin(&key);
                let parent = path[..path.len() - 1].join(".");
                // The key is the file's text: shown whole up to a bound.
                let shown = if key.chars().nth(SHOWN_KEY_CHARS).is_some() {
                    format!("{}…", key.chars().take(SHOWN_KEY_CHARS).collect::<String>())
                } else {
                    key.clone()
                };
                let hint = crate::suggest::did_you_mean(
                    &parent,
                    field,
                    expected.iter().copied(),
                    origin.contains("environment variable"),
                );
                ConfigError(format!("invalid config: unknown key {shown}{origin}{hint}"))
            }
            kind => {
                let key = path.join(".");
                ConfigError(format!(
                    "invalid config: {key}: {kind}{}",
                    self.origin(&key)
                ))
            }
        }
    }
}

fn check_toml_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError(format!(
            "invalid config: cannot read config file {}: {e}",
            path.display()
        ))
    })?;
    text.parse::<toml::Table>().map_err(|e| {
        // One line: `file:line:column: what is wrong` (the parser's message may span lines).
        let message = e
            .message()
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        let location = e.span().map_or_else(String::new, |span| {
            let (line, column) = line_and_column(&text, span.start);
            format!(":{line}:{column}")
        });
        ConfigError(format!(
            "invalid config: {}{location}: not valid TOML: {message}",
            path.display()
        ))
    })
}

/// 1-based line and column (in characters) of byte `offset` of `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map_or(0, |last| last.chars().count())
        + 1;
    (line, column)
}

/// A config file that holds a secret inline must be as private as a token file.
fn check_inline_secrets(path: &Path, table: &toml::Table) -> Result<(), ConfigError> {
    let Some(key) = crate::secret_env::SECRET_KEYS
        .iter()
        .find(|key| holds_key(table, key))
    else {
        return Ok(());
    };
    crate::secret::check_secret_file_mode(path).map_err(|e| {
        ConfigError(format!(
            "invalid config: {key} is set inline in the config file, and {}",
            e.describe(path)
        ))
    })
}

/// Whether the dotted `key` is present in `table`.
fn holds_key(table: &toml::Table, key: &str) -> bool {
    let mut table = table;
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        let Some(item) = table.get(part) else {
            return false;
        };
        if parts.peek().is_none() {
            return true;
        }
        let Some(inner) = item.as_table() else {
            return false;
        };
        table = inner;
    }
    false
}

/// The environment variable that set `key`: its own name when it is set, else the first
/// variable below it (`proces` was set by `EXEC_SERVER_PROCES__MAX_PROCESSES`, not by a
/// variable named `EXEC_SERVER_PROCES`).
fn variable_setting(key: &str) -> String {
    let name = crate::variables::config_variable(key);
    if std::env::var_os(&name).is_some() {
        return name;
    }
    let below = format!("{name}{}", crate::variables::ENV_SEPARATOR);
    let mut found: Vec<String> = std::env::vars_os()
        .filter_map(|(var, _)| var.into_string().ok())
        .filter(|var| {
            var.len() > below.len()
                && var
                    .get(..below.len())
                    .is_some_and(|head| head.eq_ignore_ascii_case(&below))
        })
        .collect();
    found.sort();
    found.into_iter().next().unwrap_or(name)
}

/// The most characters of an unknown key an error shows.
const SHOWN_KEY_CHARS: usize = 200;

fn describe(metadata: &Metadata, key: &str) -> String {
    if let Some(figment::Source::File(path)) = &metadata.source {
        return format!(" (from {})", PathBuf::from(path).display());
    }
    if metadata.name == CLI_SOURCE_NAME {
        return " (from the command line)".to_owned();
    }
    if metadata.name.contains("environment variable") {
        return format!(" (from environment variable {})", variable_setting(key));
    }
    format!(" (from {})", metadata.name)
}

//! The audit trail (docs/AUDIT.md): real sessions over stdio, WebSocket and the relay,
//! with the exact events they leave, their identities, and secrets kept out; both
//! backends in both modes; rotation under load.

mod backends;
mod relay;
mod sessions;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::util::STEP_TIMEOUT;

/// An audit file and the directory it (and its rotations) live in.
pub(crate) struct AuditFile {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) path: PathBuf,
}

impl AuditFile {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        Self { dir, path }
    }

    /// `[audit]` with one file backend in `mode`, then `extra` lines for `[audit]`.
    pub(crate) fn config(&self, mode: &str, extra: &str) -> String {
        format!(
            "[audit]\nenabled = true\n{extra}\n[[audit.backends]]\ntype = \"file\"\npath = {:?}\nmode = \"{mode}\"\n",
            self.path.to_str().unwrap()
        )
    }

    /// Every event written so far, in order, from the rotated files up to the current one.
    pub(crate) fn events(&self) -> Vec<Value> {
        let mut files: Vec<(u32, PathBuf)> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let n = match name.strip_prefix("audit.jsonl") {
                    Some("") => 0,
                    Some(rest) => rest.strip_prefix('.')?.parse().ok()?,
                    None => return None,
                };
                Some((n, entry.path()))
            })
            .collect();
        files.sort_by_key(|file| std::cmp::Reverse(file.0));
        files.iter().flat_map(|(_, path)| lines(path)).collect()
    }

    /// Waits until an event satisfies `wanted`; returns every event so far.
    pub(crate) async fn wait_for(&self, what: &str, wanted: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            let events = self.events();
            if events.iter().any(&wanted) {
                return events;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no audit event {what} in {events:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The whole trail as text, for the secret checks.
    pub(crate) fn text(&self) -> String {
        self.events()
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// A WebSocket server with `config` and the capability token in `token_file`.
pub(crate) async fn server_with_token(config: &Path, token_file: &str) -> crate::util::WsServer {
    crate::util::WsServer::start(&[
        "--config",
        config.to_str().unwrap(),
        "--ws-auth",
        "capability-token",
        "--ws-token-file",
        token_file,
    ])
    .await
}

/// `kind`, plus `method` and `stage` for request events: what the order checks compare.
pub(crate) fn shape(event: &Value) -> String {
    let kind = event["kind"].as_str().unwrap();
    match (event["method"].as_str(), event["stage"].as_str()) {
        (Some(method), Some(stage)) => format!("{kind} {method} {stage}"),
        _ => kind.to_owned(),
    }
}

/// The events of one session, in order.
pub(crate) fn of_session<'a>(events: &'a [Value], session: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["session"] == session).collect()
}

/// The first event of shape `wanted`.
pub(crate) fn find<'a>(events: &'a [Value], wanted: &str) -> &'a Value {
    events
        .iter()
        .find(|e| shape(e) == wanted)
        .unwrap_or_else(|| panic!("no {wanted} in {events:#?}"))
}

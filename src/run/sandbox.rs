//! `run --sandbox MODE`: the permission profiles a user asks for by name, as the `sandbox`
//! object of `process/start` (PROTOCOL.md "Sandboxes", SANDBOX.md §2.4).
//!
//! * `read-only` — everything readable, nothing writable, no network;
//! * `workspace-write` — everything readable; the working directory, `/tmp` and `$TMPDIR`
//!   writable, with `.git` below the working directory kept read-only; no network.

use clap::ValueEnum;
use serde_json::{json, Value};

/// A named sandbox preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SandboxMode {
    /// Read everything, write nothing, no network.
    ReadOnly,
    /// Read everything; write the working directory, /tmp and $TMPDIR; no network.
    WorkspaceWrite,
}

impl SandboxMode {
    /// The `sandbox` member of `process/start` for a process started in `cwd` (a path or
    /// `file:` URI as the server reads it).
    pub fn policy(self, cwd: &str) -> Value {
        let special = |kind: &str| json!({"type": "special", "value": {"kind": kind}});
        let mut entries = vec![json!({"path": special("root"), "access": "read"})];
        if self == Self::WorkspaceWrite {
            entries.extend([
                json!({"path": special("project_roots"), "access": "write"}),
                json!({"path": special("slash_tmp"), "access": "write"}),
                json!({"path": special("tmpdir"), "access": "write"}),
                json!({
                    "path": {"type": "special", "value": {"kind": "project_roots", "subpath": ".git"}},
                    "access": "read"
                }),
            ]);
        }
        json!({
            "permissions": {
                "type": "managed",
                "file_system": {"type": "restricted", "entries": entries},
                "network": "restricted"
            },
            "cwd": cwd
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_name_what_they_allow() {
        let read_only = SandboxMode::ReadOnly.policy("/srv/repo");
        let entries = &read_only["permissions"]["file_system"]["entries"];
        assert_eq!(entries.as_array().unwrap().len(), 1);
        assert_eq!(entries[0]["access"], "read");
        assert_eq!(read_only["permissions"]["network"], "restricted");
        assert_eq!(read_only["cwd"], "/srv/repo");
        let write = SandboxMode::WorkspaceWrite.policy("/srv/repo");
        let kinds: Vec<_> = write["permissions"]["file_system"]["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["path"]["value"]["kind"].clone(), e["access"].clone()))
            .collect();
        assert!(kinds.contains(&(json!("project_roots"), json!("write"))));
        assert!(kinds.contains(&(json!("slash_tmp"), json!("write"))));
    }
}

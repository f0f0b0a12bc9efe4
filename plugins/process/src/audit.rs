//! What the audit trail records of each `process/*` method (docs/AUDIT.md). A start names
//! the process and its working directory at `metadata`; at `request` also its argv, the
//! names of the variables it was given or `envPolicy` sets (never their values), its
//! terminal and the sandbox it asked for. The handler adds the pid, the isolation obtained
//! and the policy applied; the pump records the exit (`process.exited`).

use exec_server_core::audit::describe::{base64_bytes, describe};
use exec_server_core::audit::{Described, Level, MethodAudit};
use exec_server_core::proto::process::{
    CLOSE_STDIN, READ, RESIZE, SIGNAL, START, TERMINATE, WRITE,
};
use exec_server_core::Install;
use serde_json::Value;

/// Declares every method's audit.
pub(crate) fn declare(install: &mut Install<'_>) {
    install.audit_method(START, MethodAudit::changes(start));
    install.audit_method(WRITE, MethodAudit::changes(write));
    install.audit_method(SIGNAL, MethodAudit::changes(signal));
    install.audit_method(TERMINATE, MethodAudit::changes(by_id));
    install.audit_method(RESIZE, MethodAudit::changes(resize));
    install.audit_method(CLOSE_STDIN, MethodAudit::changes(by_id));
    install.audit_method(READ, MethodAudit::reads(by_id));
}

fn start(params: &Value, level: Level) -> Described {
    let mut described = describe(
        params,
        level,
        &["processId", "cwd"],
        &[
            "argv",
            "arg0",
            "tty",
            "pipeStdin",
            "size",
            "envPolicy",
            "sandbox",
        ],
        &[],
    );
    if level == Level::Request {
        let names: Vec<Value> = params
            .get("env")
            .and_then(Value::as_object)
            .map(|env| env.keys().map(|name| Value::String(name.clone())).collect())
            .unwrap_or_default();
        let details = &mut described.details;
        details.insert("envNames".into(), Value::Array(names));
        if let Some(policy) = params.get("envPolicy").filter(|v| !v.is_null()) {
            details.insert("envPolicy".into(), env_policy(policy));
        }
        // Proxy settings may carry credentials: only whether they were given.
        for member in ["networkProxy", "managedNetwork"] {
            if params.get(member).is_some_and(|v| !v.is_null()) {
                details.insert(member.into(), "(given)".into());
            }
        }
    }
    described
}

/// An `envPolicy` without the values of its `set` map: the names it sets, and its other
/// members (lists of names and patterns).
fn env_policy(policy: &Value) -> Value {
    let mut kept = serde_json::Map::new();
    for member in ["inherit", "ignoreDefaultExcludes", "exclude", "includeOnly"] {
        if let Some(value) = policy.get(member) {
            kept.insert(member.into(), value.clone());
        }
    }
    if let Some(set) = policy.get("set").and_then(Value::as_object) {
        let names = set.keys().map(|name| Value::String(name.clone())).collect();
        kept.insert("setNames".into(), Value::Array(names));
    }
    Value::Object(kept)
}

fn write(params: &Value, level: Level) -> Described {
    let mut described = describe(params, level, &["processId"], &["writeId"], &[]);
    if level == Level::Request {
        if let Some(bytes) = base64_bytes(params.get("chunk")) {
            described.details.insert("bytes".into(), bytes.into());
        }
    }
    described
}

fn signal(params: &Value, level: Level) -> Described {
    describe(params, level, &["processId", "signal"], &[], &[])
}

fn resize(params: &Value, level: Level) -> Described {
    describe(params, level, &["processId"], &["rows", "cols"], &[])
}

fn by_id(params: &Value, level: Level) -> Described {
    describe(params, level, &["processId"], &[], &[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Found attacking the audit trail: `envPolicy.set` was recorded with its values.
    #[test]
    fn variable_values_are_never_recorded() {
        let params = json!({"processId": "p", "argv": ["x"], "cwd": "/",
            "env": {"API_KEY": "sk-env-value"},
            "envPolicy": {"inherit": "none", "ignoreDefaultExcludes": false, "exclude": ["A*"],
                "set": {"TOKEN": "sk-set-value"}, "includeOnly": []},
            "networkProxy": {"url": "http://u:pw@proxy"}});
        let text = Value::Object(start(&params, Level::Request).details).to_string();
        assert!(!text.contains("sk-") && !text.contains("pw@"), "{text}");
        assert!(
            text.contains(r#""setNames":["TOKEN"]"#) && text.contains("API_KEY"),
            "{text}"
        );
    }
}

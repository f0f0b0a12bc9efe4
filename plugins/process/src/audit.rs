//! What the audit trail records of each `process/*` method (docs/AUDIT.md). A start names
//! the process and its working directory at `metadata`; at `request` also its argv, the
//! names of the variables it was given (never their values), its terminal and the sandbox
//! it asked for. The handler adds the pid, the isolation obtained and the policy applied;
//! the pump records the exit (`process.exited`).

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
        // Proxy settings may carry credentials: only whether they were given.
        for member in ["networkProxy", "managedNetwork"] {
            if params.get(member).is_some_and(|v| !v.is_null()) {
                details.insert(member.into(), "(given)".into());
            }
        }
    }
    described
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

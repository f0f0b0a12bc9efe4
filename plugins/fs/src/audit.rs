//! What the audit trail records of each `fs/*` method (docs/AUDIT.md): the paths and
//! handles at `metadata`, the options and sizes at `request`, never file contents. Reads
//! name the paths they read, so reads inside `audit.workspace_roots` are not recorded.

use exec_server_core::audit::describe::{base64_bytes, describe};
use exec_server_core::audit::{Described, Level, MethodAudit};
use exec_server_core::proto::fs::{
    CANONICALIZE, CLOSE, COPY, CREATE_DIRECTORY, GET_METADATA, OPEN, READ_BLOCK, READ_DIRECTORY,
    READ_FILE, REMOVE, WALK, WATCH_MISSING, WRITE_BLOCK, WRITE_FILE,
};
use exec_server_core::Install;
use serde_json::Value;

use crate::watch::changes::{UNWATCH, WATCH};

/// Declares every method's audit.
pub(crate) fn declare(install: &mut Install<'_>) {
    let methods: [(&'static str, MethodAudit); 16] = [
        (READ_FILE, MethodAudit::reads(read_path)),
        (GET_METADATA, MethodAudit::reads(read_path)),
        (CANONICALIZE, MethodAudit::reads(read_path)),
        (READ_DIRECTORY, MethodAudit::reads(read_path)),
        (WALK, MethodAudit::reads(walk)),
        (READ_BLOCK, MethodAudit::reads(read_block)),
        (WRITE_FILE, MethodAudit::changes(write_file)),
        (CREATE_DIRECTORY, MethodAudit::changes(create_directory)),
        (REMOVE, MethodAudit::changes(remove)),
        (COPY, MethodAudit::changes(copy)),
        (OPEN, MethodAudit::changes(open)),
        (WRITE_BLOCK, MethodAudit::changes(write_block)),
        (CLOSE, MethodAudit::changes(close)),
        (WATCH, MethodAudit::changes(watch)),
        (UNWATCH, MethodAudit::changes(unwatch)),
        (WATCH_MISSING, MethodAudit::changes(watch_missing)),
    ];
    for (method, audit) in methods {
        install.audit_method(method, audit);
    }
}

/// Whether the request asked for a sandbox, and (at `request` level) which.
const SANDBOX: [&str; 2] = ["sandbox", "sandboxPolicy"];

fn read_path(params: &Value, level: Level) -> Described {
    describe(
        params,
        level,
        &["path"],
        &["followSymlinks", SANDBOX[0], SANDBOX[1]],
        &["path"],
    )
}

fn walk(params: &Value, level: Level) -> Described {
    describe(
        params,
        level,
        &["path"],
        &["options", SANDBOX[0], SANDBOX[1]],
        &["path"],
    )
}

fn read_block(params: &Value, level: Level) -> Described {
    describe(params, level, &["handleId"], &["offset", "len"], &[])
}

fn write_file(params: &Value, level: Level) -> Described {
    let mut described = describe(
        params,
        level,
        &["path"],
        &["followSymlinks", SANDBOX[0], SANDBOX[1]],
        &[],
    );
    if level == Level::Request {
        if let Some(bytes) = base64_bytes(params.get("dataBase64")) {
            described.details.insert("bytes".into(), bytes.into());
        }
    }
    described
}

fn create_directory(params: &Value, level: Level) -> Described {
    describe(
        params,
        level,
        &["path"],
        &["recursive", "followSymlinks", SANDBOX[0], SANDBOX[1]],
        &[],
    )
}

fn remove(params: &Value, level: Level) -> Described {
    describe(
        params,
        level,
        &["path"],
        &[
            "recursive",
            "force",
            "followSymlinks",
            SANDBOX[0],
            SANDBOX[1],
        ],
        &[],
    )
}

fn copy(params: &Value, level: Level) -> Described {
    describe(
        params,
        level,
        &["sourcePath", "destinationPath"],
        &["recursive", SANDBOX[0], SANDBOX[1]],
        &["sourcePath"],
    )
}

fn open(params: &Value, level: Level) -> Described {
    describe(params, level, &["handleId", "path", "mode"], &SANDBOX, &[])
}

fn write_block(params: &Value, level: Level) -> Described {
    let mut described = describe(params, level, &["handleId"], &["offset"], &[]);
    if level == Level::Request {
        if let Some(bytes) = base64_bytes(params.get("chunk")) {
            described.details.insert("bytes".into(), bytes.into());
        }
    }
    described
}

fn close(params: &Value, level: Level) -> Described {
    describe(params, level, &["handleId"], &[], &[])
}

fn watch(params: &Value, level: Level) -> Described {
    describe(params, level, &["watchId", "path"], &SANDBOX, &["path"])
}

fn unwatch(params: &Value, level: Level) -> Described {
    describe(params, level, &["watchId"], &[], &[])
}

fn watch_missing(params: &Value, level: Level) -> Described {
    describe(
        params,
        level,
        &["watchId", "missing", "present"],
        &SANDBOX,
        &[],
    )
}

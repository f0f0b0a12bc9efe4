use exec_server_core::proto::fs::{
    CANONICALIZE, COPY, CREATE_DIRECTORY, GET_METADATA, READ_DIRECTORY, READ_FILE, REMOVE, WALK,
    WRITE_FILE,
};
use exec_server_sandbox::fs_helper::OPERATIONS;
use serde_json::json;

use super::*;
use crate::routing::SandboxMembers;

/// What the server's handler of `O` runs for `params` (see `routing::execute_params`),
/// under the default configuration.
fn in_server<O: FsOperation>(params: Value) -> String {
    let mut params: O::Params = serde_json::from_value(params).unwrap();
    params.take_sandbox();
    format!(
        "{:?}",
        InHelper(
            O::from_params(params, &FsConfig::default()).unwrap(),
            SpelledPaths::default()
        )
    )
}

/// How the server's handler builds one method's operation, shown with `Debug`.
type InServer = fn(Value) -> String;

/// Every method the server installs with a handler that runs an operation, and sample
/// params that leave every optional member to its default.
fn handler_operations() -> Vec<(&'static str, InServer, Value)> {
    vec![
        (READ_FILE, in_server::<ReadFile>, json!({"path": "/a"})),
        (
            WRITE_FILE,
            in_server::<WriteFile>,
            json!({"path": "/a", "dataBase64": "aGk="}),
        ),
        (
            CREATE_DIRECTORY,
            in_server::<CreateDirectory>,
            json!({"path": "/a"}),
        ),
        (
            GET_METADATA,
            in_server::<GetMetadata>,
            json!({"path": "/a"}),
        ),
        (
            CANONICALIZE,
            in_server::<Canonicalize>,
            json!({"path": "/a/../b"}),
        ),
        (
            READ_DIRECTORY,
            in_server::<ReadDirectory>,
            json!({"path": "/a"}),
        ),
        (
            WALK,
            in_server::<Walk>,
            json!({"path": "/a", "options": {"maxDepth": 3, "maxDirectories": 4,
                "maxEntries": 5, "followDirectorySymlinks": false}}),
        ),
        (REMOVE, in_server::<Remove>, json!({"path": "/a"})),
        (
            COPY,
            in_server::<Copy>,
            json!({"sourcePath": "/a", "destinationPath": "/b", "recursive": true}),
        ),
    ]
}

#[test]
fn the_helper_runs_exactly_the_operations_it_accepts() {
    let mut names: Vec<&str> = HELPER_OPERATIONS.iter().map(|(name, _)| *name).collect();
    let mut accepted = OPERATIONS.to_vec();
    names.sort_unstable();
    accepted.sort_unstable();
    assert_eq!(names, accepted);
}

#[test]
fn the_helper_builds_the_operation_the_server_builds() {
    let handled = handler_operations();
    assert_eq!(handled.len(), OPERATIONS.len());
    for (method, in_server, params) in handled {
        assert!(OPERATIONS.contains(&method), "{method}");
        let mut helper_params = params.clone();
        helper_params["sandbox"] = Value::Null;
        let in_helper = decode_in_helper(method, helper_params).unwrap();
        assert_eq!(format!("{in_helper:?}"), in_server(params), "{method}");
    }
}

#[test]
fn the_helper_refuses_what_the_server_refuses() {
    let bad_base64 = json!({"path": "/a", "dataBase64": "!", "sandbox": null});
    assert_eq!(
        decode_in_helper(WRITE_FILE, bad_base64)
            .unwrap_err()
            .message,
        "fs/writeFile requires valid base64 dataBase64: Invalid symbol 33, offset 0."
    );
    let zero = json!({"path": "/a", "options": {"maxDepth": 1, "maxDirectories": 0,
        "maxEntries": 5, "followDirectorySymlinks": false}, "sandbox": null});
    assert_eq!(
        decode_in_helper(WALK, zero).unwrap_err(),
        RpcError::walk_limits_zero()
    );
    assert_eq!(
        decode_in_helper("fs/open", json!({})).unwrap_err().message,
        "unsupported fs sandbox helper operation fs/open"
    );
}

#[test]
fn targets_name_the_access_each_path_needs() {
    let targets = |method: &str, params: Value| decode_in_helper(method, params).unwrap().targets();
    let remove = targets(REMOVE, json!({"path": "/a/l", "recursive": false}));
    assert_eq!(
        remove,
        [Target {
            path: "/a/l".into(),
            follow_last: false,
            need: exec_server_sandbox::fs_helper::Need::Write
        }]
    );
    // `recursive` defaults to true for the check as for the removal (the member-by-name
    // check this replaces read a missing `recursive` as false).
    let remove = targets(REMOVE, json!({"path": "/a/l"}));
    assert_eq!(
        remove[0].need,
        exec_server_sandbox::fs_helper::Need::WriteTreeIfDirectory
    );
    let copy = targets(
        COPY,
        json!({"sourcePath": "/s", "destinationPath": "/d", "recursive": false}),
    );
    assert_eq!(copy.len(), 2);
    assert_eq!(
        (copy[0].follow_last, copy[1].follow_last),
        (false, true),
        "{copy:?}"
    );
}

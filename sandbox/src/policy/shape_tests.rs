use serde_json::json;

use super::*;

fn form(sandbox: Value) -> Form {
    decode(&sandbox).unwrap().form
}

#[test]
fn tagged_and_untagged_permissions_are_told_apart_by_type() {
    assert!(matches!(
        form(json!({"permissions": {"type": "disabled"}})),
        Form::Tagged(TaggedProfile::Disabled)
    ));
    assert!(matches!(
        form(json!({"permissions": {"type": null, "file_system": {"read": ["/x"]}}})),
        Form::Untagged(_)
    ));
    assert!(matches!(
        form(json!({"permissions": {}})),
        Form::Untagged(_)
    ));
}

#[test]
fn entry_forms_decode() {
    let Form::Tagged(TaggedProfile::Managed {
        file_system,
        network,
    }) = form(json!({
    "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
        {"path": {"type": "path", "path": "/a"}, "access": "none"},
        {"path": {"type": "glob_pattern", "pattern": "*.x"}, "access": "deny"},
        {"path": {"type": "special", "value": {"kind": "project_roots", "subpath": "s"}},
         "access": "write", "missing_path_behavior": "skip"}
    ]}}}))
    else {
        panic!("managed expected")
    };
    assert_eq!(network, NetworkMode::Restricted);
    let FileSystem::Restricted {
        entries,
        glob_scan_max_depth,
    } = file_system
    else {
        panic!("restricted expected")
    };
    assert_eq!(glob_scan_max_depth, None);
    assert_eq!(entries[0].access, Access::Deny);
    assert_eq!(
        entries[1].path,
        EntryPath::GlobPattern {
            pattern: "*.x".into()
        }
    );
    assert_eq!(
        entries[2].path,
        EntryPath::Special {
            value: Special {
                kind: "project_roots".into(),
                subpath: Some("s".into())
            }
        }
    );
}

#[test]
fn nulls_are_absent_members() {
    let legacy = form(
        json!({"sandboxPolicy": {"type": "workspace-write", "writable_roots": null,
        "network_access": null, "exclude_slash_tmp": null, "read_only_access": null},
        "workspaceRoots": null, "cwd": null}),
    );
    let Form::Legacy(legacy) = legacy else {
        panic!()
    };
    assert_eq!(
        legacy.policy,
        LegacyPolicy::WorkspaceWrite {
            writable_roots: vec![],
            network_access: NetworkMode::Restricted,
            exclude_tmpdir_env_var: false,
            exclude_slash_tmp: false,
            read_only_access: None,
        }
    );
    let restricted = form(json!({"sandboxPolicy": {"type": "read-only",
        "access": {"type": "restricted", "include_platform_defaults": null}}}));
    let Form::Legacy(legacy) = restricted else {
        panic!()
    };
    assert_eq!(
        legacy.policy,
        LegacyPolicy::ReadOnly {
            network_access: NetworkMode::Restricted,
            access: Some(ReadAccess::Restricted {
                include_platform_defaults: true,
                readable_roots: vec![],
            }),
        }
    );
}

#[test]
fn camel_case_inside_is_refused_anywhere_but_not_outside() {
    let error = decode(
        &json!({"permissions": {"type": "managed", "file_system": {"type": "restricted",
        "entries": [{"path": {"type": "path", "path": "/x"}, "access": "read",
                     "missingPathBehavior": "skip"}]}}}),
    )
    .unwrap_err();
    assert_eq!(
        error,
        RpcError::sandbox_member_casing("missingPathBehavior", "missing_path_behavior")
    );
    // Outer members are camelCase by definition.
    assert!(decode(&json!({"sandboxPolicy": {"type": "read-only"},
        "sandboxPolicyCwd": "/x", "workspaceRoots": [], "useLegacyLandlock": false}))
    .is_ok());
}

#[test]
fn a_sandbox_that_is_not_an_object_says_so() {
    let error = decode(&json!(true)).unwrap_err();
    assert_eq!(error.code, -32602);
    assert_eq!(
        error.message,
        "invalid type: boolean `true`, expected a sandbox object"
    );
}

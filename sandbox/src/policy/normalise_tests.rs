//! SANDBOX.md §10.1 (N1–N16), the worked examples of §2.11, the errors of §2.7, computed
//! carve-outs (§2.9), server additions (§2.10) and the routing decision (§3.1).

use std::os::unix::fs::symlink;

use exec_server_proto::error::code;
use serde_json::{json, Value};

use crate::policy::expand::existing_minimal_paths;
use crate::policy::*;

const HELPER: &str = "/usr/local/bin/exec-server";

/// The context of the worked examples: `TMPDIR` unset, the helper in `/usr/local/bin`, no
/// configuration loaded.
fn fs_ctx() -> PolicyContext {
    PolicyContext {
        target: PolicyTarget::Fs,
        helper_executable: Ok(PathBuf::from(HELPER)),
        tmpdir: None,
        secret_files: Vec::new(),
        secret_globs: Vec::new(),
    }
}

fn process_ctx(cwd: &Path) -> PolicyContext {
    PolicyContext {
        target: PolicyTarget::Process {
            cwd: cwd.to_path_buf(),
        },
        ..fs_ctx()
    }
}

fn fs(sandbox: &Value) -> Result<SandboxDecision, RpcError> {
    decide_fs_in(Some(sandbox), None, &fs_ctx()).map(|o| o.decision)
}

fn process(sandbox: &Value, cwd: &Path) -> Result<SandboxDecision, RpcError> {
    decide_process_in(Some(sandbox), &process_ctx(cwd)).map(|o| o.decision)
}

fn enforced(decision: Result<SandboxDecision, RpcError>) -> SandboxPolicy {
    match decision {
        Ok(SandboxDecision::Enforce(policy)) => policy,
        other => panic!("expected Enforce, got {other:?}"),
    }
}

fn fs_policy(sandbox: &Value) -> SandboxPolicy {
    enforced(fs(sandbox))
}

fn fs_error(sandbox: &Value) -> RpcError {
    fs(sandbox).expect_err("expected an error")
}

fn process_error(sandbox: &Value) -> RpcError {
    process(sandbox, Path::new("/")).expect_err("expected an error")
}

/// The §4.3 JSON form with every list sorted as strings, so that it compares with the
/// examples whatever order they were written in.
fn comparable(mut json: Value) -> Value {
    fn sort(list: Option<&mut Value>) {
        if let Some(Value::Array(items)) = list {
            items.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
        }
    }
    for member in ["writable", "readOnly", "deniedPaths", "deniedGlobs"] {
        sort(json.get_mut(member));
    }
    sort(json.pointer_mut("/readable/roots"));
    json
}

fn json_of(policy: &SandboxPolicy) -> Value {
    comparable(serde_json::from_str(&policy.to_helper_json(Enforcement::Require)).unwrap())
}

fn assert_sorted(policy: &SandboxPolicy) {
    let sorted = |paths: &[PathBuf]| paths.windows(2).all(|w| w[0] < w[1]);
    assert!(sorted(&policy.writable), "{policy:?}");
    assert!(sorted(&policy.read_only), "{policy:?}");
    assert!(sorted(&policy.denied_paths), "{policy:?}");
    if let Readable::Roots(roots) = &policy.readable {
        assert!(sorted(roots), "{policy:?}");
    }
}

/// A fresh canonical temp root `T` standing in for `/` of the examples' `/srv/…` paths.
struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Tree {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        Self { _dir: dir, root }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn native(&self, rel: &str) -> String {
        self.path(rel).to_str().unwrap().to_owned()
    }

    fn uri(&self, rel: &str) -> String {
        format!("file://{}", self.native(rel))
    }

    fn mkdir(&self, rel: &str) -> PathBuf {
        let path = self.path(rel);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    fn write(&self, rel: &str, contents: &str) {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }

    /// An example text with its `/srv/` paths moved below `T`.
    fn adjust(&self, text: &str) -> String {
        let root = self.root.to_str().unwrap();
        text.replace("file:///srv/", &format!("file://{root}/srv/"))
            .replace("\"/srv/", &format!("\"{root}/srv/"))
    }

    fn example(&self, text: &str) -> Value {
        serde_json::from_str(&self.adjust(text)).unwrap()
    }

    fn expected(&self, text: &str) -> Value {
        comparable(self.example(text))
    }
}

fn minimal_uris() -> Vec<String> {
    existing_minimal_paths()
        .iter()
        .map(|p| exec_server_proto::path::to_file_uri(p))
        .collect()
}

fn path_entry(path: &str, access: &str) -> Value {
    json!({"path": {"type": "path", "path": path}, "access": access})
}

fn special_entry(kind: &str, access: &str) -> Value {
    json!({"path": {"type": "special", "value": {"kind": kind}}, "access": access})
}

fn glob_entry(pattern: &str, access: &str) -> Value {
    json!({"path": {"type": "glob_pattern", "pattern": pattern}, "access": access})
}

fn managed(entries: Vec<Value>, network: &str) -> Value {
    json!({"type": "managed",
           "file_system": {"type": "restricted", "entries": entries},
           "network": network})
}

// ---- worked examples (§2.11) ------------------------------------------------------------

const EXAMPLE_A: &str = r#"{
  "permissions": {
    "type": "managed",
    "file_system": {
      "type": "restricted",
      "entries": [
        {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
        {"path": {"type": "special", "value": {"kind": "project_roots"}}, "access": "write"},
        {"path": {"type": "special", "value": {"kind": "slash_tmp"}}, "access": "write"},
        {"path": {"type": "special", "value": {"kind": "tmpdir"}}, "access": "write"},
        {"path": {"type": "special", "value": {"kind": "project_roots", "subpath": ".git"}}, "access": "read"}
      ]
    },
    "network": "restricted"
  },
  "cwd": "file:///srv/repo",
  "windowsSandboxLevel": "disabled"
}"#;

const EXPECTED_A: &str = r#"{"version":1,"readable":"all",
 "writable":["file:///tmp","file:///srv/repo"],
 "readOnly":["file:///tmp/.agents","file:///tmp/.codex","file:///tmp/.git",
             "file:///srv/repo/.agents","file:///srv/repo/.codex","file:///srv/repo/.git"],
 "deniedPaths":[],"deniedGlobs":[],"network":"restricted","enforcement":"require"}"#;

#[test]
fn n1_example_a_current_shape_workspace_projection() {
    let t = Tree::new();
    t.mkdir("srv/repo/.git");
    let policy = fs_policy(&t.example(EXAMPLE_A));
    assert_eq!(json_of(&policy), t.expected(EXPECTED_A));
    assert!(!policy.full_disk_write);
    assert_eq!(policy.network, Network::Restricted);
    assert_eq!(policy.glob_scan_max_depth, 16);
    assert_sorted(&policy);
}

const EXAMPLE_B: &str = r#"{
  "sandboxPolicy": {
    "type": "workspace-write",
    "writable_roots": ["/srv/cache"],
    "network_access": false,
    "exclude_tmpdir_env_var": true,
    "exclude_slash_tmp": false
  },
  "sandboxPolicyCwd": "/srv/repo"
}"#;

const EXPECTED_B: &str = r#"{"version":1,"readable":"all",
 "writable":["file:///tmp","file:///srv/cache","file:///srv/repo"],
 "readOnly":["file:///tmp/.agents","file:///tmp/.codex","file:///tmp/.git",
             "file:///srv/cache/.agents","file:///srv/cache/.codex","file:///srv/cache/.git",
             "file:///srv/main/.git/worktrees/repo",
             "file:///srv/repo/.agents","file:///srv/repo/.codex","file:///srv/repo/.git"],
 "deniedPaths":[],"deniedGlobs":[],"network":"restricted","enforcement":"require"}"#;

#[test]
fn example_b_legacy_workspace_write_with_gitdir_pointer() {
    let t = Tree::new();
    t.mkdir("srv/main/.git/worktrees/repo");
    t.write(
        "srv/repo/.git",
        &format!("gitdir: {}\n", t.native("srv/main/.git/worktrees/repo")),
    );
    let policy = fs_policy(&t.example(EXAMPLE_B));
    assert_eq!(json_of(&policy), t.expected(EXPECTED_B));
    assert_sorted(&policy);
}

#[test]
fn n2_relative_gitdir_pointer_is_canonicalised() {
    let t = Tree::new();
    t.mkdir("srv/main/.git/worktrees/r");
    // The pointer goes through a symlinked directory, which must be resolved.
    symlink(t.path("srv/main"), t.path("srv/main-link")).unwrap();
    t.write("srv/repo/.git", "gitdir: ../main-link/.git/worktrees/r\n");
    let policy = fs_policy(&t.example(EXAMPLE_B));
    assert!(policy
        .read_only
        .contains(&t.path("srv/main/.git/worktrees/r")));
    assert!(policy.read_only.contains(&t.path("srv/repo/.git")));
    assert_eq!(
        policy.writable,
        vec![
            t.path("srv/cache"),
            t.path("srv/repo"),
            PathBuf::from("/tmp")
        ]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>()
    );
}

const EXAMPLE_C: &str = r#"{
  "permissions": {
    "type": "managed",
    "file_system": {
      "type": "restricted",
      "entries": [
        {"path": {"type": "path", "path": "file:///srv/repo"}, "access": "read"},
        {"path": {"type": "path", "path": "/srv/repo/out"}, "access": "write"},
        {"path": {"type": "path", "path": "file:///srv/repo/secrets"}, "access": "none"},
        {"path": {"type": "glob_pattern", "pattern": "**/*.pem"}, "access": "deny"},
        {"path": {"type": "special", "value": {"kind": "home_dir"}}, "access": "read"}
      ]
    },
    "network": "enabled"
  },
  "cwd": "file:///srv/repo"
}"#;

const EXPECTED_C: &str = r#"{"version":1,
 "readable":{"roots":["file:///usr/local/bin","file:///srv/repo","file:///srv/repo/out"]},
 "writable":["file:///srv/repo/out"],
 "readOnly":["file:///srv/repo/out/.agents","file:///srv/repo/out/.codex","file:///srv/repo/out/.git"],
 "deniedPaths":["file:///srv/repo/secrets"],
 "deniedGlobs":["/srv/repo/**/*.pem"],
 "network":"restricted","enforcement":"require"}"#;

#[test]
fn example_c_restricted_reads_write_subtree_deny_entries_unknown_kind() {
    let t = Tree::new();
    t.mkdir("srv/repo");
    let policy = fs_policy(&t.example(EXAMPLE_C));
    assert_eq!(json_of(&policy), t.expected(EXPECTED_C));
    assert_sorted(&policy);
}

#[test]
fn example_c_on_process_start_keeps_the_network_and_adds_minimal_and_proc() {
    let t = Tree::new();
    t.mkdir("srv/repo");
    let policy = enforced(process(&t.example(EXAMPLE_C), Path::new("/")));
    let mut expected = t.expected(EXPECTED_C);
    expected["network"] = json!("enabled");
    let roots = expected["readable"]["roots"].as_array_mut().unwrap();
    roots.extend(minimal_uris().into_iter().map(Value::from));
    roots.push(json!("file:///proc"));
    assert_eq!(json_of(&policy), comparable(expected));
    assert_eq!(policy.network, Network::Enabled);
    assert_sorted(&policy);
}

fn example_d() -> Vec<Value> {
    vec![
        json!({"permissions": {"type": "disabled"}}),
        json!({"sandboxPolicy": {"type": "danger-full-access"}}),
        json!({"sandboxPolicy": {"type": "external-sandbox", "network_access": "restricted"}}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "write"}]}, "network": "enabled"}}),
    ]
}

#[test]
fn n4_example_d_runs_fs_in_process() {
    for sandbox in example_d() {
        assert_eq!(fs(&sandbox), Ok(SandboxDecision::Unsandboxed), "{sandbox}");
    }
}

#[test]
fn n4_example_d_on_process_start() {
    for sandbox in example_d() {
        assert_eq!(
            process(&sandbox, Path::new("/")),
            Ok(SandboxDecision::Unsandboxed),
            "{sandbox}"
        );
    }
    // The managed root-write profile needs the network enabled to run unsandboxed.
    let mut restricted = example_d().pop().unwrap();
    restricted["permissions"]["network"] = json!("restricted");
    let policy = enforced(process(&restricted, Path::new("/")));
    assert_eq!(policy.readable, Readable::All);
    assert_eq!(policy.writable, vec![PathBuf::from("/")]);
    assert_eq!(policy.network, Network::Restricted);
    assert!(policy.full_disk_write);
    assert!(policy.read_only.is_empty(), "no carve-outs under /");
    assert_eq!(fs(&restricted), Ok(SandboxDecision::Unsandboxed));
}

#[test]
fn example_d_with_a_read_entry_goes_to_the_helper() {
    let mut sandbox = example_d().pop().unwrap();
    sandbox["permissions"]["file_system"]["entries"]
        .as_array_mut()
        .unwrap()
        .push(path_entry("/etc", "read"));
    let policy = fs_policy(&sandbox);
    assert!(!policy.full_disk_write);
    assert_eq!(policy.readable, Readable::All);
    assert_eq!(policy.read_only, vec![canonicalise(Path::new("/etc"))]);
}

#[test]
fn unrestricted_file_system_enforces_only_the_network_for_processes() {
    let unrestricted = |network: &str| json!({"permissions": {"type": "managed", "file_system": {"type": "unrestricted"}, "network": network}});
    assert_eq!(
        fs(&unrestricted("restricted")),
        Ok(SandboxDecision::Unsandboxed)
    );
    assert_eq!(
        process(&unrestricted("enabled"), Path::new("/")),
        Ok(SandboxDecision::Unsandboxed)
    );
    let policy = enforced(process(&unrestricted("restricted"), Path::new("/")));
    assert_eq!(policy.readable, Readable::All);
    assert_eq!(policy.writable, vec![PathBuf::from("/")]);
    assert_eq!(policy.network, Network::Restricted);
    // Default network of `managed` is restricted.
    let default_network =
        json!({"permissions": {"type": "managed", "file_system": {"type": "unrestricted"}}});
    assert!(process(&default_network, Path::new("/"))
        .unwrap()
        .needs_enforcement());
    // `external` says nothing is to be enforced, whatever its network.
    let external = json!({"permissions": {"type": "external", "network": "restricted"}});
    assert_eq!(
        process(&external, Path::new("/")),
        Ok(SandboxDecision::Unsandboxed)
    );
}

const EXAMPLE_E: &str = r#"{"permissions": {"network": {"enabled": false},
                 "file_system": {"read": ["/srv/docs"], "write": ["/srv/out"]}},
 "cwd": "/work"}"#;

#[test]
fn example_e_older_untagged_profile() {
    let t = Tree::new();
    let policy = fs_policy(&t.example(EXAMPLE_E));
    assert_eq!(
        policy.readable,
        Readable::Roots(vec![
            t.path("srv/docs"),
            t.path("srv/out"),
            PathBuf::from("/usr/local/bin"),
        ])
    );
    assert_eq!(policy.writable, vec![t.path("srv/out")]);
    assert_eq!(
        policy.read_only,
        vec![
            t.path("srv/out/.agents"),
            t.path("srv/out/.codex"),
            t.path("srv/out/.git"),
        ]
    );
    assert_eq!(policy.network, Network::Restricted);
}

#[test]
fn untagged_profile_forms() {
    // `{}` means restricted, no entries, network restricted.
    let empty = fs_policy(&json!({"permissions": {}}));
    assert_eq!(
        empty.readable,
        Readable::Roots(vec![PathBuf::from("/usr/local/bin")])
    );
    assert!(empty.writable.is_empty());
    let on = enforced(process(
        &json!({"permissions": {"network": {"enabled": true}}}),
        Path::new("/"),
    ));
    assert_eq!(on.network, Network::Enabled);
    // The canonical entries form equals the legacy lists.
    let t = Tree::new();
    let canonical = json!({"permissions": {"file_system": {"entries": [
        path_entry(&t.native("docs"), "read"), path_entry(&t.native("out"), "write")]}}});
    let lists = json!({"permissions": {"file_system": {
        "read": [t.native("docs")], "write": [t.uri("out")]}}});
    assert_eq!(fs_policy(&canonical), fs_policy(&lists));
}

const EXAMPLE_F: &str = r#"{"sandboxPolicy": {"type": "read-only",
                   "access": {"type": "restricted", "include_platform_defaults": true,
                              "readable_roots": ["/srv/docs"]}},
 "sandboxPolicyCwd": "/srv/repo"}"#;

#[test]
fn example_f_legacy_read_only_with_restricted_reads() {
    let t = Tree::new();
    let policy = fs_policy(&t.example(EXAMPLE_F));
    let mut roots = minimal_uris();
    roots.extend([
        "file:///usr/local/bin".to_owned(),
        t.uri("srv/docs"),
        t.uri("srv/repo"),
    ]);
    let json = json_of(&policy);
    let expected_roots = comparable(json!({"readable": {"roots": roots}}));
    assert_eq!(json["readable"], expected_roots["readable"]);
    assert_eq!(json["writable"], json!([]));
    // Without platform defaults only the listed roots, the cwd and the helper remain.
    let mut without = t.example(EXAMPLE_F);
    without["sandboxPolicy"]["access"]["include_platform_defaults"] = json!(false);
    assert_eq!(
        fs_policy(&without).readable,
        Readable::Roots(vec![
            t.path("srv/docs"),
            t.path("srv/repo"),
            PathBuf::from("/usr/local/bin"),
        ])
    );
}

// ---- N3, N5–N16 --------------------------------------------------------------------------

#[test]
fn n3_legacy_read_only() {
    let policy = fs_policy(&json!({"sandboxPolicy": {"type": "read-only"}}));
    assert_eq!(policy.readable, Readable::All);
    assert!(policy.writable.is_empty());
    assert!(policy.read_only.is_empty());
    assert!(!policy.full_disk_write);
}

#[test]
fn n5_root_write_with_one_deny_entry_is_enforced() {
    let t = Tree::new();
    let sandbox = json!({"permissions": managed(vec![
        special_entry("root", "write"), path_entry(&t.native("secret"), "deny")], "enabled")});
    let policy = fs_policy(&sandbox);
    assert!(!policy.full_disk_write);
    assert_eq!(policy.denied_paths, vec![t.path("secret")]);
    assert!(process(&sandbox, Path::new("/"))
        .unwrap()
        .needs_enforcement());
    // A deny glob narrows the disk just as well.
    let glob = json!({"permissions": managed(vec![
        special_entry("root", "write"), glob_entry("/**/*.pem", "deny")], "enabled")});
    assert!(!fs_policy(&glob).full_disk_write);
}

#[test]
fn n6_dynamic_entries_need_a_cwd_on_fs() {
    let t = Tree::new();
    let project_roots = json!({"permissions": managed(vec![special_entry("project_roots", "write")], "restricted")});
    let needs_cwd = RpcError::sandbox_requires_cwd();
    assert_eq!(fs_error(&project_roots), needs_cwd);
    assert_eq!(needs_cwd.code, code::INVALID_REQUEST);
    assert_eq!(
        needs_cwd.message,
        "file system sandbox context with dynamic permissions requires cwd"
    );

    let mut relative_glob = json!({"permissions": managed(vec![
        special_entry("root", "read"), glob_entry("*.pem", "deny")], "restricted")});
    relative_glob["workspaceRoots"] = json!([t.uri("ws")]);
    assert_eq!(fs_error(&relative_glob), needs_cwd);

    let mut with_roots = project_roots.clone();
    with_roots["workspaceRoots"] = json!([t.uri("a"), t.native("b")]);
    assert_eq!(
        fs_policy(&with_roots).writable,
        vec![t.path("a"), t.path("b")]
    );

    let policy = enforced(process(&project_roots, &t.path("req")));
    assert_eq!(policy.writable, vec![t.path("req")]);
    let policy = enforced(process(&relative_glob, &t.path("req")));
    assert_eq!(
        policy.denied_globs[0].as_str(),
        format!("{}/*.pem", t.native("req"))
    );
}

#[test]
fn n7_unknown_special_kinds_are_ignored_and_deny_is_reported_once() {
    let base = vec![special_entry("root", "read")];
    let reference = fs_policy(&json!({"permissions": managed(base.clone(), "restricted")}));
    let unknown_path = json!({"path": {"type": "special",
        "value": {"kind": "unknown", "path": "/x", "subpath": "y"}}, "access": "deny"});
    for (entry, reported) in [
        (special_entry("home_dir", "read"), vec![]),
        (special_entry("home_dir", "write"), vec![]),
        (special_entry("home_dir", "deny"), vec!["home_dir"]),
        (unknown_path, vec!["unknown"]),
    ] {
        let mut entries = base.clone();
        entries.extend([entry.clone(), entry.clone()]);
        let sandbox = json!({"permissions": managed(entries, "restricted")});
        let outcome = decide_fs_in(Some(&sandbox), None, &fs_ctx()).unwrap();
        assert_eq!(
            outcome.decision,
            SandboxDecision::Enforce(reference.clone()),
            "{entry}"
        );
        assert_eq!(outcome.ignored_deny_kinds, reported, "{entry}");
    }
    let log = IgnoredKindLog::default();
    let kinds = vec!["home_dir".to_owned()];
    assert_eq!(log.report(&kinds), kinds);
    assert_eq!(log.report(&kinds), Vec::<String>::new());
    assert_eq!(IgnoredKindLog::default().report(&kinds), kinds);
}

#[test]
fn n8_none_is_an_alias_of_deny() {
    let t = Tree::new();
    let with = |access| {
        json!({"permissions": managed(vec![
            special_entry("root", "read"), path_entry(&t.native("s"), access)], "restricted")})
    };
    assert_eq!(fs_policy(&with("none")), fs_policy(&with("deny")));
    assert_eq!(fs_policy(&with("none")).denied_paths, vec![t.path("s")]);
}

#[test]
fn n9_glob_patterns_only_deny() {
    for access in ["write", "read"] {
        let sandbox =
            json!({"permissions": managed(vec![glob_entry("/x/*", access)], "restricted")});
        let expected = RpcError::glob_pattern_requires_deny();
        assert_eq!(
            expected.message,
            "glob_pattern entries only support deny access"
        );
        assert_eq!(fs_error(&sandbox), expected);
        assert_eq!(process_error(&sandbox), expected);
        assert_eq!(expected.code, code::INVALID_PARAMS);
    }
}

#[test]
fn n10_camel_case_spellings_are_refused() {
    let cases = [
        (
            json!({"permissions": {"type": "managed", "fileSystem": {"type": "restricted"}}}),
            "fileSystem",
            "file_system",
        ),
        (
            json!({"permissions": {"fileSystem": {}}}),
            "fileSystem",
            "file_system",
        ),
        (
            json!({"permissions": {"type": "managed", "file_system": {"type": "restricted", "globScanMaxDepth": 3}}}),
            "globScanMaxDepth",
            "glob_scan_max_depth",
        ),
        (
            json!({"permissions": managed(vec![json!({"path": {"type": "path", "path": "/x"},
                "access": "read", "missingPathBehavior": "skip"})], "restricted")}),
            "missingPathBehavior",
            "missing_path_behavior",
        ),
        (
            json!({"sandboxPolicy": {"type": "workspace-write", "writableRoots": ["/x"]}}),
            "writableRoots",
            "writable_roots",
        ),
        (
            json!({"sandboxPolicy": {"type": "read-only", "networkAccess": true}}),
            "networkAccess",
            "network_access",
        ),
        (
            json!({"sandboxPolicy": {"type": "workspace-write", "excludeTmpdirEnvVar": true}}),
            "excludeTmpdirEnvVar",
            "exclude_tmpdir_env_var",
        ),
        (
            json!({"sandboxPolicy": {"type": "workspace-write", "excludeSlashTmp": true}}),
            "excludeSlashTmp",
            "exclude_slash_tmp",
        ),
        (
            json!({"sandboxPolicy": {"type": "workspace-write", "readOnlyAccess": {"type": "full-access"}}}),
            "readOnlyAccess",
            "read_only_access",
        ),
        (
            json!({"sandboxPolicy": {"type": "read-only", "access": {"type": "restricted", "includePlatformDefaults": false}}}),
            "includePlatformDefaults",
            "include_platform_defaults",
        ),
        (
            json!({"sandboxPolicy": {"type": "read-only", "access": {"type": "restricted", "readableRoots": ["/x"]}}}),
            "readableRoots",
            "readable_roots",
        ),
        (
            json!({"sandboxPolicy": {"type": "read-only"},
                   "fileSystemSandboxPolicy": {"kind": "restricted", "globScanMaxDepth": 2}}),
            "globScanMaxDepth",
            "glob_scan_max_depth",
        ),
        (
            json!({"sandboxPolicy": {"type": "read-only"},
                   "additionalPermissions": {"fileSystem": {"write": ["/x"]}}}),
            "fileSystem",
            "file_system",
        ),
    ];
    for (sandbox, camel, snake) in cases {
        let expected = RpcError::sandbox_member_casing(camel, snake);
        assert_eq!(
            expected.message,
            format!("sandbox member `{camel}` must be spelled `{snake}`")
        );
        assert_eq!(expected.code, code::INVALID_PARAMS);
        assert_eq!(fs_error(&sandbox), expected, "{sandbox}");
        assert_eq!(process_error(&sandbox), expected, "{sandbox}");
    }
}

#[test]
fn n10_outer_members_stay_camel_case() {
    let t = Tree::new();
    // The outer object is camelCase: `sandbox_policy_cwd` is an unknown member, ignored.
    let sandbox = json!({"sandboxPolicy": {"type": "workspace-write", "exclude_slash_tmp": true},
                         "sandbox_policy_cwd": t.native("ignored"),
                         "sandboxPolicyCwd": t.native("repo")});
    assert_eq!(fs_policy(&sandbox).writable, vec![t.path("repo")]);
}

#[test]
fn n11_exactly_one_shape() {
    let expected = RpcError::sandbox_needs_one_shape();
    assert_eq!(
        expected.message,
        "sandbox must contain either permissions or sandboxPolicy"
    );
    for sandbox in [
        json!({"permissions": {"type": "disabled"}, "sandboxPolicy": {"type": "read-only"}}),
        json!({}),
        json!({"cwd": "/x"}),
        json!({"permissions": null, "sandboxPolicy": null}),
    ] {
        assert_eq!(fs_error(&sandbox), expected, "{sandbox}");
        assert_eq!(process_error(&sandbox), expected, "{sandbox}");
    }
}

#[test]
fn n12_top_level_sandbox_policy() {
    let read_only = json!({"type": "read-only"});
    let sandbox = json!({"permissions": {"type": "disabled"}});
    let error = decide_fs_in(Some(&sandbox), Some(&read_only), &fs_ctx()).unwrap_err();
    assert_eq!(error, RpcError::sandbox_and_top_level_policy());
    assert_eq!(error.code, code::INVALID_PARAMS);
    assert_eq!(
        error.message,
        "sandbox and sandboxPolicy must not both be present"
    );
    let alone = decide_fs_in(None, Some(&read_only), &fs_ctx()).unwrap();
    assert_eq!(
        alone.decision,
        fs(&json!({"sandboxPolicy": {"type": "read-only"}})).unwrap()
    );
    let null_sandbox = decide_fs_in(Some(&Value::Null), Some(&read_only), &fs_ctx()).unwrap();
    assert!(null_sandbox.decision.needs_enforcement());
}

#[test]
fn n13_explicit_write_reopens_a_carve_out() {
    let t = Tree::new();
    t.mkdir("repo/.git");
    let sandbox = json!({"permissions": managed(vec![
        special_entry("root", "read"),
        special_entry("project_roots", "write"),
        json!({"path": {"type": "special", "value": {"kind": "project_roots", "subpath": ".git"}},
               "access": "write"}),
    ], "restricted"), "cwd": t.uri("repo")});
    let policy = fs_policy(&sandbox);
    assert!(!policy.read_only.contains(&t.path("repo/.git")));
    assert!(policy.read_only.contains(&t.path("repo/.codex")));
    assert!(policy.writable.contains(&t.path("repo/.git")));
    assert!(policy.allows(&t.path("repo/.git/config"), AccessKind::Write));
    // The re-opened `.git` is a writable root of its own and gets its own carve-outs.
    assert!(policy.read_only.contains(&t.path("repo/.git/.git")));
}

#[test]
fn n14_network_access_as_bool_or_string() {
    let variants = [
        json!({"type": "read-only"}),
        json!({"type": "workspace-write", "exclude_slash_tmp": true, "exclude_tmpdir_env_var": true}),
    ];
    for variant in variants {
        for (value, network) in [
            (json!(true), Network::Enabled),
            (json!("enabled"), Network::Enabled),
            (json!(false), Network::Restricted),
            (json!("restricted"), Network::Restricted),
            (Value::Null, Network::Restricted),
        ] {
            let mut policy = variant.clone();
            policy["network_access"] = value.clone();
            let sandbox = json!({"sandboxPolicy": policy});
            let decided = enforced(process(&sandbox, Path::new("/srv/repo")));
            assert_eq!(decided.network, network, "{sandbox}");
            // The fs helper never gets the network.
            assert_eq!(fs_policy(&sandbox).network, Network::Restricted);
        }
    }
    for value in [
        json!(true),
        json!(false),
        json!("enabled"),
        json!("restricted"),
    ] {
        let sandbox =
            json!({"sandboxPolicy": {"type": "external-sandbox", "network_access": value}});
        assert_eq!(fs(&sandbox), Ok(SandboxDecision::Unsandboxed));
        assert_eq!(
            process(&sandbox, Path::new("/")),
            Ok(SandboxDecision::Unsandboxed)
        );
    }
    let bad = json!({"sandboxPolicy": {"type": "read-only", "network_access": "on"}});
    assert_eq!(fs_error(&bad).code, code::INVALID_PARAMS);
}

#[test]
fn n14_additional_permissions_can_enable_the_network() {
    let sandbox = json!({"sandboxPolicy": {"type": "read-only"},
                         "additionalPermissions": {"network": {"enabled": true}}});
    assert_eq!(
        enforced(process(&sandbox, Path::new("/"))).network,
        Network::Enabled
    );
}

#[test]
fn n15_windows_members_and_legacy_landlock_have_no_effect() {
    let base = json!({"sandboxPolicy": {"type": "read-only"}});
    let reference = fs(&base).unwrap();
    for (member, value) in [
        ("windowsSandboxLevel", json!("mxc")),
        ("windowsSandboxLevel", json!("elevated")),
        ("windowsSandboxLevel", json!("restricted-token")),
        ("windowsSandboxPrivateDesktop", json!(true)),
        ("windowsSandboxProxySettingsMode", json!("reconcile")),
        ("useLegacyLandlock", json!(true)),
    ] {
        let mut sandbox = base.clone();
        sandbox[member] = value;
        assert_eq!(fs(&sandbox).unwrap(), reference, "{sandbox}");
    }
}

#[test]
fn n16_foreign_workspace_root() {
    let sandbox = json!({"permissions": managed(vec![special_entry("project_roots", "write")], "restricted"),
                         "workspaceRoots": ["file:///C:/x"]});
    let reason = "'file:///C:/x' is invalid on 'linux'";
    let fs_err = fs_error(&sandbox);
    assert_eq!(fs_err.code, code::INVALID_REQUEST);
    assert_eq!(
        fs_err.message,
        format!(
            "file system sandbox workspace root is not native to this exec-server host: {reason}"
        )
    );
    let process_err = process_error(&sandbox);
    assert_eq!(process_err.code, code::INVALID_PARAMS);
    assert_eq!(process_err.message, fs_err.message);
}

// ---- §2.7 policy errors, fs and process codes ---------------------------------------------

#[test]
fn foreign_permission_path() {
    let reason = "'file:///C:/Users/x' is invalid on 'linux'";
    for sandbox in [
        json!({"permissions": managed(vec![path_entry("file:///C:/Users/x", "read")], "restricted")}),
        json!({"permissions": {"file_system": {"write": ["file:///C:/Users/x"]}}}),
        json!({"sandboxPolicy": {"type": "workspace-write", "writable_roots": ["file:///C:/Users/x"]}}),
        json!({"sandboxPolicy": {"type": "read-only"}, "sandboxPolicyCwd": "file:///C:/Users/x"}),
    ] {
        let message = format!("invalid sandbox permission path URI: {reason}");
        let fs_err = fs_error(&sandbox);
        assert_eq!(
            (fs_err.code, fs_err.message.as_str()),
            (code::INVALID_REQUEST, message.as_str())
        );
        let process_err = process_error(&sandbox);
        assert_eq!(
            (process_err.code, process_err.message.as_str()),
            (code::INVALID_PARAMS, message.as_str())
        );
    }
}

#[test]
fn malformed_paths_are_decode_errors() {
    for path in ["relative/x", "", "http://host/x", "file://host/x"] {
        let sandbox = json!({"permissions": managed(vec![path_entry(path, "read")], "restricted")});
        let error = fs_error(&sandbox);
        assert_eq!(error.code, code::INVALID_PARAMS, "{path}");
        assert!(
            error.message.starts_with(&format!("invalid path `{path}`")),
            "{error:?}"
        );
        assert_eq!(process_error(&sandbox).code, code::INVALID_PARAMS);
    }
}

#[test]
fn bad_project_roots_subpath() {
    for subpath in ["/abs", "../up", "a/../../b", "a/.."] {
        let sandbox = json!({"permissions": managed(vec![json!({"path": {"type": "special",
            "value": {"kind": "project_roots", "subpath": subpath}}, "access": "write"})], "restricted"),
            "cwd": "/srv/repo"});
        let message = format!("invalid project_roots subpath {subpath}");
        let fs_err = fs_error(&sandbox);
        assert_eq!(
            (fs_err.code, fs_err.message.as_str()),
            (code::INVALID_REQUEST, message.as_str())
        );
        let process_err = process_error(&sandbox);
        assert_eq!(
            (process_err.code, process_err.message.as_str()),
            (code::INVALID_PARAMS, message.as_str())
        );
    }
    // `current_working_directory` is the same kind.
    let t = Tree::new();
    let alias = json!({"permissions": managed(vec![json!({"path": {"type": "special",
        "value": {"kind": "current_working_directory", "subpath": "./src"}}, "access": "write"})], "restricted"),
        "cwd": t.uri("repo")});
    assert_eq!(fs_policy(&alias).writable, vec![t.path("repo/src")]);
}

#[test]
fn unresolvable_helper_fails_to_prepare_only_with_restricted_reads() {
    let restricted = json!({"permissions": {"file_system": {"read": ["/srv"]}}});
    let mut ctx = fs_ctx();
    ctx.helper_executable = Err("no such helper".to_owned());
    let error = decide_fs_in(Some(&restricted), None, &ctx).unwrap_err();
    assert_eq!(error, RpcError::fs_sandbox_prepare("no such helper"));
    assert_eq!(error.code, code::INVALID_REQUEST);
    assert_eq!(
        error.message,
        "failed to prepare fs sandbox: no such helper"
    );

    let mut ctx = process_ctx(Path::new("/"));
    ctx.helper_executable = Err("no such helper".to_owned());
    let error = decide_process_in(Some(&restricted), &ctx).unwrap_err();
    assert_eq!(error.code, code::INVALID_PARAMS);
    assert_eq!(
        error.message,
        "failed to prepare process sandbox: no such helper"
    );

    let read_all = json!({"sandboxPolicy": {"type": "read-only"}});
    assert!(decide_process_in(Some(&read_all), &ctx).is_ok());
}

#[test]
fn shape_errors_are_invalid_params_for_both() {
    for sandbox in [
        json!("not an object"),
        json!({"permissions": {"type": "managed"}}),
        json!({"permissions": {"type": "sandboxed"}}),
        json!({"permissions": managed(vec![json!({"path": {"type": "path", "path": "/x"}, "access": "exec"})], "restricted")}),
        json!({"permissions": managed(vec![json!({"path": {"type": "path", "path": "/x"}, "access": "read",
                                                  "missing_path_behavior": "fail"})], "restricted")}),
        json!({"permissions": managed(vec![json!({"path": {"type": "drive", "path": "/x"}, "access": "read"})], "restricted")}),
        json!({"permissions": managed(vec![json!({"path": {"type": "special", "value": {}}, "access": "read"})], "restricted")}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted", "glob_scan_max_depth": 0}}}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted", "glob_scan_max_depth": -1}}}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "partial"}}}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted"}, "network": "on"}}),
        json!({"permissions": {"file_system": {"read": "/x"}}}),
        json!({"sandboxPolicy": {"type": "workspace-write", "writable_roots": "/x"}}),
        json!({"sandboxPolicy": {"type": "readonly"}}),
        json!({"sandboxPolicy": {}}),
        json!({"sandboxPolicy": {"type": "read-only", "access": {"type": "partial"}}}),
        json!({"sandboxPolicy": {"type": "read-only"}, "fileSystemSandboxPolicy": {"kind": "external_sandbox"}}),
        json!({"sandboxPolicy": {"type": "read-only"}, "cwd": 5}),
        json!({"sandboxPolicy": {"type": "read-only"}, "windowsSandboxLevel": 2}),
        json!({"permissions": managed(vec![glob_entry("/x/[ab", "deny")], "restricted")}),
        json!({"permissions": managed(vec![glob_entry("", "deny")], "restricted")}),
    ] {
        let fs_err = fs_error(&sandbox);
        assert_eq!(fs_err.code, code::INVALID_PARAMS, "{sandbox}: {fs_err:?}");
        assert_eq!(
            process_error(&sandbox).code,
            code::INVALID_PARAMS,
            "{sandbox}"
        );
    }
}

#[test]
fn missing_path_behavior_skip_and_unknown_members_are_accepted() {
    let sandbox = json!({"permissions": {"type": "managed", "future": 1,
        "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "path", "path": "/srv", "extra": true}, "access": "read",
             "missing_path_behavior": "skip", "note": "x"}]}}, "futureOuter": {}});
    assert!(fs(&sandbox).unwrap().needs_enforcement());
}

// ---- legacy forms ---------------------------------------------------------------------------

#[test]
fn legacy_workspace_write_without_cwd_grants_only_its_roots_and_temporaries() {
    let t = Tree::new();
    let sandbox = json!({"sandboxPolicy": {"type": "workspace-write",
        "writable_roots": [t.native("cache")], "exclude_slash_tmp": true}});
    let mut ctx = fs_ctx();
    ctx.tmpdir = Some(t.path("tmpdir").into_os_string());
    let policy = enforced(decide_fs_in(Some(&sandbox), None, &ctx).map(|o| o.decision));
    assert_eq!(policy.writable, vec![t.path("cache"), t.path("tmpdir")]);
    // A relative or empty TMPDIR counts as unset.
    for tmpdir in ["relative", ""] {
        ctx.tmpdir = Some(tmpdir.into());
        let policy = enforced(decide_fs_in(Some(&sandbox), None, &ctx).map(|o| o.decision));
        assert_eq!(policy.writable, vec![t.path("cache")]);
    }
}

#[test]
fn legacy_workspace_write_with_restricted_reads() {
    let t = Tree::new();
    let sandbox = json!({"sandboxPolicy": {"type": "workspace-write", "exclude_slash_tmp": true,
        "exclude_tmpdir_env_var": true,
        "read_only_access": {"type": "restricted", "include_platform_defaults": false,
                             "readable_roots": [t.uri("docs")]}},
        "sandboxPolicyCwd": t.native("repo"), "cwd": t.native("cwd-wins")});
    let policy = fs_policy(&sandbox);
    assert_eq!(
        policy.readable,
        Readable::Roots(vec![
            t.path("cwd-wins"),
            t.path("docs"),
            PathBuf::from("/usr/local/bin"),
        ])
    );
    assert_eq!(policy.writable, vec![t.path("cwd-wins")]);
}

#[test]
fn legacy_companions() {
    let t = Tree::new();
    // `fileSystemSandboxPolicy` replaces the file-system part, the network stays.
    let replaced = json!({"sandboxPolicy": {"type": "workspace-write", "network_access": true},
        "sandboxPolicyCwd": t.native("repo"),
        "additionalPermissions": {"file_system": {"write": [t.native("extra")]}},
        "fileSystemSandboxPolicy": {"kind": "restricted", "glob_scan_max_depth": 4, "entries": [
            path_entry(&t.native("only"), "write")]}});
    let policy = enforced(process(&replaced, Path::new("/")));
    assert_eq!(policy.writable, vec![t.path("only")]);
    assert_eq!(policy.network, Network::Enabled);
    assert_eq!(policy.glob_scan_max_depth, 4);
    // Unrestricted kinds lift the file system restriction.
    for kind in ["unrestricted", "external-sandbox"] {
        let sandbox = json!({"sandboxPolicy": {"type": "read-only"},
                             "fileSystemSandboxPolicy": {"kind": kind}});
        assert_eq!(fs(&sandbox), Ok(SandboxDecision::Unsandboxed), "{kind}");
        assert!(process(&sandbox, Path::new("/"))
            .unwrap()
            .needs_enforcement());
    }
    // `additionalPermissions` adds grants.
    let added = json!({"sandboxPolicy": {"type": "read-only"},
        "additionalPermissions": {"file_system": {"write": [t.native("extra")]}}});
    assert_eq!(fs_policy(&added).writable, vec![t.path("extra")]);
    // Next to `permissions` the companions are ignored, even when malformed.
    let ignored = json!({"permissions": {"type": "disabled"},
        "fileSystemSandboxPolicy": {"kind": "bogus"}, "additionalPermissions": 5,
        "sandboxPolicyCwd": "relative"});
    assert_eq!(fs(&ignored), Ok(SandboxDecision::Unsandboxed));
}

// ---- canonicalisation, carve-outs, additions --------------------------------------------

#[test]
fn paths_are_canonicalised_sorted_and_deduplicated() {
    let t = Tree::new();
    t.mkdir("real/dir");
    symlink(t.path("real"), t.path("link")).unwrap();
    let sandbox = json!({"permissions": {"file_system": {
        "write": [t.native("link/dir"), t.uri("real/dir"), t.native("real/./dir/../dir"),
                  t.native("link/missing/../new/file")],
        "read": [t.native("b"), t.native("a"), t.native("a")]}}});
    let policy = fs_policy(&sandbox);
    assert_eq!(
        policy.writable,
        vec![t.path("real/dir"), t.path("real/new/file")]
    );
    assert_eq!(
        policy.readable,
        Readable::Roots(vec![
            t.path("a"),
            t.path("b"),
            t.path("real/dir"),
            t.path("real/new/file"),
            PathBuf::from("/usr/local/bin"),
        ])
    );
    assert_sorted(&policy);
}

#[test]
fn symlinked_dot_git_protects_link_and_target() {
    let t = Tree::new();
    t.mkdir("repo");
    t.mkdir("elsewhere/gitdata");
    symlink(t.path("elsewhere/gitdata"), t.path("repo/.git")).unwrap();
    let sandbox = json!({"permissions": {"file_system": {"write": [t.native("repo")]}}});
    let policy = fs_policy(&sandbox);
    assert_eq!(
        policy.read_only,
        vec![
            t.path("elsewhere/gitdata"),
            t.path("repo/.agents"),
            t.path("repo/.codex"),
            t.path("repo/.git"),
        ]
    );
}

#[test]
fn gitdir_target_can_be_reopened_by_an_explicit_write() {
    let t = Tree::new();
    t.mkdir("main/.git/worktrees/r");
    t.write("repo/.git", "gitdir: ../main/.git/worktrees/r\n");
    let sandbox = json!({"permissions": {"file_system": {
        "write": [t.native("repo"), t.native("main/.git/worktrees/r/logs")]}}});
    let policy = fs_policy(&sandbox);
    assert!(!policy.read_only.contains(&t.path("main/.git/worktrees/r")));
    assert!(policy.read_only.contains(&t.path("repo/.git")));
    // A write below `.git` re-opens the whole `.git` carve-out.
    let below = json!({"permissions": {"file_system": {
        "write": [t.native("repo"), t.native("repo/.git/hooks")]}}});
    let policy = fs_policy(&below);
    assert!(!policy.read_only.contains(&t.path("repo/.git")));
    assert!(policy.read_only.contains(&t.path("repo/.codex")));
}

#[test]
fn gitdir_pointer_files_that_do_not_point_are_ignored() {
    let t = Tree::new();
    t.write("repo/.git", "not a pointer\n");
    let sandbox = json!({"permissions": {"file_system": {"write": [t.native("repo")]}}});
    assert_eq!(
        fs_policy(&sandbox).read_only,
        vec![
            t.path("repo/.agents"),
            t.path("repo/.codex"),
            t.path("repo/.git")
        ]
    );
}

#[test]
fn carve_outs_exist_for_missing_names_under_every_writable_root() {
    let t = Tree::new();
    let sandbox = json!({"permissions": {"file_system": {
        "write": [t.native("w1"), t.native("w1/nested")]}}});
    let policy = fs_policy(&sandbox);
    assert_eq!(policy.read_only.len(), 6);
    assert!(policy.read_only.contains(&t.path("w1/nested/.git")));
    assert!(!policy.allows(&t.path("w1/.codex/new"), AccessKind::Write));
    assert!(policy.allows(&t.path("w1/.codex/new"), AccessKind::Read));
}

#[test]
fn server_additions() {
    let t = Tree::new();
    let sandbox = json!({"permissions": {"file_system": {"read": [t.native("docs")]}}});
    let mut ctx = fs_ctx();
    ctx.helper_executable = Ok(t.path("bin/helper"));
    ctx.secret_files = vec![t.path("conf/../conf/server.toml"), t.path("token")];
    let policy = enforced(decide_fs_in(Some(&sandbox), None, &ctx).map(|o| o.decision));
    assert_eq!(
        policy.readable,
        Readable::Roots(vec![t.path("bin"), t.path("docs")])
    );
    assert_eq!(
        policy.denied_paths,
        vec![t.path("conf/server.toml"), t.path("token")]
    );
    // With reads unrestricted nothing is added to the read set.
    let read_all = json!({"sandboxPolicy": {"type": "read-only"}});
    let policy = enforced(decide_fs_in(Some(&read_all), None, &ctx).map(|o| o.decision));
    assert_eq!(policy.readable, Readable::All);
    assert_eq!(policy.denied_paths.len(), 2);
}

#[test]
fn process_additions_are_minimal_and_proc() {
    let t = Tree::new();
    let sandbox = json!({"permissions": {"file_system": {"read": [t.native("docs")]}}});
    let policy = enforced(process(&sandbox, Path::new("/")));
    let Readable::Roots(roots) = &policy.readable else {
        panic!("reads should be restricted")
    };
    assert!(roots.contains(&PathBuf::from("/proc")));
    assert!(roots.contains(&PathBuf::from("/usr/local/bin")));
    for minimal in existing_minimal_paths() {
        assert!(roots.contains(&minimal), "{minimal:?}");
    }
}

#[test]
fn special_kinds_expand() {
    let t = Tree::new();
    let mut ctx = fs_ctx();
    ctx.tmpdir = Some(t.path("tmpdir").into_os_string());
    let decide = |entries: Vec<Value>| {
        let sandbox = json!({"permissions": managed(entries, "restricted"), "cwd": t.uri("cwd")});
        enforced(decide_fs_in(Some(&sandbox), None, &ctx).map(|o| o.decision))
    };
    assert_eq!(
        decide(vec![special_entry("tmpdir", "write")]).writable,
        vec![t.path("tmpdir")]
    );
    assert_eq!(
        decide(vec![special_entry("slash_tmp", "write")]).writable,
        vec![canonicalise(Path::new("/tmp"))]
    );
    // `minimal` with write grants read only; with deny it is ignored.
    let minimal_write = decide(vec![special_entry("minimal", "write")]);
    assert!(minimal_write.writable.is_empty());
    let Readable::Roots(roots) = &minimal_write.readable else {
        panic!()
    };
    assert!(existing_minimal_paths().iter().all(|p| roots.contains(p)));
    let minimal_deny = decide(vec![
        special_entry("root", "read"),
        special_entry("minimal", "deny"),
    ]);
    assert!(minimal_deny.denied_paths.is_empty());
    // `root` with deny denies everything not named more specifically.
    let root_deny = decide(vec![
        special_entry("root", "deny"),
        path_entry(&t.native("ok"), "read"),
    ]);
    assert_eq!(root_deny.denied_paths, vec![PathBuf::from("/")]);
    assert!(root_deny.allows(&t.path("ok/x"), AccessKind::Read));
    assert!(!root_deny.allows(&t.path("other"), AccessKind::Read));
}

#[test]
fn absolute_globs_have_their_literal_prefix_canonicalised() {
    let t = Tree::new();
    t.mkdir("real");
    symlink(t.path("real"), t.path("link")).unwrap();
    let sandbox = json!({"permissions": managed(vec![
        special_entry("root", "read"),
        glob_entry(&format!("{}/./sub/../**/*.pem", t.native("link")), "deny"),
        glob_entry(&format!("{}/**", t.uri("link")), "deny"),
    ], "restricted")});
    let policy = fs_policy(&sandbox);
    let globs: Vec<&str> = policy
        .denied_globs
        .iter()
        .map(GlobPattern::as_str)
        .collect();
    assert_eq!(
        globs,
        vec![
            format!("{}/**", t.native("real")),
            format!("{}/**/*.pem", t.native("real")),
        ]
    );
    assert!(!policy.allows(&t.path("real/a/b.pem"), AccessKind::Read));
}

#[test]
fn glob_scan_max_depth_is_kept() {
    let sandbox = json!({"permissions": {"type": "managed", "file_system": {"type": "restricted",
        "glob_scan_max_depth": 3}}});
    assert_eq!(fs_policy(&sandbox).glob_scan_max_depth, 3);
    let untagged = json!({"permissions": {"file_system": {"glob_scan_max_depth": 5}}});
    assert_eq!(fs_policy(&untagged).glob_scan_max_depth, 5);
}

// ---- routing (§3.1) -------------------------------------------------------------------------

#[test]
fn routing_table() {
    let cwd = Path::new("/");
    // No sandbox, or null: as without one.
    assert_eq!(decide_fs(None, None), Ok(SandboxDecision::Unsandboxed));
    assert_eq!(
        decide_fs(Some(&Value::Null), None),
        Ok(SandboxDecision::Unsandboxed)
    );
    assert_eq!(
        decide_fs(None, Some(&Value::Null)),
        Ok(SandboxDecision::Unsandboxed)
    );
    assert_eq!(decide_process(None, cwd), Ok(SandboxDecision::Unsandboxed));
    assert_eq!(
        decide_process(Some(&Value::Null), cwd),
        Ok(SandboxDecision::Unsandboxed)
    );
    // Unsandboxed policies.
    let disabled = json!({"permissions": {"type": "disabled"}});
    assert!(!decide_fs(Some(&disabled), None)
        .unwrap()
        .needs_enforcement());
    assert!(!decide_process(Some(&disabled), cwd)
        .unwrap()
        .needs_enforcement());
    // Enforced policies, through the default entry points.
    let read_only = json!({"sandboxPolicy": {"type": "read-only"}});
    let fs_decision = decide_fs(Some(&read_only), None).unwrap();
    assert!(fs_decision.needs_enforcement());
    assert_eq!(fs_decision.policy().unwrap().network, Network::Restricted);
    assert!(decide_fs(None, Some(&json!({"type": "workspace-write"})))
        .unwrap()
        .needs_enforcement());
    assert!(decide_process(Some(&read_only), cwd)
        .unwrap()
        .needs_enforcement());
}

#[test]
fn helper_json_round_trips() {
    let t = Tree::new();
    t.mkdir("srv/repo");
    let policy = fs_policy(&t.example(EXAMPLE_C));
    let text = policy.to_helper_json(Enforcement::BestEffort);
    assert!(
        text.starts_with(r#"{"version":1,"readable":{"roots":["#),
        "{text}"
    );
    assert!(
        text.ends_with(r#""network":"restricted","enforcement":"best-effort"}"#),
        "{text}"
    );
    let (parsed, enforcement) = SandboxPolicy::from_helper_json(&text).unwrap();
    assert_eq!(enforcement, Enforcement::BestEffort);
    assert_eq!(parsed.readable, policy.readable);
    assert_eq!(parsed.read_only, policy.read_only);
    assert_eq!(parsed.denied_paths, policy.denied_paths);
    assert_eq!(parsed.denied_globs, policy.denied_globs);
    let all = fs_policy(&json!({"sandboxPolicy": {"type": "read-only"}}));
    let (parsed, _) =
        SandboxPolicy::from_helper_json(&all.to_helper_json(Enforcement::Require)).unwrap();
    assert_eq!(parsed.readable, Readable::All);
    assert!(
        SandboxPolicy::from_helper_json(&text.replace("\"version\":1", "\"version\":2")).is_err()
    );
}

/// Found by the `policy` fuzz target: with `/` readable, a `read` entry below a denied path
/// was dropped (`Readable::All` keeps no roots), so the shorter deny decided below it too.
#[test]
fn a_read_entry_below_a_denied_path_decides_below_it() {
    let t = Tree::new();
    t.mkdir("home/.ssh");
    let sandbox = json!({"permissions": managed(vec![
        special_entry("root", "read"),
        path_entry(&t.native("home/.ssh"), "deny"),
        path_entry(&t.native("home/.ssh/known_hosts"), "read"),
    ], "restricted")});
    let policy = fs_policy(&sandbox);
    assert!(policy.allows(&t.path("home/.ssh/known_hosts"), AccessKind::Read));
    assert!(!policy.allows(&t.path("home/.ssh/known_hosts"), AccessKind::Write));
    assert!(!policy.allows(&t.path("home/.ssh/id_ed25519"), AccessKind::Read));
    assert!(policy.allows(&t.path("home/other"), AccessKind::Read));
    assert!(policy.allows(Path::new("/etc/passwd"), AccessKind::Read));
    // Without such an entry, reading everything stays `All`.
    let plain = fs_policy(&json!({"permissions": managed(vec![
        special_entry("root", "read"),
        path_entry(&t.native("home/.ssh"), "deny"),
    ], "restricted")}));
    assert_eq!(plain.readable, Readable::All);
}

/// The helper-JSON round trip of the `policy` fuzz target: a policy path whose first name
/// reads as a drive letter (`/C:/x`, a fine Linux path) went into the helper's JSON as
/// `file:///C:/x`, which the helper refused as another OS's URI: every sandboxed `fs/*`
/// call failed.
#[test]
fn helper_json_names_every_path_exactly() {
    let sandbox = json!({"permissions": managed(vec![
        special_entry("root", "read"),
        path_entry("/C:/x", "write"),
        path_entry("/c|", "deny"),
    ], "restricted")});
    let policy = fs_policy(&sandbox);
    let text = policy.to_helper_json(Enforcement::Require);
    let (parsed, _) = SandboxPolicy::from_helper_json(&text).unwrap();
    assert_eq!(parsed.writable, [PathBuf::from("/C:/x")]);
    assert!(
        parsed.denied_paths.contains(&PathBuf::from("/c|")),
        "{text}"
    );
    assert_eq!(parsed.readable, policy.readable);
}

/// Found by the `policy` fuzz target: the helper's directory, added as a read root below a
/// writable root, was the longer rule there and made the client's writable tree read-only.
#[test]
fn server_additions_never_take_write_access_away() {
    let t = Tree::new();
    t.mkdir("work/bin");
    let sandbox = json!({"permissions": {"file_system": {"write": [t.native("work")]}}});
    let mut ctx = process_ctx(&t.path("work"));
    ctx.helper_executable = Ok(t.path("work/bin/exec-server"));
    let policy = enforced(decide_process_in(Some(&sandbox), &ctx).map(|o| o.decision));
    assert!(policy.allows(&t.path("work/bin/out"), AccessKind::Write));
    let Readable::Roots(roots) = &policy.readable else {
        panic!("reads are restricted: {policy:?}");
    };
    assert!(!roots.contains(&t.path("work/bin")), "{roots:?}");
    assert!(roots.contains(&PathBuf::from("/proc")), "{roots:?}");
    // Where the policy does not let it be written, the directory is added as before.
    ctx.helper_executable = Ok(t.path("elsewhere/exec-server"));
    let policy = enforced(decide_process_in(Some(&sandbox), &ctx).map(|o| o.decision));
    assert!(policy.allows(&t.path("elsewhere"), AccessKind::Read));
    assert!(!policy.allows(&t.path("elsewhere"), AccessKind::Write));
}

/// A deny glob whose literal prefix is not UTF-8 reaches the helper and the launcher with
/// that prefix's exact bytes (the spec's string form cannot carry them).
#[test]
fn helper_json_carries_glob_prefixes_that_are_not_utf8() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt as _;
    let t = Tree::new();
    let dir = t.path("srv").join(OsString::from_vec(b"caf\xe9".to_vec()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut uri = exec_server_proto::path::to_file_uri(&dir);
    uri.push_str("/**/*.env");
    let sandbox = json!({"permissions": managed(vec![
        special_entry("root", "read"),
        json!({"path": {"type": "glob_pattern", "pattern": uri}, "access": "deny"}),
    ], "restricted")});
    let policy = fs_policy(&sandbox);
    assert_eq!(policy.denied_globs.len(), 1, "{policy:?}");
    assert_eq!(policy.denied_globs[0].prefix(), dir);
    let text = policy.to_helper_json(Enforcement::Require);
    let (parsed, _) = SandboxPolicy::from_helper_json(&text).unwrap();
    assert_eq!(parsed.denied_globs[0].prefix(), dir, "{text}");
    assert!(!parsed.allows(&dir.join("prod.env"), AccessKind::Read));
    assert!(parsed.allows(&t.path("srv/other.env"), AccessKind::Read));
}

#![no_main]
//! `policy`: sandbox policies through shape, intent, expansion, classification, carve-outs,
//! server additions, the helper's JSON form and the access check — for `fs/*` and for
//! `process/start` — against a small tree in a fresh temporary directory (directories,
//! files, links in and out of it, `.git` directories, links and `gitdir:` files).
//!
//! Two kinds of input:
//! * JSON text (starts with `{`): a `sandbox` member as a client sends it; `@T` stands for
//!   the tree's root. Checked: no panic; a decided policy is sorted, deduplicated and
//!   canonical; its helper JSON reads back as the same policy; the server's secret file is
//!   never allowed; and every write it allows lies below something the JSON names for
//!   writing (any write entry, write list, writable root, or what `workspace-write`, the
//!   `root`/`tmpdir`/`slash_tmp`/`project_roots` kinds or an unrestricted file system
//!   name) — a policy never grants more than it names.
//! * Anything else: bytes that choose a policy of every shape (tagged, untagged, legacy with
//!   its companions; paths native, as URIs, outside the tree, malformed; globs; special
//!   kinds) together with a model of what it names. The model is the specification's
//!   steps written out plainly (SANDBOX.md §2.4–§2.10, §5.6); the policy must fail exactly
//!   when the model does, and decide every probe (resolved paths in and around the tree)
//!   exactly as the model's longest-prefix rule does. Canonicalisation is the code's own,
//!   checked against the kernel wherever the path exists.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use exec_server_proto::path::{parse_path, to_file_uri};
use exec_server_sandbox::policy::{
    canonicalise, decide_fs_in, decide_process_in, resolve, AccessKind, Enforcement, Network,
    PolicyContext, PolicyTarget, Readable, SandboxDecision, SandboxPolicy, MINIMAL_READ_SET,
};
use libfuzzer_sys::arbitrary::{Result as ArbResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

fuzz_target!(|data: &[u8]| {
    let tree = Tree::new();
    if data.first() == Some(&b'{') {
        raw_json(&tree, data);
    } else {
        let _ = structured(&tree, &mut Unstructured::new(data));
    }
});

// ---------------------------------------------------------------------------------------
// The tree.

/// A fresh temporary directory (canonical path) holding:
///
/// ```text
/// a/ a/b/ a/.git/ a/.git/config  b/  c  secret  bin/helper  tmpdir/  gitdir/
/// repo/ repo/.git ("gitdir: ../gitdir")  linked/ linked/.git -> ../gitdir
/// link -> a  outlink -> /
/// ```
struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Tree {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical temp dir");
        for d in [
            "a", "a/b", "a/.git", "b", "bin", "tmpdir", "gitdir", "repo", "linked",
        ] {
            std::fs::create_dir(root.join(d)).expect("mkdir");
        }
        for (f, text) in [
            ("a/.git/config", ""),
            ("c", "c"),
            ("secret", "key"),
            ("bin/helper", ""),
            ("repo/.git", "gitdir: ../gitdir\n"),
        ] {
            std::fs::write(root.join(f), text).expect("write");
        }
        std::os::unix::fs::symlink("../gitdir", root.join("linked/.git")).expect("link");
        std::os::unix::fs::symlink("a", root.join("link")).expect("link");
        std::os::unix::fs::symlink("/", root.join("outlink")).expect("link");
        Self { _dir: dir, root }
    }

    fn path(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            PathBuf::from(format!("{}/{rel}", self.root.display()))
        }
    }

    fn native(&self, rel: &str) -> String {
        self.path(rel).to_str().expect("UTF-8 temp dir").to_owned()
    }

    /// Links (and `gitdir:` files) at a few fixed names, whose parents are directories of
    /// the base layout: nothing is ever created through a link.
    fn add_nodes(&self, u: &mut Unstructured<'_>) -> ArbResult<()> {
        for _ in 0..u.int_in_range(0..=4)? {
            let name = *u.choose(&["x", "a/x", "a/.codex", "b/.git", "b/.agents", "a/b/.git"])?;
            let path = self.path(name);
            if u.ratio(1, 4)? {
                let pointer =
                    *u.choose(&["../gitdir", "/", "a", "../../..", "", "  ../c  ", "../link"])?;
                if let Ok(mut file) = std::fs::File::create_new(&path) {
                    use std::io::Write;
                    let _ = writeln!(file, "gitdir: {pointer}");
                }
                continue;
            }
            let target = match u.int_in_range(0..=10)? {
                0 => "a".to_owned(),
                1 => "..".to_owned(),
                2 => "/".to_owned(),
                3 => "/etc".to_owned(),
                4 => "../gitdir".to_owned(),
                5 => "missing".to_owned(),
                6 => "b".to_owned(),
                7 => "a/b".to_owned(),
                8 => self.native("c"),
                9 => "x".to_owned(),
                _ => self.native("b/.git"),
            };
            let _ = std::os::unix::fs::symlink(target, &path);
        }
        Ok(())
    }
}

fn contexts(tree: &Tree, tmpdir: Option<&str>, cwd: &str) -> [PolicyContext; 2] {
    let fs = PolicyContext {
        target: PolicyTarget::Fs,
        helper_executable: Ok(tree.path("bin/helper")),
        tmpdir: tmpdir.map(Into::into),
        secret_files: vec![tree.path("secret")],
        secret_globs: Vec::new(),
    };
    let process = PolicyContext {
        target: PolicyTarget::Process {
            cwd: tree.path(cwd),
        },
        ..fs.clone()
    };
    [fs, process]
}

fn decide(sandbox: &Value, ctx: &PolicyContext) -> Result<SandboxDecision, String> {
    let outcome = match ctx.target {
        PolicyTarget::Fs => decide_fs_in(Some(sandbox), None, ctx),
        PolicyTarget::Process { .. } => decide_process_in(Some(sandbox), ctx),
    };
    outcome.map(|o| o.decision).map_err(|e| e.message)
}

/// Resolved paths in and around the tree.
fn probes(tree: &Tree) -> Vec<PathBuf> {
    let mut probes: Vec<PathBuf> = [
        "",
        "a",
        "a/b",
        "a/b/new",
        "a/.git",
        "a/.git/config",
        "a/.codex/x",
        "a/.agents",
        "a/x",
        "a/x/y",
        "b",
        "b/.git",
        "b/.git/y",
        "b/.agents/z",
        "b/x.pem",
        "b/k.pem/in",
        "c",
        "secret",
        "bin",
        "bin/helper",
        "tmpdir/f",
        "gitdir",
        "gitdir/HEAD",
        "repo/.git",
        "repo/src",
        "linked/.git",
        "link",
        "link/b",
        "outlink",
        "x",
        "x/y",
        "missing",
        "a/b/.git/z",
        "a/ab",
        "a/b/c.pem",
        "repo/a/b",
    ]
    .iter()
    .map(|rel| tree.path(rel))
    .collect();
    probes.extend(
        [
            "/",
            "/etc/passwd",
            "/usr/bin",
            "/tmp",
            "/proc/1/status",
            "/proc/self/status",
            "/proc",
            "/C:/x",
        ]
        .iter()
        .map(PathBuf::from),
    );
    probes.into_iter().map(|p| resolve(&p, true)).collect()
}

/// What every decided policy must satisfy, whatever produced it.
fn check_policy(tree: &Tree, ctx: &PolicyContext, policy: &SandboxPolicy, probes: &[PathBuf]) {
    let normal = |p: &PathBuf| {
        p.has_root()
            && p.components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
    };
    let sorted = |paths: &[PathBuf]| paths.windows(2).all(|w| w[0] < w[1]);
    let mut lists = vec![&policy.writable, &policy.read_only, &policy.denied_paths];
    if let Readable::Roots(roots) = &policy.readable {
        lists.push(roots);
    }
    for list in lists {
        assert!(sorted(list), "unsorted or duplicated: {policy:?}");
        assert!(list.iter().all(normal), "not canonical: {policy:?}");
    }
    assert!(policy.denied_globs.windows(2).all(|w| w[0] < w[1]));
    assert!(policy
        .denied_globs
        .iter()
        .all(|g| g.as_str().starts_with('/')));
    if ctx.target == PolicyTarget::Fs {
        assert_eq!(policy.network, Network::Restricted);
    }

    // The helper's form names the same policy.
    let text = policy.to_helper_json(Enforcement::BestEffort);
    let (back, enforcement) = SandboxPolicy::from_helper_json(&text)
        .unwrap_or_else(|e| panic!("helper JSON {text} does not read back: {e}"));
    assert_eq!(enforcement, Enforcement::BestEffort);
    let bytes = |paths: &[PathBuf]| -> Vec<Vec<u8>> {
        paths
            .iter()
            .map(|p| p.as_os_str().as_bytes().to_vec())
            .collect()
    };
    assert_eq!(bytes(&back.writable), bytes(&policy.writable), "{text}");
    assert_eq!(bytes(&back.read_only), bytes(&policy.read_only), "{text}");
    assert_eq!(
        bytes(&back.denied_paths),
        bytes(&policy.denied_paths),
        "{text}"
    );
    match (&back.readable, &policy.readable) {
        (Readable::All, Readable::All) => {}
        (Readable::Roots(a), Readable::Roots(b)) => assert_eq!(bytes(a), bytes(b), "{text}"),
        _ => panic!("readable changed: {text}"),
    }
    assert_eq!(back.denied_globs, policy.denied_globs);
    assert_eq!(back.network, policy.network);
    for probe in probes {
        for access in [AccessKind::Read, AccessKind::Write] {
            assert_eq!(
                back.allows(probe, access),
                policy.allows(probe, access),
                "{probe:?} {access:?} after {text}"
            );
        }
    }

    // The server's secrets are never reachable.
    let secret = tree.path("secret");
    assert!(!policy.allows(&secret, AccessKind::Read), "{policy:?}");
    assert!(!policy.allows(&secret, AccessKind::Write), "{policy:?}");
    // Nor are other processes.
    assert!(!policy.allows(Path::new("/proc/1/status"), AccessKind::Read));
}

// ---------------------------------------------------------------------------------------
// Raw JSON.

fn raw_json(tree: &Tree, data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let text = text.replace("@T", &tree.native(""));
    let Ok(sandbox) = serde_json::from_str::<Value>(&text) else {
        return;
    };
    let probes = probes(tree);
    for ctx in contexts(tree, Some(&tree.native("tmpdir")), "a") {
        let Ok(SandboxDecision::Enforce(policy)) = decide(&sandbox, &ctx) else {
            continue;
        };
        check_policy(tree, &ctx, &policy, &probes);
        let named = named_for_writing(&sandbox, &ctx);
        for probe in &probes {
            if policy.allows(probe, AccessKind::Write) {
                assert!(
                    named.iter().any(|w| probe.starts_with(w)),
                    "{probe:?} writable, but {text} names only {named:?} for writing"
                );
            }
        }
    }
}

/// Everything a `sandbox` JSON could possibly mean to make writable, read loosely (every
/// member at every depth, whichever shape is in force): an over-approximation.
fn named_for_writing(sandbox: &Value, ctx: &PolicyContext) -> Vec<PathBuf> {
    let path = |s: &str| parse_path(s).ok().map(|p| canonicalise(&p));
    let mut roots: Vec<PathBuf> = Vec::new();
    let mut strings = |v: Option<&Value>| {
        for s in v.into_iter().flat_map(|v| match v {
            Value::String(s) => vec![s.as_str()],
            Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        }) {
            roots.extend(parse_path(s).ok());
        }
    };
    strings(sandbox.get("cwd"));
    strings(sandbox.get("sandboxPolicyCwd"));
    strings(sandbox.get("workspaceRoots"));
    if let PolicyTarget::Process { cwd } = &ctx.target {
        roots.push(cwd.clone());
    }
    let tmpdir = ctx
        .tmpdir
        .as_ref()
        .map(PathBuf::from)
        .filter(|t| t.is_absolute());
    let mut named = Vec::new();
    let mut pending = vec![sandbox];
    while let Some(value) = pending.pop() {
        match value {
            Value::Object(members) => {
                if members.get("access").and_then(Value::as_str) == Some("write") {
                    let target = members.get("path");
                    let kind = target.and_then(|t| t.pointer("/value/kind"));
                    match kind.and_then(Value::as_str) {
                        Some("root") => named.push(PathBuf::from("/")),
                        Some("tmpdir") => named.extend(tmpdir.iter().map(|t| canonicalise(t))),
                        Some("slash_tmp") => named.push(canonicalise(Path::new("/tmp"))),
                        Some("project_roots" | "current_working_directory") => {
                            let sub = target
                                .and_then(|t| t.pointer("/value/subpath"))
                                .and_then(Value::as_str)
                                .unwrap_or("");
                            named.extend(roots.iter().map(|r| canonicalise(&r.join(sub))));
                        }
                        _ => {}
                    }
                    if let Some(p) = target.and_then(|t| t.get("path")).and_then(Value::as_str) {
                        named.extend(path(p));
                    }
                }
                for key in ["write", "writable_roots"] {
                    if let Some(Value::Array(items)) = members.get(key) {
                        named.extend(items.iter().filter_map(Value::as_str).filter_map(path));
                    }
                }
                let tag = members.get("type").or(members.get("kind"));
                match tag.and_then(Value::as_str) {
                    Some("workspace-write") => {
                        named.extend(roots.iter().map(|r| canonicalise(r)));
                        named.push(canonicalise(Path::new("/tmp")));
                        named.extend(tmpdir.iter().map(|t| canonicalise(t)));
                    }
                    Some(
                        "unrestricted" | "external-sandbox" | "danger-full-access" | "disabled"
                        | "external",
                    ) => named.push(PathBuf::from("/")),
                    _ => {}
                }
                pending.extend(members.values());
            }
            Value::Array(items) => pending.extend(items),
            _ => {}
        }
    }
    named
}

// ---------------------------------------------------------------------------------------
// Structured policies and their model.

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Acc {
    Read,
    Write,
    Deny,
}

#[derive(Debug, Clone)]
enum Target {
    Path(String),
    Glob(String),
    Special(String, Option<String>),
}

#[derive(Debug, Clone)]
struct Entry {
    target: Target,
    /// As sent: `read`, `write`, `deny` or `none`.
    access: &'static str,
}

#[derive(Debug, Clone)]
struct Restricted {
    entries: Vec<Entry>,
    depth: Option<u32>,
}

#[derive(Debug, Clone)]
struct Untagged {
    file_system: Option<(Restricted, Vec<String>, Vec<String>)>,
    network: Option<bool>,
}

#[derive(Debug, Clone)]
enum ReadAccess {
    Full,
    Restricted {
        platform: Option<bool>,
        roots: Vec<String>,
    },
}

#[derive(Debug, Clone)]
enum Legacy {
    Danger,
    External,
    ReadOnly {
        access: Option<ReadAccess>,
        network: bool,
    },
    WorkspaceWrite {
        roots: Vec<String>,
        exclude_tmpdir: bool,
        exclude_slash_tmp: bool,
        access: Option<ReadAccess>,
        network: bool,
    },
}

#[derive(Debug, Clone)]
enum Form {
    Managed {
        file_system: Option<Restricted>,
        network: Option<bool>,
    },
    Disabled,
    External,
    Untagged(Untagged),
    Legacy {
        policy: Legacy,
        additional: Option<Untagged>,
        /// `restricted` (with entries), `unrestricted` or `external-sandbox`.
        file_system: Option<(&'static str, Restricted)>,
    },
}

#[derive(Debug, Clone)]
struct Description {
    form: Form,
    cwd: Option<String>,
    workspace_roots: Vec<String>,
}

const RELS: &[&str] = &[
    "",
    "a",
    "a/b",
    "a/.git",
    "a/.git/config",
    "b",
    "c",
    "link",
    "link/b",
    "outlink/etc",
    "repo",
    "repo/.git",
    "gitdir",
    "linked",
    "linked/.git",
    "secret",
    "missing/x",
    "a/../b",
    "a/./b/",
    "x",
    "a/x",
    "tmpdir",
    "bin",
];

fn wire_path(u: &mut Unstructured<'_>, tree: &Tree) -> ArbResult<String> {
    Ok(match u.int_in_range(0..=31)? {
        0..=17 => tree.native(u.choose(RELS)?),
        18..=25 => to_file_uri(&tree.path(u.choose(RELS)?)),
        26..=29 => {
            (*u.choose(&["/", "/etc", "/tmp", "/proc", "/usr", "/C:/x", "/proc/self"])?).to_owned()
        }
        30 => (*u.choose(&[
            "file://host/x",
            "file:///C:/x",
            "",
            "file:///x?q",
            "file:///%zz",
        ])?)
        .to_owned(),
        _ => (*u.choose(&["relative/x", "a", "./b"])?).to_owned(),
    })
}

fn wire_paths(u: &mut Unstructured<'_>, tree: &Tree) -> ArbResult<Vec<String>> {
    (0..u.int_in_range(0..=2)?)
        .map(|_| wire_path(u, tree))
        .collect()
}

fn glob(u: &mut Unstructured<'_>, tree: &Tree) -> ArbResult<String> {
    let prefix = match u.int_in_range(0..=5)? {
        0 => String::new(),
        1 => "/".to_owned(),
        _ => format!(
            "{}/",
            tree.native(u.choose(&["", "a", "link", "repo", "b", "a/../b", "missing"])?)
        ),
    };
    let rest: Vec<&str> = (0..u.int_in_range(1..=3)?)
        .map(|_| {
            u.choose(&[
                "*", "**", "?", "*.pem", "[ab]", "[!a]*", "x", ".git", "config", "b", ".", "..",
                "[]]", "a**b",
            ])
            .copied()
        })
        .collect::<ArbResult<_>>()?;
    let pattern = format!("{prefix}{}", rest.join("/"));
    Ok(match u.int_in_range(0..=7)? {
        0 if pattern.starts_with('/') => format!("file://{pattern}"),
        1 => String::new(),
        _ => pattern,
    })
}

fn entry(u: &mut Unstructured<'_>, tree: &Tree) -> ArbResult<Entry> {
    let access = *u.choose(&["read", "write", "deny", "none"])?;
    let target = match u.int_in_range(0..=9)? {
        0..=4 => Target::Path(wire_path(u, tree)?),
        5 | 6 => Target::Glob(glob(u, tree)?),
        _ => {
            let kind = *u.choose(&[
                "root",
                "minimal",
                "project_roots",
                "current_working_directory",
                "tmpdir",
                "slash_tmp",
                "home_dir",
            ])?;
            let subpath = if u.ratio(1, 3)? {
                Some(
                    (*u.choose(&["", ".git", "a", "a/b", "../x", "/abs", "./a", "b/.git"])?)
                        .to_owned(),
                )
            } else {
                None
            };
            Target::Special(kind.to_owned(), subpath)
        }
    };
    // Mostly deny for globs: anything else is a shape error.
    let access = match target {
        Target::Glob(_) if u.ratio(7, 8)? => "deny",
        _ => access,
    };
    Ok(Entry { target, access })
}

fn restricted(u: &mut Unstructured<'_>, tree: &Tree) -> ArbResult<Restricted> {
    Ok(Restricted {
        entries: (0..u.int_in_range(0..=5)?)
            .map(|_| entry(u, tree))
            .collect::<ArbResult<_>>()?,
        depth: match u.int_in_range(0..=7)? {
            0 => Some(0),
            1 => Some(3),
            _ => None,
        },
    })
}

fn untagged(u: &mut Unstructured<'_>, tree: &Tree) -> ArbResult<Untagged> {
    let file_system = if u.ratio(4, 5)? {
        Some((
            restricted(u, tree)?,
            wire_paths(u, tree)?,
            wire_paths(u, tree)?,
        ))
    } else {
        None
    };
    Ok(Untagged {
        file_system,
        network: if u.arbitrary()? {
            Some(u.arbitrary()?)
        } else {
            None
        },
    })
}

fn read_access(u: &mut Unstructured<'_>, tree: &Tree) -> ArbResult<Option<ReadAccess>> {
    Ok(match u.int_in_range(0..=2)? {
        0 => None,
        1 => Some(ReadAccess::Full),
        _ => Some(ReadAccess::Restricted {
            platform: if u.arbitrary()? {
                Some(u.arbitrary()?)
            } else {
                None
            },
            roots: wire_paths(u, tree)?,
        }),
    })
}

fn description(u: &mut Unstructured<'_>, tree: &Tree) -> ArbResult<Description> {
    let form = match u.int_in_range(0..=11)? {
        0..=3 => Form::Managed {
            file_system: if u.ratio(7, 8)? {
                Some(restricted(u, tree)?)
            } else {
                None
            },
            network: if u.arbitrary()? {
                Some(u.arbitrary()?)
            } else {
                None
            },
        },
        4 => {
            if u.arbitrary()? {
                Form::Disabled
            } else {
                Form::External
            }
        }
        5..=6 => Form::Untagged(untagged(u, tree)?),
        _ => {
            let policy = match u.int_in_range(0..=7)? {
                0 => Legacy::Danger,
                1 => Legacy::External,
                2 | 3 => Legacy::ReadOnly {
                    access: read_access(u, tree)?,
                    network: u.arbitrary()?,
                },
                _ => Legacy::WorkspaceWrite {
                    roots: wire_paths(u, tree)?,
                    exclude_tmpdir: u.arbitrary()?,
                    exclude_slash_tmp: u.arbitrary()?,
                    access: read_access(u, tree)?,
                    network: u.arbitrary()?,
                },
            };
            Form::Legacy {
                policy,
                additional: if u.ratio(1, 3)? {
                    Some(untagged(u, tree)?)
                } else {
                    None
                },
                file_system: if u.ratio(1, 4)? {
                    let kind = *u.choose(&["restricted", "unrestricted", "external-sandbox"])?;
                    Some((kind, restricted(u, tree)?))
                } else {
                    None
                },
            }
        }
    };
    Ok(Description {
        form,
        cwd: if u.ratio(1, 2)? {
            Some(wire_path(u, tree)?)
        } else {
            None
        },
        workspace_roots: if u.ratio(1, 4)? {
            wire_paths(u, tree)?
        } else {
            Vec::new()
        },
    })
}

// The JSON a client sends for a description.

fn entry_json(entry: &Entry) -> Value {
    let path = match &entry.target {
        Target::Path(path) => json!({"type": "path", "path": path}),
        Target::Glob(pattern) => json!({"type": "glob_pattern", "pattern": pattern}),
        Target::Special(kind, None) => json!({"type": "special", "value": {"kind": kind}}),
        Target::Special(kind, Some(sub)) => {
            json!({"type": "special", "value": {"kind": kind, "subpath": sub}})
        }
    };
    json!({"path": path, "access": entry.access})
}

fn restricted_json(r: &Restricted) -> Value {
    let mut v = json!({"entries": r.entries.iter().map(entry_json).collect::<Vec<_>>()});
    if let Some(depth) = r.depth {
        v["glob_scan_max_depth"] = json!(depth);
    }
    v
}

fn untagged_json(p: &Untagged) -> Value {
    let mut v = json!({});
    if let Some((r, read, write)) = &p.file_system {
        let mut fs = restricted_json(r);
        if !read.is_empty() {
            fs["read"] = json!(read);
        }
        if !write.is_empty() {
            fs["write"] = json!(write);
        }
        v["file_system"] = fs;
    }
    if let Some(enabled) = p.network {
        v["network"] = json!({ "enabled": enabled });
    }
    v
}

fn read_access_json(a: &ReadAccess) -> Value {
    match a {
        ReadAccess::Full => json!({"type": "full-access"}),
        ReadAccess::Restricted { platform, roots } => {
            let mut v = json!({"type": "restricted", "readable_roots": roots});
            if let Some(p) = platform {
                v["include_platform_defaults"] = json!(p);
            }
            v
        }
    }
}

fn to_json(d: &Description) -> Value {
    let mut outer = json!({});
    let legacy = matches!(d.form, Form::Legacy { .. });
    match &d.form {
        Form::Managed {
            file_system,
            network,
        } => {
            let fs = match file_system {
                None => json!({"type": "unrestricted"}),
                Some(r) => {
                    let mut v = restricted_json(r);
                    v["type"] = json!("restricted");
                    v
                }
            };
            let mut p = json!({"type": "managed", "file_system": fs});
            if let Some(enabled) = network {
                p["network"] = json!(if *enabled { "enabled" } else { "restricted" });
            }
            outer["permissions"] = p;
        }
        Form::Disabled => outer["permissions"] = json!({"type": "disabled"}),
        Form::External => outer["permissions"] = json!({"type": "external"}),
        Form::Untagged(p) => outer["permissions"] = untagged_json(p),
        Form::Legacy {
            policy,
            additional,
            file_system,
        } => {
            outer["sandboxPolicy"] = match policy {
                Legacy::Danger => json!({"type": "danger-full-access"}),
                Legacy::External => json!({"type": "external-sandbox"}),
                Legacy::ReadOnly { access, network } => {
                    let mut v = json!({"type": "read-only", "network_access": network});
                    if let Some(a) = access {
                        v["access"] = read_access_json(a);
                    }
                    v
                }
                Legacy::WorkspaceWrite {
                    roots,
                    exclude_tmpdir,
                    exclude_slash_tmp,
                    access,
                    network,
                } => {
                    let mut v = json!({"type": "workspace-write", "writable_roots": roots,
                        "exclude_tmpdir_env_var": exclude_tmpdir,
                        "exclude_slash_tmp": exclude_slash_tmp, "network_access": network});
                    if let Some(a) = access {
                        v["read_only_access"] = read_access_json(a);
                    }
                    v
                }
            };
            if let Some(a) = additional {
                outer["additionalPermissions"] = untagged_json(a);
            }
            if let Some((kind, r)) = file_system {
                let mut v = restricted_json(r);
                v["kind"] = json!(kind);
                outer["fileSystemSandboxPolicy"] = v;
            }
        }
    }
    if let Some(cwd) = &d.cwd {
        outer[if legacy { "sandboxPolicyCwd" } else { "cwd" }] = json!(cwd);
    }
    if !d.workspace_roots.is_empty() {
        outer["workspaceRoots"] = json!(d.workspace_roots);
    }
    outer
}

// The model.

#[derive(Debug, Clone)]
enum Grant {
    Path(String),
    Glob(String),
    Special(String, Option<String>),
    Cwd,
}

/// The model's failure: the policy is refused (the reason shows in a failure's report).
#[derive(Debug)]
struct Refused(#[allow(dead_code)] &'static str);

fn access_of(sent: &str) -> Acc {
    match sent {
        "read" => Acc::Read,
        "write" => Acc::Write,
        _ => Acc::Deny,
    }
}

fn depth_ok(r: &Restricted) -> Result<(), Refused> {
    if r.depth == Some(0) {
        return Err(Refused("glob_scan_max_depth 0"));
    }
    Ok(())
}

fn grants_of(r: &Restricted) -> Result<Vec<(Grant, Acc)>, Refused> {
    r.entries
        .iter()
        .map(|e| {
            let access = access_of(e.access);
            let grant = match &e.target {
                Target::Path(p) => Grant::Path(p.clone()),
                Target::Glob(_) if access != Acc::Deny => return Err(Refused("glob without deny")),
                Target::Glob(g) => Grant::Glob(g.clone()),
                Target::Special(k, s) => Grant::Special(k.clone(), s.clone()),
            };
            Ok((grant, access))
        })
        .collect()
}

fn untagged_grants(p: &Untagged) -> Result<Vec<(Grant, Acc)>, Refused> {
    let Some((r, read, write)) = &p.file_system else {
        return Ok(Vec::new());
    };
    let mut grants = grants_of(r)?;
    grants.extend(read.iter().map(|s| (Grant::Path(s.clone()), Acc::Read)));
    grants.extend(write.iter().map(|s| (Grant::Path(s.clone()), Acc::Write)));
    depth_ok(r)?;
    Ok(grants)
}

fn special(kind: &str) -> Grant {
    Grant::Special(kind.to_owned(), None)
}

fn read_grants(access: &Option<ReadAccess>) -> Vec<(Grant, Acc)> {
    match access {
        None | Some(ReadAccess::Full) => vec![(special("root"), Acc::Read)],
        Some(ReadAccess::Restricted { platform, roots }) => {
            let mut grants: Vec<_> = roots
                .iter()
                .map(|r| (Grant::Path(r.clone()), Acc::Read))
                .collect();
            grants.push((Grant::Cwd, Acc::Read));
            if platform.unwrap_or(true) {
                grants.push((special("minimal"), Acc::Read));
            }
            grants
        }
    }
}

/// §2.8 steps 1–4: `None` is "enforce nothing"; `Some((None, network))` an unrestricted
/// file system.
#[allow(clippy::type_complexity)]
fn intent(form: &Form) -> Result<Option<(Option<Vec<(Grant, Acc)>>, bool)>, Refused> {
    Ok(Some(match form {
        Form::Disabled | Form::External => return Ok(None),
        Form::Managed {
            file_system,
            network,
        } => {
            let grants = match file_system {
                None => None,
                Some(r) => {
                    let grants = grants_of(r)?;
                    depth_ok(r)?;
                    Some(grants)
                }
            };
            (grants, network.unwrap_or(false))
        }
        Form::Untagged(p) => (Some(untagged_grants(p)?), p.network == Some(true)),
        Form::Legacy {
            policy,
            additional,
            file_system,
        } => {
            let (mut grants, mut network) = match policy {
                Legacy::Danger | Legacy::External => return Ok(None),
                Legacy::ReadOnly { access, network } => (read_grants(access), *network),
                Legacy::WorkspaceWrite {
                    roots,
                    exclude_tmpdir,
                    exclude_slash_tmp,
                    access,
                    network,
                } => {
                    let mut grants = read_grants(access);
                    grants.push((Grant::Cwd, Acc::Write));
                    grants.extend(roots.iter().map(|r| (Grant::Path(r.clone()), Acc::Write)));
                    if !exclude_slash_tmp {
                        grants.push((special("slash_tmp"), Acc::Write));
                    }
                    if !exclude_tmpdir {
                        grants.push((special("tmpdir"), Acc::Write));
                    }
                    (grants, *network)
                }
            };
            if let Some(a) = additional {
                grants.extend(untagged_grants(a)?);
                network |= a.network == Some(true);
            }
            let grants = match file_system {
                None => Some(grants),
                Some(("restricted", r)) => {
                    let grants = grants_of(r)?;
                    depth_ok(r)?;
                    Some(grants)
                }
                Some(_) => None,
            };
            (grants, network)
        }
    }))
}

/// One segment of a deny glob: a name of its canonical literal prefix, `**`, or a
/// component pattern.
#[derive(Debug, Clone)]
enum Seg {
    Name(String),
    AnyDepth,
    Pattern(Vec<char>),
}

/// The model's policy: rules on canonical paths and deny globs.
#[derive(Debug, Default)]
struct Model {
    rules: Vec<(PathBuf, Acc)>,
    globs: Vec<Vec<Seg>>,
    network: bool,
}

fn has_meta(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// A `[…]` class at the start of `p`: its length and whether `c` is in it; `None` when it
/// never closes or holds a reversed range.
fn class(p: &[char], c: char) -> Option<(usize, bool)> {
    let mut i = 1;
    let negated = matches!(p.get(1), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let first = i;
    let mut found = false;
    loop {
        let &lo = p.get(i)?;
        if lo == ']' && i > first {
            return Some((i + 1, found != negated));
        }
        match (p.get(i + 1), p.get(i + 2)) {
            (Some('-'), Some(&hi)) if hi != ']' => {
                if hi < lo {
                    return None;
                }
                found |= lo <= c && c <= hi;
                i += 3;
            }
            _ => {
                found |= lo == c;
                i += 1;
            }
        }
    }
}

fn component_matches(p: &[char], n: &[char]) -> bool {
    match p.first() {
        None => n.is_empty(),
        Some('*') => {
            component_matches(&p[1..], n) || (!n.is_empty() && component_matches(p, &n[1..]))
        }
        Some('?') => !n.is_empty() && component_matches(&p[1..], &n[1..]),
        Some('[') => match (n.first(), class(p, n.first().copied().unwrap_or('\0'))) {
            (Some(_), Some((len, true))) => component_matches(&p[len..], &n[1..]),
            _ => false,
        },
        Some(&c) => n.first() == Some(&c) && component_matches(&p[1..], &n[1..]),
    }
}

fn segments_match(segs: &[Seg], names: &[Vec<char>]) -> bool {
    match segs.first() {
        None => names.is_empty(),
        Some(Seg::AnyDepth) => (0..=names.len()).any(|j| segments_match(&segs[1..], &names[j..])),
        Some(Seg::Name(name)) => {
            !names.is_empty()
                && names[0].iter().copied().eq(name.chars())
                && segments_match(&segs[1..], &names[1..])
        }
        Some(Seg::Pattern(p)) => {
            !names.is_empty()
                && component_matches(p, &names[0])
                && segments_match(&segs[1..], &names[1..])
        }
    }
}

impl Model {
    fn push(&mut self, path: PathBuf, access: Acc) {
        self.rules.push((path, access));
    }

    /// §5.6 on a resolved path.
    fn allows(&self, path: &Path, access: AccessKind) -> bool {
        let names: Vec<String> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        if names.len() >= 2
            && names[0] == "proc"
            && !names[1].is_empty()
            && names[1].bytes().all(|b| b.is_ascii_digit())
            && names[1].parse::<u64>() != Ok(u64::from(std::process::id()))
        {
            return false;
        }
        let chars: Vec<Vec<char>> = names.iter().map(|n| n.chars().collect()).collect();
        if self
            .globs
            .iter()
            .any(|g| (0..=chars.len()).any(|k| segments_match(g, &chars[..k])))
        {
            return false;
        }
        let deciding = self
            .rules
            .iter()
            .filter(|(rule, _)| path.starts_with(rule))
            .max_by_key(|(rule, kind)| (rule.components().count(), *kind));
        match deciding.map(|(_, kind)| kind) {
            None | Some(Acc::Deny) => false,
            Some(Acc::Read) => access == AccessKind::Read,
            Some(Acc::Write) => true,
        }
    }
}

/// The code's canonicalisation, held to the kernel where the path exists.
fn canonical(path: &Path) -> PathBuf {
    let ours = canonicalise(path);
    if let Ok(kernel) = std::fs::canonicalize(path) {
        assert_eq!(ours, kernel, "canonicalise({path:?})");
    }
    ours
}

fn parse(value: &str) -> Result<PathBuf, Refused> {
    parse_path(value).map_err(|_| Refused("invalid path"))
}

/// The whole decision: `None` for "run unsandboxed".
fn model(d: &Description, ctx: &PolicyContext) -> Result<Option<Model>, Refused> {
    let Some((grants, network)) = intent(&d.form)? else {
        return Ok(None);
    };
    let process = matches!(ctx.target, PolicyTarget::Process { .. });
    let grants = match grants {
        Some(grants) => grants,
        None if !process || network => return Ok(None),
        None => vec![(special("root"), Acc::Write)],
    };
    // §2.8 step 3.
    let cwd = match &d.cwd {
        Some(value) => Some(parse(value)?),
        None => match &ctx.target {
            PolicyTarget::Process { cwd } => Some(cwd.clone()),
            PolicyTarget::Fs => None,
        },
    };
    let mut project_roots = d
        .workspace_roots
        .iter()
        .map(|r| parse(r))
        .collect::<Result<Vec<_>, _>>()?;
    if project_roots.is_empty() {
        project_roots.extend(cwd.clone());
    }

    let mut m = Model {
        network: process && network,
        ..Model::default()
    };
    for (grant, access) in grants {
        match grant {
            Grant::Path(value) => {
                let path = parse(&value)?;
                if access == Acc::Read
                    && std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink())
                {
                    if let (Some(parent), Some(name)) = (path.parent(), path.file_name()) {
                        m.push(canonical(parent).join(name), Acc::Read);
                    }
                }
                m.push(canonical(&path), access);
            }
            Grant::Cwd => {
                if let Some(cwd) = &cwd {
                    m.push(canonical(cwd), access);
                }
            }
            Grant::Glob(pattern) => m.globs.push(glob_model(&pattern, cwd.as_deref())?),
            Grant::Special(kind, subpath) => match kind.as_str() {
                "root" => m.push(PathBuf::from("/"), access),
                "minimal" if access != Acc::Deny => {
                    for p in MINIMAL_READ_SET
                        .iter()
                        .map(Path::new)
                        .filter(|p| p.exists())
                    {
                        m.push(canonical(p), Acc::Read);
                    }
                }
                "project_roots" | "current_working_directory" => {
                    if let Some(sub) = &subpath {
                        let plain = Path::new(sub)
                            .components()
                            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
                        if !plain {
                            return Err(Refused("subpath"));
                        }
                    }
                    if project_roots.is_empty() {
                        return Err(Refused("project_roots without cwd"));
                    }
                    for root in &project_roots {
                        let path = match &subpath {
                            Some(sub) => root.join(sub),
                            None => root.clone(),
                        };
                        m.push(canonical(&path), access);
                    }
                }
                "tmpdir" => {
                    let tmpdir = ctx.tmpdir.as_ref().map(PathBuf::from);
                    if let Some(t) = tmpdir.filter(|t| t.is_absolute()) {
                        m.push(canonical(&t), access);
                    }
                }
                "slash_tmp" if Path::new("/tmp").is_dir() => {
                    m.push(canonical(Path::new("/tmp")), access)
                }
                _ => {}
            },
        }
    }

    // §2.4.7: equal paths conflict as deny > write > read.
    let mut effective: BTreeMap<PathBuf, Acc> = BTreeMap::new();
    for (path, access) in &m.rules {
        let e = effective.entry(path.clone()).or_insert(*access);
        *e = (*e).max(*access);
    }
    let root = effective.get(Path::new("/")).copied();
    let all_readable = matches!(root, Some(Acc::Read | Acc::Write));
    let full_disk_write = root == Some(Acc::Write)
        && effective
            .iter()
            .all(|(p, a)| p == Path::new("/") || *a == Acc::Write)
        && m.globs.is_empty();
    let unsandboxed = full_disk_write && (!process || m.network);
    if unsandboxed {
        return Ok(None);
    }

    // §2.9: carve-outs under every writable root but `/`, unless a write reopens them.
    let writable: Vec<PathBuf> = effective
        .iter()
        .filter(|(_, a)| **a == Acc::Write)
        .map(|(p, _)| p.clone())
        .collect();
    let mut carve_outs = Vec::new();
    for w in writable.iter().filter(|w| w.parent().is_some()) {
        for name in [".git", ".codex", ".agents"] {
            let c = w.join(name);
            if std::fs::symlink_metadata(&c).is_ok_and(|m| m.file_type().is_symlink()) {
                carve_outs.push(canonical(&c));
            }
            carve_outs.push(c);
        }
        let dot_git = w.join(".git");
        if let Ok(meta) = std::fs::symlink_metadata(&dot_git) {
            if meta.is_file() {
                if let Some(pointer) = gitdir_pointer(&dot_git) {
                    carve_outs.push(canonical(&w.join(pointer)));
                }
            }
        }
    }
    carve_outs.retain(|c| !writable.iter().any(|w| w.starts_with(c)));
    let rules: Vec<(PathBuf, Acc)> = effective.into_iter().collect();
    m.rules = rules;
    m.rules
        .extend(carve_outs.into_iter().map(|c| (c, Acc::Read)));

    // §2.10: what reading needs, unless the policy lets it be written (a longer read root
    // would take that away).
    if all_readable {
        m.push(PathBuf::from("/"), Acc::Read);
    } else {
        let mut additions = Vec::new();
        if let Ok(helper) = &ctx.helper_executable {
            additions.extend(canonical(helper).parent().map(Path::to_path_buf));
        }
        if process {
            for p in MINIMAL_READ_SET
                .iter()
                .map(Path::new)
                .filter(|p| p.exists())
            {
                additions.push(canonical(p));
            }
            additions.push(canonical(Path::new("/proc")));
        }
        additions.retain(|p| !m.allows(p, AccessKind::Write));
        for p in additions {
            m.push(p, Acc::Read);
        }
    }
    for secret in &ctx.secret_files {
        m.push(canonical(secret), Acc::Deny);
    }
    Ok(Some(m))
}

/// The `<p>` of a first line `gitdir: <p>`, read as SANDBOX.md §2.9 says.
fn gitdir_pointer(file: &Path) -> Option<PathBuf> {
    let mut line = Vec::new();
    BufReader::new(std::fs::File::open(file).ok()?.take(4096))
        .read_until(b'\n', &mut line)
        .ok()?;
    let pointer = line.strip_prefix(b"gitdir:")?.trim_ascii();
    (!pointer.is_empty()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(pointer)))
}

/// A deny glob (§2.4.4): relative to `cwd` unless absolute; its literal leading names are a
/// path like any other (canonicalised); `.` after a wildcard is nothing and `..` after one
/// is refused, since a resolved path never holds either.
fn glob_model(pattern: &str, cwd: Option<&Path>) -> Result<Vec<Seg>, Refused> {
    if pattern.is_empty() {
        return Err(Refused("empty glob"));
    }
    let text = if pattern.len() >= 5 && pattern[..5].eq_ignore_ascii_case("file:") {
        parse(pattern)?.to_string_lossy().into_owned()
    } else {
        pattern.to_owned()
    };
    let mut prefix = if text.starts_with('/') {
        PathBuf::from("/")
    } else {
        cwd.ok_or(Refused("relative glob without cwd"))?
            .to_path_buf()
    };
    let mut rest: Vec<&str> = Vec::new();
    for name in text.split('/').filter(|n| !n.is_empty()) {
        if rest.is_empty() && !has_meta(name) {
            prefix.push(name);
        } else {
            rest.push(name);
        }
    }
    let mut segs: Vec<Seg> = canonical(&prefix)
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(Seg::Name(n.to_string_lossy().into_owned())),
            _ => None,
        })
        .collect();
    for name in rest {
        match name {
            "." => {}
            ".." => return Err(Refused("`..` after a wildcard")),
            "**" => segs.push(Seg::AnyDepth),
            other => {
                let chars: Vec<char> = other.chars().collect();
                // Reject what the grammar cannot read: a class that never closes or a
                // reversed range.
                let mut i = 0;
                while i < chars.len() {
                    if chars[i] == '[' {
                        let (len, _) = class(&chars[i..], 'a').ok_or(Refused("bad class"))?;
                        i += len;
                    } else {
                        i += 1;
                    }
                }
                segs.push(Seg::Pattern(chars));
            }
        }
    }
    Ok(segs)
}

fn structured(tree: &Tree, u: &mut Unstructured<'_>) -> ArbResult<()> {
    tree.add_nodes(u)?;
    let description = description(u, tree)?;
    let tmpdir = match u.int_in_range(0..=5)? {
        0 => None,
        1 => Some(String::new()),
        2 => Some("relative".to_owned()),
        3 => Some(tree.native("link")),
        _ => Some(tree.native("tmpdir")),
    };
    let cwd = *u.choose(&["a", "link", "", "missing", "repo"])?;
    let sandbox = to_json(&description);
    let probes = probes(tree);
    for ctx in contexts(tree, tmpdir.as_deref(), cwd) {
        let decided = decide(&sandbox, &ctx);
        let expected = model(&description, &ctx);
        let policy = match (decided, expected) {
            (Err(_), Err(_)) | (Ok(SandboxDecision::Unsandboxed), Ok(None)) => continue,
            (Ok(SandboxDecision::Enforce(policy)), Ok(Some(m))) => {
                if let PolicyTarget::Process { .. } = ctx.target {
                    let network = if m.network {
                        Network::Enabled
                    } else {
                        Network::Restricted
                    };
                    assert_eq!(policy.network, network, "{sandbox}");
                }
                (policy, m)
            }
            (decided, expected) => {
                panic!(
                    "{sandbox}\nfor {:?}: decided {decided:?}, model {expected:?}",
                    ctx.target
                )
            }
        };
        let (policy, m) = policy;
        check_policy(tree, &ctx, &policy, &probes);
        for probe in &probes {
            for access in [AccessKind::Read, AccessKind::Write] {
                assert_eq!(
                    policy.allows(probe, access),
                    m.allows(probe, access),
                    "{probe:?} {access:?} under {sandbox}\nfor {:?}\npolicy {policy:?}\nmodel {m:?}",
                    ctx.target
                );
            }
        }
    }
    Ok(())
}

//! Crate layering that reviews cannot see in one file: the client library carries no
//! server code, so a harness that links it gets neither axum nor the rendezvous service;
//! no crate's modules import each other in a circle; every crate root says its job.

use std::process::Command;

/// Every package `cargo tree` shows for `package` (normal, build and dev dependencies),
/// one name per entry.
fn dependency_names(package: &str) -> Vec<String> {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--prefix",
            "none",
            "-e",
            "normal,build,dev",
            "-p",
        ])
        .arg(package)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn the_client_library_depends_on_the_relay_core_and_no_server() {
    let names = dependency_names("exec-server-client");
    assert!(
        names.iter().any(|n| n == "exec-server-relay-core"),
        "{names:?}"
    );
    for server in [
        "axum",
        "exec-server-core",
        "exec-server-relay",
        "exec-server-rendezvous",
    ] {
        assert!(
            !names.iter().any(|n| n == server),
            "exec-server-client pulls in {server}"
        );
    }
}

/// The crates of the workspace: `(name, its src directory)`.
fn workspace_sources() -> Vec<(String, std::path::PathBuf)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut crates = vec![("exec-server".to_owned(), root.join("src"))];
    for group in [".", "plugins", "examples"] {
        let Ok(entries) = std::fs::read_dir(root.join(group)) else {
            continue;
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() && dir != root {
                let name = dir.file_name().unwrap().to_string_lossy().into_owned();
                crates.push((name, dir.join("src")));
            }
        }
    }
    crates.sort();
    crates
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The top-level modules a source text names through `crate::…` paths (comments skipped).
fn crate_references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let ident = |s: &str| -> String {
                s.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect()
            };
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a::X, b}`: the first segment of each top-level entry.
                let mut depth = 0;
                let mut start_of_entry = true;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => start_of_entry = true,
                        c if c.is_whitespace() => {}
                        _ if start_of_entry && depth == 0 => {
                            found.push(ident(&group[i..]));
                            start_of_entry = false;
                        }
                        _ => {}
                    }
                }
            } else {
                found.push(ident(rest));
            }
        }
    }
    found
}

/// Module → the modules it uses, for the top-level modules of one crate (a file
/// `src/a.rs` and everything under `src/a/` is module `a`; `src/a_tests.rs` is its own
/// node, since nothing depends on tests).
fn module_graph(src: &std::path::Path) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut files_of: std::collections::BTreeMap<String, Vec<std::path::PathBuf>> =
        Default::default();
    for file in rust_files(src) {
        let relative = file.strip_prefix(src).unwrap();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_string_lossy().trim_end_matches(".rs").to_owned();
        if module != "lib" && module != "main" {
            files_of.entry(module).or_default().push(file);
        }
    }
    let modules: Vec<String> = files_of.keys().cloned().collect();
    files_of
        .iter()
        .map(|(module, files)| {
            let mut uses: Vec<String> = files
                .iter()
                .flat_map(|f| crate_references(&std::fs::read_to_string(f).unwrap()))
                .filter(|used| used != module && modules.contains(used))
                .collect();
            uses.sort();
            uses.dedup();
            (module.clone(), uses)
        })
        .collect()
}

/// A cycle through `start`, if one exists.
fn cycle_through(
    graph: &std::collections::BTreeMap<String, Vec<String>>,
    start: &str,
) -> Option<Vec<String>> {
    let mut path = vec![start.to_owned()];
    let mut seen = std::collections::HashSet::new();
    fn walk(
        graph: &std::collections::BTreeMap<String, Vec<String>>,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut std::collections::HashSet<String>,
    ) -> bool {
        let last = path.last().unwrap().clone();
        for next in &graph[&last] {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    walk(graph, start, &mut path, &mut seen).then_some(path)
}

/// The modules of every crate read top-down: no module reaches itself through `crate::`
/// paths, so each can be understood from the ones below it.
#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let mut cycles = Vec::new();
    for (name, src) in workspace_sources() {
        let graph = module_graph(&src);
        for module in graph.keys() {
            if let Some(cycle) = cycle_through(&graph, module) {
                cycles.push(format!("{name}: {}", cycle.join(" -> ")));
                break;
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_cycle_check_sees_a_cycle() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.rs"), "use crate::b::B;\n").unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    std::fs::write(dir.path().join("b/inner.rs"), "use crate::{c, a::A};\n").unwrap();
    std::fs::write(dir.path().join("c.rs"), "// crate::a in a comment\n").unwrap();
    let graph = module_graph(dir.path());
    assert_eq!(graph["b"], ["a", "c"]);
    assert_eq!(
        cycle_through(&graph, "a").unwrap(),
        ["a", "b", "a"].map(String::from)
    );
    assert!(cycle_through(&graph, "c").is_none());
}

/// Each crate says its one job at the top of its root module.
#[test]
fn every_crate_root_starts_with_the_doc_of_its_job() {
    for (name, src) in workspace_sources() {
        let root = ["lib.rs", "main.rs"]
            .iter()
            .map(|f| src.join(f))
            .find(|p| p.is_file())
            .unwrap();
        let text = std::fs::read_to_string(&root).unwrap();
        assert!(
            text.starts_with("//! "),
            "{name}: {} does not start with a `//!` doc",
            root.display()
        );
    }
}

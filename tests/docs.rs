//! The documentation's code is real code: every Rust snippet in `docs/` and the README is
//! an excerpt of a file that the build compiles (most come from `examples/plugin-hello`,
//! which CI builds on its own, outside the workspace, as a plugin author would), so a
//! snippet cannot drift from what builds.

use std::path::{Path, PathBuf};

/// Lines as compared: trimmed, blank lines left out.
fn normalized(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Every ```rust block of a Markdown text.
fn rust_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.trim_start().starts_with("```rust") => current = Some(String::new()),
            Some(block) if line.trim_start().starts_with("```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    blocks
}

fn rust_sources(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if name != "target" && name != ".git" && name != "node_modules" {
                    pending.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

fn contains_run(haystack: &[String], needle: &[String]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

#[test]
fn every_rust_snippet_in_the_docs_is_compiled_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sources: Vec<(PathBuf, Vec<String>)> = rust_sources(root)
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path, normalized(&text))
        })
        .collect();
    let mut documents: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    documents.push(root.join("README.md"));
    let mut drifted = Vec::new();
    for document in documents {
        let text = std::fs::read_to_string(&document).unwrap();
        for block in rust_blocks(&text) {
            let lines = normalized(&block);
            if !sources
                .iter()
                .any(|(_, source)| contains_run(source, &lines))
            {
                drifted.push(format!(
                    "{}:\n{}",
                    document.strip_prefix(root).unwrap().display(),
                    block
                ));
            }
        }
    }
    assert!(
        drifted.is_empty(),
        "snippets that are not an excerpt of any source file:\n\n{}",
        drifted.join("\n")
    );
}

#[test]
fn the_snippet_check_sees_drift() {
    let source = normalized("fn a() {\n    let x = 1;\n\n    x\n}\n");
    assert!(contains_run(&source, &normalized("let x = 1;\nx")));
    assert!(!contains_run(&source, &normalized("let x = 2;")));
    let blocks = rust_blocks("text\n```rust\nlet x = 1;\n```\n```toml\n[a]\n```\n");
    assert_eq!(blocks, ["let x = 1;\n"]);
}

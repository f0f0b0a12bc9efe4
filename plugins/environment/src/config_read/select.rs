//! Keeping only the requested key paths of a layer, in the file's own key order, and
//! writing them back as TOML the way codex 0.169.0 does (`toml` 0.9, order preserved).

use std::collections::HashMap;

use super::layers::SourceLayer;
use super::wire::{Layer, LayerStack};
use exec_server_core::proto::path::to_file_uri;

/// The stack of `layers` reduced to `paths`: a layer with nothing selected is left out,
/// and the cloud insertion index counts the system layers that remain (cloud layers go
/// right above them).
pub(crate) fn stack(layers: Vec<SourceLayer>, paths: &[Vec<String>]) -> LayerStack {
    let mut stack = LayerStack::default();
    for layer in layers {
        let Some(selected) = select(&layer.table, paths) else {
            continue;
        };
        if layer.system {
            stack.cloud_insertion_index += 1;
        }
        stack.layers.push(Layer {
            source: layer.source,
            base_dir: to_file_uri(&layer.base_dir),
            toml: toml::to_string(&selected).unwrap_or_default(),
        });
    }
    stack
}

/// The parts of `table` that some path in `paths` names (a path names a key and its whole
/// value); `None` when nothing is named. As in codex, every table a path passes through is
/// kept, even when the path ends in a key it lacks (`[mcp_servers]` for
/// `mcp_servers.home` where only `mcp_servers.repo` exists); a path through a value that
/// is not a table keeps nothing.
pub(crate) fn select(table: &toml::Table, paths: &[Vec<String>]) -> Option<toml::Table> {
    let suffixes: Vec<&[String]> = paths.iter().map(Vec::as_slice).collect();
    select_in(table, &suffixes)
}

/// One level: the paths are grouped by their first key once, so a level costs its keys
/// plus its paths, not their product (a large layer and many paths would otherwise keep
/// a thread busy for minutes).
fn select_in(table: &toml::Table, paths: &[&[String]]) -> Option<toml::Table> {
    let mut by_key: HashMap<&str, Vec<&[String]>> = HashMap::new();
    for (first, rest) in paths.iter().filter_map(|path| path.split_first()) {
        by_key.entry(first.as_str()).or_default().push(rest);
    }
    let mut kept = toml::Table::new();
    for (key, value) in table {
        let Some(below) = by_key.get(key.as_str()) else {
            continue;
        };
        if below.iter().any(|rest| rest.is_empty()) {
            kept.insert(key.clone(), value.clone());
        } else if let Some(inner) = value.as_table() {
            let inner = select_in(inner, below).unwrap_or_default();
            kept.insert(key.clone(), toml::Value::Table(inner));
        }
    }
    (!kept.is_empty()).then_some(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(list: &[&[&str]]) -> Vec<Vec<String>> {
        list.iter()
            .map(|p| p.iter().map(|s| s.to_string()).collect())
            .collect()
    }

    fn selected(text: &str, list: &[&[&str]]) -> Option<String> {
        let table: toml::Table = toml::from_str(text).unwrap();
        select(&table, &paths(list)).map(|t| toml::to_string(&t).unwrap())
    }

    /// The outputs codex 0.169.0 gave for the same files and paths.
    #[test]
    fn output_matches_codex() {
        let home = "model = \"x\"\n# comment\n[mcp_servers.home]\ncommand = \"h\"   # c\nargs = [\"a\", 'b']\n\n[other]\nk = 1\n";
        assert_eq!(
            selected(home, &[&["mcp_servers"], &["model"]]).unwrap(),
            "model = \"x\"\n\n[mcp_servers.home]\ncommand = \"h\"\nargs = [\"a\", \"b\"]\n"
        );
        let system = "zeta = 1\nalpha = 2\n[nested]\nb = 1\na = { y = 1, x = [1, {k = 2}] }\n";
        assert_eq!(
            selected(
                system,
                &[
                    &["zeta"],
                    &["alpha"],
                    &["nested", "a"],
                    &["nested", "a", "y"],
                    &["zeta", "q"]
                ]
            )
            .unwrap(),
            "zeta = 1\nalpha = 2\n\n[nested.a]\ny = 1\nx = [1, { k = 2 }]\n"
        );
        assert_eq!(
            selected(system, &[&["nested"]]).unwrap(),
            "[nested]\nb = 1\n\n[nested.a]\ny = 1\nx = [1, { k = 2 }]\n"
        );
        assert_eq!(
            selected(system, &[&["nested", "a", "x"]]).unwrap(),
            "[nested.a]\nx = [1, { k = 2 }]\n"
        );
        assert_eq!(
            selected(
                "[mcp_servers]\ndeep = { command = \"d\" }\n",
                &[&["mcp_servers"]]
            )
            .unwrap(),
            "[mcp_servers.deep]\ncommand = \"d\"\n"
        );
        assert_eq!(
            selected(system, &[&["missing"], &[""], &["zeta", "q"]]),
            None
        );
        assert_eq!(
            selected(
                "[mcp_servers.repo]\ncommand = \"r\"\n",
                &[&["mcp_servers", "home"]]
            )
            .unwrap(),
            "[mcp_servers]\n"
        );
    }
}

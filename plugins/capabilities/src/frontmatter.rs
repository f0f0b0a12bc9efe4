//! The YAML front matter of a `SKILL.md` (`---` … `---` at the top), read for the few
//! keys discovery reports: `name`, `description` and `metadata.short-description`.
//!
//! Only what skill files use is understood: top-level `key: value` pairs whose values are
//! plain, single- or double-quoted scalars or block scalars (`|`, `>`, with `-`/`+`
//! chomping), and one level of nested mapping. Anything else is skipped, never an error.

use std::collections::BTreeMap;

/// The keys of one front matter, nested mappings flattened as `parent.child`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FrontMatter {
    values: BTreeMap<String, String>,
}

impl FrontMatter {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }
}

/// The front matter of `text`, or `None` when it does not open with a `---` line closed
/// by another.
pub fn parse(text: &str) -> Option<FrontMatter> {
    let mut lines = text.lines();
    if lines.next()?.trim_end() != "---" {
        return None;
    }
    let mut block: Vec<&str> = Vec::new();
    let mut closed = false;
    for line in lines {
        if line.trim_end() == "---" {
            closed = true;
            break;
        }
        block.push(line);
    }
    if !closed {
        return None;
    }
    let mut values = BTreeMap::new();
    read_mapping(&block, 0, "", &mut values);
    Some(FrontMatter { values })
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// Reads the mapping whose keys sit at `indent` spaces, from the start of `lines` to the
/// first line indented less.
fn read_mapping(lines: &[&str], indent: usize, prefix: &str, out: &mut BTreeMap<String, String>) {
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let content = line.trim();
        if content.is_empty() || content.starts_with('#') {
            i += 1;
            continue;
        }
        let here = indent_of(line);
        if here < indent {
            return;
        }
        if here > indent {
            i += 1;
            continue;
        }
        let Some((key, rest)) = content.split_once(':') else {
            i += 1;
            continue;
        };
        let key = unquote(key.trim());
        let rest = rest.trim();
        let full_key = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        // The lines that belong to this key: everything indented deeper.
        let mut end = i + 1;
        while end < lines.len() && (lines[end].trim().is_empty() || indent_of(lines[end]) > indent)
        {
            end += 1;
        }
        let body = &lines[i + 1..end];
        if rest.is_empty() {
            if let Some(child) = body.iter().find(|l| !l.trim().is_empty()) {
                read_mapping(body, indent_of(child), &full_key, out);
            }
        } else if let Some(style) = rest.strip_prefix(['|', '>']) {
            let folded = rest.starts_with('>');
            out.insert(full_key, block_scalar(body, folded, style));
        } else {
            out.insert(full_key, scalar(rest, body));
        }
        i = end;
    }
}

/// A flow scalar, continued on more-indented lines (plain multi-line scalars fold).
fn scalar(first: &str, continuation: &[&str]) -> String {
    if first.starts_with('"') || first.starts_with('\'') {
        return unquote(first);
    }
    let without_comment = first.split(" #").next().unwrap_or(first).trim();
    let mut text = without_comment.to_owned();
    for line in continuation {
        let line = line.trim();
        if !line.is_empty() {
            text.push(' ');
            text.push_str(line);
        }
    }
    text
}

fn unquote(text: &str) -> String {
    if let Some(inner) = text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) {
        return inner.replace("''", "'");
    }
    if let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => {}
            }
        }
        return out;
    }
    text.to_owned()
}

/// `|` (literal) or `>` (folded) with its chomping indicator (`-` strip, `+` keep).
fn block_scalar(body: &[&str], folded: bool, style: &str) -> String {
    let indent = body
        .iter()
        .find(|l| !l.trim().is_empty())
        .map_or(0, |l| indent_of(l));
    // Strip at most the block's indentation, and only spaces: a later line indented less
    // keeps its text (and no slice ever cuts a character).
    let lines: Vec<&str> = body
        .iter()
        .map(|l| &l[indent.min(indent_of(l))..])
        .collect();
    let mut text = if folded {
        let mut out = String::new();
        for (n, line) in lines.iter().enumerate() {
            if n > 0 {
                out.push(if line.is_empty() || lines[n - 1].is_empty() {
                    '\n'
                } else {
                    ' '
                });
            }
            out.push_str(line);
        }
        out
    } else {
        lines.join("\n")
    };
    let trimmed_len = text.trim_end_matches('\n').len();
    text.truncate(trimmed_len);
    if style.contains('-') {
        text
    } else {
        text.push('\n');
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skill_front_matter() {
        let text = "---\nname: 'dd'\ndescription: >-\n  folded\n  text\nmetadata:\n  short-description: \"short \\\"q\\\"\"\n  other: x # comment\n---\nbody\n";
        let fm = parse(text).unwrap();
        assert_eq!(fm.get("name"), Some("dd"));
        assert_eq!(fm.get("description"), Some("folded text"));
        assert_eq!(fm.get("metadata.short-description"), Some("short \"q\""));
        assert_eq!(fm.get("metadata.other"), Some("x"));
        let literal = parse("---\ndescription: |\n  a\n  b\nname: n\n---\n").unwrap();
        assert_eq!(literal.get("description"), Some("a\nb\n"));
        assert_eq!(literal.get("name"), Some("n"));
        assert_eq!(parse("no front matter\n"), None);
        let uneven = parse("---\ndescription: |\n    four\n  é two\n---\n").unwrap();
        assert_eq!(uneven.get("description"), Some("four\né two\n"));
        assert_eq!(parse("---\nname: unclosed\n"), None);
    }
}

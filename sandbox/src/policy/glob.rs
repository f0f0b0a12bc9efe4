//! Glob patterns of `deny` entries (SANDBOX.md §2.4.4): parsing and matching against
//! resolved absolute paths.
//!
//! `*` and `?` match within one path component, a component that is exactly `**` matches
//! any number of components (including none), `[…]` is a character class (`!` or `^`
//! negates, `a-z` ranges, a `]` right after the opening bracket is literal); a `.`
//! component is nothing and a `..` component is refused. There is no brace expansion and
//! no backslash escape; a metacharacter is written literally as a one-character class
//! (`[*]`). A pattern denies every path it matches **and everything beneath** such a path,
//! so matching accepts as soon as the pattern is used up.
//!
//! Hand-written rather than a crate: the whole grammar is the few lines below, and the
//! "or beneath" rule would need extra patterns with `globset`.

use std::cmp::Ordering;
use std::fmt;
use std::path::{Component, Path, PathBuf};

/// An absolute glob pattern, compiled once: a literal directory prefix, kept as the exact
/// bytes of a host path (non-UTF-8 names included), and the segments that follow it.
#[derive(Clone)]
pub struct GlobPattern {
    source: String,
    prefix: PathBuf,
    /// The segments after the prefix as text, `/`-separated (empty: none).
    rest: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone)]
enum Segment {
    /// `**`: any number of whole components.
    AnyDepth,
    /// One component matched by wildcard tokens.
    Component(Vec<Token>),
}

#[derive(Debug, Clone)]
enum Token {
    Literal(char),
    /// `?`
    AnyChar,
    /// `*`
    AnyRun,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// Characters that make a component a pattern rather than a literal name.
pub(crate) fn has_meta(component: &str) -> bool {
    component.contains(['*', '?', '['])
}

/// Writes a literal name so that it matches only itself inside a pattern.
pub(crate) fn escape(literal: &str) -> String {
    let mut out = String::with_capacity(literal.len());
    for c in literal.chars() {
        match c {
            '*' | '?' | '[' => {
                out.push('[');
                out.push(c);
                out.push(']');
            }
            _ => out.push(c),
        }
    }
    out
}

impl GlobPattern {
    /// Compiles an absolute pattern (starting with `/`); the error text says what is wrong.
    pub fn new(source: &str) -> Result<Self, String> {
        if !source.starts_with('/') {
            return Err(format!("glob pattern `{source}` is not absolute"));
        }
        // Patterns match resolved paths, which never hold `.` or `..`: a `.` means nothing,
        // and a `..` would make the pattern match nothing at all — a deny entry that denies
        // nothing — so it is refused (a literal prefix has had its `..` resolved already).
        let components: Vec<&str> = source
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        let literal = components
            .iter()
            .take_while(|c| !has_meta(c) && **c != "..")
            .count();
        let prefix: PathBuf = std::iter::once("/")
            .chain(components[..literal].iter().copied())
            .collect();
        let mut pattern = Self::with_prefix(prefix, &components[literal..].join("/"))?;
        pattern.source = source.to_owned();
        Ok(pattern)
    }

    /// A pattern whose literal prefix is the host path `prefix`, exactly (absolute,
    /// resolved), followed by `rest` (relative, `/`-separated; may be empty). Names that
    /// are not UTF-8 can only be in the prefix; below it, names are compared lossily.
    pub fn with_prefix(prefix: PathBuf, rest: &str) -> Result<Self, String> {
        // `.` means nothing and empty names are no names: the rest is kept without them,
        // so a pattern reads back the same from its text.
        let rest = rest
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect::<Vec<_>>()
            .join("/");
        let rest = rest.as_str();
        let display = escape(&prefix.to_string_lossy());
        let source = match rest.is_empty() {
            true => display,
            false => format!("{}/{rest}", display.trim_end_matches('/')),
        };
        if !prefix.is_absolute() {
            return Err(format!("glob pattern `{source}` is not absolute"));
        }
        let segments = rest
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(|c| {
                if c == ".." {
                    Err(format!(
                        "invalid glob pattern `{source}`: `..` cannot follow a wildcard"
                    ))
                } else if c == "**" {
                    Ok(Segment::AnyDepth)
                } else {
                    parse_component(c)
                        .map(Segment::Component)
                        .map_err(|reason| format!("invalid glob pattern `{source}`: {reason}"))
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            source,
            prefix,
            rest: rest.to_owned(),
            segments,
        })
    }

    /// The pattern as text (the prefix lossy where it is not UTF-8), for messages.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The literal directory the pattern starts at, exactly.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The segments after [`GlobPattern::prefix`], `/`-separated (empty: none).
    pub fn rest(&self) -> &str {
        &self.rest
    }

    /// True when the pattern matches `path` or one of its ancestors. `path` must be
    /// absolute and resolved (no `.`/`..`). The prefix is compared byte for byte; names
    /// below it that are not UTF-8 are compared lossily (a wildcard matches them; a
    /// literal U+FFFD matches any invalid sequence: a deny pattern then denies more).
    pub fn matches_or_beneath(&self, path: &Path) -> bool {
        let Ok(below) = path.strip_prefix(&self.prefix) else {
            return false;
        };
        let names: Vec<Vec<char>> = below
            .components()
            .filter_map(|c| match c {
                Component::Normal(name) => Some(name.to_string_lossy().chars().collect()),
                _ => None,
            })
            .collect();
        // reachable[i]: the segments seen so far can consume exactly the first i names.
        // Each segment costs one pass over the names (`**` reaches everything from the
        // first reachable index on): a client's long pattern against a deep path costs
        // their product, not its square.
        let mut reachable = vec![false; names.len() + 1];
        reachable[0] = true;
        for segment in &self.segments {
            let mut next = vec![false; names.len() + 1];
            match segment {
                Segment::AnyDepth => {
                    if let Some(first) = reachable.iter().position(|&r| r) {
                        next[first..].iter_mut().for_each(|r| *r = true);
                    }
                }
                Segment::Component(tokens) => {
                    for i in (0..names.len()).filter(|&i| reachable[i]) {
                        if match_component(tokens, &names[i]) {
                            next[i + 1] = true;
                        }
                    }
                }
            }
            if !next.contains(&true) {
                return false;
            }
            reachable = next;
        }
        // Anything left over is beneath the match.
        true
    }
}

fn parse_component(component: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = component.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => {
                if !matches!(tokens.last(), Some(Token::AnyRun)) {
                    tokens.push(Token::AnyRun);
                }
                i += 1;
            }
            '?' => {
                tokens.push(Token::AnyChar);
                i += 1;
            }
            '[' => {
                let (token, next) = parse_class(&chars, i)?;
                tokens.push(token);
                i = next;
            }
            c => {
                tokens.push(Token::Literal(c));
                i += 1;
            }
        }
    }
    Ok(tokens)
}

/// Parses the class starting at `chars[open] == '['`; returns it and the index after `]`.
fn parse_class(chars: &[char], open: usize) -> Result<(Token, usize), String> {
    let mut i = open + 1;
    let negated = matches!(chars.get(i), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let first = i;
    let mut ranges = Vec::new();
    loop {
        let Some(&c) = chars.get(i) else {
            return Err("unclosed character class".to_owned());
        };
        if c == ']' && i > first {
            return Ok((Token::Class { negated, ranges }, i + 1));
        }
        match (chars.get(i + 1), chars.get(i + 2)) {
            (Some('-'), Some(&end)) if end != ']' => {
                if end < c {
                    return Err(format!("invalid character range `{c}-{end}`"));
                }
                ranges.push((c, end));
                i += 3;
            }
            _ => {
                ranges.push((c, c));
                i += 1;
            }
        }
    }
}

fn token_matches_char(token: &Token, c: char) -> bool {
    match token {
        Token::Literal(l) => *l == c,
        Token::AnyChar => true,
        Token::AnyRun => unreachable!("runs are handled by the matcher"),
        Token::Class { negated, ranges } => {
            ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
        }
    }
}

/// Wildcard matching of one name: linear backtracking to the most recent `*`.
fn match_component(tokens: &[Token], name: &[char]) -> bool {
    let (mut t, mut n) = (0, 0);
    let mut resume: Option<(usize, usize)> = None;
    while n < name.len() {
        match tokens.get(t) {
            Some(Token::AnyRun) => {
                resume = Some((t, n));
                t += 1;
            }
            Some(token) if token_matches_char(token, name[n]) => {
                t += 1;
                n += 1;
            }
            _ => match resume {
                Some((star, consumed)) => {
                    t = star + 1;
                    n = consumed + 1;
                    resume = Some((star, consumed + 1));
                }
                None => return false,
            },
        }
    }
    tokens[t..]
        .iter()
        .all(|token| matches!(token, Token::AnyRun))
}

impl fmt::Debug for GlobPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("GlobPattern").field(&self.source).finish()
    }
}

impl fmt::Display for GlobPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// Two patterns are equal when they match alike: the same prefix bytes and the same rest
/// (their texts can agree where a prefix is not UTF-8).
impl PartialEq for GlobPattern {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for GlobPattern {}

impl PartialOrd for GlobPattern {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for GlobPattern {
    fn cmp(&self, other: &Self) -> Ordering {
        (&self.source, &self.prefix, &self.rest).cmp(&(&other.source, &other.prefix, &other.rest))
    }
}

#[cfg(test)]
#[path = "glob_tests.rs"]
mod tests;

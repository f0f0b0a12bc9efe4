//! The search itself, on a blocking thread: `ignore` walks the tree (gitignore rules,
//! include/exclude overrides), `grep-searcher` reads each file and `grep-regex` finds the
//! matches, which go out one by one through a bounded channel. A full channel blocks the
//! walk, so a slow client slows the search down and memory stays bounded.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use exec_server_core::proto::path::to_file_uri;
use exec_server_core::proto::RpcError;
use grep_matcher::Matcher;
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkMatch};
use ignore::overrides::{Override, OverrideBuilder};
use ignore::{DirEntry, WalkBuilder};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::line::{without_terminator, MatchedLine};
use crate::wire::{empty_pattern, invalid_glob, invalid_globs, invalid_pattern};

/// One search with every parameter validated and every default applied.
#[derive(Debug)]
pub struct SearchJob {
    pub root: PathBuf,
    pub matcher: RegexMatcher,
    pub overrides: Override,
    pub respect_gitignore: bool,
    pub max_results: u64,
    pub max_line_bytes: usize,
    pub max_file_bytes: u64,
}

/// A match on its way to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundMatch {
    /// The file's `file:` URI, shared by its matches.
    pub path: Arc<str>,
    pub line_number: u64,
    /// Shared by the matches of one line.
    pub line: Arc<str>,
    pub start: usize,
    pub end: usize,
    pub line_truncated: bool,
}

/// How the walk ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SearchEnd {
    /// Stopped at `max_results` with more matches left.
    pub truncated: bool,
    /// Stopped early because the stop token was cancelled.
    pub cancelled: bool,
    /// The root could not be walked.
    pub error: Option<String>,
}

/// Largest compiled form of a pattern, in bytes: the `regex` crate's default. Compiling
/// costs time in proportion (`grep-regex` allows 100 MiB, some seconds of a search thread
/// for one `\w{1000}`-style pattern); larger patterns are refused as invalid.
pub const MAX_COMPILED_PATTERN_BYTES: usize = 10 << 20;

/// Most memory the lazy DFA of one search may cache, in bytes (`grep-regex` allows
/// 1000 MiB per matcher); past it the search goes on, slower.
pub const MAX_PATTERN_CACHE_BYTES: usize = 10 << 20;

/// The matcher for `pattern`: a literal unless `regex`. Matches never span lines.
pub fn build_matcher(
    pattern: &str,
    regex: bool,
    case_insensitive: bool,
) -> Result<RegexMatcher, RpcError> {
    if pattern.is_empty() {
        return Err(empty_pattern());
    }
    RegexMatcherBuilder::new()
        .case_insensitive(case_insensitive)
        .fixed_strings(!regex)
        .line_terminator(Some(b'\n'))
        .size_limit(MAX_COMPILED_PATTERN_BYTES)
        .dfa_size_limit(MAX_PATTERN_CACHE_BYTES)
        .build(pattern)
        .map_err(invalid_pattern)
}

/// Include and exclude globs as `ignore` overrides, matched like `.gitignore` lines against
/// paths relative to `root`. With any include glob, only files matching one are searched;
/// an exclude glob wins over an include glob.
///
/// A `.gitignore` line that is blank or starts with `#` means nothing, so such a glob would
/// silently widen the search: a blank glob is refused, and a leading `#` is escaped to name
/// files that start with `#`.
pub fn build_overrides(
    root: &Path,
    include: &[String],
    exclude: &[String],
) -> Result<Override, RpcError> {
    let mut builder = OverrideBuilder::new(root);
    for (member, globs, prefix) in [("include", include, ""), ("exclude", exclude, "!")] {
        for glob in globs {
            if glob.starts_with('!') {
                return Err(invalid_glob(member, glob, "globs must not start with `!`"));
            }
            if glob.trim_end().is_empty() {
                return Err(invalid_glob(member, glob, "globs must not be blank"));
            }
            let escape = if glob.starts_with('#') { "\\" } else { "" };
            builder
                .add(&format!("{prefix}{escape}{glob}"))
                .map_err(|e| invalid_glob(member, glob, e))?;
        }
    }
    builder.build().map_err(invalid_globs)
}

impl SearchJob {
    /// Walks and searches until the tree is done, `max_results` is reached, `stop` is
    /// cancelled or `out` is closed. Files that cannot be read are skipped.
    pub fn run(self, stop: &CancellationToken, out: &mpsc::Sender<FoundMatch>) -> SearchEnd {
        let mut searcher = SearcherBuilder::new()
            .line_number(true)
            // A NUL byte marks a binary file: its search stops there, before anything is
            // reported when the NUL is in the first buffer (64 KiB), as for nearly all.
            .binary_detection(BinaryDetection::quit(0))
            .build();
        let mut sink = MatchSink {
            matcher: &self.matcher,
            out,
            stop,
            path: Arc::from(""),
            remaining: self.max_results,
            max_line_bytes: self.max_line_bytes,
            truncated: false,
            cancelled: false,
            closed: false,
        };
        for entry in self.walker() {
            if sink.should_stop() {
                break;
            }
            let entry = match entry {
                Ok(entry) => entry,
                Err(error) if error.depth() == Some(0) => {
                    return SearchEnd {
                        error: Some(error.to_string()),
                        ..SearchEnd::default()
                    }
                }
                Err(_) => continue,
            };
            let Some(file) = self.open_searchable(&entry) else {
                continue;
            };
            sink.path = Arc::from(to_file_uri(entry.path()));
            // A file that fails part-way (an I/O error) keeps what it already reported.
            let _ = searcher.search_file(&self.matcher, &file, &mut sink);
        }
        SearchEnd {
            truncated: sink.truncated,
            cancelled: sink.cancelled,
            error: None,
        }
    }

    fn walker(&self) -> ignore::Walk {
        let respect = self.respect_gitignore;
        let mut builder = WalkBuilder::new(&self.root);
        builder
            .standard_filters(false)
            .git_ignore(respect)
            .git_exclude(respect)
            .parents(respect)
            .require_git(false)
            .follow_links(false)
            .overrides(self.overrides.clone())
            .sort_by_file_name(|a, b| a.cmp(b))
            // A repository's own store is never searched, but it can be the root.
            .filter_entry(|entry| entry.depth() == 0 || entry.file_name() != ".git");
        builder.build()
    }

    /// Opens a regular file no larger than `max_file_bytes`; anything else is skipped.
    /// `O_NONBLOCK` keeps a FIFO that replaced the file since the walk saw it from
    /// blocking the open; the type and size checks then use the opened file.
    fn open_searchable(&self, entry: &DirEntry) -> Option<File> {
        if !entry.file_type().is_some_and(|t| t.is_file()) {
            return None;
        }
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(entry.path())
            .ok()?;
        let metadata = file.metadata().ok()?;
        (metadata.is_file() && metadata.len() <= self.max_file_bytes).then_some(file)
    }
}

/// Receives matching lines from `grep-searcher` and sends one [`FoundMatch`] per match.
struct MatchSink<'a> {
    matcher: &'a RegexMatcher,
    out: &'a mpsc::Sender<FoundMatch>,
    stop: &'a CancellationToken,
    /// The `file:` URI of the file being searched.
    path: Arc<str>,
    /// Matches that may still be sent.
    remaining: u64,
    max_line_bytes: usize,
    truncated: bool,
    /// The stop token was seen cancelled.
    cancelled: bool,
    /// The receiving side is gone: nobody will read further matches.
    closed: bool,
}

impl MatchSink<'_> {
    fn should_stop(&mut self) -> bool {
        if self.stop.is_cancelled() {
            self.cancelled = true;
        }
        self.truncated || self.closed || self.cancelled
    }

    /// Sends the matches of one line; `false` once the search must stop.
    fn line(&mut self, raw: &[u8], line_number: u64) -> io::Result<bool> {
        let raw = without_terminator(raw);
        // One more than may be sent is enough to know whether the results are truncated.
        let wanted = usize::try_from(self.remaining.saturating_add(1)).unwrap_or(usize::MAX);
        let mut ranges = Vec::new();
        self.matcher
            .find_iter(raw, |m| {
                ranges.push(m);
                ranges.len() < wanted
            })
            .map_err(io::Error::other)?;
        if ranges.is_empty() {
            return Ok(true);
        }
        let line = MatchedLine::new(raw, self.max_line_bytes);
        for range in ranges {
            if self.should_stop() {
                return Ok(false);
            }
            if self.remaining == 0 {
                self.truncated = true;
                return Ok(false);
            }
            let found = FoundMatch {
                path: Arc::clone(&self.path),
                line_number,
                line: Arc::clone(&line.text),
                start: line.start(range.start()),
                end: line.end(range.end()),
                line_truncated: line.truncated,
            };
            if self.out.blocking_send(found).is_err() {
                self.closed = true;
                return Ok(false);
            }
            self.remaining -= 1;
        }
        Ok(true)
    }
}

impl Sink for MatchSink<'_> {
    type Error = io::Error;

    fn matched(&mut self, _searcher: &Searcher, found: &SinkMatch<'_>) -> io::Result<bool> {
        let first = found.line_number().unwrap_or(1);
        for (index, raw) in (0..).zip(found.lines()) {
            if !self.line(raw, first + index)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;

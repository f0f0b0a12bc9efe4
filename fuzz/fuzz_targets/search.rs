#![no_main]
//! `search`: client-supplied patterns and globs through compilation and matching, bounded
//! in time and memory: `build_matcher` (regex or literal, either case), `build_overrides`
//! (include/exclude globs), a whole `SearchJob::run` over a small tree in a fresh temporary
//! directory, and the deny-glob matcher of sandbox policies (`GlobPattern`).
//!
//! Input: NUL-separated fields `flags \0 pattern \0 include \0 exclude \0 text`; globs are
//! one per line, `flags` is one byte (the rest of the first field is ignored), `text` is
//! the content of the files searched (it may hold NULs: binary files).
//!
//! Invariants:
//! * compiling and matching never panic and stay within a time budget (and the run's
//!   `-rss_limit_mb`); an empty pattern and `!`-prefixed globs are refused; a literal
//!   without a line break always compiles;
//! * the matcher's matches of a line are ordered, disjoint and inside the line; a literal's
//!   matches are exactly its non-overlapping occurrences (case-sensitive: bytes equal;
//!   ASCII case-insensitive: equal but for ASCII case);
//! * a search reports at most `maxResults` matches (`truncated` only with exactly that
//!   many), each in a regular file below the root, never in `.git`, never in an excluded
//!   or (with include globs) not included file, never in a `.gitignore`d file when that is
//!   respected; lines are cut to `max_line_bytes` on a character boundary; offsets are
//!   ordered; and an untruncated search of NUL-free text reports per file exactly the
//!   matcher's matches of its lines;
//! * a deny glob matches a path exactly when it matches one of its ancestors or the path
//!   itself, and `**` between names is the same as matching any number of names.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use exec_server_proto::path::to_file_uri;
use exec_server_sandbox::policy::GlobPattern;
use exec_server_search::fuzzing::{
    build_matcher, build_overrides, CancellationToken, FoundMatch, Matcher, SearchJob,
};
use libfuzzer_sys::fuzz_target;

/// What one compilation or one match may take (ASan makes everything slower), in CPU time
/// of the thread: wall time would also count what other processes on a busy machine take
/// (a run beside another fuzzer reported a 0.8 s compilation as over budget).
const BUDGET: Duration = Duration::from_secs(2);

fuzz_target!(|data: &[u8]| {
    let mut fields = data.splitn(5, |&b| b == 0);
    let flags = fields.next().and_then(|f| f.first().copied()).unwrap_or(0);
    let pattern = String::from_utf8_lossy(fields.next().unwrap_or_default()).into_owned();
    let lines = |field: Option<&[u8]>| -> Vec<String> {
        String::from_utf8_lossy(field.unwrap_or_default())
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let include = lines(fields.next());
    let exclude = lines(fields.next());
    let text = fields.next().unwrap_or_default();

    let options = Options {
        regex: flags & 1 != 0,
        case_insensitive: flags & 2 != 0,
        respect_gitignore: flags & 4 != 0,
        max_results: [1, 3, 1_000, 1][usize::from(flags >> 3 & 3)],
        max_line_bytes: if flags & 32 != 0 { 7 } else { 4_096 },
        gitignore: flags & 64 != 0,
    };
    check_globs(&include, &exclude, text);
    check_search(&pattern, &include, &exclude, text, &options);
});

struct Options {
    regex: bool,
    case_insensitive: bool,
    respect_gitignore: bool,
    max_results: u64,
    max_line_bytes: usize,
    /// The tree has a `.gitignore` leaving out `*.log`.
    gitignore: bool,
}

fn timed<T>(what: &str, input: &dyn std::fmt::Debug, f: impl FnOnce() -> T) -> T {
    let start = thread_cpu_time();
    let result = f();
    let spent = thread_cpu_time().saturating_sub(start);
    assert!(spent < BUDGET, "{what} took {spent:?} for {input:?}");
    result
}

/// CPU time this thread has used.
fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

fn check_search(pattern: &str, include: &[String], exclude: &[String], text: &[u8], o: &Options) {
    let matcher = timed("build_matcher", &pattern, || {
        build_matcher(pattern, o.regex, o.case_insensitive)
    });
    if pattern.is_empty() {
        assert!(matcher.is_err());
    }
    if !o.regex && !pattern.is_empty() && !pattern.contains(['\n', '\r']) {
        assert!(matcher.is_ok(), "literal {pattern:?}: {:?}", matcher.err());
    }
    let Ok(matcher) = matcher else {
        return;
    };

    // The matcher on each line of the text.
    let file_lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    let mut expected_per_line = Vec::new();
    for line in &file_lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let mut found = Vec::new();
        timed("find_iter", &(pattern, line.len()), || {
            matcher
                .find_iter(line, |m| {
                    found.push((m.start(), m.end()));
                    true
                })
                .expect("find_iter")
        });
        let mut previous_end = 0;
        for (i, &(start, end)) in found.iter().enumerate() {
            assert!(start <= end && end <= line.len(), "{pattern:?} {found:?}");
            assert!(i == 0 || start >= previous_end, "{pattern:?} {found:?}");
            previous_end = end;
        }
        if !o.regex && !pattern.contains(['\n', '\r']) {
            let needle = pattern.as_bytes();
            let ascii = pattern.is_ascii() && line.is_ascii();
            if !o.case_insensitive || ascii {
                let same = |a: &[u8]| {
                    if o.case_insensitive {
                        a.eq_ignore_ascii_case(needle)
                    } else {
                        a == needle
                    }
                };
                let mut occurrences = Vec::new();
                let mut at = 0;
                while at + needle.len() <= line.len() {
                    if same(&line[at..at + needle.len()]) {
                        occurrences.push((at, at + needle.len()));
                        at += needle.len();
                    } else {
                        at += 1;
                    }
                }
                assert_eq!(found, occurrences, "literal {pattern:?} in {line:?}");
            }
        }
        expected_per_line.push(found.len());
    }

    // A whole search over a small tree.
    let dir = tempfile::tempdir().expect("temp dir");
    let root = std::fs::canonicalize(dir.path()).expect("canonical temp dir");
    let names = [
        "f.txt",
        "sub/g.md",
        "sub/deep/h.rs",
        "notes.log",
        ".git/config",
        "big.txt",
    ];
    std::fs::create_dir_all(root.join("sub/deep")).expect("mkdir");
    std::fs::create_dir(root.join(".git")).expect("mkdir");
    for name in names {
        let content: &[u8] = if name == "big.txt" { b"" } else { text };
        std::fs::write(root.join(name), content).expect("write");
    }
    // Larger than `max_file_bytes` below: never searched.
    std::fs::write(
        root.join("big.txt"),
        [text, b"\n".as_slice()].concat().repeat(2),
    )
    .expect("write");
    if o.gitignore {
        std::fs::write(root.join(".gitignore"), "*.log\n").expect("write");
    }
    let overrides = timed("build_overrides", &(include, exclude), || {
        build_overrides(&root, include, exclude)
    });
    if include.iter().chain(exclude).any(|g| g.starts_with('!')) {
        assert!(overrides.is_err());
    }
    let Ok(overrides) = overrides else {
        return;
    };
    let max_file_bytes = text.len() as u64 + 1;
    let job = SearchJob {
        root: root.clone(),
        matcher,
        overrides: overrides.clone(),
        respect_gitignore: o.respect_gitignore,
        max_results: o.max_results,
        max_line_bytes: o.max_line_bytes,
        max_file_bytes,
    };
    let capacity = usize::try_from(o.max_results).expect("small") + 1;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<FoundMatch>(capacity);
    let end = timed("search", &(pattern, include, exclude), || {
        job.run(&CancellationToken::new(), &tx)
    });
    drop(tx);
    let mut found = Vec::new();
    while let Ok(m) = rx.try_recv() {
        found.push(m);
    }
    assert_eq!(end.error, None);
    assert!(!end.cancelled);
    assert!(found.len() as u64 <= o.max_results);
    if end.truncated {
        assert_eq!(found.len() as u64, o.max_results);
    }

    let prefix = format!("{}/", to_file_uri(&root));
    let mut per_file: BTreeMap<&str, Vec<&FoundMatch>> = BTreeMap::new();
    for m in &found {
        let name = m
            .path
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("{} outside the root", m.path));
        assert!(
            names.contains(&name) || (o.gitignore && name == ".gitignore"),
            "{name} is not a searched file"
        );
        assert!(!name.starts_with(".git/"), "{name} is in .git");
        assert_ne!(name, "big.txt", "a file over max_file_bytes was searched");
        if o.gitignore && o.respect_gitignore {
            assert!(!name.ends_with(".log"), "{name} is .gitignored");
        }
        let path = PathBuf::from(name);
        let verdict = overrides.matched(&path, false);
        assert!(!verdict.is_ignore(), "{name} is excluded");
        if !include.is_empty() {
            assert!(verdict.is_whitelist(), "{name} is not included");
        }
        assert!(m.line_number >= 1);
        assert!(m.start <= m.end, "{m:?}");
        assert!(m.line.len() <= o.max_line_bytes, "{m:?}");
        if !m.line_truncated {
            assert!(m.end <= m.line.len(), "{m:?}");
            assert!(m.line.is_char_boundary(m.start) && m.line.is_char_boundary(m.end));
        }
        per_file.entry(name).or_default().push(m);
    }
    for (name, matches) in &per_file {
        let places: Vec<(u64, usize)> = matches.iter().map(|m| (m.line_number, m.start)).collect();
        assert!(
            places.windows(2).all(|w| w[0] <= w[1]),
            "{name}: {places:?}"
        );
        if !end.truncated && !text.contains(&0) && *name != ".gitignore" {
            let total: usize = expected_per_line.iter().sum();
            assert_eq!(matches.len(), total, "{name}: matches of {pattern:?}");
        }
    }
}

/// Include and exclude globs as deny globs of a policy, matched against the text as a path.
fn check_globs(include: &[String], exclude: &[String], text: &[u8]) {
    let path_text = String::from_utf8_lossy(text.split(|&b| b == b'\n').next().unwrap_or(b""));
    let path = PathBuf::from(format!("/{}", path_text.trim_start_matches('/')));
    for glob in include.iter().chain(exclude) {
        let source = format!("/{}", glob.trim_start_matches('/'));
        let Ok(pattern) = timed("GlobPattern::new", &source, || GlobPattern::new(&source)) else {
            continue;
        };
        let matched = timed("matches_or_beneath", &(&source, &path), || {
            pattern.matches_or_beneath(&path)
        });
        // A match of an ancestor is a match of the path.
        let mut ancestor = path.as_path();
        let mut any_ancestor = false;
        while let Some(parent) = ancestor.parent() {
            ancestor = parent;
            if timed("matches_or_beneath", &(&source, ancestor), || {
                pattern.matches_or_beneath(ancestor)
            }) {
                any_ancestor = true;
                assert!(matched, "{source} matches {ancestor:?} but not {path:?}");
                break;
            }
        }
        // `**` between names: the pattern with `/**/` in place of a `/` matches at least
        // what the pattern matches.
        if matched && !any_ancestor {
            if let Some(at) = source[1..].find('/').map(|i| i + 1) {
                let widened = format!("{}/**{}", &source[..at], &source[at..]);
                if let Ok(wide) = GlobPattern::new(&widened) {
                    assert!(
                        wide.matches_or_beneath(&path),
                        "{widened} misses {path:?}, which {source} matches"
                    );
                }
            }
        }
    }
}

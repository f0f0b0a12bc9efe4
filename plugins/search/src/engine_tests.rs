use std::fs;
use std::os::unix::ffi::OsStrExt;

use tempfile::TempDir;

use super::*;

/// Params of one test search, with the defaults of `search/start`.
struct Query<'a> {
    pattern: &'a str,
    regex: bool,
    case_insensitive: bool,
    include: &'a [&'a str],
    exclude: &'a [&'a str],
    respect_gitignore: bool,
    max_results: u64,
    max_line_bytes: usize,
    max_file_bytes: u64,
}

fn query(pattern: &str) -> Query<'_> {
    Query {
        pattern,
        regex: false,
        case_insensitive: false,
        include: &[],
        exclude: &[],
        respect_gitignore: true,
        max_results: 1_000,
        max_line_bytes: 4_096,
        max_file_bytes: 1 << 20,
    }
}

fn job(root: &Path, q: &Query<'_>) -> SearchJob {
    let strings = |globs: &[&str]| globs.iter().map(|g| (*g).to_owned()).collect::<Vec<_>>();
    SearchJob {
        root: root.to_owned(),
        matcher: build_matcher(q.pattern, q.regex, q.case_insensitive).unwrap(),
        overrides: build_overrides(root, &strings(q.include), &strings(q.exclude)).unwrap(),
        respect_gitignore: q.respect_gitignore,
        max_results: q.max_results,
        max_line_bytes: q.max_line_bytes,
        max_file_bytes: q.max_file_bytes,
    }
}

fn run(root: &Path, q: &Query<'_>) -> (Vec<FoundMatch>, SearchEnd) {
    let (tx, mut rx) = mpsc::channel(10_000);
    let end = job(root, q).run(&CancellationToken::new(), &tx);
    let mut found = Vec::new();
    while let Ok(m) = rx.try_recv() {
        found.push(m);
    }
    (found, end)
}

/// `(file name relative to root, line number, start, end)` of each match.
fn places(root: &Path, found: &[FoundMatch]) -> Vec<(String, u64, usize, usize)> {
    let prefix = format!("{}/", to_file_uri(root));
    found
        .iter()
        .map(|m| {
            let name = m.path.strip_prefix(&prefix).unwrap_or(&m.path).to_owned();
            (name, m.line_number, m.start, m.end)
        })
        .collect()
}

fn tree(files: &[(&str, &[u8])]) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in files {
        let path = dir.path().join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }
    dir
}

fn at(name: &str, line: u64, start: usize, end: usize) -> (String, u64, usize, usize) {
    (name.to_owned(), line, start, end)
}

#[test]
fn literal_patterns_match_literally_and_regexes_as_regexes() {
    let dir = tree(&[("a.txt", b"abc\na.c\n")]);
    let (found, end) = run(dir.path(), &query("a.c"));
    assert_eq!(places(dir.path(), &found), [at("a.txt", 2, 0, 3)]);
    assert_eq!(end, SearchEnd::default());
    let (found, _) = run(
        dir.path(),
        &Query {
            regex: true,
            ..query("a.c")
        },
    );
    assert_eq!(
        places(dir.path(), &found),
        [at("a.txt", 1, 0, 3), at("a.txt", 2, 0, 3)]
    );
}

#[test]
fn every_match_of_a_line_is_reported_with_byte_offsets() {
    let dir = tree(&[("f", "éx xx\nnone\n  x\r\n".as_bytes())]);
    let (found, _) = run(dir.path(), &query("x"));
    assert_eq!(
        places(dir.path(), &found),
        [
            at("f", 1, 2, 3),
            at("f", 1, 4, 5),
            at("f", 1, 5, 6),
            at("f", 3, 2, 3)
        ]
    );
    assert_eq!(&*found[0].line, "éx xx");
    assert_eq!(
        &*found[3].line, "  x",
        "the CRLF terminator is not part of the line"
    );
    assert_eq!(found[0].path, found[1].path);
}

#[test]
fn case_insensitive_matching() {
    let dir = tree(&[("f", b"Hello\nHELLO\nhello\n")]);
    assert_eq!(run(dir.path(), &query("hello")).0.len(), 1);
    let (found, _) = run(
        dir.path(),
        &Query {
            case_insensitive: true,
            ..query("hello")
        },
    );
    assert_eq!(found.len(), 3);
}

#[test]
fn files_come_in_name_order_and_subdirectories_are_searched() {
    let dir = tree(&[
        ("b", b"x\n"),
        ("a/z", b"x\n"),
        ("a/b", b"x\n"),
        ("c", b"x\n"),
    ]);
    let names: Vec<String> = places(dir.path(), &run(dir.path(), &query("x")).0)
        .into_iter()
        .map(|p| p.0)
        .collect();
    assert_eq!(names, ["a/b", "a/z", "b", "c"]);
}

#[test]
fn include_and_exclude_globs() {
    let dir = tree(&[
        ("src/main.rs", b"x\n"),
        ("src/gen/out.rs", b"x\n"),
        ("README.md", b"x\n"),
        ("notes.txt", b"x\n"),
    ]);
    let names = |q: &Query<'_>| -> Vec<String> {
        places(dir.path(), &run(dir.path(), q).0)
            .into_iter()
            .map(|p| p.0)
            .collect()
    };
    assert_eq!(
        names(&Query {
            include: &["*.rs"],
            ..query("x")
        }),
        ["src/gen/out.rs", "src/main.rs"]
    );
    assert_eq!(
        names(&Query {
            include: &["*.rs", "*.md"],
            exclude: &["gen"],
            ..query("x")
        }),
        ["README.md", "src/main.rs"]
    );
    assert_eq!(
        names(&Query {
            exclude: &["*.rs", "src"],
            ..query("x")
        }),
        ["README.md", "notes.txt"]
    );
}

/// Found by the `search` fuzz target: an include glob that `.gitignore` syntax reads as
/// nothing (blank, or a `#` comment) was dropped, and with no include glob left every file
/// was searched.
#[test]
fn globs_are_never_read_as_gitignore_comments_or_blank_lines() {
    let dir = tree(&[("#notes#", b"x\n"), ("main.rs", b"x\n")]);
    let names = |q: &Query<'_>| -> Vec<String> {
        places(dir.path(), &run(dir.path(), q).0)
            .into_iter()
            .map(|p| p.0)
            .collect()
    };
    for include in ["#notes#", "#*"] {
        let q = Query {
            include: &[include],
            ..query("x")
        };
        assert_eq!(names(&q), ["%23notes%23"], "{include}");
    }
    let q = Query {
        exclude: &["#*"],
        ..query("x")
    };
    assert_eq!(names(&q), ["main.rs"]);
    for blank in ["", " ", "\t "] {
        for (include, exclude) in [
            (vec![blank.to_owned()], vec![]),
            (vec![], vec![blank.to_owned()]),
        ] {
            let error = build_overrides(dir.path(), &include, &exclude).unwrap_err();
            assert!(
                error.message.ends_with("globs must not be blank"),
                "{}",
                error.message
            );
        }
    }
}

#[test]
fn gitignore_is_respected_unless_told_otherwise() {
    let dir = tree(&[
        (".gitignore", b"target/\n*.log\n"),
        ("target/out", b"x\n"),
        ("app.log", b"x\n"),
        ("src/.gitignore", b"local\n"),
        ("src/local", b"x\n"),
        ("src/lib.rs", b"x\n"),
        (".git/config", b"x\n"),
        (".hidden", b"x\n"),
    ]);
    let names = |respect_gitignore: bool| -> Vec<String> {
        let q = Query {
            respect_gitignore,
            ..query("x")
        };
        places(dir.path(), &run(dir.path(), &q).0)
            .into_iter()
            .map(|p| p.0)
            .collect()
    };
    // Hidden files are searched; a repository's `.git` never is.
    assert_eq!(names(true), [".hidden", "src/lib.rs"]);
    assert_eq!(
        names(false),
        [
            ".hidden",
            "app.log",
            "src/lib.rs",
            "src/local",
            "target/out"
        ]
    );
}

#[test]
fn gitignore_files_above_the_root_apply() {
    let dir = tree(&[
        (".gitignore", b"*.log\n"),
        ("sub/a.log", b"x\n"),
        ("sub/a", b"x\n"),
    ]);
    let root = dir.path().join("sub");
    let names: Vec<String> = places(&root, &run(&root, &query("x")).0)
        .into_iter()
        .map(|p| p.0)
        .collect();
    assert_eq!(names, ["a"]);
}

#[test]
fn binary_large_and_special_files_are_skipped() {
    let dir = tree(&[
        ("bin", b"x\0x\nx\n"),
        ("big", &[b'x'; 2048]),
        ("small", b"x\n"),
    ]);
    let fifo = dir.path().join("fifo");
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c_path` is a valid NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let (found, _) = run(
        dir.path(),
        &Query {
            max_file_bytes: 1024,
            ..query("x")
        },
    );
    assert_eq!(places(dir.path(), &found), [at("small", 1, 0, 1)]);
}

#[test]
fn a_file_root_is_searched_itself() {
    let dir = tree(&[("one.txt", b"no\nyes x\n")]);
    let root = dir.path().join("one.txt");
    let (found, _) = run(
        &root,
        &Query {
            include: &["*.md"],
            ..query("x")
        },
    );
    assert_eq!(found.len(), 1);
    assert_eq!(&*found[0].path, to_file_uri(&root));
    assert_eq!((found[0].line_number, found[0].start), (2, 4));
}

#[test]
fn max_results_truncates_only_when_more_matches_exist() {
    let dir = tree(&[("a", b"x x\nx\n"), ("b", b"x\n")]);
    let (found, end) = run(
        dir.path(),
        &Query {
            max_results: 2,
            ..query("x")
        },
    );
    assert_eq!(
        places(dir.path(), &found),
        [at("a", 1, 0, 1), at("a", 1, 2, 3)]
    );
    assert!(end.truncated);
    let (found, end) = run(
        dir.path(),
        &Query {
            max_results: 4,
            ..query("x")
        },
    );
    assert_eq!(found.len(), 4);
    assert!(!end.truncated);
}

#[test]
fn non_utf8_lines_are_sent_lossily_and_long_lines_cut() {
    let dir = tree(&[("f", b"\xFFab\xFEx\n"), ("g", b"0123456789x\n")]);
    let (found, _) = run(
        dir.path(),
        &Query {
            max_line_bytes: 9,
            ..query("x")
        },
    );
    assert_eq!(&*found[0].line, "\u{FFFD}ab\u{FFFD}x");
    assert!(!found[0].line_truncated);
    assert_eq!((found[0].start, found[0].end), (8, 9));
    assert_eq!(&*found[1].line, "012345678");
    assert!(found[1].line_truncated);
    assert_eq!((found[1].start, found[1].end), (10, 11));
}

#[test]
fn a_cancelled_search_stops_and_says_so() {
    let dir = tree(&[("a", b"x\n"), ("b", b"x\n")]);
    let (tx, mut rx) = mpsc::channel(10);
    let stop = CancellationToken::new();
    stop.cancel();
    let end = job(dir.path(), &query("x")).run(&stop, &tx);
    assert!(end.cancelled);
    assert!(rx.try_recv().is_err());
}

#[test]
fn a_closed_channel_stops_the_search() {
    let dir = tree(&[("a", b"x\nx\nx\n")]);
    let (tx, rx) = mpsc::channel(1);
    drop(rx);
    let end = job(dir.path(), &query("x")).run(&CancellationToken::new(), &tx);
    assert!(!end.cancelled && !end.truncated);
}

#[test]
fn bad_patterns_and_globs_are_invalid_params() {
    assert_eq!(
        build_matcher("", false, false).unwrap_err(),
        empty_pattern()
    );
    let error = build_matcher("(", true, false).unwrap_err();
    assert_eq!(error.code, -32602);
    assert!(error.message.starts_with("invalid pattern: "), "{error:?}");
    assert!(
        build_matcher("(", false, false).is_ok(),
        "literals are escaped"
    );
    let error = build_overrides(Path::new("/"), &["a[".into()], &[]).unwrap_err();
    assert_eq!(error.code, -32602);
    assert!(
        error.message.starts_with("invalid include glob `a[`: "),
        "{error:?}"
    );
    let error = build_overrides(Path::new("/"), &[], &["!x".into()]).unwrap_err();
    assert_eq!(
        error.message,
        "invalid exclude glob `!x`: globs must not start with `!`"
    );
}

/// Found by the `search` fuzz target: `\w+@\w{1000}` took seconds (and some hundred MiB)
/// to compile under `grep-regex`'s 100 MiB size limit, per search; patterns are now held
/// to the `regex` crate's 10 MiB, which such patterns reach in a fraction of a second.
#[test]
fn patterns_too_large_to_compile_cheaply_are_refused() {
    for pattern in [r"\w+@\w{1000}", r"(?:\w{1000}){5}", r"\pL{500}"] {
        let error = build_matcher(pattern, true, false).unwrap_err();
        assert_eq!(
            error.code,
            exec_server_core::proto::error::code::INVALID_PARAMS
        );
        assert!(
            error.message.starts_with("invalid pattern: ")
                && error.message.contains("exceeds size limit"),
            "{pattern}: {}",
            error.message
        );
    }
    assert!(build_matcher(r"\w{100}", true, false).is_ok());
    assert!(build_matcher(&"x".repeat(100_000), false, true).is_ok());
}

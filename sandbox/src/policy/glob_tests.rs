use std::path::{Path, PathBuf};

use super::*;

fn denies(pattern: &str, path: &str) -> bool {
    GlobPattern::new(pattern)
        .unwrap()
        .matches_or_beneath(Path::new(path))
}

#[test]
fn star_and_question_mark_stay_within_one_component() {
    assert!(denies("/srv/*.pem", "/srv/key.pem"));
    assert!(denies("/srv/*.pem", "/srv/.pem"));
    assert!(!denies("/srv/*.pem", "/srv/sub/key.pem"));
    assert!(denies("/srv/ke?.pem", "/srv/key.pem"));
    assert!(!denies("/srv/ke?.pem", "/srv/ke.pem"));
    assert!(!denies("/srv/ke?.pem", "/srv/keyy.pem"));
    assert!(denies("/srv/*a*b*", "/srv/xxaxxbxx"));
    assert!(!denies("/srv/*a*b", "/srv/xxbxxa"));
    assert!(denies("/srv/é?", "/srv/éé"));
}

#[test]
fn double_star_matches_any_number_of_components_including_none() {
    assert!(denies("/srv/repo/**/*.pem", "/srv/repo/key.pem"));
    assert!(denies("/srv/repo/**/*.pem", "/srv/repo/a/b/c/key.pem"));
    assert!(!denies("/srv/repo/**/*.pem", "/srv/other/key.pem"));
    assert!(denies("/**/secrets", "/secrets"));
    assert!(denies("/**/secrets", "/a/b/secrets"));
    assert!(denies("/srv/**", "/srv"));
    assert!(denies("/srv/**/a/**/b", "/srv/x/a/y/z/b"));
    assert!(!denies("/srv/**/a/**/b", "/srv/x/b/y/a"));
}

#[test]
fn a_match_covers_everything_beneath_it() {
    assert!(denies("/srv/*/secrets", "/srv/repo/secrets/deep/file"));
    assert!(denies("/srv/repo/**/*.pem", "/srv/repo/certs.pem/inner"));
    assert!(!denies("/srv/*/secrets", "/srv/repo"));
    assert!(!denies("/srv/*/secrets", "/srv"));
}

#[test]
fn character_classes() {
    assert!(denies("/srv/[abc].txt", "/srv/b.txt"));
    assert!(!denies("/srv/[abc].txt", "/srv/d.txt"));
    assert!(denies("/srv/[a-c]x", "/srv/bx"));
    assert!(denies("/srv/[!a-c]x", "/srv/dx"));
    assert!(!denies("/srv/[^a-c]x", "/srv/ax"));
    assert!(denies("/srv/[]]", "/srv/]"));
    assert!(denies("/srv/[a-]", "/srv/-"));
    assert!(denies("/srv/[*]", "/srv/*"));
    assert!(!denies("/srv/[*]", "/srv/x"));
}

#[test]
fn escaped_literals_match_only_themselves() {
    let pattern = format!("/srv/{}/*.pem", escape("we[i]rd*?"));
    assert!(denies(&pattern, "/srv/we[i]rd*?/k.pem"));
    assert!(!denies(&pattern, "/srv/weirdxy/k.pem"));
}

#[test]
fn no_brace_expansion() {
    assert!(denies("/srv/{a,b}", "/srv/{a,b}"));
    assert!(!denies("/srv/{a,b}", "/srv/a"));
}

/// Found by the `policy` fuzz target: a deny glob such as `/srv/*/../secret` was accepted
/// and matched nothing, since resolved paths never hold `..`; `.` was as inert.
#[test]
fn dot_names_mean_nothing_and_dot_dot_is_refused() {
    assert!(denies("/srv/*/./x", "/srv/a/x"));
    assert!(denies("/srv/*/.", "/srv/a"));
    for pattern in ["/srv/*/../secret", "/srv/**/..", "/../x"] {
        let error = GlobPattern::new(pattern).unwrap_err();
        assert!(error.contains("`..` cannot follow a wildcard"), "{error}");
    }
}

#[test]
fn malformed_patterns_are_refused() {
    assert!(GlobPattern::new("relative/*").is_err());
    assert!(GlobPattern::new("/srv/[abc").is_err());
    assert!(GlobPattern::new("/srv/[z-a]").is_err());
}

/// Found by the `search` fuzz target: each `**` walked every reachable index to the end,
/// so a long pattern of them against a deep path cost segments × names² (seconds for a
/// few KiB of client input, per checked path).
#[test]
fn many_any_depth_segments_against_a_deep_path_cost_their_product() {
    let pattern = GlobPattern::new(&format!("/{}x", "**/".repeat(2_000))).unwrap();
    let deep = PathBuf::from(format!("/{}", "a/".repeat(3_000)));
    let start = std::time::Instant::now();
    assert!(!pattern.matches_or_beneath(&deep));
    assert!(pattern.matches_or_beneath(&deep.join("x")));
    assert!(pattern.matches_or_beneath(&deep.join("x/below")));
    let spent = start.elapsed();
    assert!(spent < std::time::Duration::from_secs(10), "{spent:?}");
}

/// Found attacking name fidelity: a glob's literal prefix was kept as lossy text, so a
/// directory whose name is not UTF-8 was scanned (and compared) as another one, and the
/// deny entry protected nothing for processes.
#[test]
fn a_prefix_that_is_not_utf8_matches_its_own_bytes_only() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt as _;
    let bytes = |b: &[u8]| PathBuf::from(OsString::from_vec(b.to_vec()));
    let prefix = bytes(b"/data/caf\xe9");
    let glob = GlobPattern::with_prefix(prefix.clone(), "**/*.env").unwrap();
    assert_eq!(glob.prefix(), prefix);
    assert!(glob.matches_or_beneath(&prefix.join("prod.env")));
    assert!(glob.matches_or_beneath(&prefix.join("a/b/prod.env/x")));
    assert!(!glob.matches_or_beneath(Path::new("/data/caf\u{FFFD}/prod.env")));
    assert!(!glob.matches_or_beneath(&bytes(b"/data/caf\xe8/prod.env")));
    // Below the prefix, a wildcard matches names that are not UTF-8.
    assert!(glob.matches_or_beneath(&prefix.join(OsString::from_vec(b"\xff.env".to_vec()))));
    // A pattern string splits into the same prefix and rest.
    let text = GlobPattern::new("/srv/repo/**/*.pem").unwrap();
    assert_eq!(
        (text.prefix(), text.rest()),
        (Path::new("/srv/repo"), "**/*.pem")
    );
}

/// Found by the `policy` fuzz target: `.` and empty names in the rest of a pattern made
/// a pattern and the one read back from its helper JSON differ.
#[test]
fn dot_names_in_the_rest_are_dropped_so_patterns_read_back_equal() {
    let built = GlobPattern::with_prefix(PathBuf::from("/t/missing"), "a**b/./.").unwrap();
    assert_eq!(built.rest(), "a**b");
    let read_back = GlobPattern::new(built.as_str()).unwrap();
    assert_eq!(read_back, built);
}

use std::path::Path;

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

#[test]
fn malformed_patterns_are_refused() {
    assert!(GlobPattern::new("relative/*").is_err());
    assert!(GlobPattern::new("/srv/[abc").is_err());
    assert!(GlobPattern::new("/srv/[z-a]").is_err());
}

//! "Did you mean": the known name nearest to a misspelt key or table, for the
//! `unknown key` errors (`[methods] disable` → `methods.disabled`,
//! `EXEC_SERVER_PROCES__…` → `process`).

use crate::variables::{config_variable, ENV_SEPARATOR};

/// The longest word a suggestion is looked for.
const MAX_WORD_BYTES: usize = 64;

/// The candidate nearest to `word` by edit distance, if it is near enough to be a typo:
/// at most one edit in four letters (and at least one edit allowed). Ties go to the first.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    // Keys are short; a long word is no typo of one, and is not worth a distance matrix.
    if word.len() > MAX_WORD_BYTES {
        return None;
    }
    let length = word.chars().count();
    let allowed = (length / 4).max(1);
    candidates
        .into_iter()
        .filter(|candidate| *candidate != word)
        .filter(|candidate| candidate.chars().count().abs_diff(length) <= allowed)
        .map(|candidate| (edit_distance(word, candidate), candidate))
        .filter(|(distance, _)| *distance <= allowed)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// `; did you mean `<parent>.<nearest>`?` (and its variable when the unknown key came from
/// the environment), or nothing when no candidate is near.
pub fn did_you_mean<'a>(
    parent: &str,
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    from_environment: bool,
) -> String {
    let Some(found) = nearest(word, candidates) else {
        return String::new();
    };
    let key = if parent.is_empty() {
        found.to_owned()
    } else {
        format!("{parent}.{found}")
    };
    if from_environment && parent.is_empty() {
        // A table: its variables start with this prefix.
        format!(
            "; did you mean `{key}` ({}{ENV_SEPARATOR}…)?",
            config_variable(&key)
        )
    } else if from_environment {
        format!("; did you mean `{key}` ({})?", config_variable(&key))
    } else {
        format!("; did you mean `{key}`?")
    }
}

/// Edit distance over characters, counting a swap of two neighbours as one edit (optimal
/// string alignment): `enabeld` is one edit from `enabled`.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let width = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * width];
    for (i, cell) in d.iter_mut().step_by(width).enumerate() {
        *cell = i;
    }
    for (j, cell) in d.iter_mut().take(width).enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[(i - 1) * width + j] + 1)
                .min(d[i * width + j - 1] + 1)
                .min(d[(i - 1) * width + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[(i - 2) * width + j - 2] + 1);
            }
            d[i * width + j] = best;
        }
    }
    d[a.len() * width + b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_find_their_key_and_strangers_find_nothing() {
        let keys = ["enabled", "disabled", "allow"];
        assert_eq!(nearest("disable", keys), Some("disabled"));
        assert_eq!(nearest("enabeld", keys), Some("enabled"));
        assert_eq!(nearest("alow", keys), Some("allow"));
        assert_eq!(nearest("timeout", keys), None);
        assert_eq!(
            nearest("proces", ["process", "server", "sandbox"]),
            Some("process")
        );
        assert_eq!(nearest("x", ["y"]), Some("y"));
        assert_eq!(nearest("xyz", ["abc"]), None);
        assert_eq!(nearest(&"a".repeat(5_000_000), ["abc"]), None);
        assert_eq!(nearest("disabledxxxxxxxxxx", ["disabled"]), None);
    }

    #[test]
    fn suggestions_name_the_key_and_the_variable_when_from_the_environment() {
        assert_eq!(
            did_you_mean("methods", "disable", ["disabled"], false),
            "; did you mean `methods.disabled`?"
        );
        assert_eq!(
            did_you_mean("", "proces", ["process"], true),
            "; did you mean `process` (EXEC_SERVER_PROCESS__…)?"
        );
        assert_eq!(
            did_you_mean("websocket", "ping_intervl_ms", ["ping_interval_ms"], true),
            "; did you mean `websocket.ping_interval_ms` (EXEC_SERVER_WEBSOCKET__PING_INTERVAL_MS)?"
        );
        assert_eq!(did_you_mean("", "zzzz", ["process"], false), "");
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("abc", "abc"), 0);
        assert_eq!(edit_distance("enabeld", "enabled"), 1);
    }
}

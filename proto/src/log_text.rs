//! Text from a peer (a client, a sandboxed process, a rendezvous tenant) quoted in a log
//! line or an error message.

/// The most bytes of peer text one log line quotes.
pub const MAX_QUOTED_BYTES: usize = 256;

/// `text` as a log line may quote it: at most [`MAX_QUOTED_BYTES`] of it, with newlines,
/// control characters and quotes escaped so that it cannot forge a line of its own.
pub fn quoted(text: &str) -> String {
    truncated(text).escape_debug().to_string()
}

/// `text` whole, with control characters, the Unicode line and paragraph separators and
/// the invisible format characters that reorder or hide text (bidi overrides and isolates,
/// zero-width characters, tags) escaped (`\n`, `\u{2028}`, `\u{202e}`), and nothing else:
/// for a peer's message printed where a reader splits lines or reads it (a terminal, a log
/// collector), when it must be shown in full.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() || is_invisible_format(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The first `chars` characters of `text`, trimmed and [`printable`]: a peer's short
/// reason (a refusal's body or header) as an error shows it.
pub fn printable_start(text: &str, chars: usize) -> String {
    let start: String = text.trim().chars().take(chars).collect();
    printable(&start)
}

/// Separators and format characters a reader does not see but that change what is shown.
fn is_invisible_format(c: char) -> bool {
    matches!(c,
        '\u{2028}' | '\u{2029}'           // line and paragraph separators
        | '\u{200b}'..='\u{200f}'         // zero-width characters, LRM/RLM
        | '\u{202a}'..='\u{202e}'         // bidi embeddings and overrides
        | '\u{2060}'..='\u{206f}'         // word joiner, bidi isolates, invisible operators
        | '\u{061c}' | '\u{feff}'          // Arabic letter mark, byte order mark
        | '\u{e0000}'..='\u{e007f}'       // tags
    )
}

/// The first [`MAX_QUOTED_BYTES`] of `text` (less, to end on a character): what is worth
/// keeping of peer text that is only ever logged.
pub fn truncated(text: &str) -> &str {
    prefix(text, MAX_QUOTED_BYTES)
}

/// The longest prefix of `text` of at most `bytes` bytes that ends on a character.
pub fn prefix(text: &str, bytes: usize) -> &str {
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quote_is_one_short_line() {
        let forged = "x\n2026-01-01T00:00:00Z  INFO forged\r\u{1b}[2J\"";
        let one_line = quoted(forged);
        assert!(!one_line.chars().any(char::is_control), "{one_line}");
        assert!(one_line.starts_with("x\\n2026"));
        let separators = quoted("a\u{2028}b\u{2029}c");
        assert!(!separators.contains('\u{2028}') && !separators.contains('\u{2029}'));
        let printed = printable("a \"b\"\nc\u{2028}d\u{1b}[2J");
        assert_eq!(printed, "a \"b\"\\nc\\u{2028}d\\u{1b}[2J");
        let spoof = printable("file\u{202e}txt.exe\u{200b}\u{2066}x\u{e0041}");
        assert!(
            !spoof.contains('\u{202e}') && !spoof.contains('\u{200b}'),
            "{spoof}"
        );
        assert!(
            !spoof.contains('\u{2066}') && !spoof.contains('\u{e0041}'),
            "{spoof}"
        );
        assert!(spoof.contains("\\u{202e}"), "{spoof}");
        assert_eq!(printable("naïve 日本"), "naïve 日本");
        assert_eq!(printable_start("  ab\ncd  ", 4), "ab\\nc");
        let long = "é".repeat(MAX_QUOTED_BYTES);
        assert_eq!(super::quoted(&long).len(), MAX_QUOTED_BYTES);
    }
}

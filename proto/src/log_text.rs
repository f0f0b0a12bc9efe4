//! Text from a peer (a client, a sandboxed process, a rendezvous tenant) quoted in a log
//! line or an error message.

/// The most bytes of peer text one log line quotes.
pub const MAX_QUOTED_BYTES: usize = 256;

/// `text` as a log line may quote it: at most [`MAX_QUOTED_BYTES`] of it, with newlines,
/// control characters and quotes escaped so that it cannot forge a line of its own.
pub fn quoted(text: &str) -> String {
    truncated(text).escape_debug().to_string()
}

/// `text` whole, with control characters and the Unicode line and paragraph separators
/// escaped (`\n`, `\u{2028}`), and nothing else: for a peer's message printed where a
/// reader splits lines (a terminal, a log collector), when it must be shown in full.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                c.escape_default().to_string()
            }
            c => c.to_string(),
        })
        .collect()
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
        let long = "é".repeat(MAX_QUOTED_BYTES);
        assert_eq!(super::quoted(&long).len(), MAX_QUOTED_BYTES);
    }
}

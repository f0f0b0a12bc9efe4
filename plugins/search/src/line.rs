//! A matched line as `search/match` sends it: without its terminator, decoded as UTF-8
//! (invalid sequences become U+FFFD, one per maximal invalid sequence, as
//! `String::from_utf8_lossy` does), cut to `search.max_line_bytes`, and match offsets moved
//! from the file's bytes to that decoded text.

use std::sync::Arc;

/// `bytes` without a trailing `\n` or `\r\n`.
pub(crate) fn without_terminator(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    bytes.strip_suffix(b"\r").unwrap_or(bytes)
}

/// Length of U+FFFD in UTF-8.
const REPLACEMENT_BYTES: usize = '\u{FFFD}'.len_utf8();

#[derive(Debug)]
pub(crate) struct MatchedLine<'a> {
    raw: &'a [u8],
    /// The raw bytes are valid UTF-8, so offsets need no mapping.
    utf8: bool,
    /// The decoded text, at most `max_bytes` long.
    pub(crate) text: Arc<str>,
    /// The decoded text was longer than `max_bytes`.
    pub(crate) truncated: bool,
}

impl<'a> MatchedLine<'a> {
    pub(crate) fn new(raw: &'a [u8], max_bytes: usize) -> Self {
        let mut text = String::with_capacity(raw.len().min(max_bytes));
        let mut truncated = false;
        let mut utf8 = true;
        for chunk in raw.utf8_chunks() {
            if !push_within(&mut text, chunk.valid(), max_bytes) {
                truncated = true;
                break;
            }
            if !chunk.invalid().is_empty() {
                utf8 = false;
                if !push_within(&mut text, "\u{FFFD}", max_bytes) {
                    truncated = true;
                    break;
                }
            }
        }
        if truncated && utf8 {
            // The loop stopped early: the rest of the line may still hold invalid bytes.
            utf8 = std::str::from_utf8(raw).is_ok();
        }
        Self {
            raw,
            utf8,
            text: Arc::from(text),
            truncated,
        }
    }

    /// Where a match starting at byte `raw_offset` of the line starts in the decoded text.
    pub(crate) fn start(&self, raw_offset: usize) -> usize {
        self.decoded_offset(raw_offset, false)
    }

    /// Where a match ending at byte `raw_offset` of the line ends in the decoded text.
    pub(crate) fn end(&self, raw_offset: usize) -> usize {
        self.decoded_offset(raw_offset, true)
    }

    /// An offset inside an invalid sequence moves to the start of its U+FFFD, or past it
    /// when `round_up`, so a match always covers whole characters.
    fn decoded_offset(&self, raw_offset: usize, round_up: bool) -> usize {
        if self.utf8 {
            return raw_offset;
        }
        let (mut raw_pos, mut decoded_pos) = (0, 0);
        for chunk in self.raw.utf8_chunks() {
            let valid = chunk.valid().len();
            if raw_offset <= raw_pos + valid {
                return decoded_pos + (raw_offset - raw_pos);
            }
            raw_pos += valid;
            decoded_pos += valid;
            let invalid = chunk.invalid().len();
            if raw_offset < raw_pos + invalid {
                return decoded_pos + if round_up { REPLACEMENT_BYTES } else { 0 };
            }
            raw_pos += invalid;
            decoded_pos += REPLACEMENT_BYTES;
        }
        decoded_pos
    }
}

/// Appends as much of `piece` as fits within `max_bytes` of `text`, cut at a character
/// boundary; `false` when not all of it fitted.
fn push_within(text: &mut String, piece: &str, max_bytes: usize) -> bool {
    let room = max_bytes.saturating_sub(text.len());
    if piece.len() <= room {
        text.push_str(piece);
        return true;
    }
    let mut cut = room;
    while !piece.is_char_boundary(cut) {
        cut -= 1;
    }
    text.push_str(&piece[..cut]);
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminators_are_removed() {
        assert_eq!(without_terminator(b"abc\n"), b"abc");
        assert_eq!(without_terminator(b"abc\r\n"), b"abc");
        assert_eq!(without_terminator(b"abc"), b"abc");
        assert_eq!(without_terminator(b"abc\r"), b"abc");
        assert_eq!(without_terminator(b""), b"");
    }

    #[test]
    fn utf8_lines_keep_their_offsets() {
        let line = MatchedLine::new("héllo wörld".as_bytes(), 100);
        assert_eq!(&*line.text, "héllo wörld");
        assert!(!line.truncated);
        assert_eq!((line.start(7), line.end(12)), (7, 12));
    }

    #[test]
    fn invalid_bytes_become_replacement_characters_and_offsets_follow() {
        // "a" 0xFF "b" 0xC3 "c": two invalid sequences.
        let raw = b"a\xFFb\xC3c";
        let line = MatchedLine::new(raw, 100);
        assert_eq!(&*line.text, String::from_utf8_lossy(raw));
        assert_eq!(&*line.text, "a\u{FFFD}b\u{FFFD}c");
        // "b" is raw 2..3, decoded 4..5; "c" is raw 4..5, decoded 8..9.
        assert_eq!((line.start(2), line.end(3)), (4, 5));
        assert_eq!((line.start(4), line.end(5)), (8, 9));
        // A match covering an invalid byte covers its replacement character.
        assert_eq!((line.start(1), line.end(2)), (1, 4));
        assert_eq!(&line.text[line.start(1)..line.end(2)], "\u{FFFD}");
    }

    #[test]
    fn long_lines_are_cut_at_a_character_boundary() {
        let line = MatchedLine::new("abcdé".as_bytes(), 5);
        assert_eq!(&*line.text, "abcd");
        assert!(line.truncated);
        // Offsets still refer to the whole line.
        assert_eq!((line.start(4), line.end(6)), (4, 6));

        let exact = MatchedLine::new(b"abcde", 5);
        assert_eq!(&*exact.text, "abcde");
        assert!(!exact.truncated);
    }

    #[test]
    fn invalid_bytes_after_the_cut_still_shift_offsets() {
        let raw = b"abc\xFFxyz";
        let line = MatchedLine::new(raw, 2);
        assert_eq!(&*line.text, "ab");
        assert!(line.truncated);
        assert_eq!((line.start(4), line.end(7)), (6, 9));
    }
}

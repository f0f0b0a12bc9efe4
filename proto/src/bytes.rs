//! Bytes on the wire: base64 in both directions (PROTOCOL §0.3) and the empty result.

use base64::alphabet::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

/// Standard alphabet; always pads output, accepts padded and unpadded input.
pub const BASE64: GeneralPurpose = GeneralPurpose::new(
    &STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Serializes borrowed bytes as a base64 JSON string (for serde_json output).
///
/// The bytes are encoded once into a raw JSON value that serde_json copies verbatim:
/// serializing them as an ordinary string would make serde_json scan every character for
/// escaping, which costs about three times the encoding itself, and base64 never needs
/// escaping.
#[derive(Debug, Clone, Copy)]
pub struct Base64<'a>(pub &'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        base64_json(self.0).serialize(s)
    }
}

/// Appends `bytes` to `out` as padded standard base64: the one encoder of every byte the
/// server sends. It picks the widest vector instructions the CPU has at run time (AVX2 on
/// current x86), about ten times the throughput of the portable encoder, which was most
/// of the server's time on large output and whole-file reads.
pub fn append_base64(bytes: &[u8], out: &mut String) {
    base64_simd::STANDARD.encode_append(bytes, out);
}

/// `bytes` as a JSON string of padded base64, ready to be embedded verbatim in a message.
pub fn base64_json(bytes: &[u8]) -> Box<RawValue> {
    let mut json = String::with_capacity(bytes.len().div_ceil(3) * 4 + 2);
    json.push('"');
    append_base64(bytes, &mut json);
    json.push('"');
    // SAFETY: a quoted run of base64 characters (A–Z a–z 0–9 + / =) is one well-formed JSON
    // string with no surrounding whitespace, which is all a raw value requires.
    unsafe { RawValue::from_string_unchecked(json) }
}

/// `{"<member>":"<bytes as padded base64>"}` as one raw JSON object, encoded straight into
/// its final buffer: a whole file's answer is then made with one pass over the bytes and
/// no copy of the encoded text. `member` must be a plain key (letters and digits).
pub fn base64_object(member: &str, bytes: &[u8]) -> Box<RawValue> {
    let mut object = Base64Object::new(member, bytes.len());
    object.push(bytes);
    object.finish()
}

/// [`base64_object`] made from bytes that come in pieces of any size (a file read in
/// chunks), so they are never held whole: up to two bytes wait between pieces for the
/// rest of their three-byte group.
pub struct Base64Object {
    json: String,
    carry: [u8; 3],
    carried: usize,
}

impl Base64Object {
    /// An object for `member`, with room for `expected` bytes (a hint, not a limit).
    pub fn new(member: &str, expected: usize) -> Self {
        debug_assert!(member.bytes().all(|b| b.is_ascii_alphanumeric()));
        let mut json = String::with_capacity(expected.div_ceil(3) * 4 + member.len() + 7);
        json.push_str("{\"");
        json.push_str(member);
        json.push_str("\":\"");
        Self {
            json,
            carry: [0; 3],
            carried: 0,
        }
    }

    /// Encodes the next piece.
    pub fn push(&mut self, mut bytes: &[u8]) {
        if self.carried > 0 {
            let take = (3 - self.carried).min(bytes.len());
            self.carry[self.carried..self.carried + take].copy_from_slice(&bytes[..take]);
            self.carried += take;
            bytes = &bytes[take..];
            if self.carried < 3 {
                return;
            }
            append_base64(&self.carry, &mut self.json);
            self.carried = 0;
        }
        let whole = bytes.len() / 3 * 3;
        append_base64(&bytes[..whole], &mut self.json);
        let rest = &bytes[whole..];
        self.carry[..rest.len()].copy_from_slice(rest);
        self.carried = rest.len();
    }

    /// The object, the last group padded.
    pub fn finish(mut self) -> Box<RawValue> {
        append_base64(&self.carry[..self.carried], &mut self.json);
        self.json.push_str("\"}");
        // SAFETY: one member whose key is plain ASCII and whose value is a quoted run of
        // base64 characters: a well-formed JSON object with no surrounding whitespace.
        unsafe { RawValue::from_string_unchecked(self.json) }
    }
}

/// Decodes client-sent base64 (padded or not, no whitespace).
pub fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    BASE64.decode(text)
}

/// Deserializes a base64 string member into its bytes; the decoder's text is the error.
pub fn deserialize_base64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let text = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
    decode_base64(&text).map_err(serde::de::Error::custom)
}

/// Encodes bytes as padded base64.
pub fn encode_base64(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len().div_ceil(3) * 4);
    append_base64(bytes, &mut text);
    text
}

/// The `{}` result.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize, Serialize)]
pub struct Empty {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_made_in_pieces_is_the_object_made_whole() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1_000).collect();
        let whole = base64_object("dataBase64", &data);
        for sizes in [&[1usize][..], &[2], &[3], &[4, 1, 2], &[7, 0, 5], &[1_000]] {
            let mut object = Base64Object::new("dataBase64", 10);
            let mut rest = &data[..];
            for size in sizes.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (piece, tail) = rest.split_at((*size).min(rest.len()));
                object.push(piece);
                rest = tail;
                if *size == 0 {
                    object.push(&[]);
                }
            }
            assert_eq!(object.finish().get(), whole.get(), "pieces of {sizes:?}");
        }
        let empty = Base64Object::new("dataBase64", 0).finish();
        assert_eq!(empty.get(), r#"{"dataBase64":""}"#);
    }

    #[test]
    fn round_trips_and_accepts_unpadded() {
        assert_eq!(
            serde_json::to_string(&Base64(b"hello\n")).unwrap(),
            r#""aGVsbG8K""#
        );
        assert_eq!(decode_base64("aGVsbG8K").unwrap(), b"hello\n");
        assert_eq!(decode_base64("aGk=").unwrap(), b"hi");
        assert_eq!(decode_base64("aGk").unwrap(), b"hi");
        assert!(decode_base64("aG k=").is_err());
    }

    #[test]
    fn the_vector_encoder_agrees_with_the_portable_one_at_every_length() {
        // Every tail length and the vector loops' block boundaries, on bytes that use the
        // whole alphabet (`+` and `/` included).
        let bytes: Vec<u8> = (0..1_200u32).map(|i| (i * 167 + i / 7) as u8).collect();
        for len in 0..bytes.len() {
            let data = &bytes[..len];
            assert_eq!(encode_base64(data), BASE64.encode(data), "length {len}");
        }
        let large = vec![0xfbu8; 3 << 20];
        assert_eq!(encode_base64(&large), BASE64.encode(&large));
    }

    #[test]
    fn a_base64_object_is_what_serde_makes_of_the_same_object() {
        for bytes in [&b""[..], b"h", b"hi", b"hello\n", &[0xff; 1000]] {
            let ours = base64_object("dataBase64", bytes);
            let serde = serde_json::json!({"dataBase64": encode_base64(bytes)}).to_string();
            assert_eq!(ours.get(), serde);
        }
    }
}

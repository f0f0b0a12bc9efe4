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
    debug_assert!(member.bytes().all(|b| b.is_ascii_alphanumeric()));
    let mut json = String::with_capacity(bytes.len().div_ceil(3) * 4 + member.len() + 7);
    json.push_str("{\"");
    json.push_str(member);
    json.push_str("\":\"");
    append_base64(bytes, &mut json);
    json.push_str("\"}");
    // SAFETY: one member whose key is plain ASCII and whose value is a quoted run of base64
    // characters: a well-formed JSON object with no surrounding whitespace.
    unsafe { RawValue::from_string_unchecked(json) }
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

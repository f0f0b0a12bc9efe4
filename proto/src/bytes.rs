//! Bytes on the wire: base64 in both directions (PROTOCOL §0.3) and the empty result.

use base64::alphabet::STANDARD;
use base64::display::Base64Display;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use serde::{Serialize, Serializer};

/// Standard alphabet; always pads output, accepts padded and unpadded input.
pub const BASE64: GeneralPurpose = GeneralPurpose::new(
    &STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Serializes borrowed bytes as a base64 string, encoding straight into the output buffer
/// (no intermediate `String`).
#[derive(Debug, Clone, Copy)]
pub struct Base64<'a>(pub &'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&Base64Display::new(self.0, &BASE64))
    }
}

/// Decodes client-sent base64 (padded or not, no whitespace).
pub fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    BASE64.decode(text)
}

/// Encodes bytes as padded base64.
pub fn encode_base64(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
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
}

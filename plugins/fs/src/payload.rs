//! File bytes in a response: held once, base64-encoded straight into the response JSON.

use exec_server_core::proto::bytes::Base64;
use serde::{Serialize, Serializer};

/// Owned bytes that serialize as a padded base64 string without an intermediate `String`,
/// so a large read costs the buffer plus the response, not a third copy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Base64Bytes(pub Vec<u8>);

impl Serialize for Base64Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Base64(&self.0).serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_as_padded_base64() {
        let json = serde_json::to_string(&Base64Bytes(b"hi".to_vec())).unwrap();
        assert_eq!(json, r#""aGk=""#);
        let empty = serde_json::to_string(&Base64Bytes::default()).unwrap();
        assert_eq!(empty, r#""""#);
    }
}

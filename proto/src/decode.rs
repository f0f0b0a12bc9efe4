//! The bounded JSON decoder of PROTOCOL §2.5.
//!
//! Every inbound message is parsed here, in one pass, into a [`serde_json::Value`] while
//! counting values, tracking nesting depth and rejecting duplicate object keys. A hostile
//! message therefore costs at most its own size in memory and never recurses deeper than
//! [`MAX_DEPTH`].

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Maximum nesting depth of a message (fixed by the protocol; the top-level object is 1).
pub const MAX_DEPTH: usize = 128;

/// Limits applied to every inbound message.
#[derive(Debug, Clone, Copy)]
pub struct DecodeLimits {
    /// `limits.max_message_bytes`.
    pub max_message_bytes: usize,
    /// `limits.max_json_values`.
    pub max_json_values: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            max_message_bytes: 64 * 1024 * 1024,
            max_json_values: 262_144,
        }
    }
}

/// Why a message could not be decoded. The text is the `<detail>` of an id -1 reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

/// The `<detail>` for a message above `limits.max_message_bytes`.
pub fn oversized_detail(limit: usize) -> String {
    format!("message exceeds the maximum size of {limit} bytes")
}

/// Parses one message, enforcing every rule of PROTOCOL §2.5 except the top-level shape
/// (which [`crate::jsonrpc::classify`] checks).
pub fn decode_value(bytes: &[u8], limits: &DecodeLimits) -> Result<Value, DecodeError> {
    if bytes.len() > limits.max_message_bytes {
        return Err(DecodeError(oversized_detail(limits.max_message_bytes)));
    }
    let budget = Cell::new(limits.max_json_values);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    // Depth is enforced by `BoundedValue` itself (exactly MAX_DEPTH levels allowed), which
    // stops before recursing further, so serde_json's own (one level lower) limit is off.
    de.disable_recursion_limit();
    let seed = BoundedValue {
        depth: 1,
        budget: &budget,
        max_values: limits.max_json_values,
    };
    let value = seed
        .deserialize(&mut de)
        .map_err(|e| DecodeError(e.to_string()))?;
    de.end().map_err(|e| DecodeError(e.to_string()))?;
    Ok(value)
}

/// A `DeserializeSeed` that builds a `Value` under the decoder limits.
#[derive(Clone, Copy)]
struct BoundedValue<'a> {
    depth: usize,
    budget: &'a Cell<usize>,
    max_values: usize,
}

impl BoundedValue<'_> {
    fn count<E: de::Error>(&self) -> Result<(), E> {
        match self.budget.get().checked_sub(1) {
            Some(left) => {
                self.budget.set(left);
                Ok(())
            }
            None => Err(E::custom(format!(
                "message contains more than {} JSON values",
                self.max_values
            ))),
        }
    }

    fn nested(&self) -> Self {
        Self {
            depth: self.depth + 1,
            ..*self
        }
    }
}

impl<'de> DeserializeSeed<'de> for BoundedValue<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        if self.depth > MAX_DEPTH {
            return Err(de::Error::custom(format!(
                "message nesting exceeds the maximum depth of {MAX_DEPTH}"
            )));
        }
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BoundedValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.count()?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.count()?;
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.count()?;
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.count()?;
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.count()?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.count()?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.count()?;
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.count()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self.nested())? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.count()?;
        let mut members = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if members.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate key `{key}`")));
            }
            let value = map.next_value_seed(self.nested())?;
            members.insert(key, value);
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(values: usize) -> DecodeLimits {
        DecodeLimits {
            max_message_bytes: 1 << 20,
            max_json_values: values,
        }
    }

    #[test]
    fn counts_every_value_but_not_keys() {
        // object + 2 strings + array + 2 numbers = 6 values
        let msg = br#"{"a":"x","b":"y","c":[1,2]}"#;
        assert!(decode_value(msg, &limits(6)).is_ok());
        let err = decode_value(msg, &limits(5)).unwrap_err();
        assert!(err.0.contains("more than 5 JSON values"), "{err}");
    }

    #[test]
    fn rejects_duplicate_keys_at_any_depth() {
        let err = decode_value(br#"{"a":{"b":1,"b":2}}"#, &limits(100)).unwrap_err();
        assert!(err.0.contains("duplicate key `b`"), "{err}");
    }

    #[test]
    fn allows_exactly_max_depth() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(decode_value(ok.as_bytes(), &limits(1000)).is_ok());
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        let err = decode_value(deep.as_bytes(), &limits(1000)).unwrap_err();
        assert!(err.0.contains("maximum depth of 128"), "{err}");
    }

    #[test]
    fn very_deep_input_does_not_overflow_the_stack() {
        let deep = "[".repeat(1_000_000);
        assert!(decode_value(deep.as_bytes(), &limits(usize::MAX)).is_err());
    }

    #[test]
    fn rejects_oversized_and_trailing_garbage() {
        let small = DecodeLimits {
            max_message_bytes: 4,
            max_json_values: 10,
        };
        let err = decode_value(b"{\"a\":1}", &small).unwrap_err();
        assert_eq!(err.0, "message exceeds the maximum size of 4 bytes");
        assert!(decode_value(b"{} x", &limits(10)).is_err());
    }
}

//! The codex dialect of JSON-RPC 2.0 (PROTOCOL §2.1–§2.2): message classification by
//! member presence and the encoding of what the server sends. `"jsonrpc"` is accepted with
//! any value and never sent.

use std::fmt;

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::decode::{decode_value, DecodeError, DecodeLimits};
use crate::error::RpcError;

/// A request id: a JSON string or an integer that fits `i64`, echoed unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RequestId {
    Int(i64),
    Str(String),
}

impl RequestId {
    /// The id of replies that answer no request (§2.6).
    pub const UNTIED: RequestId = RequestId::Int(-1);

    fn from_value(value: &Value) -> Result<Self, DecodeError> {
        match value {
            Value::String(s) => Ok(Self::Str(s.clone())),
            Value::Number(n) => n.as_i64().map(Self::Int).ok_or_else(|| {
                DecodeError(format!(
                    "request id must be a string or a 64-bit signed integer, got {n}"
                ))
            }),
            other => Err(DecodeError(format!(
                "request id must be a string or a 64-bit signed integer, got {}",
                kind_name(other)
            ))),
        }
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(i) => write!(f, "{i}"),
            Self::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl Serialize for RequestId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Int(i) => s.serialize_i64(*i),
            Self::Str(v) => s.serialize_str(v),
        }
    }
}

/// An inbound message, classified per §2.1.
#[derive(Debug)]
pub enum Incoming {
    Request {
        id: RequestId,
        method: String,
        /// `Value::Null` when absent.
        params: Value,
        /// The W3C trace carrier, when present (§2.4).
        trace: Option<Value>,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// A response or error response from the client, to a request the server sent it
    /// (`network/policyRequest`); one that answers nothing pending is logged and dropped
    /// (§2.7).
    Response {
        id: Option<RequestId>,
        /// The `result`, or the `error` object.
        answer: Result<Value, Value>,
    },
}

/// Decodes and classifies one message. Errors are the `<detail>` of an id -1 reply.
pub fn parse_message(bytes: &[u8], limits: &DecodeLimits) -> Result<Incoming, DecodeError> {
    classify(decode_value(bytes, limits)?)
}

/// Classifies a decoded message by which members are present (§2.1).
pub fn classify(value: Value) -> Result<Incoming, DecodeError> {
    let mut object = match value {
        Value::Object(map) => map,
        Value::Array(_) => {
            return Err(DecodeError(
                "batch messages (JSON arrays) are not supported".into(),
            ))
        }
        other => {
            return Err(DecodeError(format!(
                "expected a JSON object, got {}",
                kind_name(&other)
            )))
        }
    };
    let id = object.get("id").map(RequestId::from_value).transpose()?;
    if let Some(method) = object.remove("method") {
        let Value::String(method) = method else {
            return Err(DecodeError("method must be a string".into()));
        };
        let params = object.remove("params").unwrap_or(Value::Null);
        return Ok(match id {
            Some(id) => Incoming::Request {
                id,
                method,
                params,
                trace: object.remove("trace"),
            },
            None => Incoming::Notification { method, params },
        });
    }
    if let Some(result) = object.remove("result") {
        return Ok(Incoming::Response {
            id,
            answer: Ok(result),
        });
    }
    if let (Some(error), Some(_)) = (object.get("error"), &id) {
        check_error_object(error)?;
        let error = object.remove("error").unwrap_or(Value::Null);
        return Ok(Incoming::Response {
            id,
            answer: Err(error),
        });
    }
    Err(DecodeError(
        "message is neither a request, a notification nor a response".into(),
    ))
}

fn check_error_object(error: &Value) -> Result<(), DecodeError> {
    let ok = error.as_object().is_some_and(|e: &Map<String, Value>| {
        e.get("code").is_some_and(Value::is_i64) && e.get("message").is_some_and(Value::is_string)
    });
    if ok {
        Ok(())
    } else {
        Err(DecodeError(
            "error object must have an integer code and a string message".into(),
        ))
    }
}

fn kind_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[derive(Serialize)]
struct ResultFrame<'a> {
    id: &'a RequestId,
    result: &'a RawValue,
}

#[derive(Serialize)]
struct ErrorFrame<'a> {
    error: &'a RpcError,
    id: &'a RequestId,
}

#[derive(Serialize)]
struct NotificationFrame<'a, P: ?Sized> {
    method: &'a str,
    params: &'a P,
}

/// Encodes `{"id":…,"result":…}`; the result is already serialized.
pub fn encode_result(id: &RequestId, result: &RawValue) -> String {
    serde_json::to_string(&ResultFrame { id, result }).expect("a raw value always serializes")
}

/// Encodes `{"error":{…},"id":…}`.
pub fn encode_error(id: &RequestId, error: &RpcError) -> String {
    serde_json::to_string(&ErrorFrame { error, id }).expect("an error object always serializes")
}

/// Encodes `{"method":…,"params":…}`.
pub fn encode_notification<P: Serialize + ?Sized>(
    method: &str,
    params: &P,
) -> Result<String, serde_json::Error> {
    serde_json::to_string(&NotificationFrame { method, params })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Incoming, DecodeError> {
        parse_message(s.as_bytes(), &DecodeLimits::default())
    }

    #[test]
    fn classifies_by_member_presence() {
        assert!(matches!(
            parse(r#"{"id":"a","method":"m","jsonrpc":"1.0"}"#).unwrap(),
            Incoming::Request { id: RequestId::Str(s), params: Value::Null, .. } if s == "a"
        ));
        assert!(matches!(
            parse(r#"{"method":"initialized"}"#).unwrap(),
            Incoming::Notification { .. }
        ));
        assert!(matches!(
            parse(r#"{"id":3,"result":null}"#).unwrap(),
            Incoming::Response { .. }
        ));
        assert!(matches!(
            parse(r#"{"id":3,"error":{"code":1,"message":"x"}}"#).unwrap(),
            Incoming::Response { .. }
        ));
        assert!(parse(r#"{"id":3,"error":{"code":1}}"#).is_err());
        assert!(parse(r#"{"id":3}"#).is_err());
        assert!(parse(r#"[{"id":1,"method":"m"}]"#)
            .unwrap_err()
            .0
            .contains("batch"));
    }

    #[test]
    fn rejects_bad_ids() {
        for id in ["null", "1.5", "true", "{}", "[]", "9223372036854775808"] {
            let msg = format!(r#"{{"id":{id},"method":"m"}}"#);
            assert!(parse(&msg).is_err(), "{msg}");
        }
        assert!(parse(r#"{"id":-9223372036854775808,"method":"m"}"#).is_ok());
    }

    #[test]
    fn encodes_frames_in_wire_order() {
        let raw = RawValue::from_string("{}".into()).unwrap();
        assert_eq!(
            encode_result(&RequestId::Int(7), &raw),
            r#"{"id":7,"result":{}}"#
        );
        assert_eq!(
            encode_error(&RequestId::UNTIED, &RpcError::unknown_method("x")),
            r#"{"error":{"code":-32601,"message":"unknown method `x`"},"id":-1}"#
        );
        assert_eq!(
            encode_notification("a/b", &serde_json::json!({"k":1})).unwrap(),
            r#"{"method":"a/b","params":{"k":1}}"#
        );
    }
}

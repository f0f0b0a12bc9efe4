//! Helpers for plugins describing their requests ([`super::Describe`]): copy the members
//! that are safe to record, measure payloads without recording them.

use std::path::PathBuf;

use serde_json::{Map, Value};

use super::{Described, Level};

/// The members `names` of `params` that are present, as they were sent.
pub fn members(params: &Value, names: &[&str]) -> Map<String, Value> {
    let mut out = Map::new();
    for name in names {
        if let Some(value) = params.get(*name) {
            out.insert((*name).to_owned(), value.clone());
        }
    }
    out
}

/// The size in bytes of the payload a base64 member holds, without decoding it.
pub fn base64_bytes(value: Option<&Value>) -> Option<u64> {
    let text = value?.as_str()?;
    let padding = text.bytes().rev().take_while(|b| *b == b'=').count();
    Some((text.len() as u64 / 4 * 3).saturating_sub(padding as u64))
}

/// A request described by `targets` (always recorded) and `asked` (recorded at `request`
/// level), reading the host paths of the members `reads` (for `workspace_roots`).
pub fn describe(
    params: &Value,
    level: Level,
    targets: &[&str],
    asked: &[&str],
    reads: &[&str],
) -> Described {
    let mut details = members(params, targets);
    if level == Level::Request {
        details.extend(members(params, asked));
    }
    let read_paths = reads
        .iter()
        .filter_map(|name| params.get(*name)?.as_str())
        .filter_map(|text| exec_server_proto::path::parse_path(text).ok())
        .collect::<Vec<PathBuf>>();
    Described {
        details,
        read_paths,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn payloads_are_measured_and_only_named_members_copied() {
        assert_eq!(base64_bytes(Some(&json!("aGVsbG8="))), Some(5));
        assert_eq!(base64_bytes(Some(&json!(""))), Some(0));
        let params = json!({"path": "/w/a", "dataBase64": "c2VjcmV0", "recursive": true});
        let d = describe(
            &params,
            Level::Metadata,
            &["path"],
            &["recursive"],
            &["path"],
        );
        assert_eq!(Value::Object(d.details), json!({"path": "/w/a"}));
        assert_eq!(d.read_paths, [PathBuf::from("/w/a")]);
        let d = describe(&params, Level::Request, &["path"], &["recursive"], &[]);
        assert_eq!(
            Value::Object(d.details),
            json!({"path": "/w/a", "recursive": true})
        );
    }
}

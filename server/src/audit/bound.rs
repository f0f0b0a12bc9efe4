//! Bounds on what one event holds. A client chooses the paths, argv and ids an event
//! records; without a bound, a few requests with megabyte-long values would rotate every
//! earlier event out of the file backend's history and hold megabytes in each queue.

use exec_server_proto::log_text::prefix;
use serde_json::{Map, Value};
use sha2::Digest as _;

/// The longest string an event keeps whole; a longer one becomes its length and hash.
pub(crate) const MAX_STRING_BYTES: usize = 4096;

/// The most elements of one array an event keeps; the rest are counted.
pub(crate) const MAX_ARRAY_ITEMS: usize = 256;

/// The longest outcome message an event keeps.
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024;

/// `details` with every string over [`MAX_STRING_BYTES`] replaced by
/// `{"truncatedBytes": <its length>, "sha256": "<hex>", "start": "<its first 256 bytes>"}`
/// and every array cut to [`MAX_ARRAY_ITEMS`] elements and `{"moreItems": <n>}`.
pub(crate) fn bound_details(details: &mut Map<String, Value>) {
    for value in details.values_mut() {
        bound(value);
    }
}

fn bound(value: &mut Value) {
    match value {
        Value::String(text) if text.len() > MAX_STRING_BYTES => {
            let hash = sha2::Sha256::digest(text.as_bytes());
            let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
            *value = serde_json::json!({
                "truncatedBytes": text.len(),
                "sha256": hex,
                "start": prefix(text, 256),
            });
        }
        Value::Array(items) => {
            if items.len() > MAX_ARRAY_ITEMS {
                let more = items.len() - MAX_ARRAY_ITEMS;
                items.truncate(MAX_ARRAY_ITEMS);
                items.push(serde_json::json!({ "moreItems": more }));
            }
            items.iter_mut().for_each(bound);
        }
        Value::Object(members) => {
            if members.len() > MAX_ARRAY_ITEMS {
                let more = members.len() - MAX_ARRAY_ITEMS;
                let kept: Map<String, Value> = std::mem::take(members)
                    .into_iter()
                    .take(MAX_ARRAY_ITEMS)
                    .collect();
                *members = kept;
                members.insert("(moreMembers)".into(), more.into());
            }
            members.values_mut().for_each(bound);
        }
        _ => {}
    }
}

/// An outcome message as an event keeps it: a decoder's quote of the value it refused
/// (between backticks: ``invalid type: integer `12345` ``) is left out, since that value
/// can be anything the client sent, a secret included; URLs lose their user information,
/// query and fragment (where credentials travel: `http/request` failures quote the URL);
/// the rest is cut to [`MAX_MESSAGE_BYTES`].
pub(crate) fn message(text: &str, invalid_params: bool) -> String {
    let text = if invalid_params {
        without_quoted_values(text)
    } else {
        text.to_owned()
    };
    let text = without_url_credentials(&text);
    if text.len() <= MAX_MESSAGE_BYTES {
        return text;
    }
    format!(
        "{}… ({} bytes)",
        prefix(&text, MAX_MESSAGE_BYTES),
        text.len()
    )
}

/// `text` with every `scheme://…` URL cut to its scheme, host and path.
pub(crate) fn without_url_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let after = at + 3;
        let end = rest[after..]
            .find(|c: char| c.is_whitespace() || matches!(c, ')' | '"' | '\'' | '>' | '`'))
            .map_or(rest.len(), |n| after + n);
        out.push_str(&rest[..after]);
        let url = &rest[after..end];
        let url = url.split(['?', '#']).next().unwrap_or_default();
        let authority_end = url.find('/').unwrap_or(url.len());
        match url[..authority_end].rfind('@') {
            Some(at_sign) => out.push_str(&url[at_sign + 1..]),
            None => out.push_str(url),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// `text` with every `` `…` `` span written as `` `…` ``.
fn without_quoted_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut quoted = false;
    for c in text.chars() {
        match (c, quoted) {
            ('`', false) => {
                out.push_str("`…");
                quoted = true;
            }
            ('`', true) => {
                out.push('`');
                quoted = false;
            }
            (_, true) => {}
            (c, false) => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn long_values_become_their_length_and_hash() {
        let mut details = Map::new();
        details.insert("path".into(), json!("A".repeat(900_000)));
        details.insert("argv".into(), json!(vec!["x"; 1000]));
        details.insert("cwd".into(), json!("/w"));
        bound_details(&mut details);
        assert_eq!(details["path"]["truncatedBytes"], 900_000);
        assert_eq!(details["path"]["sha256"].as_str().unwrap().len(), 64);
        let argv = details["argv"].as_array().unwrap();
        assert_eq!(argv.len(), MAX_ARRAY_ITEMS + 1);
        assert_eq!(
            argv[MAX_ARRAY_ITEMS],
            json!({"moreItems": 1000 - MAX_ARRAY_ITEMS})
        );
        assert_eq!(details["cwd"], "/w");
        assert!(Value::Object(details).to_string().len() < 2 * MAX_STRING_BYTES);
    }

    #[test]
    fn refused_values_are_not_quoted_and_messages_are_cut() {
        let text = "invalid type: integer `12345`, expected a string at line 1 column 9";
        assert_eq!(
            message(text, true),
            "invalid type: integer `…`, expected a string at line 1 column 9"
        );
        assert_eq!(message(text, false), text);
        let failed = "error sending request for url (http://alice:pw@h.example/p?token=s3cret#f)";
        assert_eq!(
            message(failed, false),
            "error sending request for url (http://h.example/p)"
        );
        let long = message(&"é".repeat(2000), false);
        assert!(
            long.len() < MAX_MESSAGE_BYTES + 32 && long.ends_with("(4000 bytes)"),
            "{long}"
        );
    }
}

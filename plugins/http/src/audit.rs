//! What the audit trail records of `http/request` (docs/AUDIT.md): the method and the URL
//! without its user information, query or fragment (where credentials travel) at
//! `metadata`; the header names (never their values) and the body's size at `request`.

use exec_server_core::audit::describe::{base64_bytes, members};
use exec_server_core::audit::{Described, Level, MethodAudit};
use exec_server_core::Install;
use serde_json::Value;

use crate::REQUEST;

pub(crate) fn declare(install: &mut Install<'_>) {
    install.audit_method(REQUEST, MethodAudit::changes(request));
}

fn request(params: &Value, level: Level) -> Described {
    let mut details = members(params, &["method", "requestId"]);
    if let Some(url) = params.get("url").and_then(Value::as_str) {
        details.insert("url".into(), without_credentials(url).into());
    }
    if level == Level::Request {
        let names: Vec<Value> = params
            .get("headers")
            .and_then(Value::as_array)
            .map(|headers| {
                headers
                    .iter()
                    .filter_map(|h| h.get("name").cloned())
                    .collect()
            })
            .unwrap_or_default();
        details.insert("headerNames".into(), Value::Array(names));
        if let Some(bytes) = base64_bytes(params.get("bodyBase64")) {
            details.insert("bodyBytes".into(), bytes.into());
        }
    }
    Described {
        details,
        read_paths: Vec::new(),
    }
}

/// `url` without user information, query and fragment; text that is not a URL is cut at
/// its first `?`, `#` or `@`-bearing authority the same way.
fn without_credentials(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.set_query(None);
            parsed.set_fragment(None);
            parsed.to_string()
        }
        Err(_) => "(not a URL)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn credentials_in_urls_and_headers_are_never_recorded() {
        let params = json!({"method": "GET", "url": "https://u:pw@h.example/p?token=s3cret#f",
            "headers": [{"name": "Authorization", "value": "Bearer s3cret"}], "requestId": "r"});
        let described = request(&params, Level::Request);
        let text = Value::Object(described.details).to_string();
        assert!(!text.contains("s3cret") && !text.contains("pw"), "{text}");
        assert!(
            text.contains("https://h.example/p") && text.contains("Authorization"),
            "{text}"
        );
    }
}

//! The server side of the RFC 6455 opening handshake over HTTP/1.1, owned here rather than
//! left to axum's `WebSocketUpgrade` so the connection is a tokio-tungstenite stream whose
//! writer can send a large message as several frames (see `websocket::fragments`).
//!
//! The checks, their order and their answers are axum's, with the key and version checked
//! as RFC 6455 §4.2.1 asks: a method other than `GET` is 405; a `Connection` header without
//! the `upgrade` token, an `Upgrade` other than `websocket`, anything but exactly one
//! `Sec-WebSocket-Key` that is the base64 of 16 bytes, or anything but exactly one
//! `Sec-WebSocket-Version: 13` is 400; a request hyper cannot upgrade is 426.

use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper::upgrade::OnUpgrade;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

/// A request that may be answered with 101: the client's key and hyper's upgrade future.
pub(crate) struct UpgradeRequest {
    key: HeaderValue,
    pub(crate) on_upgrade: OnUpgrade,
}

/// Why a request cannot be upgraded: its status and the text of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal(StatusCode, &'static str);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, self.1).into_response()
    }
}

/// Checks the handshake headers and takes the upgrade future out of `parts`.
pub(crate) fn upgrade_request(parts: &mut Parts) -> Result<UpgradeRequest, Refusal> {
    if parts.method != Method::GET {
        return Err(Refusal(
            StatusCode::METHOD_NOT_ALLOWED,
            "Request method must be `GET`",
        ));
    }
    if !has_token(&parts.headers, header::CONNECTION, "upgrade") {
        return Err(Refusal(
            StatusCode::BAD_REQUEST,
            "Connection header did not include 'upgrade'",
        ));
    }
    if !is(&parts.headers, header::UPGRADE, "websocket") {
        return Err(Refusal(
            StatusCode::BAD_REQUEST,
            "`Upgrade` header did not include 'websocket'",
        ));
    }
    let Some(key) = only(&parts.headers, header::SEC_WEBSOCKET_KEY).filter(|k| is_nonce(k)) else {
        return Err(Refusal(
            StatusCode::BAD_REQUEST,
            "`Sec-WebSocket-Key` must be one header: the base64 of 16 bytes",
        ));
    };
    let key = key.clone();
    if only(&parts.headers, header::SEC_WEBSOCKET_VERSION).is_none_or(|v| v != "13") {
        return Err(Refusal(
            StatusCode::BAD_REQUEST,
            "`Sec-WebSocket-Version` header did not include '13'",
        ));
    }
    let Some(on_upgrade) = parts.extensions.remove::<OnUpgrade>() else {
        return Err(Refusal(
            StatusCode::UPGRADE_REQUIRED,
            "WebSocket request couldn't be upgraded since no upgrade state was present",
        ));
    };
    Ok(UpgradeRequest { key, on_upgrade })
}

impl UpgradeRequest {
    /// The 101 answer; hyper hands the socket to `on_upgrade` once it is written.
    pub(crate) fn switching_protocols(&self) -> Response {
        let accept = derive_accept_key(self.key.as_bytes());
        (
            StatusCode::SWITCHING_PROTOCOLS,
            [
                (header::CONNECTION, "upgrade".to_owned()),
                (header::UPGRADE, "websocket".to_owned()),
                (header::SEC_WEBSOCKET_ACCEPT, accept),
            ],
        )
            .into_response()
    }
}

/// `name` is exactly `value`, ignoring ASCII case.
fn is(headers: &HeaderMap, name: header::HeaderName, value: &str) -> bool {
    headers
        .get(name)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(value.as_bytes()))
}

/// The value of `name` when the request has exactly one.
fn only(headers: &HeaderMap, name: header::HeaderName) -> Option<&HeaderValue> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    values.next().is_none().then_some(first)
}

/// The client's nonce: 16 bytes in padded base64, 24 characters.
fn is_nonce(key: &HeaderValue) -> bool {
    key.len() == 24
        && key
            .to_str()
            .ok()
            .and_then(|text| exec_server_proto::bytes::decode_base64(text).ok())
            .is_some_and(|bytes| bytes.len() == 16)
}

/// One of the comma-separated tokens of `name` is `token`, ignoring ASCII case.
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.as_bytes()
            .split(|b| *b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    fn parts(method: Method, headers: &[(&str, &str)]) -> Parts {
        let mut request = Request::builder().method(method).uri("/");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    const VALID: [(&str, &str); 4] = [
        ("connection", "keep-alive, Upgrade"),
        ("upgrade", "WebSocket"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("sec-websocket-version", "13"),
    ];

    fn status(method: Method, headers: &[(&str, &str)]) -> StatusCode {
        match upgrade_request(&mut parts(method, headers)) {
            Ok(_) => StatusCode::SWITCHING_PROTOCOLS,
            Err(refusal) => refusal.0,
        }
    }

    #[test]
    fn each_missing_piece_has_its_status() {
        assert_eq!(status(Method::POST, &VALID), StatusCode::METHOD_NOT_ALLOWED);
        for (skip, expected) in [
            (0, StatusCode::BAD_REQUEST),
            (1, StatusCode::BAD_REQUEST),
            (2, StatusCode::BAD_REQUEST),
            (3, StatusCode::BAD_REQUEST),
        ] {
            let headers: Vec<_> = VALID
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != skip)
                .map(|(_, h)| *h)
                .collect();
            assert_eq!(status(Method::GET, &headers), expected, "without {skip}");
        }
        let mut old = VALID;
        old[3] = ("sec-websocket-version", "8");
        assert_eq!(status(Method::GET, &old), StatusCode::BAD_REQUEST);
        for key in [
            "",
            "!!!",
            "dGhlIHNhbXBsZSBub25jZQ",
            "dGhlIHNhbXBsZSBub25jZQ==AAAA",
        ] {
            let mut bad = VALID;
            bad[2] = ("sec-websocket-key", key);
            assert_eq!(
                status(Method::GET, &bad),
                StatusCode::BAD_REQUEST,
                "{key:?}"
            );
        }
        for twice in [VALID[2], VALID[3], ("sec-websocket-version", "8")] {
            let headers = [&VALID[..], &[twice]].concat();
            assert_eq!(
                status(Method::GET, &headers),
                StatusCode::BAD_REQUEST,
                "{twice:?}"
            );
        }
        // Valid headers, but nothing hyper could upgrade (no OnUpgrade in the request).
        assert_eq!(status(Method::GET, &VALID), StatusCode::UPGRADE_REQUIRED);
    }

    #[test]
    fn the_accept_key_is_rfc_6455_s_example() {
        let request = UpgradeRequest {
            key: HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="),
            on_upgrade: hyper::upgrade::on(Request::new(())),
        };
        let response = request.switching_protocols();
        assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(
            response.headers()[header::SEC_WEBSOCKET_ACCEPT],
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }
}

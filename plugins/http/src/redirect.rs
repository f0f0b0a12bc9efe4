//! Following a redirect by hand (CODEX-NETWORK.md §2.4): the next request after a 3xx, with
//! the method, body and headers each status calls for, a `referer`, and the credentials of
//! one origin never sent to another: `authorization`, cookies, and every header whose
//! value came from the server's environment (`valueEnvVar`), whatever its name.

use bytes::Bytes;
use exec_server_core::proto::RpcError;
use reqwest::header::{
    HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, COOKIE,
    HOST, LOCATION, PROXY_AUTHORIZATION, REFERER, TRANSFER_ENCODING, WWW_AUTHENTICATE,
};
use reqwest::{Method, StatusCode};
use url::Url;

use crate::wire;

/// Redirects followed at most; the next one fails the request.
pub(crate) const MAX_REDIRECTS: usize = 10;

/// One request of the exchange.
#[derive(Debug, Clone)]
pub(crate) struct Hop {
    pub(crate) method: Method,
    pub(crate) url: Url,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Option<Bytes>,
}

/// The request a redirect answer asks for, or `None` when `status` is no redirect (or
/// names no `location`).
pub(crate) fn next_hop(
    hop: &Hop,
    status: StatusCode,
    headers: &HeaderMap,
) -> Result<Option<Hop>, RpcError> {
    let code = status.as_u16();
    if !matches!(code, 301 | 302 | 303 | 307 | 308) {
        return Ok(None);
    }
    let Some(location) = headers.get(LOCATION).and_then(|l| l.to_str().ok()) else {
        return Ok(None);
    };
    let url = hop
        .url
        .join(location)
        .map_err(|e| wire::failed(format!("redirect location is invalid: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(wire::failed(format!(
            "redirect target uses unsupported URL scheme: {}",
            url.scheme()
        )));
    }
    let mut next = Hop {
        method: hop.method.clone(),
        url,
        headers: hop.headers.clone(),
        body: hop.body.clone(),
    };
    let to_get = match code {
        301 | 302 => hop.method == Method::POST,
        303 => hop.method != Method::HEAD,
        _ => false,
    };
    if to_get {
        next.method = Method::GET;
        next.body = None;
        for name in [
            CONTENT_TYPE,
            CONTENT_LENGTH,
            CONTENT_ENCODING,
            TRANSFER_ENCODING,
        ] {
            next.headers.remove(name);
        }
    }
    let same_origin = hop.url.origin() == next.url.origin();
    if !same_origin {
        for name in [
            AUTHORIZATION,
            COOKIE,
            PROXY_AUTHORIZATION,
            WWW_AUTHENTICATE,
            HOST,
        ] {
            next.headers.remove(name);
        }
        next.headers.remove("cookie2");
        drop_sensitive(&mut next.headers);
    }
    next.headers.remove(REFERER);
    if let Some(referer) = referer(&hop.url, &next.url, same_origin) {
        next.headers.insert(REFERER, referer);
    }
    Ok(Some(next))
}

/// Removes every header that carries a server secret (a `valueEnvVar` value, marked
/// sensitive when it was read), whatever its name: an `x-api-key` is a credential of its
/// origin as much as an `authorization` is.
fn drop_sensitive(headers: &mut HeaderMap) {
    let secret: Vec<_> = headers
        .iter()
        .filter(|(_, value)| value.is_sensitive())
        .map(|(name, _)| name.clone())
        .collect();
    for name in secret {
        headers.remove(name);
    }
}

/// The `referer` of a hop from `from` to `to`: the whole previous URL within one origin,
/// only its origin across origins, none from `https` to `http`.
fn referer(from: &Url, to: &Url, same_origin: bool) -> Option<HeaderValue> {
    if from.scheme() == "https" && to.scheme() == "http" {
        return None;
    }
    let mut shown = from.clone();
    shown.set_fragment(None);
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    let text = if same_origin {
        shown.to_string()
    } else {
        format!("{}/", shown.origin().ascii_serialization())
    };
    HeaderValue::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop(method: Method, url: &str) -> Hop {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        headers.insert(COOKIE, HeaderValue::from_static("a=b"));
        let mut secret = HeaderValue::from_static("from-the-environment");
        secret.set_sensitive(true);
        headers.insert("x-api-key", secret);
        headers.insert("x-plain", HeaderValue::from_static("kept"));
        Hop {
            method,
            url: Url::parse(url).unwrap(),
            headers,
            body: Some(Bytes::from_static(b"body")),
        }
    }

    fn redirect(to: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(LOCATION, HeaderValue::from_str(to).unwrap());
        headers
    }

    #[test]
    fn same_origin_keeps_credentials_and_sends_the_whole_referer() {
        let first = hop(Method::POST, "http://127.0.0.1:8080/redirect");
        let next = next_hop(&first, StatusCode::TEMPORARY_REDIRECT, &redirect("/next"))
            .unwrap()
            .unwrap();
        assert_eq!(next.url.as_str(), "http://127.0.0.1:8080/next");
        assert_eq!(next.method, Method::POST);
        assert_eq!(next.body.as_deref(), Some(&b"body"[..]));
        assert_eq!(next.headers[AUTHORIZATION], "Bearer t");
        assert_eq!(next.headers[REFERER], "http://127.0.0.1:8080/redirect");
    }

    #[test]
    fn another_origin_gets_no_credentials_and_only_the_origin_as_referer() {
        let first = hop(Method::GET, "http://127.0.0.1:8080/redirect");
        let next = next_hop(
            &first,
            StatusCode::FOUND,
            &redirect("http://127.0.0.1:9090/x"),
        )
        .unwrap()
        .unwrap();
        assert!(next.headers.get(AUTHORIZATION).is_none());
        assert!(next.headers.get(COOKIE).is_none());
        assert!(next.headers.get("x-api-key").is_none(), "a server secret");
        assert_eq!(next.headers["x-plain"], "kept");
        assert_eq!(next.headers[REFERER], "http://127.0.0.1:8080/");
        let secure = hop(Method::GET, "https://a.test/");
        let down = next_hop(&secure, StatusCode::FOUND, &redirect("http://a.test/"))
            .unwrap()
            .unwrap();
        assert!(down.headers.get(REFERER).is_none());
    }

    #[test]
    fn methods_and_bodies_change_as_the_status_says() {
        let post = hop(Method::POST, "http://h.test/");
        for (status, method, body) in [
            (StatusCode::MOVED_PERMANENTLY, Method::GET, false),
            (StatusCode::FOUND, Method::GET, false),
            (StatusCode::SEE_OTHER, Method::GET, false),
            (StatusCode::TEMPORARY_REDIRECT, Method::POST, true),
            (StatusCode::PERMANENT_REDIRECT, Method::POST, true),
        ] {
            let next = next_hop(&post, status, &redirect("/n")).unwrap().unwrap();
            assert_eq!(next.method, method, "{status}");
            assert_eq!(next.body.is_some(), body, "{status}");
            assert_eq!(next.headers.get(CONTENT_TYPE).is_some(), body, "{status}");
        }
        let put = hop(Method::PUT, "http://h.test/");
        let next = next_hop(&put, StatusCode::FOUND, &redirect("/n"))
            .unwrap()
            .unwrap();
        assert_eq!(next.method, Method::PUT);
        let head = hop(Method::HEAD, "http://h.test/");
        let next = next_hop(&head, StatusCode::SEE_OTHER, &redirect("/n"))
            .unwrap()
            .unwrap();
        assert_eq!(next.method, Method::HEAD);
    }

    #[test]
    fn other_schemes_and_non_redirects_end_the_chain() {
        let first = hop(Method::GET, "http://h.test/");
        let error = next_hop(&first, StatusCode::FOUND, &redirect("ftp://h.test/")).unwrap_err();
        assert_eq!(
            error.message,
            "http/request failed: redirect target uses unsupported URL scheme: ftp"
        );
        assert!(next_hop(&first, StatusCode::OK, &redirect("/x"))
            .unwrap()
            .is_none());
        assert!(next_hop(&first, StatusCode::FOUND, &HeaderMap::new())
            .unwrap()
            .is_none());
    }
}

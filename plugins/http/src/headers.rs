//! Request headers from the client's list, response headers for the client's answer.
//!
//! A request header with `valueEnvVar` takes its value from the executor's own
//! environment: `value` followed by that variable's value (CODEX-NETWORK.md §2.6). The
//! variables that hold the executor's own credentials can never be sent this way: codex's
//! list, and every `EXEC_SERVER_*` variable (this server's tokens and keys).

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, ACCEPT_ENCODING};

use exec_server_core::proto::RpcError;

use crate::wire::{self, HeaderOut, HeaderParam};

/// What `accept-encoding` says when the client sends none: the encodings the body is
/// decoded from.
const ACCEPTED_ENCODINGS: &str = "zstd,gzip";

/// Variables no header may carry, compared without case (codex 0.171.0's list).
const DENIED_VARIABLES: &[&str] = &[
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
    "CODEX_ACCESS_TOKEN",
    "CODEX_CONNECTORS_TOKEN",
    "CODEX_GUARDIAN_DECISIONS_API_KEY",
    "CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN",
    "OPENAI_FEDERATION_RULE_ID",
    "OPENAI_IDENTITY_TOKEN_FILE",
    "OPENAI_WORKLOAD_IDENTITY_CONTEXT",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_CLIENT_SECRET",
    "AZURE_FEDERATED_TOKEN_FILE",
    "GOOGLE_APPLICATION_CREDENTIALS",
];

/// Prefix of this server's own variables (tokens, keys, configuration), none of which a
/// header may carry.
const OWN_PREFIX: &str = "EXEC_SERVER_";

/// The request's headers: the client's, in order and lowercased, then `accept` and
/// `accept-encoding` where the client sent none (`host` and `content-length` are added
/// when the request is written).
pub(crate) fn request_headers(
    params: &[HeaderParam],
    env: impl Fn(&str) -> Option<String>,
) -> Result<HeaderMap, RpcError> {
    let mut headers = HeaderMap::with_capacity(params.len() + 2);
    for header in params {
        let name = HeaderName::from_bytes(header.name.as_bytes())
            .map_err(|_| wire::invalid_header_name())?;
        let value = header_value(header, name.as_str(), &env)?;
        headers.append(name, value);
    }
    if !headers.contains_key(ACCEPT) {
        headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
    }
    if !headers.contains_key(ACCEPT_ENCODING) {
        headers.insert(
            ACCEPT_ENCODING,
            HeaderValue::from_static(ACCEPTED_ENCODINGS),
        );
    }
    Ok(headers)
}

/// One header's value: `value`, or `value` + the variable `valueEnvVar` names.
fn header_value(
    header: &HeaderParam,
    name: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<HeaderValue, RpcError> {
    let mut text = header.value.clone();
    if let Some(var) = &header.value_env_var {
        text.push_str(&variable(name, var, env)?);
    }
    let mut value = HeaderValue::from_str(&text).map_err(|_| wire::invalid_header_value(name))?;
    if header.value_env_var.is_some() {
        // Kept out of any debug output of the request.
        value.set_sensitive(true);
    }
    Ok(value)
}

/// The value of `var` for header `name`: refused when denied (checked first, without
/// case), missing, not a usable name, or empty.
fn variable(
    name: &str,
    var: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<String, RpcError> {
    if is_denied(var) {
        return Err(wire::env_var_denied(name, var));
    }
    if var.is_empty() || var.contains(['=', '\0']) {
        return Err(wire::env_var_missing(name, var));
    }
    match env(var) {
        None => Err(wire::env_var_missing(name, var)),
        Some(value) if value.is_empty() => Err(wire::env_var_empty(name, var)),
        Some(value) => Ok(value),
    }
}

fn is_denied(var: &str) -> bool {
    DENIED_VARIABLES.iter().any(|d| d.eq_ignore_ascii_case(var))
        || var
            .get(..OWN_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(OWN_PREFIX))
}

/// The server process's variable `var`, if it is set and valid UTF-8.
pub(crate) fn process_env(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

/// The answer's headers in the order they came, names lowercase; a value that is not
/// UTF-8 is left out, as codex does.
pub(crate) fn response_headers(headers: &HeaderMap) -> Vec<HeaderOut> {
    headers
        .iter()
        .filter_map(|(name, value)| {
            let value = std::str::from_utf8(value.as_bytes()).ok()?;
            Some(HeaderOut {
                name: name.as_str().to_owned(),
                value: value.to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str, value: &str, var: Option<&str>) -> HeaderParam {
        HeaderParam {
            name: name.to_owned(),
            value: value.to_owned(),
            value_env_var: var.map(str::to_owned),
        }
    }

    fn env(var: &str) -> Option<String> {
        match var {
            "MY_TOKEN" => Some("sekrit".to_owned()),
            "EMPTY" => Some(String::new()),
            "OPENAI_API_KEY" | "EXEC_SERVER_TOKEN" => Some("real".to_owned()),
            _ => None,
        }
    }

    #[test]
    fn client_headers_come_first_lowercased_then_the_defaults() {
        let params = [header("X-A", "1", None), header("x-a", "2", None)];
        let headers = request_headers(&params, env).unwrap();
        let names: Vec<_> = headers.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["x-a", "accept", "accept-encoding"]);
        assert_eq!(headers.get_all("x-a").iter().count(), 2);
        assert_eq!(headers["accept-encoding"], "zstd,gzip");
        let own = request_headers(&[header("Accept-Encoding", "identity", None)], env).unwrap();
        assert_eq!(own["accept-encoding"], "identity");
    }

    #[test]
    fn value_env_var_is_a_prefix_rule_with_a_denylist() {
        let bearer = [header("authorization", "Bearer ", Some("MY_TOKEN"))];
        assert_eq!(
            request_headers(&bearer, env).unwrap()["authorization"],
            "Bearer sekrit"
        );
        let cases = [
            (
                "OPENAI_API_KEY",
                "cannot use executor environment variable OPENAI_API_KEY",
            ),
            (
                "openai_api_key",
                "cannot use executor environment variable openai_api_key",
            ),
            (
                "EXEC_SERVER_TOKEN",
                "cannot use executor environment variable EXEC_SERVER_TOKEN",
            ),
            ("UNSET", "requires executor environment variable UNSET"),
            ("", "requires executor environment variable "),
            (
                "BAD=NAME",
                "requires executor environment variable BAD=NAME",
            ),
            (
                "EMPTY",
                "requires a non-empty executor environment variable EMPTY",
            ),
        ];
        for (var, expected) in cases {
            let error =
                request_headers(&[header("authorization", "", Some(var))], env).unwrap_err();
            assert_eq!(error.code, -32602);
            assert_eq!(
                error.message,
                format!("http/request header authorization {expected}")
            );
        }
    }

    #[test]
    fn bad_names_and_values_are_refused() {
        let error = request_headers(&[header("bad name", "x", None)], env).unwrap_err();
        assert_eq!(
            error.message,
            "http/request header name is invalid: invalid HTTP header name"
        );
        let error = request_headers(&[header("x-a", "a\r\nb", None)], env).unwrap_err();
        assert_eq!(
            error.message,
            "http/request header value is invalid for x-a: failed to parse header value"
        );
    }

    #[test]
    fn values_that_are_not_utf8_are_left_out() {
        let mut headers = HeaderMap::new();
        headers.append("x-bin", HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        headers.append("x-ok", HeaderValue::from_bytes("é".as_bytes()).unwrap());
        let out = response_headers(&headers);
        assert_eq!(
            out,
            [HeaderOut {
                name: "x-ok".into(),
                value: "é".into()
            }]
        );
    }
}

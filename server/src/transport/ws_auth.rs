//! Checking the credential of a WebSocket upgrade (CODEX-0169 §3.2–§3.4): the
//! `Authorization: Bearer` header against the configured [`WebsocketAuth`], with codex's
//! failure texts.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use exec_server_config::secret::constant_time_eq;
use exec_server_config::ws_auth::token_digest;
use exec_server_config::WebsocketAuth;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// Why an upgrade was refused; the body of its 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    Missing,
    MalformedHeader,
    WrongToken,
    InvalidJwt,
    Expired,
    NotYetValid,
    IssuerMismatch,
    AudienceMismatch,
}

impl AuthFailure {
    /// codex 0.169.0's body text for this failure.
    pub fn text(self) -> &'static str {
        match self {
            Self::Missing => "missing websocket bearer token",
            Self::MalformedHeader => "invalid authorization header",
            Self::WrongToken => "invalid websocket bearer token",
            Self::InvalidJwt => "invalid websocket jwt",
            Self::Expired => "expired websocket jwt",
            Self::NotYetValid => "websocket jwt is not valid yet",
            Self::IssuerMismatch => "websocket jwt issuer mismatch",
            Self::AudienceMismatch => "websocket jwt audience mismatch",
        }
    }

    /// `401` with the text as a `text/plain` body. `WWW-Authenticate: Bearer` is added
    /// (codex sends none; RFC 9110 requires it on a 401, and clients ignore it).
    pub fn into_response(self) -> Response {
        (
            StatusCode::UNAUTHORIZED,
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                ),
                (header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")),
            ],
            self.text(),
        )
            .into_response()
    }
}

/// Checks `headers` against `auth`. Only the `Authorization` header counts: a token in
/// the query string is ignored.
pub fn authenticate(auth: &WebsocketAuth, headers: &HeaderMap) -> Result<(), AuthFailure> {
    if auth.is_none() {
        return Ok(());
    }
    let token = bearer_token(headers.get(header::AUTHORIZATION))?;
    match auth {
        WebsocketAuth::None => Ok(()),
        WebsocketAuth::CapabilityToken { digest } => {
            if constant_time_eq(&token_digest(token), digest) {
                Ok(())
            } else {
                Err(AuthFailure::WrongToken)
            }
        }
        WebsocketAuth::SignedBearerToken {
            secret,
            issuer,
            audience,
            max_clock_skew_seconds,
        } => check_jwt(
            token,
            secret.expose(),
            issuer.as_deref(),
            audience.as_deref(),
            *max_clock_skew_seconds,
        ),
    }
}

/// The token of `Authorization: Bearer <token>`: split at the first space, the scheme
/// compared ignoring case, the rest trimmed and not empty.
fn bearer_token(value: Option<&HeaderValue>) -> Result<&str, AuthFailure> {
    let value = value.ok_or(AuthFailure::Missing)?;
    let text = value.to_str().map_err(|_| AuthFailure::MalformedHeader)?;
    let (scheme, rest) = text.split_once(' ').ok_or(AuthFailure::MalformedHeader)?;
    let token = rest.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(AuthFailure::MalformedHeader);
    }
    Ok(token)
}

/// HS256 only; `exp` required; `nbf`, `iss` and `aud` checked as configured, with
/// `skew` seconds of leeway on the times.
fn check_jwt(
    token: &str,
    secret: &[u8],
    issuer: Option<&str>,
    audience: Option<&str>,
    skew: u64,
) -> Result<(), AuthFailure> {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.leeway = skew;
    validation.validate_exp = true;
    validation.validate_nbf = true;
    // A configured issuer or audience must be present, not merely match when present.
    let mut required = vec!["exp"];
    match issuer {
        Some(issuer) => {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        None => validation.iss = None,
    }
    match audience {
        Some(audience) => {
            validation.set_audience(&[audience]);
            required.push("aud");
        }
        None => validation.validate_aud = false,
    }
    validation.set_required_spec_claims(&required);
    let key = DecodingKey::from_secret(secret);
    match jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation) {
        Ok(_) => Ok(()),
        Err(error) => Err(match error.kind() {
            ErrorKind::ExpiredSignature => AuthFailure::Expired,
            ErrorKind::ImmatureSignature => AuthFailure::NotYetValid,
            ErrorKind::InvalidIssuer => AuthFailure::IssuerMismatch,
            ErrorKind::InvalidAudience => AuthFailure::AudienceMismatch,
            ErrorKind::MissingRequiredClaim(claim) if claim == "iss" => AuthFailure::IssuerMismatch,
            ErrorKind::MissingRequiredClaim(claim) if claim == "aud" => {
                AuthFailure::AudienceMismatch
            }
            _ => AuthFailure::InvalidJwt,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).unwrap()
    }

    #[test]
    fn the_header_parses_as_codex_parses_it() {
        assert_eq!(bearer_token(None), Err(AuthFailure::Missing));
        assert_eq!(bearer_token(Some(&header("bearer   tok  "))), Ok("tok"));
        assert_eq!(bearer_token(Some(&header("BEARER tok"))), Ok("tok"));
        for bad in ["Bearer", "Bearer    ", "Basic tok", "Bearertok"] {
            assert_eq!(
                bearer_token(Some(&header(bad))),
                Err(AuthFailure::MalformedHeader),
                "{bad}"
            );
        }
        let not_text = HeaderValue::from_bytes(b"Bearer \xff").unwrap();
        assert_eq!(
            bearer_token(Some(&not_text)),
            Err(AuthFailure::MalformedHeader)
        );
    }
}

//! Checking the credential of a WebSocket upgrade (CODEX-0169 §3.2–§3.4): the
//! `Authorization: Bearer` header against the configured [`WebsocketAuth`], with codex's
//! failure texts.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use exec_server_config::secret::constant_time_eq;
use exec_server_config::ws_auth::token_digest;
use exec_server_config::WebsocketAuth;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::audit::AuthIdentity;

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

/// The header types [`authenticate`] takes, for the `ws_auth` fuzz target, whose crate
/// depends on no HTTP crate. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use axum::http::{HeaderMap, HeaderName, HeaderValue};
}

/// Checks `headers` against `auth`. Only the `Authorization` header counts: a token in
/// the query string is ignored.
pub fn authenticate(auth: &WebsocketAuth, headers: &HeaderMap) -> Result<(), AuthFailure> {
    authenticate_as(auth, headers).map(|_| ())
}

/// Like [`authenticate`], answering who the credential names, for the audit trail: a
/// capability token by `sha256:<the first 16 hex digits of its digest>` (never the token),
/// a JWT by its `sub` and `iss`.
pub fn authenticate_as(
    auth: &WebsocketAuth,
    headers: &HeaderMap,
) -> Result<AuthIdentity, AuthFailure> {
    let anonymous = |mode| AuthIdentity {
        mode,
        subject: None,
        issuer: None,
    };
    if auth.is_none() {
        return Ok(anonymous("none"));
    }
    let token = bearer_token(headers.get(header::AUTHORIZATION))?;
    match auth {
        WebsocketAuth::None => Ok(anonymous("none")),
        WebsocketAuth::CapabilityToken { digest } => {
            if constant_time_eq(&token_digest(token), digest) {
                let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
                Ok(AuthIdentity {
                    subject: Some(format!("sha256:{hex}")),
                    ..anonymous("capability-token")
                })
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

/// HS256 only: the library checks the header and the signature, and no claim. The claims
/// are judged here as CODEX-0169 §3.3 states them (the library's own claim checks are
/// laxer about types and overflow on large skews): `now > exp + skew` is expired,
/// `now < nbf - skew` not yet valid, then `iss` and `aud` as configured, in saturating
/// arithmetic so any skew the configuration accepts works.
fn check_jwt(
    token: &str,
    secret: &[u8],
    issuer: Option<&str>,
    audience: Option<&str>,
    skew: u64,
) -> Result<AuthIdentity, AuthFailure> {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    let key = DecodingKey::from_secret(secret);
    let claims = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation)
        .map_err(|_| AuthFailure::InvalidJwt)?
        .claims;
    let claims = JwtClaims::read(&claims).ok_or(AuthFailure::InvalidJwt)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let skew = i64::try_from(skew).unwrap_or(i64::MAX);
    if now > claims.exp.saturating_add(skew) {
        return Err(AuthFailure::Expired);
    }
    if claims.nbf.is_some_and(|nbf| now < nbf.saturating_sub(skew)) {
        return Err(AuthFailure::NotYetValid);
    }
    if issuer.is_some() && claims.iss != issuer {
        return Err(AuthFailure::IssuerMismatch);
    }
    if let Some(audience) = audience {
        if !claims.aud.is_some_and(|aud| aud.contains(&audience)) {
            return Err(AuthFailure::AudienceMismatch);
        }
    }
    Ok(AuthIdentity {
        mode: "signed-bearer-token",
        subject: claims.sub.map(str::to_owned),
        issuer: claims.iss.map(str::to_owned),
    })
}

/// The claims §3.3 judges, each of its own type.
struct JwtClaims<'a> {
    exp: i64,
    nbf: Option<i64>,
    iss: Option<&'a str>,
    /// A single audience is a list of one.
    aud: Option<Vec<&'a str>>,
    /// Who the token names (recorded, never judged); a `sub` of another type is ignored.
    sub: Option<&'a str>,
}

impl<'a> JwtClaims<'a> {
    /// `None` when `exp` is missing or not an integer, or another claim is present (not
    /// `null`) with another type than its own: the token is invalid, as for codex.
    fn read(claims: &'a Map<String, Value>) -> Option<Self> {
        let present = |name: &str| claims.get(name).filter(|value| !value.is_null());
        let exp = present("exp")?.as_i64()?;
        let nbf = match present("nbf") {
            Some(nbf) => Some(nbf.as_i64()?),
            None => None,
        };
        let iss = match present("iss") {
            Some(iss) => Some(iss.as_str()?),
            None => None,
        };
        let aud = match present("aud") {
            Some(Value::String(one)) => Some(vec![one.as_str()]),
            Some(Value::Array(many)) => {
                Some(many.iter().map(Value::as_str).collect::<Option<_>>()?)
            }
            Some(_) => return None,
            None => None,
        };
        let sub = claims.get("sub").and_then(Value::as_str);
        Some(Self {
            exp,
            nbf,
            iss,
            aud,
            sub,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-hs256";

    fn now() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    /// An HS256 JWT over `claims`, whatever JSON a signer put there.
    fn jwt(claims: &Value) -> String {
        let key = jsonwebtoken::EncodingKey::from_secret(SECRET);
        jsonwebtoken::encode(&jsonwebtoken::Header::new(Algorithm::HS256), claims, &key).unwrap()
    }

    /// The check with issuer `issuer-a`, audience `aud-a` and `skew`.
    fn check(claims: &Value, skew: u64) -> Result<(), AuthFailure> {
        check_jwt(&jwt(claims), SECRET, Some("issuer-a"), Some("aud-a"), skew).map(|_| ())
    }

    #[test]
    fn identities_name_the_credential_without_revealing_it() {
        let claims = json!({"exp": now() + 60, "iss": "issuer-a", "aud": "aud-a", "sub": "ci-bot"});
        let who = check_jwt(&jwt(&claims), SECRET, Some("issuer-a"), Some("aud-a"), 30).unwrap();
        assert_eq!(
            (who.mode, who.subject.as_deref(), who.issuer.as_deref()),
            ("signed-bearer-token", Some("ci-bot"), Some("issuer-a"))
        );
        let token = "a-capability-token-of-some-length";
        let auth = WebsocketAuth::CapabilityToken {
            digest: token_digest(token),
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        let who = authenticate_as(&auth, &headers).unwrap();
        let subject = who.subject.unwrap();
        assert!(
            subject.starts_with("sha256:") && subject.len() == 7 + 16,
            "{subject}"
        );
        assert!(!subject.contains(token));
    }

    /// Found by the `ws_auth` fuzz target: claims of another type than the spec's were
    /// ignored or coerced (a string `nbf`, a fractional `exp`, an `iss` list, a claims
    /// array) and the token accepted. Each makes the token invalid, as for codex.
    #[test]
    fn ill_typed_claims_make_the_token_invalid() {
        let t = now();
        let good = json!({"exp": t + 300, "iss": "issuer-a", "aud": ["x", "aud-a"]});
        let with = |name: &str, value: Value| {
            let mut claims = good.clone();
            claims[name] = value;
            claims
        };
        assert_eq!(check(&good, 30), Ok(()));
        for claims in [
            with("nbf", json!("2099-01-01")),
            with("nbf", json!(1.5)),
            with("exp", json!(t as f64 + 300.5)),
            with("exp", json!(u64::MAX)),
            with("exp", json!(null)),
            with("iss", json!(["issuer-a"])),
            with("aud", json!(["aud-a", 5])),
            with("aud", json!({"aud-a": true})),
            json!([t + 300, 0, "sub", "issuer-a", "aud-a"]),
        ] {
            assert_eq!(check(&claims, 30), Err(AuthFailure::InvalidJwt), "{claims}");
        }
        // A null claim is an absent one; a negative `exp` is an integer, long expired.
        assert_eq!(check(&with("nbf", json!(null)), 30), Ok(()));
        assert_eq!(
            check(&with("iss", json!(null)), 30),
            Err(AuthFailure::IssuerMismatch)
        );
        assert_eq!(
            check(&with("exp", json!(-5)), 30),
            Err(AuthFailure::Expired)
        );
    }

    /// Found by the `ws_auth` fuzz target: a `max_clock_skew_seconds` above the Unix time
    /// overflowed in the JWT library (a panic with overflow checks; without them every
    /// token was expired). Every skew the configuration accepts saturates instead.
    #[test]
    fn the_largest_skews_saturate() {
        let far = json!({"exp": 1, "nbf": now() + 1_000_000, "iss": "issuer-a", "aud": "aud-a"});
        for skew in [1 << 62, i64::MAX as u64, u64::MAX] {
            assert_eq!(check(&far, skew), Ok(()), "{skew}");
        }
        let extremes = json!({"exp": i64::MAX, "nbf": i64::MIN, "iss": "issuer-a", "aud": "aud-a"});
        assert_eq!(check(&extremes, i64::MAX as u64), Ok(()));
    }

    /// Found by the `ws_auth` fuzz target: a missing `iss` was named before an expiry.
    /// codex judges expiry, then `nbf`, then the issuer, then the audience.
    #[test]
    fn failures_are_named_in_codex_order() {
        let t = now();
        let cases = [
            (
                json!({"exp": t - 100, "nbf": t + 100}),
                AuthFailure::Expired,
            ),
            (
                json!({"exp": t + 100, "nbf": t + 100}),
                AuthFailure::NotYetValid,
            ),
            (
                json!({"exp": t + 100, "aud": "aud-b"}),
                AuthFailure::IssuerMismatch,
            ),
            (
                json!({"exp": t + 100, "iss": "issuer-a"}),
                AuthFailure::AudienceMismatch,
            ),
        ];
        for (claims, failure) in cases {
            assert_eq!(check(&claims, 0), Err(failure), "{claims}");
        }
    }

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

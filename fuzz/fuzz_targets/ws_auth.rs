#![no_main]
//! WebSocket upgrade authentication (CODEX-0169 §3.2–§3.4): `authenticate(auth, headers)`
//! of `exec_server_core::transport::ws_auth`, for every mode, against a reference written
//! here from the spec alone (its own SHA-256, HMAC and base64url; the claim rules of
//! §3.3), so acceptance is judged independently of the JWT library.
//!
//! The first byte picks the input's shape:
//! * even: the rest is a raw header block (`Name: value` lines) and byte 1 picks the
//!   configuration: none, capability token, or HS256 JWT with or without issuer,
//!   audience, and a skew of 0, 30 or 2^62 s. Seeds hold tokens as the tests make them.
//! * odd: the rest drives a generator that builds a JWT claim by claim (every claim of
//!   every type: `exp`, `nbf`, `iss`, `aud`, extras), a header (`alg`, `typ`), signs it
//!   with the configured secret, another one or not at all, and presents it in an
//!   `Authorization` header among others.
//!
//! Invariants: never a panic; the answer is the reference's — the same acceptance and the
//! same failure — except within a second of a time boundary, and where the spec leaves a
//! choice (duplicate members, header members other than `alg`/`typ`): there an accepted
//! token must still be one the reference accepts.

use std::sync::OnceLock;

use exec_server_config::ws_auth::{read_shared_secret, token_digest, SharedSecret};
use exec_server_config::WebsocketAuth;
use exec_server_core::transport::ws_auth::fuzzing::{HeaderMap, HeaderName, HeaderValue};
use exec_server_core::transport::ws_auth::{authenticate, AuthFailure};
use libfuzzer_sys::arbitrary::{Result as ArbResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};

const SECRET: &str = "0123456789abcdef0123456789abcdef-hs256";
const WRONG_SECRET: &str = "another-secret-another-secret-12";
const CAPABILITY_TOKEN: &str = "capability-token-0123456789";
const ISSUER: &str = "issuer-a";
const AUDIENCE: &str = "aud-a";

/// The configured secret, read through the server's own secret-file reader.
fn secret() -> &'static SharedSecret {
    static SECRET_READ: OnceLock<SharedSecret> = OnceLock::new();
    SECRET_READ.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("jwt-secret");
        std::fs::write(&path, format!("{SECRET}\n")).expect("the secret file is written");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .expect("the secret file is owner-only");
        read_shared_secret(&path).expect("the secret file is accepted")
    })
}

#[derive(Debug, Clone)]
enum Mode {
    None,
    Capability,
    Jwt {
        issuer: Option<&'static str>,
        audience: Option<&'static str>,
        skew: u64,
    },
}

impl Mode {
    fn auth(&self) -> WebsocketAuth {
        match self {
            Self::None => WebsocketAuth::None,
            Self::Capability => WebsocketAuth::CapabilityToken {
                digest: token_digest(CAPABILITY_TOKEN),
            },
            Self::Jwt {
                issuer,
                audience,
                skew,
            } => WebsocketAuth::SignedBearerToken {
                secret: secret().clone(),
                issuer: issuer.map(str::to_owned),
                audience: audience.map(str::to_owned),
                max_clock_skew_seconds: *skew,
            },
        }
    }
}

/// Configurations picked by one byte: the largest skew is what the configuration accepts
/// (`max_clock_skew_seconds` fits in an i64).
fn mode_of(byte: u8) -> Mode {
    const SKEWS: [u64; 4] = [0, 30, 1 << 62, i64::MAX as u64];
    match byte % 4 {
        0 => Mode::None,
        1 => Mode::Capability,
        _ => Mode::Jwt {
            issuer: (byte & 0x10 != 0).then_some(ISSUER),
            audience: (byte & 0x20 != 0).then_some(AUDIENCE),
            skew: SKEWS[usize::from(byte >> 6)],
        },
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    if selector % 2 == 0 {
        let Some((&config, block)) = rest.split_first() else {
            return;
        };
        check(&mode_of(config), &header_lines(block), true);
    } else {
        let mut u = Unstructured::new(rest);
        if let Ok((mode, headers)) = generated(&mut u) {
            check(&mode, &headers, false);
        }
    }
});

/// `Name: value` lines (LF or CRLF); lines without a colon are skipped.
fn header_lines(block: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    block
        .split(|b| *b == b'\n')
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|b| *b == b':')?;
            let value = &line[colon + 1..];
            let value = value.strip_prefix(b" ").unwrap_or(value);
            Some((line[..colon].to_vec(), value.to_vec()))
        })
        .collect()
}

/// Runs the server's check on the headers an HTTP parser would have let through, and
/// compares it with the reference.
fn check(mode: &Mode, raw: &[(Vec<u8>, Vec<u8>)], raw_input: bool) {
    let mut headers = HeaderMap::new();
    let mut kept: Vec<(String, Vec<u8>)> = Vec::new();
    for (name, value) in raw {
        let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        else {
            continue;
        };
        kept.push((name.as_str().to_owned(), value.as_bytes().to_vec()));
        headers.append(name, value);
    }
    let before = now();
    let got = authenticate(&mode.auth(), &headers);
    let after = now();
    let authorization = kept
        .iter()
        .find(|(name, _)| name == "authorization")
        .map(|(_, value)| value.as_slice());
    let (expected, sure) = reference(mode, authorization, before);
    let (expected_after, _) = reference(mode, authorization, after);
    if expected != expected_after {
        return; // A second ticked over a boundary of exp or nbf.
    }
    if sure {
        assert_eq!(
            got,
            expected,
            "mode {mode:?}, authorization {:?}, raw input {raw_input}",
            authorization.map(String::from_utf8_lossy)
        );
    } else if got.is_ok() {
        assert_eq!(
            expected,
            Ok(()),
            "accepted where the reference refuses: mode {mode:?}, authorization {:?}",
            authorization.map(String::from_utf8_lossy)
        );
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

// ---- the reference ------------------------------------------------------------------

/// The answer §3.2–§3.4 give for the first `Authorization` value at `now`, and whether
/// the spec decides it fully (else only an acceptance is checked against it).
fn reference(
    mode: &Mode,
    authorization: Option<&[u8]>,
    now: i64,
) -> (Result<(), AuthFailure>, bool) {
    if matches!(mode, Mode::None) {
        return (Ok(()), true);
    }
    let token = match bearer(authorization) {
        Ok(token) => token,
        Err(failure) => return (Err(failure), true),
    };
    match mode {
        Mode::None => (Ok(()), true),
        Mode::Capability => {
            let answer = if token == CAPABILITY_TOKEN {
                Ok(())
            } else {
                Err(AuthFailure::WrongToken)
            };
            (answer, true)
        }
        Mode::Jwt {
            issuer,
            audience,
            skew,
        } => jwt_reference(token, *issuer, *audience, *skew, now),
    }
}

/// §3.2: visible ASCII, split at the first space, the scheme `Bearer` in any case, the
/// rest trimmed and not empty.
fn bearer(value: Option<&[u8]>) -> Result<&str, AuthFailure> {
    let value = value.ok_or(AuthFailure::Missing)?;
    if !value
        .iter()
        .all(|b| *b == b'\t' || (0x20..0x7f).contains(b))
    {
        return Err(AuthFailure::MalformedHeader);
    }
    let text = std::str::from_utf8(value).map_err(|_| AuthFailure::MalformedHeader)?;
    let space = text.find(' ').ok_or(AuthFailure::MalformedHeader)?;
    let (scheme, rest) = (&text[..space], text[space + 1..].trim());
    if !scheme.eq_ignore_ascii_case("bearer") || rest.is_empty() {
        return Err(AuthFailure::MalformedHeader);
    }
    Ok(rest)
}

/// §3.3 for a JWT: three base64url parts, header `alg` HS256, the HMAC-SHA256 of the
/// first two parts under the secret, then `exp` (an integer, required), `nbf`, `iss` and
/// `aud` (each absent, null, or of its type), judged in that order.
fn jwt_reference(
    token: &str,
    issuer: Option<&str>,
    audience: Option<&str>,
    skew: u64,
    now: i64,
) -> (Result<(), AuthFailure>, bool) {
    let invalid = (Err(AuthFailure::InvalidJwt), true);
    let parts: Vec<&str> = token.split('.').collect();
    let [header, payload, signature] = parts[..] else {
        return invalid;
    };
    let Some(header) = base64url_decode(header) else {
        return invalid;
    };
    let mut sure = !has_duplicate_members(&header);
    let Ok(Value::Object(header)) = serde_json::from_slice::<Value>(&header) else {
        return invalid;
    };
    if header.get("alg") != Some(&json!("HS256")) {
        return (Err(AuthFailure::InvalidJwt), sure);
    }
    // `typ` is a string when present; other members are the JOSE header's business.
    sure &= header.keys().all(|k| k == "alg" || k == "typ");
    sure &= matches!(
        header.get("typ"),
        None | Some(Value::String(_)) | Some(Value::Null)
    );
    let signing_input = &token[..token.len() - signature.len() - 1];
    let mac = hmac_sha256(SECRET.as_bytes(), signing_input.as_bytes());
    if base64url_decode(signature).as_deref() != Some(&mac[..]) {
        return (Err(AuthFailure::InvalidJwt), sure);
    }
    let Some(payload) = base64url_decode(payload) else {
        return (Err(AuthFailure::InvalidJwt), sure);
    };
    sure &= !has_duplicate_members(&payload);
    let Ok(Value::Object(claims)) = serde_json::from_slice::<Value>(&payload) else {
        return (Err(AuthFailure::InvalidJwt), sure);
    };
    match claims_verdict(&claims, issuer, audience, skew, now) {
        Some(verdict) => (verdict, sure),
        None => (Err(AuthFailure::InvalidJwt), sure),
    }
}

/// The claim checks; `None` when a claim has the wrong type.
fn claims_verdict(
    claims: &Map<String, Value>,
    issuer: Option<&str>,
    audience: Option<&str>,
    skew: u64,
    now: i64,
) -> Option<Result<(), AuthFailure>> {
    let present = |name: &str| claims.get(name).filter(|v| !v.is_null());
    let exp = claims.get("exp")?.as_i64()?;
    let nbf = match present("nbf") {
        None => None,
        Some(v) => Some(v.as_i64()?),
    };
    let iss = match present("iss") {
        None => None,
        Some(v) => Some(v.as_str()?),
    };
    let aud: Option<Vec<&str>> = match present("aud") {
        None => None,
        Some(Value::String(one)) => Some(vec![one.as_str()]),
        Some(Value::Array(many)) => Some(many.iter().map(Value::as_str).collect::<Option<_>>()?),
        Some(_) => return None,
    };
    let skew = i64::try_from(skew).unwrap_or(i64::MAX);
    if now > exp.saturating_add(skew) {
        return Some(Err(AuthFailure::Expired));
    }
    if nbf.is_some_and(|nbf| now < nbf.saturating_sub(skew)) {
        return Some(Err(AuthFailure::NotYetValid));
    }
    if issuer.is_some() && iss != issuer {
        return Some(Err(AuthFailure::IssuerMismatch));
    }
    if let Some(audience) = audience {
        if !aud.is_some_and(|aud| aud.contains(&audience)) {
            return Some(Err(AuthFailure::AudienceMismatch));
        }
    }
    Some(Ok(()))
}

/// Whether the top-level object of `json` names a member twice (JSON leaves the meaning
/// open: RFC 7519 lets a parser refuse or take the last).
fn has_duplicate_members(json: &[u8]) -> bool {
    top_level_members(json).is_some_and(|names| {
        let unique: std::collections::HashSet<&String> = names.iter().collect();
        unique.len() != names.len()
    })
}

/// The member names of the object `json` is, in order, or `None` for anything else.
fn top_level_members(json: &[u8]) -> Option<Vec<String>> {
    let skip = |i: usize| {
        i + json[i.min(json.len())..]
            .iter()
            .take_while(|b| b" \t\r\n".contains(b))
            .count()
    };
    // One JSON value from `i`: its end.
    let value_end = |i: usize| -> Option<(Value, usize)> {
        let mut values = serde_json::Deserializer::from_slice(&json[i..]).into_iter::<Value>();
        let value = values.next()?.ok()?;
        Some((value, i + values.byte_offset()))
    };
    let mut i = skip(0);
    if json.get(i) != Some(&b'{') {
        return None;
    }
    let mut names = Vec::new();
    i = skip(i + 1);
    if json.get(i) == Some(&b'}') {
        return Some(names);
    }
    loop {
        let (Value::String(name), end) = value_end(i)? else {
            return None;
        };
        names.push(name);
        i = skip(end);
        if json.get(i) != Some(&b':') {
            return None;
        }
        let (_, end) = value_end(i + 1)?;
        i = skip(end);
        match json.get(i) {
            Some(b',') => i = skip(i + 1),
            Some(b'}') => return Some(names),
            _ => return None,
        }
    }
}

// ---- SHA-256, HMAC and base64url, from FIPS 180-4, RFC 2104 and RFC 4648 ------------

fn sha256(message: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut padded = message.to_vec();
    padded.push(0x80);
    while padded.len() % 64 != 56 {
        padded.push(0);
    }
    padded.extend_from_slice(&((message.len() as u64) * 8).to_be_bytes());
    for block in padded.chunks(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (slot, add) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *slot = slot.wrapping_add(add);
        }
    }
    let mut out = [0u8; 32];
    for (i, word) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&word.to_be_bytes());
    }
    out
}

fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&sha256(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = sha256(&[pad(0x36), message.to_vec()].concat());
    sha256(&[pad(0x5c), inner.to_vec()].concat())
}

const B64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(B64URL[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// Strict base64url without padding: the canonical encoding of some bytes, or `None`.
fn base64url_decode(text: &str) -> Option<Vec<u8>> {
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for c in text.bytes() {
        let value = B64URL.iter().position(|b| *b == c)? as u32;
        bits = bits << 6 | value;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    // Leftover bits must be zero, and a lone sixth of a byte is no encoding.
    (bits == 0 && count < 6 && base64url(&out) == text).then_some(out)
}

// ---- the generator ------------------------------------------------------------------

/// A configuration and the headers of one upgrade carrying a JWT built claim by claim.
fn generated(u: &mut Unstructured) -> ArbResult<(Mode, Vec<(Vec<u8>, Vec<u8>)>)> {
    let mode = Mode::Jwt {
        issuer: if u.arbitrary()? { Some(ISSUER) } else { None },
        audience: if u.arbitrary()? { Some(AUDIENCE) } else { None },
        skew: match u.int_in_range(0..=4u8)? {
            0 => 0,
            1 => 30,
            2 => u.int_in_range(0..=3_600)?,
            3 => u.int_in_range(0..=i64::MAX as u64)?,
            _ => i64::MAX as u64,
        },
    };
    let t = now();
    let mut header = Map::new();
    let alg = match u.int_in_range(0..=6u8)? {
        0 => None,
        1 => Some(json!("HS384")),
        2 => Some(json!("none")),
        3 => Some(json!("hs256")),
        4 => Some(json!(["HS256"])),
        _ => Some(json!("HS256")),
    };
    if let Some(alg) = alg {
        header.insert("alg".into(), alg);
    }
    let (name, value) = match u.int_in_range(0..=4u8)? {
        0 => ("typ", Value::Null),
        1 => ("typ", json!("at+jwt")),
        2 => ("kid", json!("k1")),
        3 => ("typ", json!(5)),
        _ => ("typ", json!("JWT")),
    };
    header.insert(name.into(), value);
    let mut claims = Map::new();
    for name in ["exp", "nbf"] {
        if let Some(value) = time_claim(u, t)? {
            claims.insert(name.into(), value);
        }
    }
    if let Some(value) = text_claim(u, ISSUER, "issuer-b")? {
        claims.insert("iss".into(), value);
    }
    if let Some(value) = text_claim(u, AUDIENCE, "aud-b")? {
        claims.insert("aud".into(), value);
    }
    if u.arbitrary()? {
        claims.insert("sub".into(), json!("x"));
    }
    if u.arbitrary()? {
        claims.insert("jti".into(), Value::from(u.arbitrary::<u32>()?));
    }
    let header = base64url(Value::Object(header).to_string().as_bytes());
    let payload = match u.int_in_range(0..=9u8)? {
        // A payload that is not a claims object, or one written out by hand.
        0 => base64url(
            json!([t + 300, 0, "s", ISSUER, AUDIENCE])
                .to_string()
                .as_bytes(),
        ),
        1 => {
            let raw: &str = u.arbitrary()?;
            base64url(raw.as_bytes())
        }
        2 => {
            let claims = Value::Object(claims).to_string();
            let dup = format!("{{\"exp\":{},{}", t - 3_600, &claims[1..]);
            base64url(dup.as_bytes())
        }
        _ => base64url(Value::Object(claims).to_string().as_bytes()),
    };
    let signing_input = format!("{header}.{payload}");
    let mut signature = match u.int_in_range(0..=7u8)? {
        0 => base64url(&hmac_sha256(
            WRONG_SECRET.as_bytes(),
            signing_input.as_bytes(),
        )),
        1 => String::new(),
        _ => base64url(&hmac_sha256(SECRET.as_bytes(), signing_input.as_bytes())),
    };
    if u.ratio(1, 8)? && !signature.is_empty() {
        // One character of the signature changed.
        let at = u.choose_index(signature.len())?;
        let replacement = char::from(B64URL[u.choose_index(64)?]);
        signature.replace_range(at..at + 1, &replacement.to_string());
    }
    let mut token = format!("{signing_input}.{signature}");
    if u.ratio(1, 16)? {
        token.push('=');
    }
    let scheme = *u.choose(&["Bearer", "bearer", "BEARER", "Basic", "Bearer\t"])?;
    let spaces = " ".repeat(u.int_in_range(1..=3)?);
    let trailing = *u.choose(&["", " ", "\t", "  "])?;
    let mut headers = Vec::new();
    if u.arbitrary()? {
        headers.push((b"x-codex-token".to_vec(), token.clone().into_bytes()));
    }
    let authorization = format!("{scheme}{spaces}{token}{trailing}").into_bytes();
    match u.int_in_range(0..=7u8)? {
        0 => {}
        1 => headers.push((b"Authorization".to_vec(), authorization)),
        2 => {
            // A second Authorization header: only the first counts.
            headers.push((b"authorization".to_vec(), b"Bearer other".to_vec()));
            headers.push((b"authorization".to_vec(), authorization));
        }
        _ => headers.push((b"authorization".to_vec(), authorization)),
    }
    Ok((mode, headers))
}

/// `exp` or `nbf`: absent, or a value of every type, most often near now.
fn time_claim(u: &mut Unstructured, t: i64) -> ArbResult<Option<Value>> {
    let near = |u: &mut Unstructured| -> ArbResult<i64> { Ok(t + u.int_in_range(-400..=400)?) };
    Ok(Some(match u.int_in_range(0..=15u8)? {
        0 => return Ok(None),
        1 => Value::Null,
        2 => json!(near(u)? as f64 + 0.5),
        3 => json!(near(u)? as f64),
        4 => json!(near(u)?.to_string()),
        5 => json!(true),
        6 => json!(u.arbitrary::<i64>()?),
        7 => json!(u.int_in_range(i64::MAX as u64 + 1..=u64::MAX)?),
        8 => json!(-u.int_in_range(1..=i64::MAX)?),
        9 => json!([near(u)?]),
        _ => json!(near(u)?),
    }))
}

/// `iss` or `aud`: absent, the expected value, another, or a value of another type.
fn text_claim(u: &mut Unstructured, good: &str, other: &str) -> ArbResult<Option<Value>> {
    Ok(Some(match u.int_in_range(0..=10u8)? {
        0 => return Ok(None),
        1 => Value::Null,
        2 => json!(other),
        3 => json!([other, good]),
        4 => json!([other]),
        5 => json!([]),
        6 => json!(5),
        7 => json!([good, 5]),
        8 => json!(""),
        _ => json!(good),
    }))
}

#![no_main]
//! The rendezvous's HTTP surface (RELAY §7, §8.2–§8.5, §8.10): the service's own axum
//! routes called in-process over a memory store (`exec_server_rendezvous::fuzzing`), the
//! signed socket URLs and harness authorisations of `signing`, and the Redis store's
//! decoding of what Redis sends back.
//!
//! The first byte picks the surface:
//! * 0 — a registry session: byte 1 picks the configuration (base path, tight limits,
//!   `insecure_no_auth`), the rest is a script of requests separated by `\n---\n`, each
//!   `OP TOKEN TARGET` on its first line, `H name: value` header lines, then the body:
//!   `register|connect|validate` (TARGET is the environment path segment), `upgrade`
//!   (TARGET is a path and query), `get|post` (any path), `sweep SECS`, `detach ENV`,
//!   `leave ENV`. TOKEN is `e` (executor), `h` (harness), `a` (any role, `env-*` only),
//!   `o` (another tenant's executor), `-` (no header) or a literal token. `{hybrid}`,
//!   `{classic}`, `{classic2}` expand to key JSON; `{reg}`, `{authz}`, `{exec}` and
//!   `{harness}` to the last registration id, authorisation, executor and harness URL
//!   (path and query) the service answered; `{now}` to the time.
//! * 1 — a signed URL: lines role, environment, registration, key hash and expiry (seconds
//!   from now) are signed with the service's key as the service signs them, then edited by
//!   the rest (`d`elete, `i`nsert, `r`eplace, `a`ppend ops) and sent as an upgrade.
//! * 2 — a harness key authorisation (lines env, reg, kh, exp, v) signed, edited likewise
//!   and verified; the whole input is verified as a token too.
//! * 3 — a Redis reply (RESP) handed to every decoder of the Redis store.
//!
//! Invariants: no panic and no 500; every registry answer is JSON, an error in the
//! `{"error": {"code", "message"}}` shape; no call succeeds without a token of the right
//! role and environments; a registration's answer names its environment, a `reg-` id and
//! a socket URL of this service; `validate` is true only for an authorisation the service
//! issued for that environment and registration; an upgrade's signature verifies only for
//! what the service (or, for surface 1, the harness with the service's key) signed, and
//! is admitted only unexpired; an authorisation verifies only as the exact token signed;
//! a Redis reply yields no registration without an id, never names this node as another,
//! nor a lost environment this node does not hold.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use exec_server_relay_core::endpoint::encode_segment;
use exec_server_relay_core::noise::NoisePublicKey;
use exec_server_rendezvous::config::{RendezvousConfig, TokenConfig, TokenRole};
use exec_server_rendezvous::fuzzing::{decode_store_reply, Answer, InProcessService, WS_BASE};
use exec_server_rendezvous::signing::{token_digest, AuthorizationClaims, SigningKey};
use exec_server_rendezvous::store::{Connectable, Held, Lost};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

const KEY: &[u8] = b"rendezvous-fuzz-signing-key-0123456789";
const NODE: &str = "ws://node-a.example:8443";

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector % 4 {
        0 => registry_session(rest),
        1 => signed_url(rest),
        2 => authorization(rest),
        _ => store_reply(rest),
    }
});

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

fn key() -> SigningKey {
    SigningKey::new(KEY).expect("a long enough key")
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

// ---- configuration ------------------------------------------------------------------

/// The tokens of the session: `(token, tenant, role, environments)`.
const TOKENS: [(&str, &str, TokenRole, &str); 4] = [
    ("executor-token", "exec", TokenRole::Executor, "*"),
    ("harness-token", "harn", TokenRole::Harness, "*"),
    ("any-token", "any", TokenRole::Any, "env-*"),
    ("other-executor-token", "other", TokenRole::Executor, "*"),
];

#[derive(Debug, Clone, Copy)]
struct Variant {
    base_path: bool,
    tight: bool,
    no_auth: bool,
}

impl Variant {
    fn of(byte: u8) -> Self {
        Self {
            base_path: byte & 1 != 0,
            tight: byte & 2 != 0,
            no_auth: byte & 4 != 0,
        }
    }

    fn config(self) -> RendezvousConfig {
        let mut config = RendezvousConfig::default();
        if self.no_auth {
            config.insecure_no_auth = true;
        } else {
            config.tokens = TOKENS
                .iter()
                .map(|(token, tenant, role, environments)| TokenConfig {
                    name: (*tenant).to_owned(),
                    sha256: token_digest(token)
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect(),
                    role: *role,
                    environments: vec![(*environments).to_owned()],
                    max_environments: None,
                    max_harness_sockets: None,
                })
                .collect();
        }
        if self.base_path {
            config.base_path = "/rdv/".to_owned();
        }
        if self.tight {
            config.max_environments = 2;
            config.max_environments_per_tenant = 1;
            config.max_harness_sockets_per_environment = 1;
            config.max_request_body_bytes = 2_048;
            config.rate_limit_per_ip_burst = 6;
            config.rate_limit_per_ip_per_sec = 1;
            config.rate_limit_per_tenant_burst = 4;
            config.rate_limit_per_tenant_per_sec = 1;
        }
        config
    }

    /// The role and environment patterns a bearer token gets, if any.
    fn grant(self, token: Option<&str>) -> Option<(TokenRole, &'static str)> {
        let token = token?;
        if self.no_auth {
            return Some((TokenRole::Any, "*"));
        }
        TOKENS
            .iter()
            .find(|(t, ..)| *t == token)
            .map(|(_, _, role, environments)| (*role, *environments))
    }
}

// ---- surface 0: a registry session ----------------------------------------------------

/// What the service handed out so far in a session.
#[derive(Default)]
struct Issued {
    /// The canonical strings of the socket URLs it signed.
    urls: HashSet<String>,
    /// Each authorisation, with the environment and registration it was issued for.
    authorizations: HashMap<String, (String, String)>,
    /// Placeholder values.
    vars: HashMap<&'static str, String>,
}

fn registry_session(data: &[u8]) {
    let Some((&variant, script)) = data.split_first() else {
        return;
    };
    let variant = Variant::of(variant);
    let Ok(service) = InProcessService::new(variant.config(), key()) else {
        panic!("the configuration is accepted");
    };
    let script = String::from_utf8_lossy(script);
    let mut issued = Issued::default();
    runtime().block_on(async {
        for record in script.split("\n---\n").take(64) {
            step(&service, variant, &mut issued, record).await;
        }
    });
}

fn keys() -> &'static [(&'static str, String); 3] {
    static KEYS: OnceLock<[(&'static str, String); 3]> = OnceLock::new();
    KEYS.get_or_init(|| {
        let hybrid = json!({
            "suite": "Noise_hybridIK_X25519+MLKEM768_AESGCM_SHA256",
            "x25519_public_key": format!("{}AwM=", "AwMD".repeat(10)),
            "mlkem768_public_key": format!("{}BAQ=", "BAQE".repeat(394)),
        });
        [
            (
                "{classic}",
                NoisePublicKey::x25519([1; 32]).to_json().to_string(),
            ),
            (
                "{classic2}",
                NoisePublicKey::x25519([2; 32]).to_json().to_string(),
            ),
            ("{hybrid}", hybrid.to_string()),
        ]
    })
}

fn expand(text: &str, issued: &Issued) -> String {
    if !text.contains('{') {
        return text.to_owned();
    }
    let mut out = text.to_owned();
    for (name, value) in keys() {
        out = out.replace(name, value);
    }
    for (name, value) in &issued.vars {
        out = out.replace(name, value);
    }
    out.replace("{now}", &now().to_string())
}

async fn step(service: &InProcessService, variant: Variant, issued: &mut Issued, record: &str) {
    let (first, rest) = record.split_once('\n').unwrap_or((record, ""));
    let mut words = first.splitn(3, ' ');
    let op = words.next().unwrap_or("");
    let token = match words.next().unwrap_or("-") {
        "-" => None,
        "e" => Some(TOKENS[0].0.to_owned()),
        "h" => Some(TOKENS[1].0.to_owned()),
        "a" => Some(TOKENS[2].0.to_owned()),
        "o" => Some(TOKENS[3].0.to_owned()),
        other => Some(other.to_owned()),
    };
    let target = expand(words.next().unwrap_or(""), issued);
    let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut body = rest;
    while let Some(line) = body.strip_prefix("H ") {
        let (line, after) = line.split_once('\n').unwrap_or((line, ""));
        if let Some((name, value)) = line.split_once(':') {
            headers.push((
                name.as_bytes().to_vec(),
                value.trim_start().as_bytes().to_vec(),
            ));
        }
        body = after;
    }
    let body = expand(body, issued);
    if let Some(token) = &token {
        headers.insert(
            0,
            (
                b"authorization".to_vec(),
                format!("Bearer {token}").into_bytes(),
            ),
        );
    }
    let base = service.base_path().to_owned();
    let call = match op.bytes().next() {
        Some(b'r') => "register",
        Some(b'c') => "connect",
        Some(b'v') => "validate",
        Some(b'u') => return upgrade(service, issued, &target).await,
        Some(b'g') => return plain(service, b"GET", &target, &headers, &body).await,
        Some(b'p') => return plain(service, b"POST", &target, &headers, &body).await,
        Some(b's') => {
            let secs = target.trim().parse::<u64>().unwrap_or(0).min(100_000_000);
            return service.sweep_after(Duration::from_secs(secs)).await;
        }
        Some(b'd') => return service.detach(&target, false).await,
        Some(b'l') => return service.detach(&target, true).await,
        _ => return,
    };
    let path = format!("{base}/cloud/environment/{target}/{call}");
    let header_refs: Vec<(&[u8], &[u8])> = headers
        .iter()
        .map(|(n, v)| (n.as_slice(), v.as_slice()))
        .collect();
    let peer = SocketAddr::from(([127, 0, 0, 1], 40_000));
    let request = body.clone().into_bytes();
    if let Some(answer) = service
        .request(b"POST", path.as_bytes(), &header_refs, request, peer)
        .await
    {
        let call = Call {
            path: &path,
            base: &base,
            token: token.as_deref(),
            body: &body,
        };
        check_registry_answer(variant, issued, &call, &answer);
    }
}

/// A registry request as it was sent.
struct Call<'a> {
    path: &'a str,
    base: &'a str,
    token: Option<&'a str>,
    body: &'a str,
}

/// The invariants of a registry answer; what it issued is noted in `issued`.
fn check_registry_answer(variant: Variant, issued: &mut Issued, call: &Call, answer: &Answer) {
    let path = call.path;
    assert_ne!(answer.status, 500, "{path}");
    let Ok(value) = serde_json::from_slice::<Value>(&answer.body) else {
        // Only the router's and the extractors' own refusals are not JSON.
        assert!(
            matches!(answer.status, 400 | 404 | 405),
            "{path}: {} {:?}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        );
        return;
    };
    if answer.status != 200 {
        assert!(
            value["error"]["code"].is_string() && value["error"]["message"].is_string(),
            "{path}: {} {value}",
            answer.status
        );
        return;
    }
    // A success needs a token of the right role and environments. The target may have
    // moved the call into the query, or named another call.
    let Some((name, id)) = routed(path, call.base) else {
        panic!("{path} answered {value}");
    };
    let needs = if name == "connect" {
        TokenRole::Harness
    } else {
        TokenRole::Executor
    };
    let Some((role, environments)) = variant.grant(call.token) else {
        panic!("{name} of {id:?} succeeded without a known token: {value}");
    };
    assert!(
        role == needs || role == TokenRole::Any,
        "{name} with {role:?}"
    );
    assert!(
        environments == "*" || id.starts_with(environments.trim_end_matches('*')),
        "{name} of {id:?} with a token for {environments}"
    );
    let request: Value = serde_json::from_str(call.body).unwrap_or(Value::Null);
    match name.as_str() {
        "register" => {
            assert_eq!(value["environment_id"], json!(id), "{value}");
            assert_eq!(value["security_profile"], request["security_profile"]);
            let reg = value["executor_registration_id"].as_str().unwrap_or("");
            assert!(
                reg.len() == 36
                    && reg.starts_with("reg-")
                    && reg[4..].bytes().all(|b| b.is_ascii_hexdigit()),
                "{reg:?}"
            );
            let url = value["url"].as_str().unwrap_or("");
            let signed =
                canonical_of_issued(url, call.base).expect("an executor URL of this service");
            issued.urls.insert(signed);
            issued.vars.insert("{reg}", reg.to_owned());
            issued
                .vars
                .insert("{exec}", url[WS_BASE.len()..].to_owned());
        }
        "connect" => {
            let url = value["url"].as_str().unwrap_or("");
            let signed =
                canonical_of_issued(url, call.base).expect("a harness URL of this service");
            issued.urls.insert(signed);
            let reg = value["executor_registration_id"].as_str().unwrap_or("");
            let authz = value["harness_key_authorization"].as_str().unwrap_or("");
            assert!(authz.starts_with("v1."), "{value}");
            assert!(value["executor_public_key"].is_object(), "{value}");
            issued
                .authorizations
                .insert(authz.to_owned(), (id.clone(), reg.to_owned()));
            issued.vars.insert("{authz}", authz.to_owned());
            issued
                .vars
                .insert("{harness}", url[WS_BASE.len()..].to_owned());
        }
        _ => {
            let valid = value["valid"].as_bool().expect("validate answers valid");
            if valid {
                let authz = request["harness_key_authorization"].as_str().unwrap_or("");
                let Some((env, reg)) = issued.authorizations.get(authz) else {
                    panic!("valid for an authorisation never issued: {authz:?}");
                };
                assert_eq!(*env, id, "valid for another environment's authorisation");
                assert_eq!(
                    request["executor_registration_id"].as_str(),
                    Some(reg.as_str())
                );
            }
        }
    }
}

/// A request outside the registry endpoints: never a 500.
async fn plain(
    service: &InProcessService,
    method: &[u8],
    target: &str,
    headers: &[(Vec<u8>, Vec<u8>)],
    body: &str,
) {
    let header_refs: Vec<(&[u8], &[u8])> = headers
        .iter()
        .map(|(n, v)| (n.as_slice(), v.as_slice()))
        .collect();
    let peer = SocketAddr::from(([10, 0, 0, 9], 5_000));
    if let Some(answer) = service
        .request(
            method,
            target.as_bytes(),
            &header_refs,
            body.as_bytes().to_vec(),
            peer,
        )
        .await
    {
        assert_ne!(answer.status, 500, "{target}");
    }
}

async fn upgrade(service: &InProcessService, issued: &Issued, target: &str) {
    let Some(outcome) = service.upgrade(target.as_bytes()).await else {
        return;
    };
    assert_ne!(outcome.refused, Some(500), "{target}");
    if let Some((role, reg, kh, exp)) = &outcome.verified {
        let signed = canonical(role, &outcome.environment, reg, kh, *exp);
        assert!(
            issued.urls.contains(&signed),
            "a URL the service never signed verified: {target} as {signed:?}"
        );
    }
    assert!(!outcome.admitted || outcome.unexpired, "{target}");
}

/// The signed string of a socket URL (RELAY §8.4).
fn canonical(role: &str, environment: &str, reg: &str, kh: &str, exp: u64) -> String {
    format!("exec-server-rendezvous/v1\n{role}\n{environment}\n{reg}\n{kh}\n{exp}")
}

/// What a URL the service answered with says it signed, read without the service's code.
fn canonical_of_issued(url: &str, base: &str) -> Option<String> {
    let rest = url.strip_prefix(WS_BASE)?.strip_prefix(base)?;
    let rest = rest.strip_prefix("/ws/environment/")?;
    let (segment, query) = rest.split_once('?')?;
    let environment = percent_decode(segment)?;
    let mut fields: HashMap<&str, &str> = HashMap::new();
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=')?;
        fields.insert(k, v);
    }
    let role = *fields.get("role")?;
    let kh = if role == "harness" {
        fields.get("kh")?
    } else {
        ""
    };
    let exp = fields.get("exp")?.parse().ok()?;
    Some(canonical(role, &environment, fields.get("reg")?, kh, exp))
}

/// The registry call and the environment id a request for `path` reaches.
fn routed(path: &str, base: &str) -> Option<(String, String)> {
    let path = path.split(['?', '#']).next()?;
    let rest = path
        .strip_prefix(base)?
        .strip_prefix("/cloud/environment/")?;
    let (segment, call) = rest.split_once('/')?;
    Some((call.to_owned(), percent_decode(segment)?))
}

/// `%XX` escapes decoded (a `%` not followed by two hex digits stays as it is); `None`
/// when the result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let hex = |i: usize| bytes.get(i).and_then(|b| char::from(*b).to_digit(16));
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (byte, ..) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

// ---- surfaces 1 and 2: signed URLs and authorisations ---------------------------------

/// Applies the edit ops of `script` to `text`: `d` pos len, `r` pos byte, `i` pos text
/// (to a NUL), `a` text (to a NUL); positions are bytes taken modulo the length.
fn edit(text: &str, script: &[u8]) -> Vec<u8> {
    let mut out = text.as_bytes().to_vec();
    let mut ops = script.iter().copied();
    let at = |b: u8, len: usize| {
        if len == 0 {
            0
        } else {
            usize::from(b) % (len + 1)
        }
    };
    let until_nul =
        |ops: &mut dyn Iterator<Item = u8>| -> Vec<u8> { ops.take_while(|b| *b != 0).collect() };
    while let Some(op) = ops.next() {
        match op {
            b'd' => {
                let (Some(p), Some(n)) = (ops.next(), ops.next()) else {
                    break;
                };
                let p = at(p, out.len());
                let end = (p + usize::from(n % 8)).min(out.len());
                out.drain(p..end);
            }
            b'r' => {
                let (Some(p), Some(b)) = (ops.next(), ops.next()) else {
                    break;
                };
                if !out.is_empty() {
                    let p = usize::from(p) % out.len();
                    out[p] = b;
                }
            }
            b'i' => {
                let Some(p) = ops.next() else {
                    break;
                };
                let p = at(p, out.len());
                let text = until_nul(&mut ops);
                out.splice(p..p, text);
            }
            b'a' => {
                let text = until_nul(&mut ops);
                out.extend(text);
            }
            _ => {}
        }
    }
    out
}

/// The first `n` lines of `data` and what follows them.
fn lines(data: &[u8], n: usize) -> (Vec<String>, &[u8]) {
    let mut rest = data;
    let mut out = Vec::new();
    for _ in 0..n {
        let end = rest.iter().position(|b| *b == b'\n').unwrap_or(rest.len());
        out.push(String::from_utf8_lossy(&rest[..end]).into_owned());
        rest = rest.get(end + 1..).unwrap_or(&[]);
    }
    (out, rest)
}

/// One service for every signed-URL input: its store stays empty, so nothing is kept
/// from one input to the next.
fn url_service() -> &'static InProcessService {
    static SERVICE: OnceLock<InProcessService> = OnceLock::new();
    SERVICE.get_or_init(|| {
        InProcessService::new(Variant::of(0).config(), key()).expect("the service starts")
    })
}

fn signed_url(data: &[u8]) {
    let (fields, script) = lines(data, 5);
    let [role, environment, reg, kh, offset] = &fields[..] else {
        return;
    };
    let t = now();
    let exp = t.saturating_add_signed(offset.trim().parse::<i64>().unwrap_or(0));
    // As the service signs: an executor URL names no key hash.
    let kh = if role == "environment" {
        ""
    } else {
        kh.as_str()
    };
    let sig = key().url_signature(role, environment, reg, kh, exp);
    let mut url = format!(
        "/ws/environment/{}?role={}&reg={}",
        encode_segment(environment),
        encode_segment(role),
        encode_segment(reg)
    );
    if !kh.is_empty() {
        url.push_str(&format!("&kh={}", encode_segment(kh)));
    }
    url.push_str(&format!("&exp={exp}&sig={sig}"));
    let target = edit(&url, script);
    let service = url_service();
    let Some(outcome) = runtime().block_on(service.upgrade(&target)) else {
        return;
    };
    let after = now();
    let shown = String::from_utf8_lossy(&target);
    assert_ne!(outcome.refused, Some(500), "{shown}");
    if let Some((got_role, got_reg, got_kh, got_exp)) = &outcome.verified {
        assert_eq!(
            canonical(got_role, &outcome.environment, got_reg, got_kh, *got_exp),
            canonical(role, environment, reg, kh, exp),
            "verified something else than was signed: {shown}"
        );
        if outcome.unexpired {
            let ttl = if *got_role == "harness" { 60 } else { 3_600 };
            assert!(
                t <= exp.saturating_add(1) && exp <= after + ttl + 60,
                "admitted an expiry of {exp} at {t}"
            );
        }
    }
    // The store holds no registration: nothing is admitted.
    assert!(!outcome.admitted, "{shown}");
}

fn authorization(data: &[u8]) {
    let (fields, script) = lines(data, 5);
    let [env, reg, kh, exp, v] = &fields[..] else {
        return;
    };
    let claims = AuthorizationClaims {
        v: v.trim().parse().unwrap_or(1),
        env: env.clone(),
        reg: reg.clone(),
        kh: kh.clone(),
        exp: exp.trim().parse().unwrap_or(0),
    };
    let key = key();
    let token = key.authorization(&claims);
    assert_eq!(key.verify_authorization(&token), Some(claims.clone()));
    let edited = edit(&token, script);
    if let Ok(edited) = std::str::from_utf8(&edited) {
        if let Some(verified) = key.verify_authorization(edited) {
            assert_eq!(edited, token, "an edited authorisation verified");
            assert_eq!(verified, claims);
        }
    }
    let whole = String::from_utf8_lossy(data);
    assert_eq!(
        key.verify_authorization(&whole),
        None,
        "input verified as an authorisation"
    );
}

// ---- surface 3: Redis replies --------------------------------------------------------

fn store_reply(data: &[u8]) {
    let held = [
        Held {
            environment: "env-1".to_owned(),
            epoch: 1,
            executor: true,
        },
        Held {
            environment: "env-2".to_owned(),
            epoch: 7,
            executor: false,
        },
    ];
    let Some(decoded) = decode_store_reply(data, NODE, &held) else {
        return;
    };
    if let Ok(reg) = &decoded.register {
        assert!(!reg.is_empty(), "a registration without an id");
    }
    if let Connectable::Yes { reg, node, .. } = &decoded.connect {
        assert!(!reg.is_empty(), "a connectable registration without an id");
        if let Some(node) = node {
            assert!(!node.is_empty() && node != NODE, "{node:?}");
        }
    }
    for lost in &decoded.heartbeat {
        match lost {
            Lost::Moved(environment) => {
                assert!(held.iter().any(|h| h.environment == *environment));
            }
            Lost::Ended(end) => {
                assert!(held
                    .iter()
                    .any(|h| h.environment == end.environment && h.epoch == end.epoch));
            }
        }
    }
}

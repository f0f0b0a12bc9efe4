//! The rendezvous service's HMAC constructions: signed WebSocket URLs (RELAY §8.4),
//! harness key authorisations (§8.5) and registration ids (§8.2).

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use ring::{digest, hmac};
use serde::{Deserialize, Serialize};

use exec_server_relay_core::noise::NoisePublicKey;

/// At least this many bytes of signing key.
pub const MIN_SIGNING_KEY: usize = 32;

/// A signing key the service refuses (§8.4).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigningKeyError {
    #[error("the rendezvous signing key must be at least {MIN_SIGNING_KEY} bytes, got {0}")]
    TooShort(usize),
    #[error("EXEC_SERVER_RENDEZVOUS_SIGNING_KEY is not valid base64")]
    Base64,
}

/// The service's signing key.
pub struct SigningKey(hmac::Key);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(<redacted>)")
    }
}

impl SigningKey {
    pub fn new(bytes: &[u8]) -> Result<Self, SigningKeyError> {
        if bytes.len() < MIN_SIGNING_KEY {
            return Err(SigningKeyError::TooShort(bytes.len()));
        }
        Ok(Self(hmac::Key::new(hmac::HMAC_SHA256, bytes)))
    }

    /// Standard base64 of the key, as in `EXEC_SERVER_RENDEZVOUS_SIGNING_KEY`.
    pub fn from_base64(text: &str) -> Result<Self, SigningKeyError> {
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|_| SigningKeyError::Base64)?;
        Self::new(&bytes)
    }

    pub fn random() -> Self {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).expect("the OS random source works");
        Self::new(&bytes).expect("32 bytes")
    }

    fn mac(&self, data: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(hmac::sign(&self.0, data).as_ref())
    }

    fn verify(&self, data: &[u8], mac_b64: &str) -> bool {
        let Ok(mac) = URL_SAFE_NO_PAD.decode(mac_b64) else {
            return false;
        };
        hmac::verify(&self.0, data, &mac).is_ok()
    }

    /// `sig` of a rendezvous URL; `kh` is empty for executors.
    pub fn url_signature(
        &self,
        role: &str,
        environment_id: &str,
        reg: &str,
        kh: &str,
        exp: u64,
    ) -> String {
        self.mac(canonical(role, environment_id, reg, kh, exp).as_bytes())
    }

    /// Constant-time check of a URL signature.
    pub fn verify_url(
        &self,
        role: &str,
        environment_id: &str,
        reg: &str,
        kh: &str,
        exp: u64,
        sig: &str,
    ) -> bool {
        self.verify(
            canonical(role, environment_id, reg, kh, exp).as_bytes(),
            sig,
        )
    }

    /// A harness key authorisation token (§8.5).
    pub fn authorization(&self, claims: &AuthorizationClaims) -> String {
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).expect("claims serialize"));
        let mac = self.mac(format!("exec-server-authz/v1.{body}").as_bytes());
        format!("v1.{body}.{mac}")
    }

    /// The claims of a token whose MAC verifies.
    pub fn verify_authorization(&self, token: &str) -> Option<AuthorizationClaims> {
        let rest = token.strip_prefix("v1.")?;
        let (body, mac) = rest.split_once('.')?;
        if !self.verify(format!("exec-server-authz/v1.{body}").as_bytes(), mac) {
            return None;
        }
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(body).ok()?).ok()
    }
}

fn canonical(role: &str, environment_id: &str, reg: &str, kh: &str, exp: u64) -> String {
    format!("exec-server-rendezvous/v1\n{role}\n{environment_id}\n{reg}\n{kh}\n{exp}")
}

/// `K` of §8.4: base64url_nopad(SHA-256(harness public key)).
pub fn key_hash(key: &NoisePublicKey) -> String {
    URL_SAFE_NO_PAD.encode(digest::digest(&digest::SHA256, key.as_bytes()).as_ref())
}

/// Registration id of §8.2.
pub fn registration_id(environment_id: &str, key: &NoisePublicKey) -> String {
    let mut input = environment_id.as_bytes().to_vec();
    input.push(0);
    input.extend_from_slice(key.as_bytes());
    let d = digest::digest(&digest::SHA256, &input);
    let hex: String = d.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("reg-{hex}")
}

/// SHA-256 of a bearer token, as configured in `[[rendezvous.tokens]]`.
pub fn token_digest(token: &str) -> [u8; 32] {
    digest::digest(&digest::SHA256, token.as_bytes())
        .as_ref()
        .try_into()
        .expect("32 bytes")
}

/// The claims of §8.5, serialized in this member order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorizationClaims {
    pub v: u32,
    pub env: String,
    pub reg: String,
    pub kh: String,
    pub exp: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SigningKey {
        SigningKey::new(&(0u8..32).collect::<Vec<_>>()).unwrap()
    }

    fn alice() -> NoisePublicKey {
        NoisePublicKey::from_json(&serde_json::json!({
            "suite": exec_server_relay_core::noise::SUITE_V1,
            "x25519_public_key": "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=",
        }))
        .unwrap()
    }

    #[test]
    fn url_signature_vectors() {
        let k = key();
        assert_eq!(
            k.url_signature("environment", "env-1", "registration-1", "", 1_767_225_600),
            "AoG62Rzo_KExtKNu6kO83EQPYrud-prcKpC1uT6UnMc"
        );
        let kh = key_hash(&alice());
        assert_eq!(kh, "MAyclgO5Kks57TlYv5JAEUgE20_TcwEsDKR0MtY0Ja4");
        assert_eq!(
            k.url_signature("harness", "env-1", "registration-1", &kh, 1_767_225_600),
            "AzIRzGy0Z-OPjDKPDeWRdCHsDb-uc8TWYS1Q-y3iq6Y"
        );
        assert!(k.verify_url(
            "harness",
            "env-1",
            "registration-1",
            &kh,
            1_767_225_600,
            "AzIRzGy0Z-OPjDKPDeWRdCHsDb-uc8TWYS1Q-y3iq6Y"
        ));
        assert!(!k.verify_url(
            "environment",
            "env-1",
            "registration-1",
            &kh,
            1_767_225_600,
            "AzIRzGy0Z-OPjDKPDeWRdCHsDb-uc8TWYS1Q-y3iq6Y"
        ));
    }

    #[test]
    fn authorization_vector() {
        let claims = AuthorizationClaims {
            v: 1,
            env: "env-1".into(),
            reg: "registration-1".into(),
            kh: "MAyclgO5Kks57TlYv5JAEUgE20_TcwEsDKR0MtY0Ja4".into(),
            exp: 1_767_225_600,
        };
        let token = key().authorization(&claims);
        assert_eq!(
            token,
            "v1.eyJ2IjoxLCJlbnYiOiJlbnYtMSIsInJlZyI6InJlZ2lzdHJhdGlvbi0xIiwia2giOiJNQXljbGdPNUtrczU3VGxZdjVKQUVVZ0UyMF9UY3dFc0RLUjBNdFkwSmE0IiwiZXhwIjoxNzY3MjI1NjAwfQ.b9ozj37N5Qurjq4-_P4s6DRnSGo03C7c_fnhNf3RzhY"
        );
        assert_eq!(token.len(), 197);
        assert_eq!(key().verify_authorization(&token), Some(claims));
        let tampered = token.replace(".b9o", ".b9p");
        assert_eq!(key().verify_authorization(&tampered), None);
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(SigningKey::new(&[0u8; 31]).is_err());
        assert!(SigningKey::from_base64(&STANDARD.encode([1u8; 31])).is_err());
        assert!(SigningKey::from_base64(&STANDARD.encode([1u8; 32])).is_ok());
    }
}

//! The Noise layer (RELAY §3): the v1 suite behind the [`NoiseSuite`] seam, static keys and
//! their JSON form, the prologue, and the handshake message sizes.

use base64::Engine as _;
use serde_json::Value;
use zeroize::Zeroizing;

/// The v1 Noise protocol name, also the `suite` tag of key JSON.
pub const SUITE_V1: &str = "Noise_IK_25519_AESGCM_SHA256";
/// The registry security profile of the v1 suite.
pub const SECURITY_PROFILE_V1: &str = "noise_ik_v1";
/// The prologue's domain string (exactly 32 bytes).
pub const PROLOGUE_DOMAIN: &str = "codex-exec-server-relay-noise/v1";
/// Largest harness key authorisation carried in msg1.
pub const MAX_AUTHORIZATION_BYTES: usize = 4_096;
/// msg1 = 96 + P bytes with P = 1 … 4,096.
pub const MSG1_MIN: usize = 97;
pub const MSG1_MAX: usize = 96 + MAX_AUTHORIZATION_BYTES;
/// msg2 is exactly 48 bytes.
pub const MSG2_LEN: usize = 48;

/// A Noise failure, with the spec's message text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoiseError {
    #[error("unsupported Noise suite `{0}`")]
    UnsupportedSuite(String),
    #[error("invalid key JSON: {0}")]
    KeyJson(&'static str),
    #[error("invalid X25519 public key length")]
    KeyLength,
    #[error("invalid X25519 public key: all zero")]
    ZeroKey,
    #[error("noise: {0}")]
    Snow(String),
}

impl From<snow::Error> for NoiseError {
    fn from(e: snow::Error) -> Self {
        Self::Snow(e.to_string())
    }
}

/// A static X25519 public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NoisePublicKey(pub [u8; 32]);

impl std::fmt::Debug for NoisePublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NoisePublicKey({})", self.to_base64())
    }
}

impl NoisePublicKey {
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.0)
    }

    /// The key JSON of §3.2, members in the printed order.
    pub fn to_json(&self) -> Value {
        let mut map = serde_json::Map::new();
        map.insert("suite".into(), SUITE_V1.into());
        map.insert("x25519_public_key".into(), self.to_base64().into());
        Value::Object(map)
    }

    /// Parses key JSON strictly, in the order of §3.2.
    pub fn from_json(value: &Value) -> Result<Self, NoiseError> {
        let object = value
            .as_object()
            .ok_or(NoiseError::KeyJson("not an object"))?;
        let suite = object
            .get("suite")
            .and_then(Value::as_str)
            .ok_or(NoiseError::KeyJson("`suite` is not a string"))?;
        if suite != SUITE_V1 {
            return Err(NoiseError::UnsupportedSuite(suite.to_owned()));
        }
        if object.len() != 2 || !object.contains_key("x25519_public_key") {
            return Err(NoiseError::KeyJson(
                "exactly `suite` and `x25519_public_key` are expected",
            ));
        }
        let text = object["x25519_public_key"]
            .as_str()
            .ok_or(NoiseError::KeyJson("`x25519_public_key` is not a string"))?;
        if text.len() > 64 {
            return Err(NoiseError::KeyJson("`x25519_public_key` is too long"));
        }
        // The standard engine requires canonical padding and zero trailing bits.
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|_| {
                NoiseError::KeyJson("`x25519_public_key` is not padded standard base64")
            })?;
        let key: [u8; 32] = bytes.try_into().map_err(|_| NoiseError::KeyLength)?;
        if key == [0u8; 32] {
            return Err(NoiseError::ZeroKey);
        }
        Ok(Self(key))
    }
}

/// A static key pair. The private half is zeroised on drop and never printed.
pub struct NoiseIdentity {
    private: Zeroizing<Vec<u8>>,
    public: NoisePublicKey,
}

impl std::fmt::Debug for NoiseIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoiseIdentity")
            .field("public", &self.public)
            .field("private", &"<redacted>")
            .finish()
    }
}

impl NoiseIdentity {
    /// A fresh random key pair.
    pub fn generate() -> Self {
        let keypair = builder()
            .generate_keypair()
            .expect("the v1 suite generates key pairs");
        let public = NoisePublicKey(
            keypair
                .public
                .as_slice()
                .try_into()
                .expect("X25519 public keys are 32 bytes"),
        );
        Self {
            private: Zeroizing::new(keypair.private),
            public,
        }
    }

    /// A key pair from a 32-byte private key (tests, caller-supplied identities).
    pub fn from_private(private: [u8; 32]) -> Self {
        let public = x25519_public(&private);
        Self {
            private: Zeroizing::new(private.to_vec()),
            public,
        }
    }

    pub fn public(&self) -> NoisePublicKey {
        self.public
    }

    pub(crate) fn private(&self) -> &[u8] {
        &self.private
    }
}

/// The X25519 public key of a private key, through snow's DH primitive.
fn x25519_public(private: &[u8; 32]) -> NoisePublicKey {
    use snow::resolvers::CryptoResolver as _;
    let mut dh = snow::resolvers::DefaultResolver
        .resolve_dh(&snow::params::DHChoice::Curve25519)
        .expect("curve25519 is available");
    dh.set(private);
    NoisePublicKey(dh.pubkey().try_into().expect("32-byte public key"))
}

/// The prologue of §3.3.
pub fn prologue(environment_id: &str, registration_id: &str, stream_id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        32 + 4 * 8 + environment_id.len() + registration_id.len() + stream_id.len(),
    );
    for part in [PROLOGUE_DOMAIN, environment_id, registration_id, stream_id] {
        out.extend_from_slice(&(part.len() as u64).to_be_bytes());
        out.extend_from_slice(part.as_bytes());
    }
    out
}

fn params() -> snow::params::NoiseParams {
    SUITE_V1.parse().expect("the v1 suite name parses")
}

fn builder<'a>() -> snow::Builder<'a> {
    snow::Builder::new(params())
}

/// The seam a second (hybrid) suite would implement (§3.1). v1 has [`IkSuite`] only.
pub trait NoiseSuite: Send + Sync {
    fn name(&self) -> &'static str;
    fn security_profile(&self) -> &'static str;
    fn parse_key(&self, value: &Value) -> Result<NoisePublicKey, NoiseError>;
    fn print_key(&self, key: &NoisePublicKey) -> Value;
    fn initiator(
        &self,
        local: &NoiseIdentity,
        remote: &NoisePublicKey,
        prologue: &[u8],
    ) -> Result<snow::HandshakeState, NoiseError>;
    fn responder(
        &self,
        local: &NoiseIdentity,
        prologue: &[u8],
    ) -> Result<snow::HandshakeState, NoiseError>;
    /// Inclusive bounds of msg1 and the exact msg2 size.
    fn msg1_bounds(&self) -> (usize, usize);
    fn msg2_len(&self) -> usize;
}

/// `Noise_IK_25519_AESGCM_SHA256` over snow with ring-accelerated primitives.
#[derive(Debug, Clone, Copy, Default)]
pub struct IkSuite;

impl NoiseSuite for IkSuite {
    fn name(&self) -> &'static str {
        SUITE_V1
    }

    fn security_profile(&self) -> &'static str {
        SECURITY_PROFILE_V1
    }

    fn parse_key(&self, value: &Value) -> Result<NoisePublicKey, NoiseError> {
        NoisePublicKey::from_json(value)
    }

    fn print_key(&self, key: &NoisePublicKey) -> Value {
        key.to_json()
    }

    fn initiator(
        &self,
        local: &NoiseIdentity,
        remote: &NoisePublicKey,
        prologue: &[u8],
    ) -> Result<snow::HandshakeState, NoiseError> {
        Ok(builder()
            .local_private_key(local.private())?
            .remote_public_key(&remote.0)?
            .prologue(prologue)?
            .build_initiator()?)
    }

    fn responder(
        &self,
        local: &NoiseIdentity,
        prologue: &[u8],
    ) -> Result<snow::HandshakeState, NoiseError> {
        Ok(builder()
            .local_private_key(local.private())?
            .prologue(prologue)?
            .build_responder()?)
    }

    fn msg1_bounds(&self) -> (usize, usize) {
        (MSG1_MIN, MSG1_MAX)
    }

    fn msg2_len(&self) -> usize {
        MSG2_LEN
    }
}

#[cfg(test)]
#[path = "noise_tests.rs"]
mod tests;

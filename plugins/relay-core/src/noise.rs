//! The Noise layer (RELAY §3): the [`NoiseSuite`] seam every suite implements, the
//! handshake and record-cipher objects a suite hands out, static keys and their JSON form,
//! the prologue, and the table of suites this build speaks.
//!
//! Nothing outside a suite's own module names its Noise library: a suite is chosen by the
//! `suite` tag of a key or by a registration's `security_profile`, and everything after
//! that goes through the traits here. Two suites: codex's [`HybridIkSuite`]
//! (`Noise_hybridIK_X25519+MLKEM768_AESGCM_SHA256` over clatter, profile
//! `noise_hybrid_ik_v1`, keys with an ML-KEM-768 half, messages of 3,568 + P and 3,424
//! bytes), the default, and our classic [`IkSuite`] (`Noise_IK_25519_AESGCM_SHA256` over
//! snow, profile `noise_ik_v1`). Both bind the same prologue.

mod hybrid_ik;
mod ik;
mod ring_aes_gcm;

use std::sync::Arc;

use base64::Engine as _;
use serde_json::Value;
use zeroize::Zeroizing;

pub use hybrid_ik::{
    HybridIkSuite, HYBRID_MSG1_OVERHEAD, HYBRID_MSG2_LEN, SECURITY_PROFILE_HYBRID, SUITE_HYBRID,
};
pub use ik::IkSuite;

/// The v1 Noise protocol name, also the `suite` tag of key JSON.
pub const SUITE_V1: &str = "Noise_IK_25519_AESGCM_SHA256";
/// The registry security profile of the v1 suite.
pub const SECURITY_PROFILE_V1: &str = "noise_ik_v1";
/// The prologue's domain string (exactly 32 bytes).
pub const PROLOGUE_DOMAIN: &str = "codex-exec-server-relay-noise/v1";
/// Largest harness key authorisation carried in msg1.
pub const MAX_AUTHORIZATION_BYTES: usize = 4_096;
/// msg1 of the v1 suite = 96 + P bytes with P = 1 … 4,096.
pub const MSG1_MIN: usize = 97;
pub const MSG1_MAX: usize = 96 + MAX_AUTHORIZATION_BYTES;
/// msg2 of the v1 suite is exactly 48 bytes.
pub const MSG2_LEN: usize = 48;

/// Every suite this build speaks, the default of new registrations and harness keys
/// ([`DEFAULT_SUITE`]) first.
pub static SUITES: &[&dyn NoiseSuite] = &[&HybridIkSuite, &IkSuite];

/// The suite an executor registers with and a harness keys itself for unless told
/// otherwise: codex's hybrid suite, which every codex 0.169.0 peer speaks.
pub static DEFAULT_SUITE: &dyn NoiseSuite = &HybridIkSuite;

/// The suite whose key JSON tag is `name`.
pub fn suite_by_name(name: &str) -> Option<&'static dyn NoiseSuite> {
    SUITES.iter().copied().find(|s| s.name() == name)
}

/// The suite a registry `security_profile` selects.
pub fn suite_by_profile(profile: &str) -> Option<&'static dyn NoiseSuite> {
    SUITES
        .iter()
        .copied()
        .find(|s| s.security_profile() == profile)
}

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
    /// The key belongs to another suite than the one asked to use it.
    #[error("a `{key}` key cannot be used with the Noise suite `{suite}`")]
    SuiteMismatch {
        key: &'static str,
        suite: &'static str,
    },
    /// The suite's Noise implementation refused (a message that does not decrypt, a
    /// buffer too small, a nonce exhausted).
    #[error("noise: {0}")]
    Protocol(String),
}

/// A static public key of one suite: the suite and its public key bytes (for v1 the
/// 32-byte X25519 key). Only its suite interprets the bytes.
#[derive(Clone)]
pub struct NoisePublicKey {
    suite: &'static dyn NoiseSuite,
    bytes: Arc<[u8]>,
}

impl PartialEq for NoisePublicKey {
    fn eq(&self, other: &Self) -> bool {
        self.suite.name() == other.suite.name() && self.bytes == other.bytes
    }
}

impl Eq for NoisePublicKey {}

impl std::hash::Hash for NoisePublicKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.suite.name().hash(state);
        self.bytes.hash(state);
    }
}

impl std::fmt::Debug for NoisePublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NoisePublicKey({})", self.to_base64())
    }
}

impl NoisePublicKey {
    /// A v1 (X25519) public key.
    pub fn x25519(key: [u8; 32]) -> Self {
        Self::new(&IkSuite, &key)
    }

    /// A key of `suite` from its public key bytes; suites check the bytes first.
    pub(crate) fn new(suite: &'static dyn NoiseSuite, bytes: &[u8]) -> Self {
        Self {
            suite,
            bytes: Arc::from(bytes),
        }
    }

    /// The suite the key belongs to.
    pub fn suite(&self) -> &'static dyn NoiseSuite {
        self.suite
    }

    /// The tag of the suite the key belongs to.
    pub fn suite_name(&self) -> &'static str {
        self.suite.name()
    }

    /// The public key bytes, as the suite defines them (v1: the 32 X25519 bytes). The
    /// rendezvous hashes these into registration ids and key hashes (§8.2, §8.4).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Standard base64 of [`NoisePublicKey::as_bytes`].
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.bytes)
    }

    /// The key JSON of §3.2, printed by the key's suite.
    pub fn to_json(&self) -> Value {
        self.suite.print_key(self)
    }

    /// Parses key JSON strictly (§3.2): the `suite` member picks the suite, which parses
    /// the rest.
    pub fn from_json(value: &Value) -> Result<Self, NoiseError> {
        let object = value
            .as_object()
            .ok_or(NoiseError::KeyJson("not an object"))?;
        let tag = object
            .get("suite")
            .and_then(Value::as_str)
            .ok_or(NoiseError::KeyJson("`suite` is not a string"))?;
        let suite =
            suite_by_name(tag).ok_or_else(|| NoiseError::UnsupportedSuite(tag.to_owned()))?;
        suite.parse_key(value)
    }
}

/// A static key pair of one suite. The private half is zeroised on drop and never printed.
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
    /// A fresh random key pair of the classic v1 suite (`noise_ik_v1`); see
    /// [`NoiseIdentity::generate_for`] for the others.
    pub fn generate() -> Self {
        IkSuite.generate_identity()
    }

    /// A fresh random key pair of `suite`.
    pub fn generate_for(suite: &'static dyn NoiseSuite) -> Self {
        suite.generate_identity()
    }

    /// A v1 key pair from a 32-byte X25519 private key (tests, caller-supplied identities).
    pub fn from_private(private: [u8; 32]) -> Self {
        IkSuite.identity_from_private(private)
    }

    /// A key pair from a suite's private key bytes and the public key they belong to.
    pub(crate) fn from_parts(private: Vec<u8>, public: NoisePublicKey) -> Self {
        Self {
            private: Zeroizing::new(private),
            public,
        }
    }

    pub fn public(&self) -> NoisePublicKey {
        self.public.clone()
    }

    /// The suite this identity belongs to.
    pub fn suite(&self) -> &'static dyn NoiseSuite {
        self.public.suite
    }

    pub(crate) fn private(&self) -> &[u8] {
        &self.private
    }
}

/// The prologue of §3.3: length-prefixed domain, environment, registration and stream ids.
pub fn prologue(environment_id: &str, registration_id: &str, stream_id: &str) -> Vec<u8> {
    prologue_with_domain(PROLOGUE_DOMAIN, environment_id, registration_id, stream_id)
}

/// The prologue of §3.3 with another domain string, for suites that bind their own.
pub fn prologue_with_domain(
    domain: &str,
    environment_id: &str,
    registration_id: &str,
    stream_id: &str,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        domain.len() + 4 * 8 + environment_id.len() + registration_id.len() + stream_id.len(),
    );
    for part in [domain, environment_id, registration_id, stream_id] {
        out.extend_from_slice(&(part.len() as u64).to_be_bytes());
        out.extend_from_slice(part.as_bytes());
    }
    out
}

/// One Noise suite (§3.1): its names, its keys and their JSON, its handshake and its
/// message sizes. The executor, the harness and the reliable stream use a suite only
/// through this trait and the objects it returns.
pub trait NoiseSuite: Send + Sync + 'static {
    /// The Noise protocol name, which is also the `suite` tag of its key JSON.
    fn name(&self) -> &'static str;
    /// The registry `security_profile` that selects this suite (§7.3).
    fn security_profile(&self) -> &'static str;
    /// A fresh random static key pair.
    fn generate_identity(&self) -> NoiseIdentity;
    /// Parses this suite's key JSON (the `suite` member is already known to match).
    fn parse_key(&self, value: &Value) -> Result<NoisePublicKey, NoiseError>;
    /// This suite's key JSON, members in the printed order.
    fn print_key(&self, key: &NoisePublicKey) -> Value;
    /// The prologue both ends feed into the handshake of one stream (§3.3).
    fn prologue(&self, environment_id: &str, registration_id: &str, stream_id: &str) -> Vec<u8> {
        prologue(environment_id, registration_id, stream_id)
    }
    /// The harness's side: sends msg1 to the pinned `remote` key.
    fn initiator(
        &self,
        local: &NoiseIdentity,
        remote: &NoisePublicKey,
        prologue: &[u8],
    ) -> Result<Box<dyn NoiseHandshake>, NoiseError>;
    /// The executor's side: reads msg1 and answers msg2.
    fn responder(
        &self,
        local: &NoiseIdentity,
        prologue: &[u8],
    ) -> Result<Box<dyn NoiseHandshake>, NoiseError>;
    /// Inclusive bounds of msg1 (which carries the authorisation as its payload).
    fn msg1_bounds(&self) -> (usize, usize);
    /// The exact size of msg2 (whose payload is empty).
    fn msg2_len(&self) -> usize;
}

/// One side of a handshake in progress.
pub trait NoiseHandshake: Send {
    /// Writes the next handshake message carrying `payload` into `message`; its length.
    fn write_message(&mut self, payload: &[u8], message: &mut [u8]) -> Result<usize, NoiseError>;
    /// Reads the peer's next handshake message; the length of its payload in `payload`.
    fn read_message(&mut self, message: &[u8], payload: &mut [u8]) -> Result<usize, NoiseError>;
    /// The peer's static key, once a message has revealed it.
    fn remote_static(&self) -> Option<NoisePublicKey>;
    /// True once every handshake message has been written and read.
    fn is_finished(&self) -> bool;
    /// The transport phase (§3.7), once the handshake is finished.
    fn into_transport(self: Box<Self>) -> Result<Box<dyn RecordCipher>, NoiseError>;
}

/// The transport phase of one stream (§3.7): records encrypted and decrypted strictly in
/// order, the nonce being the record's position.
pub trait RecordCipher: Send {
    /// Encrypts one record; the ciphertext length (plaintext + tag).
    fn encrypt(&mut self, plaintext: &[u8], record: &mut [u8]) -> Result<usize, NoiseError>;
    /// Decrypts the next record; the plaintext length.
    fn decrypt(&mut self, record: &[u8], plaintext: &mut [u8]) -> Result<usize, NoiseError>;
    /// The nonce the next encrypted record uses.
    fn sending_nonce(&self) -> u64;
    /// The nonce the next decrypted record must have used.
    fn receiving_nonce(&self) -> u64;
}

/// Parses the v1 key JSON shape: exactly `suite` and a strict `x25519_public_key` (§3.2).
fn parse_x25519_key(
    value: &Value,
    suite: &'static dyn NoiseSuite,
) -> Result<NoisePublicKey, NoiseError> {
    let object = value
        .as_object()
        .ok_or(NoiseError::KeyJson("not an object"))?;
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
        .map_err(|_| NoiseError::KeyJson("`x25519_public_key` is not padded standard base64"))?;
    let key: [u8; 32] = bytes.try_into().map_err(|_| NoiseError::KeyLength)?;
    if key == [0u8; 32] {
        return Err(NoiseError::ZeroKey);
    }
    Ok(NoisePublicKey::new(suite, &key))
}

#[cfg(test)]
#[path = "noise_tests.rs"]
mod tests;

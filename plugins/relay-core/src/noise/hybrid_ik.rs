//! codex's suite, `Noise_hybridIK_25519+MLKEM768_AESGCM_SHA256` (CODEX-0169 §4.6), over
//! clatter 2.2.0 with RustCrypto's ML-KEM, the build codex 0.169.0 uses, and AES-GCM from
//! ring (`ring_aes_gcm.rs`, the same cipher codex's RustCrypto build computes). These two
//! are the only modules that name clatter.
//!
//! A key of this suite is a pair: an X25519 key and an ML-KEM-768 key. Its bytes (what the
//! rendezvous hashes into key hashes) are the X25519 public key followed by the ML-KEM
//! encapsulation key; the private bytes are the X25519 secret followed by the ML-KEM
//! decapsulation key.

use base64::Engine as _;
use clatter::bytearray::ByteArray;
use clatter::crypto::dh::X25519;
use clatter::crypto::hash::Sha256;
use clatter::crypto::kem::rust_crypto_ml_kem::MlKem768;
use clatter::traits::{Dh, Handshaker, Kem};
use clatter::{HybridHandshake, HybridHandshakeParams, KeyPair};
use serde_json::Value;

use super::ring_aes_gcm::RingAesGcm;
use super::{
    NoiseError, NoiseHandshake, NoiseIdentity, NoisePublicKey, NoiseSuite, RecordCipher,
    MAX_AUTHORIZATION_BYTES,
};

/// The key JSON tag (note `X25519`; the protocol name hashed into the handshake says
/// `25519`, and clatter derives that name itself).
pub const SUITE_HYBRID: &str = "Noise_hybridIK_X25519+MLKEM768_AESGCM_SHA256";
/// The registry security profile of the hybrid suite.
pub const SECURITY_PROFILE_HYBRID: &str = "noise_hybrid_ik_v1";
/// msg1 = 3,568 + P bytes (P = the authorisation, 1 … 4,096 bytes).
pub const HYBRID_MSG1_OVERHEAD: usize = 3_568;
/// msg2 is exactly 3,424 bytes (empty payload).
pub const HYBRID_MSG2_LEN: usize = 3_424;

const X25519_LEN: usize = 32;
const MLKEM_PUBLIC_LEN: usize = 1_184;
const MLKEM_SECRET_LEN: usize = 2_400;
/// Longest base64 text accepted for a member before decoding (44 and 1,580 characters).
const MAX_X25519_TEXT: usize = 64;
const MAX_MLKEM_TEXT: usize = 1_600;

type Handshake = HybridHandshake<X25519, MlKem768, MlKem768, RingAesGcm, Sha256>;
type Transport = clatter::transportstate::TransportState<RingAesGcm, Sha256>;
type MlKemPublic = <MlKem768 as Kem>::PubKey;
type MlKemSecret = <MlKem768 as Kem>::SecretKey;
type X25519Secret = <X25519 as Dh>::PrivateKey;

/// `Noise_hybridIK_25519+MLKEM768_AESGCM_SHA256`: hybrid X25519 + ML-KEM-768 static and
/// ephemeral keys, the hybridIK pattern, AES-256-GCM, SHA-256.
#[derive(Debug, Clone, Copy, Default)]
pub struct HybridIkSuite;

fn protocol(e: impl std::fmt::Display) -> NoiseError {
    NoiseError::Protocol(e.to_string())
}

impl HybridIkSuite {
    /// The two halves of a key of this suite.
    fn halves<'k>(&self, key: &'k NoisePublicKey) -> Result<(&'k [u8], &'k [u8]), NoiseError> {
        if key.suite_name() != SUITE_HYBRID {
            return Err(NoiseError::SuiteMismatch {
                key: key.suite_name(),
                suite: SUITE_HYBRID,
            });
        }
        Ok(key.as_bytes().split_at(X25519_LEN))
    }

    fn parameters<'p>(
        &self,
        local: &NoiseIdentity,
        prologue: &'p [u8],
        initiator: bool,
    ) -> Result<HybridHandshakeParams<'p, X25519, MlKem768, MlKem768>, NoiseError> {
        if local.suite().name() != SUITE_HYBRID {
            return Err(NoiseError::SuiteMismatch {
                key: local.suite().name(),
                suite: SUITE_HYBRID,
            });
        }
        let (dh_secret, kem_secret) = local.private().split_at(X25519_LEN);
        let (dh_public, kem_public) = self.halves(&local.public)?;
        Ok(
            HybridHandshakeParams::new(clatter::handshakepattern::noise_hybrid_ik(), initiator)
                .with_prologue(prologue)
                .with_s(KeyPair {
                    public: <[u8; X25519_LEN]>::from_slice(dh_public),
                    secret: X25519Secret::from_slice(dh_secret),
                })
                .with_s_kem(KeyPair {
                    public: MlKemPublic::from_slice(kem_public),
                    secret: MlKemSecret::from_slice(kem_secret),
                }),
        )
    }
}

/// Decodes one strict base64 member of the key JSON into exactly `len` bytes.
fn member(
    object: &serde_json::Map<String, Value>,
    name: &'static str,
    max_text: usize,
    len: usize,
) -> Result<Vec<u8>, NoiseError> {
    let text = object
        .get(name)
        .and_then(Value::as_str)
        .ok_or(NoiseError::KeyJson(
            "a key member is missing or not a string",
        ))?;
    // Oversized text is refused before it is decoded.
    if text.len() > max_text {
        return Err(NoiseError::KeyJson("a key member is too long"));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| NoiseError::KeyJson("a key member is not padded standard base64"))?;
    if bytes.len() != len {
        return Err(NoiseError::KeyJson(match name {
            "x25519_public_key" => "`x25519_public_key` is not 32 bytes",
            _ => "`mlkem768_public_key` is not 1,184 bytes",
        }));
    }
    Ok(bytes)
}

impl NoiseSuite for HybridIkSuite {
    fn name(&self) -> &'static str {
        SUITE_HYBRID
    }

    fn security_profile(&self) -> &'static str {
        SECURITY_PROFILE_HYBRID
    }

    fn generate_identity(&self) -> NoiseIdentity {
        let dh = X25519::genkey().expect("X25519 key generation does not fail");
        let kem = MlKem768::genkey().expect("ML-KEM-768 key generation does not fail");
        let mut public = Vec::with_capacity(X25519_LEN + MLKEM_PUBLIC_LEN);
        public.extend_from_slice(dh.public.as_slice());
        public.extend_from_slice(kem.public.as_slice());
        let mut private = Vec::with_capacity(X25519_LEN + MLKEM_SECRET_LEN);
        private.extend_from_slice(dh.secret.as_slice());
        private.extend_from_slice(kem.secret.as_slice());
        NoiseIdentity::from_parts(private, NoisePublicKey::new(&HybridIkSuite, &public))
    }

    fn parse_key(&self, value: &Value) -> Result<NoisePublicKey, NoiseError> {
        let object = value
            .as_object()
            .ok_or(NoiseError::KeyJson("not an object"))?;
        if object.len() != 3
            || !object.contains_key("x25519_public_key")
            || !object.contains_key("mlkem768_public_key")
        {
            return Err(NoiseError::KeyJson(
                "exactly `suite`, `x25519_public_key` and `mlkem768_public_key` are expected",
            ));
        }
        let dh = member(object, "x25519_public_key", MAX_X25519_TEXT, X25519_LEN)?;
        if dh.iter().all(|b| *b == 0) {
            return Err(NoiseError::ZeroKey);
        }
        let kem = member(
            object,
            "mlkem768_public_key",
            MAX_MLKEM_TEXT,
            MLKEM_PUBLIC_LEN,
        )?;
        let mut bytes = dh;
        bytes.extend_from_slice(&kem);
        Ok(NoisePublicKey::new(&HybridIkSuite, &bytes))
    }

    fn print_key(&self, key: &NoisePublicKey) -> Value {
        let (dh, kem) = key
            .as_bytes()
            .split_at(X25519_LEN.min(key.as_bytes().len()));
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let mut map = serde_json::Map::new();
        map.insert("suite".into(), SUITE_HYBRID.into());
        map.insert("x25519_public_key".into(), b64(dh).into());
        map.insert("mlkem768_public_key".into(), b64(kem).into());
        Value::Object(map)
    }

    fn initiator(
        &self,
        local: &NoiseIdentity,
        remote: &NoisePublicKey,
        prologue: &[u8],
    ) -> Result<Box<dyn NoiseHandshake>, NoiseError> {
        let (dh, kem) = self.halves(remote)?;
        let params = self
            .parameters(local, prologue, true)?
            .with_rs(<[u8; X25519_LEN]>::from_slice(dh))
            .with_rs_kem(MlKemPublic::from_slice(kem));
        Ok(Box::new(HybridHandshakeState(
            Handshake::new(params).map_err(protocol)?,
        )))
    }

    fn responder(
        &self,
        local: &NoiseIdentity,
        prologue: &[u8],
    ) -> Result<Box<dyn NoiseHandshake>, NoiseError> {
        let params = self.parameters(local, prologue, false)?;
        Ok(Box::new(HybridHandshakeState(
            Handshake::new(params).map_err(protocol)?,
        )))
    }

    fn msg1_bounds(&self) -> (usize, usize) {
        (
            HYBRID_MSG1_OVERHEAD + 1,
            HYBRID_MSG1_OVERHEAD + MAX_AUTHORIZATION_BYTES,
        )
    }

    fn msg2_len(&self) -> usize {
        HYBRID_MSG2_LEN
    }
}

/// The Noise protocol name clatter hashes into the handshake (CODEX-0169 §4.6).
#[cfg(test)]
pub(crate) fn protocol_name() -> String {
    Handshake::build_name(&clatter::handshakepattern::noise_hybrid_ik()).to_string()
}

struct HybridHandshakeState(Handshake);

impl NoiseHandshake for HybridHandshakeState {
    fn write_message(&mut self, payload: &[u8], message: &mut [u8]) -> Result<usize, NoiseError> {
        // clatter panics on a message above the Noise maximum instead of failing.
        let overhead = self.0.get_next_message_overhead().map_err(protocol)?;
        if overhead + payload.len() > crate::proto::MAX_NOISE_MESSAGE {
            return Err(NoiseError::Protocol("handshake message too long".into()));
        }
        self.0.write_message(payload, message).map_err(protocol)
    }

    fn read_message(&mut self, message: &[u8], payload: &mut [u8]) -> Result<usize, NoiseError> {
        if message.len() > crate::proto::MAX_NOISE_MESSAGE {
            return Err(NoiseError::Protocol("handshake message too long".into()));
        }
        self.0.read_message(message, payload).map_err(protocol)
    }

    fn remote_static(&self) -> Option<NoisePublicKey> {
        let pair = self.0.get_remote_static()?;
        let mut bytes = Vec::with_capacity(X25519_LEN + MLKEM_PUBLIC_LEN);
        bytes.extend_from_slice(pair.dh().as_slice());
        bytes.extend_from_slice(pair.kem().as_slice());
        Some(NoisePublicKey::new(&HybridIkSuite, &bytes))
    }

    fn is_finished(&self) -> bool {
        self.0.is_finished()
    }

    fn into_transport(self: Box<Self>) -> Result<Box<dyn RecordCipher>, NoiseError> {
        Ok(Box::new(HybridTransport(
            self.0.finalize().map_err(protocol)?,
        )))
    }
}

struct HybridTransport(Transport);

impl RecordCipher for HybridTransport {
    fn encrypt(&mut self, plaintext: &[u8], record: &mut [u8]) -> Result<usize, NoiseError> {
        if plaintext.len() + 16 > crate::proto::MAX_NOISE_MESSAGE {
            return Err(NoiseError::Protocol("record too long".into()));
        }
        self.0.send(plaintext, record).map_err(protocol)
    }

    fn decrypt(&mut self, record: &[u8], plaintext: &mut [u8]) -> Result<usize, NoiseError> {
        if record.len() > crate::proto::MAX_NOISE_MESSAGE {
            return Err(NoiseError::Protocol("record too long".into()));
        }
        self.0.receive(record, plaintext).map_err(protocol)
    }

    fn sending_nonce(&self) -> u64 {
        self.0.sending_nonce()
    }

    fn receiving_nonce(&self) -> u64 {
        self.0.receiving_nonce()
    }
}

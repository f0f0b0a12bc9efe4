//! The v1 suite, `Noise_IK_25519_AESGCM_SHA256` (RELAY §3.1), over snow with
//! ring-accelerated primitives. This is the only module that names snow.

use serde_json::Value;

use super::{
    parse_x25519_key, NoiseError, NoiseHandshake, NoiseIdentity, NoisePublicKey, NoiseSuite,
    RecordCipher, MSG1_MAX, MSG1_MIN, MSG2_LEN, SECURITY_PROFILE_V1, SUITE_V1,
};

/// `Noise_IK_25519_AESGCM_SHA256`: X25519 static keys, IK pattern, AES-256-GCM, SHA-256.
#[derive(Debug, Clone, Copy, Default)]
pub struct IkSuite;

impl From<snow::Error> for NoiseError {
    fn from(e: snow::Error) -> Self {
        Self::Protocol(e.to_string())
    }
}

fn builder<'a>() -> snow::Builder<'a> {
    snow::Builder::new(SUITE_V1.parse().expect("the v1 suite name parses"))
}

impl IkSuite {
    /// A key pair from a 32-byte X25519 private key.
    pub(crate) fn identity_from_private(&self, private: [u8; 32]) -> NoiseIdentity {
        use snow::resolvers::CryptoResolver as _;
        let mut dh = snow::resolvers::DefaultResolver
            .resolve_dh(&snow::params::DHChoice::Curve25519)
            .expect("curve25519 is available");
        dh.set(&private);
        let public = NoisePublicKey::new(&IkSuite, dh.pubkey());
        NoiseIdentity::from_parts(private.to_vec(), public)
    }

    /// The X25519 key of `key`, which must be a v1 key.
    fn x25519<'k>(&self, key: &'k NoisePublicKey) -> Result<&'k [u8], NoiseError> {
        if key.suite_name() != SUITE_V1 {
            return Err(NoiseError::SuiteMismatch {
                key: key.suite_name(),
                suite: SUITE_V1,
            });
        }
        Ok(key.as_bytes())
    }
}

impl NoiseSuite for IkSuite {
    fn name(&self) -> &'static str {
        SUITE_V1
    }

    fn security_profile(&self) -> &'static str {
        SECURITY_PROFILE_V1
    }

    fn generate_identity(&self) -> NoiseIdentity {
        let keypair = builder()
            .generate_keypair()
            .expect("the v1 suite generates key pairs");
        let public = NoisePublicKey::new(&IkSuite, &keypair.public);
        NoiseIdentity::from_parts(keypair.private, public)
    }

    fn parse_key(&self, value: &Value) -> Result<NoisePublicKey, NoiseError> {
        parse_x25519_key(value, &IkSuite)
    }

    fn print_key(&self, key: &NoisePublicKey) -> Value {
        let mut map = serde_json::Map::new();
        map.insert("suite".into(), SUITE_V1.into());
        map.insert("x25519_public_key".into(), key.to_base64().into());
        Value::Object(map)
    }

    fn initiator(
        &self,
        local: &NoiseIdentity,
        remote: &NoisePublicKey,
        prologue: &[u8],
    ) -> Result<Box<dyn NoiseHandshake>, NoiseError> {
        let state = builder()
            .local_private_key(local.private())?
            .remote_public_key(self.x25519(remote)?)?
            .prologue(prologue)?
            .build_initiator()?;
        Ok(Box::new(IkHandshake(state)))
    }

    fn responder(
        &self,
        local: &NoiseIdentity,
        prologue: &[u8],
    ) -> Result<Box<dyn NoiseHandshake>, NoiseError> {
        let state = builder()
            .local_private_key(local.private())?
            .prologue(prologue)?
            .build_responder()?;
        Ok(Box::new(IkHandshake(state)))
    }

    fn msg1_bounds(&self) -> (usize, usize) {
        (MSG1_MIN, MSG1_MAX)
    }

    fn msg2_len(&self) -> usize {
        MSG2_LEN
    }
}

struct IkHandshake(snow::HandshakeState);

impl NoiseHandshake for IkHandshake {
    fn write_message(&mut self, payload: &[u8], message: &mut [u8]) -> Result<usize, NoiseError> {
        Ok(self.0.write_message(payload, message)?)
    }

    fn read_message(&mut self, message: &[u8], payload: &mut [u8]) -> Result<usize, NoiseError> {
        Ok(self.0.read_message(message, payload)?)
    }

    fn remote_static(&self) -> Option<NoisePublicKey> {
        let key: [u8; 32] = self.0.get_remote_static()?.try_into().ok()?;
        Some(NoisePublicKey::x25519(key))
    }

    fn is_finished(&self) -> bool {
        self.0.is_handshake_finished()
    }

    fn into_transport(self: Box<Self>) -> Result<Box<dyn RecordCipher>, NoiseError> {
        Ok(Box::new(IkTransport(self.0.into_transport_mode()?)))
    }
}

struct IkTransport(snow::TransportState);

impl RecordCipher for IkTransport {
    fn encrypt(&mut self, plaintext: &[u8], record: &mut [u8]) -> Result<usize, NoiseError> {
        Ok(self.0.write_message(plaintext, record)?)
    }

    fn decrypt(&mut self, record: &[u8], plaintext: &mut [u8]) -> Result<usize, NoiseError> {
        Ok(self.0.read_message(record, plaintext)?)
    }

    fn sending_nonce(&self) -> u64 {
        self.0.sending_nonce()
    }

    fn receiving_nonce(&self) -> u64 {
        self.0.receiving_nonce()
    }
}

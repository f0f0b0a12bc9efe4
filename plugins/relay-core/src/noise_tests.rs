use super::*;
use serde_json::json;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const ALICE: &str = "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=";
const BOB: &str = "3p7bfXt9wbTTW2HC7OQ1Nz+DQ8hbeGdNrfx+FG+IK08=";

#[test]
fn prologue_vector() {
    let p = prologue("env-1", "registration-1", "stream-1");
    assert_eq!(p.len(), 91);
    assert_eq!(
        hex(&p),
        "0000000000000020636f6465782d657865632d7365727665722d72656c61792d6e6f6973652f7631\
         0000000000000005656e762d31\
         000000000000000e726567697374726174696f6e2d31\
         000000000000000873747265616d2d31"
    );
    assert_eq!(PROLOGUE_DOMAIN.len(), 32);
    let digest = ring::digest::digest(&ring::digest::SHA256, &p);
    assert_eq!(
        hex(digest.as_ref()),
        "61104073ea47510b85d9020fe87609c449d3b09aaa44c264d8834e112f6e69f1"
    );
}

#[test]
fn key_json_round_trip() {
    let value = json!({"suite": SUITE_V1, "x25519_public_key": ALICE});
    let key = NoisePublicKey::from_json(&value).unwrap();
    assert_eq!(
        hex(key.as_bytes()),
        "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
    );
    assert_eq!(
        key.to_json().to_string(),
        format!(r#"{{"suite":"{SUITE_V1}","x25519_public_key":"{ALICE}"}}"#)
    );
    assert!(
        NoisePublicKey::from_json(&json!({"suite": SUITE_V1, "x25519_public_key": BOB})).is_ok()
    );
}

#[test]
fn key_json_rejections() {
    let with_key = |k: &str| json!({"suite": SUITE_V1, "x25519_public_key": k});
    assert_eq!(
        NoisePublicKey::from_json(&json!({"suite": "Noise_XX", "x25519_public_key": ALICE})),
        Err(NoiseError::UnsupportedSuite("Noise_XX".into()))
    );
    assert_eq!(
        NoisePublicKey::from_json(&json!({"suite": "Noise_XX", "x25519_public_key": ALICE}))
            .unwrap_err()
            .to_string(),
        "unsupported Noise suite `Noise_XX`"
    );
    assert!(NoisePublicKey::from_json(&json!([])).is_err());
    assert!(NoisePublicKey::from_json(&json!({"suite": 1})).is_err());
    assert!(NoisePublicKey::from_json(
        &json!({"suite": SUITE_V1, "x25519_public_key": ALICE, "mlkem768_public_key": "x"})
    )
    .is_err());
    assert!(matches!(
        NoisePublicKey::from_json(&with_key(&"A".repeat(65))),
        Err(NoiseError::KeyJson(_))
    ));
    assert!(NoisePublicKey::from_json(&with_key("not base64!")).is_err());
    assert!(NoisePublicKey::from_json(&with_key(ALICE.trim_end_matches('='))).is_err());
    let url_safe = "3p7bfXt9wbTTW2HC7OQ1Nz-DQ8hbeGdNrfx-FG-IK08=";
    assert!(NoisePublicKey::from_json(&with_key(url_safe)).is_err());
    // Last character 'p' instead of 'o': non-zero unused bits.
    let dirty = "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmp=";
    assert!(NoisePublicKey::from_json(&with_key(dirty)).is_err());
    let short = base64::engine::general_purpose::STANDARD.encode([7u8; 31]);
    assert_eq!(
        NoisePublicKey::from_json(&with_key(&short)),
        Err(NoiseError::KeyLength)
    );
    let zero = base64::engine::general_purpose::STANDARD.encode([0u8; 32]);
    assert_eq!(
        NoisePublicKey::from_json(&with_key(&zero)),
        Err(NoiseError::ZeroKey)
    );
    let spaced = format!("{} ", ALICE);
    assert!(NoisePublicKey::from_json(&with_key(&spaced)).is_err());
}

#[test]
fn identity_public_key_matches_rfc7748() {
    let private: [u8; 32] = (0..32)
        .map(|i| {
            u8::from_str_radix(
                &"77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"
                    [i * 2..i * 2 + 2],
                16,
            )
            .unwrap()
        })
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    let identity = NoiseIdentity::from_private(private);
    assert_eq!(identity.public().to_base64(), ALICE);
    assert!(!format!("{identity:?}").contains("77076d"));
}

#[test]
fn handshake_round_trip_sizes() {
    let suite = IkSuite;
    let executor = NoiseIdentity::generate();
    let harness = NoiseIdentity::generate();
    let p = prologue("env-1", "reg-1", "stream-1");
    let mut init = suite.initiator(&harness, &executor.public(), &p).unwrap();
    let mut resp = suite.responder(&executor, &p).unwrap();
    let authz = b"v1.token";
    let mut buf = vec![0u8; 65_535];
    let n1 = init.write_message(authz, &mut buf).unwrap();
    assert_eq!(n1, 96 + authz.len());
    let mut payload = vec![0u8; 65_535];
    let p1 = resp.read_message(&buf[..n1], &mut payload).unwrap();
    assert_eq!(&payload[..p1], authz);
    assert_eq!(resp.remote_static().unwrap(), harness.public());
    let n2 = resp.write_message(&[], &mut buf).unwrap();
    assert_eq!(n2, MSG2_LEN);
    let p2 = init.read_message(&buf[..n2], &mut payload).unwrap();
    assert_eq!(p2, 0);
    assert_eq!(init.remote_static().unwrap(), executor.public());
    assert!(init.is_finished() && resp.is_finished());
}

#[test]
fn wrong_pinned_key_or_prologue_fails_msg1() {
    let suite = IkSuite;
    let executor = NoiseIdentity::generate();
    let impostor = NoiseIdentity::generate();
    let harness = NoiseIdentity::generate();
    let p = prologue("env-1", "reg-1", "stream-1");
    let mut buf = vec![0u8; 65_535];
    let mut out = vec![0u8; 65_535];

    let mut init = suite.initiator(&harness, &impostor.public(), &p).unwrap();
    let n = init.write_message(b"a", &mut buf).unwrap();
    let mut resp = suite.responder(&executor, &p).unwrap();
    assert!(resp.read_message(&buf[..n], &mut out).is_err());

    let mut init = suite.initiator(&harness, &executor.public(), &p).unwrap();
    let n = init.write_message(b"a", &mut buf).unwrap();
    let other = prologue("env-1", "reg-1", "stream-2");
    let mut resp = suite.responder(&executor, &other).unwrap();
    assert!(resp.read_message(&buf[..n], &mut out).is_err());
}

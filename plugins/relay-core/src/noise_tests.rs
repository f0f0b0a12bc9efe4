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
    let executor = NoiseIdentity::generate_for(&IkSuite);
    let harness = NoiseIdentity::generate_for(&IkSuite);
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
    let executor = NoiseIdentity::generate_for(&IkSuite);
    let impostor = NoiseIdentity::generate_for(&IkSuite);
    let harness = NoiseIdentity::generate_for(&IkSuite);
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

// ---- the hybrid suite (CODEX-0169 §4.6) --------------------------------------------

fn sha256(bytes: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .to_vec()
}

#[test]
fn hybrid_protocol_name_and_prologue_check_values() {
    // The name clatter hashes is codex's, not the key JSON tag.
    let name = hybrid_ik::protocol_name();
    assert_eq!(name, "Noise_hybridIK_25519+MLKEM768_AESGCM_SHA256");
    let h0 = sha256(name.as_bytes());
    assert_eq!(
        hex(&h0),
        "646856ce6fda9f9f037c69557c3c9f5ada7d1bc70b0c4beea72befcaf862edfa"
    );
    let p = HybridIkSuite.prologue("env-1", "registration-1", "stream-1");
    let mut mixed = h0;
    mixed.extend_from_slice(&p);
    assert_eq!(
        hex(&sha256(&mixed)),
        "456d963917650255c15bab3dab46bf948ea41eb36aa7332f659fd8faa286d066"
    );
}

#[test]
fn the_default_suite_is_hybrid_and_both_are_selectable() {
    assert_eq!(DEFAULT_SUITE.name(), SUITE_HYBRID);
    assert_eq!(SUITES[0].name(), SUITE_HYBRID);
    assert_eq!(NoiseIdentity::generate().suite().name(), SUITE_V1);
    assert_eq!(
        suite_by_profile("noise_hybrid_ik_v1").unwrap().name(),
        SUITE_HYBRID
    );
    assert_eq!(suite_by_profile("noise_ik_v1").unwrap().name(), SUITE_V1);
    assert!(suite_by_profile("noise_xx_v1").is_none());
}

#[test]
fn hybrid_key_json_round_trip_and_rejections() {
    let identity = NoiseIdentity::generate_for(&HybridIkSuite);
    let json = identity.public().to_json();
    let object = json.as_object().unwrap();
    let members: Vec<&str> = object.keys().map(String::as_str).collect();
    assert_eq!(
        members,
        ["mlkem768_public_key", "suite", "x25519_public_key"]
    );
    assert_eq!(json["suite"], SUITE_HYBRID);
    assert_eq!(json["x25519_public_key"].as_str().unwrap().len(), 44);
    assert_eq!(json["mlkem768_public_key"].as_str().unwrap().len(), 1580);
    assert_eq!(NoisePublicKey::from_json(&json).unwrap(), identity.public());

    let with = |name: &str, value: Value| {
        let mut v = json.clone();
        v[name] = value;
        NoisePublicKey::from_json(&v)
    };
    let mut extra = json.clone();
    extra["name"] = "x".into();
    assert!(matches!(
        NoisePublicKey::from_json(&extra),
        Err(NoiseError::KeyJson(_))
    ));
    let mut missing = json.clone();
    missing
        .as_object_mut()
        .unwrap()
        .remove("mlkem768_public_key");
    assert!(NoisePublicKey::from_json(&missing).is_err());
    let short = base64::engine::general_purpose::STANDARD.encode([7u8; 1183]);
    assert_eq!(
        with("mlkem768_public_key", short.into()),
        Err(NoiseError::KeyJson(
            "`mlkem768_public_key` is not 1,184 bytes"
        ))
    );
    assert!(matches!(
        with("mlkem768_public_key", "A".repeat(1_000_000).into()),
        Err(NoiseError::KeyJson(_))
    ));
    let zero = base64::engine::general_purpose::STANDARD.encode([0u8; 32]);
    assert_eq!(
        with("x25519_public_key", zero.into()),
        Err(NoiseError::ZeroKey)
    );
    assert!(with("x25519_public_key", json!(7)).is_err());
    // A classic key is not a hybrid one, and the other way round.
    assert!(
        NoisePublicKey::from_json(&json!({"suite": SUITE_HYBRID, "x25519_public_key": ALICE}))
            .is_err()
    );
}

/// Both suites, between our two ends: msg sizes, the payload, the remote static key, and
/// records in both directions with implicit nonces.
#[test]
fn handshake_and_records_both_ways_for_every_suite() {
    for suite in SUITES.iter().copied() {
        let executor = NoiseIdentity::generate_for(suite);
        let harness = NoiseIdentity::generate_for(suite);
        let p = suite.prologue("env-1", "reg-1", "7b0cd8a6-5f1e-4f59-9d8c-2f5b0c1e9a77");
        let mut init = suite.initiator(&harness, &executor.public(), &p).unwrap();
        let mut resp = suite.responder(&executor, &p).unwrap();
        let authz = b"v1.authorization-text-of-45-bytes-exactly-xx";
        let mut buf = vec![0u8; 65_535];
        let mut payload = vec![0u8; 65_535];
        let n1 = init.write_message(authz, &mut buf).unwrap();
        let (min, max) = suite.msg1_bounds();
        assert_eq!(n1, min - 1 + authz.len(), "{}", suite.name());
        assert!(n1 <= max);
        let p1 = resp.read_message(&buf[..n1], &mut payload).unwrap();
        assert_eq!(&payload[..p1], authz);
        assert_eq!(resp.remote_static().unwrap(), harness.public());
        let n2 = resp.write_message(&[], &mut buf).unwrap();
        assert_eq!(n2, suite.msg2_len(), "{}", suite.name());
        assert_eq!(init.read_message(&buf[..n2], &mut payload).unwrap(), 0);
        assert!(init.is_finished() && resp.is_finished());
        let mut to_executor = init.into_transport().unwrap();
        let mut to_harness = resp.into_transport().unwrap();
        for round in 0..3u8 {
            let text = vec![round; 100 + usize::from(round)];
            let n = to_executor.encrypt(&text, &mut buf).unwrap();
            assert_eq!(n, text.len() + 16);
            let m = to_harness.decrypt(&buf[..n], &mut payload).unwrap();
            assert_eq!(&payload[..m], &text[..]);
            let n = to_harness.encrypt(&text, &mut buf).unwrap();
            let m = to_executor.decrypt(&buf[..n], &mut payload).unwrap();
            assert_eq!(&payload[..m], &text[..]);
        }
        assert_eq!(to_executor.sending_nonce(), 3);
        assert_eq!(to_harness.receiving_nonce(), 3);
        // A replayed or tampered record does not decrypt.
        let n = to_executor.encrypt(b"once", &mut buf).unwrap();
        let record = buf[..n].to_vec();
        to_harness.decrypt(&record, &mut payload).unwrap();
        assert!(to_harness.decrypt(&record, &mut payload).is_err());
        let n = to_executor.encrypt(b"twice", &mut buf).unwrap();
        buf[0] ^= 1;
        assert!(to_harness.decrypt(&buf[..n], &mut payload).is_err());
    }
}

/// A harness pinned to a key whose X25519 half or whose ML-KEM half is not the
/// executor's fails at msg1, as does a different prologue.
#[test]
fn hybrid_wrong_half_or_prologue_fails_msg1() {
    let suite = &HybridIkSuite;
    let executor = NoiseIdentity::generate_for(suite);
    let other = NoiseIdentity::generate_for(suite);
    let harness = NoiseIdentity::generate_for(suite);
    let p = suite.prologue("env-1", "reg-1", "stream-1");
    let mixed = |dh_from: &NoiseIdentity, kem_from: &NoiseIdentity| {
        let mut bytes = dh_from.public().as_bytes()[..32].to_vec();
        bytes.extend_from_slice(&kem_from.public().as_bytes()[32..]);
        NoisePublicKey::new(suite, &bytes)
    };
    let mut buf = vec![0u8; 65_535];
    let mut out = vec![0u8; 65_535];
    for pinned in [mixed(&other, &executor), mixed(&executor, &other)] {
        let mut init = suite.initiator(&harness, &pinned, &p).unwrap();
        let n = init.write_message(b"a", &mut buf).unwrap();
        let mut resp = suite.responder(&executor, &p).unwrap();
        assert!(resp.read_message(&buf[..n], &mut out).is_err());
    }
    let mut init = suite.initiator(&harness, &executor.public(), &p).unwrap();
    let n = init.write_message(b"a", &mut buf).unwrap();
    let other_prologue = suite.prologue("env-1", "reg-2", "stream-1");
    let mut resp = suite.responder(&executor, &other_prologue).unwrap();
    assert!(resp.read_message(&buf[..n], &mut out).is_err());
    // Keys of the other suite are refused before any handshake.
    let classic = NoiseIdentity::generate_for(&IkSuite);
    assert!(matches!(
        suite.initiator(&harness, &classic.public(), &p),
        Err(NoiseError::SuiteMismatch { .. })
    ));
    assert!(suite.responder(&classic, &p).is_err());
    // An oversized payload is an error, not clatter's panic.
    let mut init = suite.initiator(&harness, &executor.public(), &p).unwrap();
    assert!(init.write_message(&vec![1u8; 65_535], &mut buf).is_err());
}

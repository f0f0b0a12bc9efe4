//! AES-256-GCM for clatter's hybrid suite through `ring`, the primitives the classic suite
//! already uses: the same cipher (Noise `AESGCM`: a 96-bit nonce of four zero bytes and the
//! big-endian counter, a 16-byte tag), so the wire is unchanged, but sealed and opened by
//! ring's fused AES-NI + CLMUL code instead of RustCrypto's separate AES and GHASH passes.
//!
//! clatter's `Cipher` methods are documented to panic on a buffer of the wrong size; these
//! return an error instead, so no record from a peer can reach a panic through them.

use clatter::bytearray::SensitiveByteArray;
use clatter::error::{CipherError, CipherResult};
use clatter::traits::{Cipher, CryptoComponent};
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};

const TAG_LEN: usize = 16;

/// Noise's `AESGCM` cipher function, sealed and opened by ring.
#[derive(Clone)]
pub(crate) struct RingAesGcm;

impl CryptoComponent for RingAesGcm {
    fn name() -> &'static str {
        "AESGCM"
    }
}

fn key(k: &[u8; 32]) -> LessSafeKey {
    // A 32-byte key is always valid for AES-256-GCM.
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, k).expect("a 32-byte AES-256 key"))
}

/// Noise §5.1: four zero bytes, then the counter big-endian.
fn nonce(n: u64) -> Nonce {
    let mut bytes = [0u8; 12];
    bytes[4..].copy_from_slice(&n.to_be_bytes());
    Nonce::assume_unique_for_key(bytes)
}

impl Cipher for RingAesGcm {
    type Key = SensitiveByteArray<[u8; 32]>;

    fn tag_len() -> usize {
        TAG_LEN
    }

    fn encrypt(
        k: &Self::Key,
        n: u64,
        ad: &[u8],
        plaintext: &[u8],
        out: &mut [u8],
    ) -> CipherResult<()> {
        if plaintext.len().checked_add(TAG_LEN) != Some(out.len()) {
            return Err(CipherError::Encrypt);
        }
        out[..plaintext.len()].copy_from_slice(plaintext);
        Self::encrypt_in_place(k, n, ad, out, plaintext.len()).map(|_| ())
    }

    fn encrypt_in_place(
        k: &Self::Key,
        n: u64,
        ad: &[u8],
        in_out: &mut [u8],
        plaintext_len: usize,
    ) -> CipherResult<usize> {
        let out_len = plaintext_len
            .checked_add(TAG_LEN)
            .filter(|len| *len <= in_out.len())
            .ok_or(CipherError::Encrypt)?;
        let (text, tag_out) = in_out[..out_len].split_at_mut(plaintext_len);
        let tag = key(k)
            .seal_in_place_separate_tag(nonce(n), Aad::from(ad), text)
            .map_err(|_| CipherError::Encrypt)?;
        tag_out.copy_from_slice(tag.as_ref());
        Ok(out_len)
    }

    fn decrypt(
        k: &Self::Key,
        n: u64,
        ad: &[u8],
        ciphertext: &[u8],
        out: &mut [u8],
    ) -> CipherResult<()> {
        if ciphertext.len().checked_sub(TAG_LEN) != Some(out.len()) {
            return Err(CipherError::Decrypt);
        }
        let (text, tag) = ciphertext.split_at(out.len());
        out.copy_from_slice(text);
        open(k, n, ad, tag, out).map(|_| ())
    }

    fn decrypt_in_place(
        k: &Self::Key,
        n: u64,
        ad: &[u8],
        in_out: &mut [u8],
        ciphertext_len: usize,
    ) -> CipherResult<usize> {
        if ciphertext_len > in_out.len() || ciphertext_len < TAG_LEN {
            return Err(CipherError::Decrypt);
        }
        let (text, tag) = in_out[..ciphertext_len].split_at_mut(ciphertext_len - TAG_LEN);
        open(k, n, ad, tag, text)
    }
}

/// Opens `text` in place against `tag`; on failure `text` holds nothing usable (ring
/// leaves it unspecified) and the caller drops the record.
fn open(k: &[u8; 32], n: u64, ad: &[u8], tag: &[u8], text: &mut [u8]) -> CipherResult<usize> {
    let tag = Tag::try_from(tag).map_err(|_| CipherError::Decrypt)?;
    key(k)
        .open_in_place_separate_tag(nonce(n), Aad::from(ad), tag, text, 0..)
        .map(|plain| plain.len())
        .map_err(|_| CipherError::Decrypt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clatter::bytearray::ByteArray;

    fn test_key() -> SensitiveByteArray<[u8; 32]> {
        SensitiveByteArray::from_slice(&[7u8; 32])
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The expected records were computed independently, with OpenSSL's AES-256-GCM
    /// through Python's `cryptography` (nonce = four zero bytes + the counter big-endian).
    #[test]
    fn seals_what_openssl_seals() {
        let mut out = [0u8; 5 + TAG_LEN];
        RingAesGcm::encrypt(&test_key(), 1, b"ad", b"hello", &mut out).unwrap();
        assert_eq!(hex(&out), "582dd50c5b4d72550ae8ab96df6a779fe777a7e162");
        let mut back = [0u8; 5];
        RingAesGcm::decrypt(&test_key(), 1, b"ad", &out, &mut back).unwrap();
        assert_eq!(&back, b"hello");
        // Another nonce, another AAD or a flipped bit is refused.
        assert!(RingAesGcm::decrypt(&test_key(), 2, b"ad", &out, &mut back).is_err());
        assert!(RingAesGcm::decrypt(&test_key(), 1, b"xx", &out, &mut back).is_err());
        out[0] ^= 1;
        assert!(RingAesGcm::decrypt(&test_key(), 1, b"ad", &out, &mut back).is_err());
    }

    /// Noise's REKEY (nonce 2^64 - 1, 32 zero bytes) through clatter's default method.
    #[test]
    fn rekeys_as_noise_says() {
        let next = RingAesGcm::rekey(&test_key()).unwrap();
        assert_eq!(
            hex(next.as_slice()),
            "f590782fc76a17d3847d154b6418cbf8a061f73ed7fd25db47b2e9b0cfb4b7c3"
        );
    }

    #[test]
    fn wrong_sizes_are_errors_not_panics() {
        let k = test_key();
        assert!(RingAesGcm::encrypt(&k, 0, &[], b"abc", &mut [0u8; 3]).is_err());
        assert!(RingAesGcm::encrypt_in_place(&k, 0, &[], &mut [0u8; 10], 5).is_err());
        assert!(RingAesGcm::decrypt(&k, 0, &[], &[0u8; 15], &mut []).is_err());
        assert!(RingAesGcm::decrypt_in_place(&k, 0, &[], &mut [0u8; 15], 15).is_err());
        assert!(RingAesGcm::decrypt_in_place(&k, 0, &[], &mut [0u8; 20], 21).is_err());
    }
}

//! In-process TLS (RELAY §8.9): the certificate chain of `rendezvous.tls_cert_file` and the
//! private key of `rendezvous.tls_key_file`, both PEM, made into the rustls configuration
//! the listener handshakes with (ring's primitives, as the relay's client side). The key
//! file is a secret file: owner-only, read once, its bytes wiped after parsing, and never
//! quoted in an error.

use std::io::Read as _;
use std::path::Path;
use std::sync::Arc;

use exec_server_core::config::secret::read_secret_file;
use exec_server_relay_core::tls::pem_error;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use zeroize::Zeroize as _;

/// Largest certificate file read: a chain is a few KiB.
const MAX_CERT_FILE_BYTES: u64 = 1024 * 1024;

/// Why the TLS files cannot be used; the text is a whole `invalid config: …` line.
#[derive(Debug, thiserror::Error)]
#[error("invalid config: {0}")]
pub struct TlsFilesError(String);

/// The server configuration for `cert_file` and `key_file`.
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
) -> Result<Arc<ServerConfig>, TlsFilesError> {
    let chain = read_chain(cert_file)?;
    let key = read_key(key_file)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring's provider supports the default TLS versions")
        .with_no_client_auth();
    let mut config = builder.with_single_cert(chain, key).map_err(|error| match error {
        rustls::Error::InconsistentKeys(_) => TlsFilesError(format!(
            "rendezvous.tls_key_file {} is not the private key of the certificate in rendezvous.tls_cert_file {}",
            key_file.display(),
            cert_file.display()
        )),
        other => TlsFilesError(format!(
            "rendezvous.tls_key_file {} cannot be used with rendezvous.tls_cert_file {}: {other}",
            key_file.display(),
            cert_file.display()
        )),
    })?;
    // The listener speaks HTTP/1.1 only (WebSocket upgrades need it).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Every certificate of the file, the server's own first.
fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFilesError> {
    let fail = |problem: String| {
        TlsFilesError(format!(
            "rendezvous.tls_cert_file {} {problem}",
            path.display()
        ))
    };
    let file = std::fs::File::open(path).map_err(|e| fail(format!("cannot be read: {e}")))?;
    let mut bytes = Vec::new();
    file.take(MAX_CERT_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(format!("cannot be read: {e}")))?;
    if bytes.len() as u64 > MAX_CERT_FILE_BYTES {
        return Err(fail(format!(
            "is larger than {MAX_CERT_FILE_BYTES} bytes; it cannot be a certificate chain"
        )));
    }
    let chain = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(format!("is not valid PEM: {}", pem_error(&e))))?;
    if chain.is_empty() {
        return Err(fail(
            "holds no PEM certificate (a `-----BEGIN CERTIFICATE-----` block)".into(),
        ));
    }
    Ok(chain)
}

/// The first private key of the file (PKCS#8, PKCS#1 or SEC1).
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsFilesError> {
    let fail = |problem: String| TlsFilesError(format!("rendezvous.tls_key_file {}", problem));
    let mut bytes = read_secret_file(path).map_err(|e| fail(e.describe(path)))?;
    let key = PrivateKeyDer::from_pem_slice(&bytes);
    bytes.zeroize();
    key.map_err(|error| match error {
        rustls::pki_types::pem::Error::NoItemsFound => fail(format!(
            "{} holds no PEM private key (a `-----BEGIN PRIVATE KEY-----`, `RSA PRIVATE KEY` or `EC PRIVATE KEY` block)",
            path.display()
        )),
        other => fail(format!(
            "{} is not valid PEM: {}",
            path.display(),
            pem_error(&other)
        )),
    })
}

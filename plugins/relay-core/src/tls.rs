//! TLS for the relay's client connections — `https` registries and `wss` rendezvous
//! sockets: rustls with ring's primitives, trusting the system's root certificates and,
//! when one is configured (`relay.ca_file`, `--ca-file`), the certificates of a CA file
//! besides them. The system's store is read the first time a TLS URL is used, so plain
//! `http`/`ws` never reads it.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::{self, PemObject as _};
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

/// Largest CA file read: a whole distribution bundle is a few hundred KiB.
pub const MAX_CA_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// The configuration that trusts the system's root certificates.
pub fn client_config() -> Arc<ClientConfig> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    Arc::clone(CONFIG.get_or_init(|| build(system_roots().clone())))
}

/// A configuration that trusts nothing, for an HTTP client that only ever speaks plain
/// `http` (the registry client needs a TLS configuration even then).
pub(crate) fn untrusting_config() -> Arc<ClientConfig> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    Arc::clone(CONFIG.get_or_init(|| build(RootCertStore::empty())))
}

/// What the relay's TLS connections trust: the system's roots, plus the certificates of a
/// CA file when one was given. Cheap to clone; one value serves every connection of an
/// executor or a harness stream.
#[derive(Clone, Default)]
pub struct TlsTrust {
    /// The CA file's certificates, already checked to be usable trust anchors.
    extra: Option<Arc<RootCertStore>>,
    /// Built the first time a TLS URL is used.
    config: Arc<OnceLock<Arc<ClientConfig>>>,
}

impl std::fmt::Debug for TlsTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsTrust")
            .field("extra_roots", &self.extra.as_ref().map_or(0, |r| r.len()))
            .finish()
    }
}

impl TlsTrust {
    /// The system's root certificates only.
    pub fn system() -> Self {
        Self::default()
    }

    /// The system's roots and, with `ca_file`, that file's certificates.
    pub fn with_ca_file(ca_file: Option<&Path>) -> Result<Self, CaFileError> {
        let Some(path) = ca_file else {
            return Ok(Self::system());
        };
        Ok(Self {
            extra: Some(Arc::new(read_ca_file(path)?)),
            config: Arc::default(),
        })
    }

    /// The rustls configuration for `https` and `wss` connections.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        let Some(extra) = &self.extra else {
            return client_config();
        };
        Arc::clone(self.config.get_or_init(|| {
            let mut roots = system_roots().clone();
            roots.roots.extend(extra.roots.iter().cloned());
            build(roots)
        }))
    }
}

/// Why a CA file cannot be used. The text completes `<key> …` (it starts with the path).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaFileError {
    #[error("{} cannot be read: {error}", path.display())]
    Read { path: PathBuf, error: String },
    #[error("{} is larger than {MAX_CA_FILE_BYTES} bytes; it cannot be a CA file", path.display())]
    TooLarge { path: PathBuf },
    #[error("{} holds no PEM certificate (a `-----BEGIN CERTIFICATE-----` block)", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{} is not valid PEM: {error}", path.display())]
    Pem { path: PathBuf, error: String },
    #[error("{}: certificate {index} cannot be a trust anchor: {error}", path.display())]
    Unusable {
        path: PathBuf,
        index: usize,
        error: String,
    },
}

/// Reads every certificate of a PEM file into a root store; an unusable certificate is an
/// error rather than skipped, since the operator named this file to be trusted.
fn read_ca_file(path: &Path) -> Result<RootCertStore, CaFileError> {
    let read_error = |error: std::io::Error| CaFileError::Read {
        path: path.to_owned(),
        error: error.to_string(),
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_CA_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_CA_FILE_BYTES {
        return Err(CaFileError::TooLarge {
            path: path.to_owned(),
        });
    }
    let mut roots = RootCertStore::empty();
    for (index, cert) in CertificateDer::pem_slice_iter(&bytes).enumerate() {
        let cert = cert.map_err(|error| CaFileError::Pem {
            path: path.to_owned(),
            error: pem_error(&error),
        })?;
        roots.add(cert).map_err(|error| CaFileError::Unusable {
            path: path.to_owned(),
            index: index + 1,
            error: error.to_string(),
        })?;
    }
    if roots.is_empty() {
        return Err(CaFileError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(roots)
}

/// A PEM parse error in words, without quoting the file's contents.
pub fn pem_error(error: &pem::Error) -> String {
    match error {
        pem::Error::MissingSectionEnd { .. } => "a section has no END line".into(),
        pem::Error::IllegalSectionStart { .. } => "a BEGIN line is malformed".into(),
        pem::Error::Base64Decode(_) => "a section is not valid base64".into(),
        pem::Error::NoItemsFound => "nothing found".into(),
        _ => "malformed PEM".into(),
    }
}

fn build(roots: RootCertStore) -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring's provider supports the default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// The system's root certificates (`SSL_CERT_FILE`, `SSL_CERT_DIR` or the distribution's
/// store), read once per process. Unreadable certificates are skipped with a warning;
/// none at all means every TLS connection fails with an unknown issuer (unless a CA file
/// supplies the issuer), which is said once here.
fn system_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for error in &found.errors {
            tracing::warn!("reading the system's root certificates: {error}");
        }
        let mut roots = RootCertStore::empty();
        let (added, ignored) = roots.add_parsable_certificates(found.certs);
        if ignored > 0 {
            tracing::warn!(
                "{ignored} system root certificates could not be parsed and are not trusted"
            );
        }
        if added == 0 {
            tracing::warn!("no system root certificates found: https registries and wss rendezvous sockets trust only a configured CA file");
        }
        roots
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(contents: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, contents).unwrap();
        (dir, path)
    }

    #[test]
    fn unusable_ca_files_are_refused_with_the_reason() {
        let missing = TlsTrust::with_ca_file(Some(Path::new("/nonexistent/ca.pem"))).unwrap_err();
        assert!(matches!(missing, CaFileError::Read { .. }), "{missing:?}");
        assert!(missing
            .to_string()
            .starts_with("/nonexistent/ca.pem cannot be read"));

        let (_dir, empty) = file(b"not a certificate\n");
        let error = TlsTrust::with_ca_file(Some(&empty)).unwrap_err();
        assert!(
            matches!(error, CaFileError::NoCertificate { .. }),
            "{error:?}"
        );

        let (_dir, broken) =
            file(b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n");
        let error = TlsTrust::with_ca_file(Some(&broken)).unwrap_err();
        assert!(matches!(error, CaFileError::Pem { .. }), "{error:?}");

        let (_dir, truncated) = file(b"-----BEGIN CERTIFICATE-----\nMIIB\n");
        let error = TlsTrust::with_ca_file(Some(&truncated)).unwrap_err();
        assert!(matches!(error, CaFileError::Pem { .. }), "{error:?}");

        // Valid base64, but not a certificate.
        let (_dir, garbage) =
            file(b"-----BEGIN CERTIFICATE-----\nAAECAwQFBgcICQ==\n-----END CERTIFICATE-----\n");
        let error = TlsTrust::with_ca_file(Some(&garbage)).unwrap_err();
        assert!(
            matches!(error, CaFileError::Unusable { index: 1, .. }),
            "{error:?}"
        );
    }

    #[test]
    fn no_ca_file_is_the_system_trust() {
        let trust = TlsTrust::with_ca_file(None).unwrap();
        assert!(trust.extra.is_none());
        assert!(Arc::ptr_eq(&trust.client_config(), &client_config()));
    }
}

//! TLS for the relay's client connections — `https` registries and `wss` rendezvous
//! sockets: one rustls configuration with ring's primitives and the system's root
//! certificates, shared by the registry client and the WebSocket connector, and built the
//! first time a TLS URL is used, so plain `http`/`ws` never reads the certificate store.

use std::sync::{Arc, OnceLock};

use rustls::{ClientConfig, RootCertStore};

/// The configuration that trusts the system's root certificates.
pub fn client_config() -> Arc<ClientConfig> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    Arc::clone(CONFIG.get_or_init(|| build(system_roots())))
}

/// A configuration that trusts nothing, for an HTTP client that only ever speaks plain
/// `http` (the registry client needs a TLS configuration even then).
pub(crate) fn untrusting_config() -> Arc<ClientConfig> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    Arc::clone(CONFIG.get_or_init(|| build(RootCertStore::empty())))
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
/// store). Unreadable certificates are skipped with a warning; none at all means every
/// TLS connection fails with an unknown issuer, which is said once here.
fn system_roots() -> RootCertStore {
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
        tracing::warn!("no system root certificates found: https registries and wss rendezvous sockets will fail");
    }
    roots
}

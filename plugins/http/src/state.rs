//! The plugin's state: its settings, the operator's target limits, and the one HTTP client
//! every request shares (its connection pool), built on first use.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use exec_server_core::proto::RpcError;
use exec_server_relay_core::tls::TlsTrust;
use reqwest::redirect::Policy;

use crate::config::HttpConfig;
use crate::targets::{CheckedResolver, Targets};

#[derive(Debug)]
pub(crate) struct HttpState {
    pub(crate) config: HttpConfig,
    pub(crate) targets: Arc<Targets>,
    trust: TlsTrust,
    client: OnceLock<Result<reqwest::Client, String>>,
}

impl HttpState {
    /// `ca_file`: `http.ca_file`, else `relay.ca_file`, with the key it came from; a file
    /// that cannot be used is a start-up error naming that key.
    pub(crate) fn new(
        config: HttpConfig,
        ca_file: Option<(PathBuf, &str)>,
    ) -> Result<Self, String> {
        let trust = match &ca_file {
            Some((path, key)) => TlsTrust::with_ca_file(Some(path))
                .map_err(|e| format!("invalid config: {key} {e}"))?,
            None => TlsTrust::system(),
        };
        Ok(Self {
            targets: Arc::new(Targets::new(&config)),
            config,
            trust,
            client: OnceLock::new(),
        })
    }

    /// The shared client; the system's root certificates are read the first time.
    pub(crate) fn client(&self) -> Result<&reqwest::Client, RpcError> {
        self.client
            .get_or_init(|| self.build_client())
            .as_ref()
            .map_err(crate::wire::failed)
    }

    /// Redirects are followed by hand (`redirect`), gzip and zstd bodies decoded (and
    /// their `content-encoding` and `content-length` removed), `https` trusted as the
    /// relay trusts it. No connection outlives its request: an idle pool would hold
    /// sockets no session is charged for, one per host a client names
    /// ([`crate::request::DESCRIPTORS_PER_REQUEST`]). With narrowed targets, host names resolve through the checking
    /// resolver and the executor's proxy variables are not used.
    fn build_client(&self) -> Result<reqwest::Client, String> {
        let tls = (*self.trust.client_config()).clone();
        let mut builder = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .redirect(Policy::none())
            .referer(false)
            .pool_max_idle_per_host(0)
            .gzip(true)
            .zstd(true);
        if self.config.restricts_targets() {
            builder = builder.no_proxy().dns_resolver(Arc::new(CheckedResolver {
                targets: Arc::clone(&self.targets),
            }));
        }
        builder
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))
    }
}

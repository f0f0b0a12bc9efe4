//! The `webhook` audit backend: posts batches of events to a collector as
//! `{"schema": "exec-server.audit/v1", "events": [<event>, …]}` (docs/AUDIT.md).
//!
//! `https` is trusted as the relay trusts its rendezvous: the system's roots plus
//! `ca_file` (else `relay.ca_file`). A `token_file` (owner-only) is sent as
//! `Authorization: Bearer`. Any answer but 2xx, a refused connection or a time-out fails
//! the batch, which the core retries and then counts as dropped; in `blocking` mode the
//! requests that change the machine are refused meanwhile. Failures are logged without the
//! URL, whose query may hold a credential.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use exec_server_core::audit::config::{BackendConfig, Mode};
use exec_server_core::audit::event::SCHEMA;
use exec_server_core::audit::{AuditBackend, AuditWriter};
use exec_server_core::config::secret::{read_token_file, SecretString};
use exec_server_core::config::ConfigSource;
use exec_server_relay_core::tls::TlsTrust;
use serde::Deserialize;

exec_server_core::inventory::submit! {
    AuditBackend { kind: "webhook", open }
}

/// The one `[relay]` key this backend reads: the CA file its trust defaults to.
#[derive(Debug, Default, Deserialize)]
struct RelayTrust {
    #[serde(default)]
    ca_file: Option<PathBuf>,
}

fn open(config: &BackendConfig, source: &ConfigSource) -> Result<Box<dyn AuditWriter>, String> {
    let url = config.url.as_deref().ok_or("needs `url`")?;
    let url = reqwest::Url::parse(url).map_err(|e| format!("`url` is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("`url` must be http:// or https://".to_owned());
    }
    let relay: RelayTrust = source.section("relay").unwrap_or_default();
    let ca_file = config.ca_file.clone().or(relay.ca_file);
    let trust = TlsTrust::with_ca_file(ca_file.as_deref()).map_err(|e| format!("ca_file: {e}"))?;
    if config.token_file.is_some() && url.scheme() == "http" {
        tracing::warn!("audit webhook: the bearer token of token_file travels in clear over http://; use https://");
    }
    let token = match &config.token_file {
        Some(path) => Some(read_token_file(path).map_err(|e| e.describe(path))?),
        None => None,
    };
    let client = reqwest::Client::builder()
        .use_preconfigured_tls((*trust.client_config()).clone())
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_millis(config.request_timeout_ms))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {}", e.without_url()))?;
    Ok(Box::new(Webhook {
        client,
        url,
        token,
        linger: (config.mode == Mode::Batch)
            .then(|| Duration::from_millis(config.flush_interval_ms)),
    }))
}

struct Webhook {
    client: reqwest::Client,
    url: reqwest::Url,
    token: Option<SecretString>,
    /// `batch` mode: how long a batch waits for more events.
    linger: Option<Duration>,
}

#[async_trait]
impl AuditWriter for Webhook {
    async fn write(&mut self, lines: &[Arc<str>]) -> Result<(), String> {
        let mut body = format!(r#"{{"schema":"{SCHEMA}","events":["#);
        for (i, line) in lines.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(line);
        }
        body.push_str("]}");
        let mut request = self
            .client
            .post(self.url.clone())
            .header("content-type", "application/json")
            .body(body);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token.expose());
        }
        let answer = request
            .send()
            .await
            .map_err(|e| format!("the collector cannot be reached: {}", e.without_url()))?;
        let status = answer.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the collector answered {status}"))
        }
    }

    fn linger(&self) -> Option<Duration> {
        self.linger
    }
}

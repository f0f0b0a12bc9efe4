//! Cutting one relay harness's physical connection while its stream lives on (RELAY §5.8).
//!
//! Each relay client gets connect bundles through [`CutBundles`]: the rendezvous's own
//! bundle with its socket URL pointed at a [`Cutter`], a TCP forwarder of this process in
//! front of the rendezvous. [`Cutter::cut`] closes every connection through it at once;
//! the harness notices, fetches a new bundle (through the forwarder again), reconnects and
//! resumes the stream with a `resume` frame. Only that client's socket is cut: the
//! executor's and the other clients' go to the rendezvous directly or through their own
//! forwarders.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exec_server_relay_core::harness::{RelayBundleProvider, RelayConnectArgs, RelayError};
use exec_server_relay_core::noise::NoisePublicKey;
use exec_server_relay_core::registry::{BaseUrl, ConnectBundle, RegistryClient, SecretString};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

use super::Failure;
use crate::target::HARNESS_TOKEN;

/// A TCP forwarder to the rendezvous whose connections can all be closed at once.
pub(super) struct Cutter {
    /// Where harness sockets are sent instead of the rendezvous (`127.0.0.1:PORT`).
    address: SocketAddr,
    /// The forwarding task of every connection still open.
    open: Arc<Mutex<Vec<AbortHandle>>>,
    accept: JoinHandle<()>,
}

impl Cutter {
    /// A forwarder to `upstream` (`127.0.0.1:PORT`).
    pub(super) async fn start(upstream: SocketAddr) -> Result<Arc<Self>, Failure> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| Failure::new(format!("bind the relay cutter: {e}")))?;
        let address = listener
            .local_addr()
            .map_err(|e| Failure::new(format!("the relay cutter's address: {e}")))?;
        let open: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let tracked = Arc::clone(&open);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let forward = tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let mut client = client;
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
                let mut open = tracked.lock().unwrap_or_else(|e| e.into_inner());
                open.retain(|task| !task.is_finished());
                open.push(forward.abort_handle());
            }
        });
        Ok(Arc::new(Self {
            address,
            open,
            accept,
        }))
    }

    /// Closes every connection through the forwarder (both directions, at once); returns
    /// how many there were.
    pub(super) fn cut(&self) -> usize {
        let open = std::mem::take(&mut *self.open.lock().unwrap_or_else(|e| e.into_inner()));
        let live = open.iter().filter(|task| !task.is_finished()).count();
        for task in open {
            task.abort();
        }
        live
    }
}

impl Drop for Cutter {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// Bundles from the registry, their socket URL pointed at a [`Cutter`].
struct CutBundles {
    registry: RegistryClient,
    /// `127.0.0.1:PORT` of the rendezvous, as its bundles name it.
    rendezvous: String,
    cutter: Arc<Cutter>,
}

#[async_trait::async_trait]
impl RelayBundleProvider for CutBundles {
    async fn connect_bundle(
        &self,
        environment_id: &str,
        harness_key: &NoisePublicKey,
    ) -> Result<ConnectBundle, RelayError> {
        let mut bundle = self.registry.connect(environment_id, harness_key).await?;
        bundle.url = bundle
            .url
            .replacen(&self.rendezvous, &self.cutter.address.to_string(), 1);
        Ok(bundle)
    }
}

/// Harness arguments for `environment` on the rendezvous at `registry_url`
/// (`http://127.0.0.1:PORT`) whose sockets go through `cutter`.
pub(super) fn harness_args(
    registry_url: &str,
    environment: &str,
    cutter: &Arc<Cutter>,
) -> Result<RelayConnectArgs, Failure> {
    let base = BaseUrl::parse(registry_url, false)
        .map_err(|e| Failure::new(format!("the rendezvous URL {registry_url}: {e}")))?;
    let registry = RegistryClient::new(
        base,
        SecretString::new(HARNESS_TOKEN),
        Duration::from_secs(10),
        false,
    );
    let rendezvous = registry_url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut args =
        RelayConnectArgs::new(registry_url, environment, SecretString::new(HARNESS_TOKEN));
    args.bundle_provider = Some(Arc::new(CutBundles {
        registry,
        rendezvous,
        cutter: Arc::clone(cutter),
    }));
    Ok(args)
}

/// The socket address of a `http://IP:PORT` URL.
pub(super) fn socket_address(url: &str) -> Result<SocketAddr, Failure> {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .map_err(|e| Failure::new(format!("the rendezvous URL {url}: {e}")))
}

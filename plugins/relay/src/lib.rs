pub mod config;
pub mod driver;
pub mod executor;
pub mod harness;
pub mod link;
pub mod noise;
pub mod proto;
pub mod registry;
pub mod reliable;
pub mod rendezvous;

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

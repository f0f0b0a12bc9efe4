//! Black-box integration tests: the real `exec-server` binary over real stdio pipes and
//! real sockets. One test binary (one link step); each module covers one area.

#[macro_use]
mod util;

mod audit;
mod capabilities;
mod client;
mod client_in_process;
mod codex;
mod config;
mod cp;
mod dependencies;
mod deploy;
mod docs;
mod doctor;
mod environment;
mod environment_config;
mod escape;
mod fair_share;
mod fs;
mod handshake;
mod http;
mod listen_exposure;
mod network_proxy;
mod process;
mod process_start_errors;
mod readme;
mod relay;
mod run_errors;
mod run_profiles;
mod run_sandbox;
mod sandbox;
mod sandbox_reuse;
mod search;
mod websocket;
mod ws_auth;

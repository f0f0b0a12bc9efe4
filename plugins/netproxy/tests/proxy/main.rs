//! The proxy over real loopback sockets: raw TCP clients, an upstream HTTP server and an
//! echo server on 127.0.0.1:0.

mod connect;
mod decider;
mod http;
mod lifecycle;
mod socks;
mod util;

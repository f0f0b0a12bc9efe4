//! Name resolution for the policy. The proxy resolves a host once, checks every address,
//! and connects only to those addresses: it never resolves again (no DNS rebinding).

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;

use async_trait::async_trait;

/// Resolves a host (never an IP literal: the policy handles those itself).
#[async_trait]
pub trait Resolver: Send + Sync {
    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<IpAddr>>;
}

/// The executor's own resolver (`getaddrinfo` through tokio).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait]
impl Resolver for SystemResolver {
    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<IpAddr>> {
        let mut addrs = Vec::new();
        for addr in tokio::net::lookup_host((host, port)).await? {
            if !addrs.contains(&addr.ip()) {
                addrs.push(addr.ip());
            }
        }
        Ok(addrs)
    }
}

/// A fixed table, for tests and for callers that pin names; unknown names fail.
#[derive(Debug, Clone, Default)]
pub struct StaticResolver {
    table: HashMap<String, Vec<IpAddr>>,
}

impl StaticResolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `host` (matched case-insensitively) → `addrs`.
    pub fn with(mut self, host: &str, addrs: &[IpAddr]) -> Self {
        self.table.insert(host.to_ascii_lowercase(), addrs.to_vec());
        self
    }
}

#[async_trait]
impl Resolver for StaticResolver {
    async fn resolve(&self, host: &str, _port: u16) -> io::Result<Vec<IpAddr>> {
        self.table
            .get(&host.to_ascii_lowercase())
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{host}: no such host")))
    }
}

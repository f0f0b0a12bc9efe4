//! The evaluation order of §3.3 for one connection: denylist, local/private check,
//! allowlist (then the decider, for misses only), resolution, limited mode.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{NetworkMode, ProxyConfig};
use crate::decider::{DeciderGate, PolicyDecider, PolicyRequest};
use crate::decision::{Decision, Protocol, Reason, Scope, Source};
use crate::host::{ip_literal, is_local_name, is_non_public, normalize_host};
use crate::pattern::DomainRules;
use crate::resolve::Resolver;

/// What is being asked for: (host, port, protocol) and, for HTTP, the method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub protocol: Protocol,
    /// In normal form ([`normalize_host`]).
    pub host: String,
    pub port: u16,
    /// `None` for SOCKS5; `CONNECT` for a tunnel.
    pub method: Option<String>,
}

impl Target {
    pub fn new(protocol: Protocol, host: &str, port: u16, method: Option<&str>) -> Self {
        Self {
            protocol,
            host: normalize_host(host),
            port,
            method: method.map(str::to_string),
        }
    }
}

/// Every decision taken, in order (a domain allow followed by a mode-guard deny is two),
/// and the addresses that were checked when the last one allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    pub decisions: Vec<Decision>,
    /// The only addresses the proxy may connect to; empty when blocked.
    pub addrs: Vec<IpAddr>,
}

impl Evaluation {
    fn blocked(decisions: Vec<Decision>) -> Self {
        Self {
            decisions,
            addrs: Vec::new(),
        }
    }

    /// The blocking decision, if the connection must not go on.
    pub fn block(&self) -> Option<&Decision> {
        self.decisions.last().filter(|d| !d.is_allow())
    }
}

/// The policy of one proxy.
pub struct PolicyEngine {
    rules: DomainRules,
    mode: NetworkMode,
    allow_local_binding: bool,
    resolver: Arc<dyn Resolver>,
    decider: Option<DeciderGate>,
    /// A name server that never answers must not hold a connection forever.
    resolve_timeout: Duration,
}

impl PolicyEngine {
    /// The decider is used only when `policy_decision_timeout_ms` is set (§3.4).
    pub fn new(
        proxy: &ProxyConfig,
        policy_decision_timeout_ms: Option<u64>,
        resolver: Arc<dyn Resolver>,
        decider: Option<Arc<dyn PolicyDecider>>,
        resolve_timeout: Duration,
    ) -> Self {
        let rules = proxy
            .domains
            .as_ref()
            .map(DomainRules::from_map)
            .unwrap_or_default();
        let decider = decider
            .zip(policy_decision_timeout_ms)
            .map(|(decider, ms)| DeciderGate::new(decider, ms));
        Self {
            rules,
            mode: proxy.mode,
            allow_local_binding: proxy.allow_local_binding,
            resolver,
            decider,
            resolve_timeout,
        }
    }

    pub async fn evaluate(&self, target: &Target) -> Evaluation {
        let (domain, addrs) = match self.evaluate_domain(target).await {
            Ok(allowed) => allowed,
            Err(blocked) => return Evaluation::blocked(vec![blocked]),
        };
        match self.mode_guard(target) {
            Some(blocked) => Evaluation::blocked(vec![domain, blocked]),
            None => Evaluation {
                decisions: vec![domain],
                addrs,
            },
        }
    }

    /// Steps 1–4: the host decision and the checked addresses.
    async fn evaluate_domain(&self, target: &Target) -> Result<(Decision, Vec<IpAddr>), Decision> {
        let host = target.host.as_str();
        let baseline = |reason| Decision::deny(Scope::Domain, Source::BaselinePolicy, reason);
        if self.rules.is_denied(host) {
            return Err(baseline(Reason::Denied));
        }
        let local_permitted = self.local_permitted(host);
        if !local_permitted && names_local_directly(host) {
            return Err(baseline(Reason::NotAllowedLocal));
        }
        let allowed = self.allowlist(target).await;
        if !allowed.is_allow() {
            return Err(allowed);
        }
        let addrs = self.resolve(host, target.port).await;
        if addrs.is_empty() || (!local_permitted && addrs.iter().any(|ip| is_non_public(*ip))) {
            return Err(baseline(Reason::NotAllowedLocal));
        }
        Ok((allowed, addrs))
    }

    /// Local targets pass with `allowLocalBinding`, or when the IP literal or
    /// `localhost` itself is allowlisted exactly (a wildcard or a name is not enough).
    fn local_permitted(&self, host: &str) -> bool {
        self.allow_local_binding
            || ((ip_literal(host).is_some() || host == "localhost")
                && self.rules.is_allowed_exactly(host))
    }

    /// Step 3, and the decider for a miss.
    async fn allowlist(&self, target: &Target) -> Decision {
        if self.rules.is_allowed(&target.host) {
            return Decision::allow(Source::BaselinePolicy);
        }
        match &self.decider {
            Some(gate) => {
                gate.ask(PolicyRequest {
                    protocol: target.protocol,
                    host: target.host.clone(),
                    port: target.port,
                })
                .await
            }
            None => Decision::deny(Scope::Domain, Source::BaselinePolicy, Reason::NotAllowed),
        }
    }

    /// Step 4: the addresses to check and then to connect to; empty on failure.
    async fn resolve(&self, host: &str, port: u16) -> Vec<IpAddr> {
        if let Some(ip) = ip_literal(host) {
            return vec![ip];
        }
        let lookup = self.resolver.resolve(host, port);
        match tokio::time::timeout(self.resolve_timeout, lookup).await {
            Ok(Ok(addrs)) => addrs,
            Ok(Err(error)) => {
                tracing::debug!(host, %error, "network proxy: resolution failed");
                Vec::new()
            }
            Err(_) => Vec::new(),
        }
    }

    /// Step 5: limited mode lets only read-only HTTP through. CONNECT would need a MITM
    /// to see methods, and SOCKS5 carries raw TCP whose methods cannot be seen at all.
    fn mode_guard(&self, target: &Target) -> Option<Decision> {
        if self.mode == NetworkMode::Full {
            return None;
        }
        let guard = |reason| Some(Decision::deny(Scope::NonDomain, Source::ModeGuard, reason));
        match target.protocol {
            Protocol::HttpsConnect => guard(Reason::MitmRequired),
            Protocol::Socks5Tcp => guard(Reason::MethodNotAllowed),
            Protocol::Http => match target.method.as_deref() {
                Some("GET" | "HEAD" | "OPTIONS") => None,
                _ => guard(Reason::MethodNotAllowed),
            },
        }
    }
}

/// An IP literal in a non-public range, or a `localhost` name: local without resolving.
fn names_local_directly(host: &str) -> bool {
    ip_literal(host).is_some_and(is_non_public) || is_local_name(host)
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;

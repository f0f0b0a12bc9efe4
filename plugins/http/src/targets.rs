//! What the operator lets `http/request` reach (`[http]`): schemes, hosts, and address
//! ranges. A URL is checked at every hop; a host name's addresses are filtered when they
//! are resolved, in the resolver the connection then uses, so the address connected to is
//! one that was checked (no second lookup that could answer differently).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use exec_server_core::proto::RpcError;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::{Host, Url};

use crate::config::HttpConfig;
use crate::wire;

/// The operator's limits, ready to check.
#[derive(Debug)]
pub(crate) struct Targets {
    schemes: Vec<String>,
    allow_loopback: bool,
    allow_private: bool,
    /// Lowercase; `*.x` entries as `.x`.
    hosts: Vec<String>,
}

/// Where an address leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    Public,
    Loopback,
    Private,
}

impl Targets {
    pub(crate) fn new(config: &HttpConfig) -> Self {
        let hosts = config
            .allowed_hosts
            .iter()
            .map(|h| {
                let h = h.to_ascii_lowercase();
                match h.strip_prefix('*') {
                    Some(suffix) => suffix.to_owned(),
                    None => h,
                }
            })
            .collect();
        Self {
            schemes: config.allowed_schemes.clone(),
            allow_loopback: config.allow_loopback,
            allow_private: config.allow_private,
            hosts,
        }
    }

    /// Checks the scheme, the host and, for an IP literal, its range.
    pub(crate) fn check_url(&self, url: &Url) -> Result<(), RpcError> {
        let scheme = url.scheme();
        if scheme != "http" && scheme != "https" {
            return Err(wire::unsupported_scheme(scheme));
        }
        if !self.schemes.iter().any(|s| s == scheme) {
            return Err(wire::target_refused(&format!(
                "the scheme {scheme} is not in http.allowed_schemes"
            )));
        }
        let host = url.host().ok_or_else(|| wire::invalid_url("empty host"))?;
        let (name, literal) = match host {
            Host::Domain(d) => (d.to_ascii_lowercase(), None),
            Host::Ipv4(ip) => (ip.to_string(), Some(IpAddr::V4(ip))),
            Host::Ipv6(ip) => (ip.to_string(), Some(IpAddr::V6(ip))),
        };
        if !self.host_allowed(&name) {
            return Err(wire::target_refused(&format!(
                "{name} is not in http.allowed_hosts"
            )));
        }
        if let Some(ip) = literal {
            if !self.address_allowed(ip) {
                return Err(wire::target_refused(&refusal(ip)));
            }
        }
        Ok(())
    }

    fn host_allowed(&self, name: &str) -> bool {
        self.hosts.is_empty()
            || self.hosts.iter().any(|rule| match rule.strip_prefix('.') {
                Some(_) => name.ends_with(rule.as_str()) && name.len() > rule.len(),
                None => rule == name,
            })
    }

    pub(crate) fn address_allowed(&self, ip: IpAddr) -> bool {
        match reach(ip) {
            Reach::Public => true,
            Reach::Loopback => self.allow_loopback,
            Reach::Private => self.allow_private,
        }
    }
}

fn refusal(ip: IpAddr) -> String {
    match reach(ip) {
        Reach::Loopback => format!("{ip} is a loopback address (http.allow_loopback)"),
        _ => format!("{ip} is a private address (http.allow_private)"),
    }
}

/// Where `ip` leads. An IPv6 address that carries an IPv4 one (mapped, compatible, NAT64,
/// 6to4) is judged as that IPv4 address, as the managed network's proxy judges it.
pub(crate) fn reach(ip: IpAddr) -> Reach {
    match ip {
        IpAddr::V4(v4) => reach_v4(v4),
        IpAddr::V6(v6) => match exec_server_netproxy::host::embedded_v4(v6) {
            Some(v4) => reach_v4(v4),
            None => reach_v6(v6),
        },
    }
}

fn reach_v4(ip: Ipv4Addr) -> Reach {
    let [a, b, c, _] = ip.octets();
    if ip.is_loopback() || ip.is_unspecified() {
        return Reach::Loopback;
    }
    let private = ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (18..20).contains(&b))
        || a >= 240;
    if private {
        Reach::Private
    } else {
        Reach::Public
    }
}

fn reach_v6(ip: Ipv6Addr) -> Reach {
    if ip.is_loopback() || ip.is_unspecified() {
        return Reach::Loopback;
    }
    let seg = ip.segments();
    let private = (seg[0] & 0xfe00) == 0xfc00 // ULA fc00::/7
        || (seg[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (seg[0] & 0xffc0) == 0xfec0 // site-local fec0::/10
        || ip.is_multicast()
        || (seg[0] == 0x2001 && seg[1] == 0x0db8) // documentation
        || (seg[0] == 0x2001 && seg[1] == 0) // Teredo: a tunnel to anywhere
        || (seg[0] == 0x0064 && seg[1] == 0xff9b); // NAT64 beyond /96
    if private {
        Reach::Private
    } else {
        Reach::Public
    }
}

/// A resolver that keeps only the addresses the operator allows; a name with none left
/// fails with [`NoAllowedAddress`], which the request reports as a refusal.
#[derive(Debug)]
pub(crate) struct CheckedResolver {
    pub(crate) targets: Arc<Targets>,
}

/// Every address of a name was refused by `[http]`.
#[derive(Debug)]
pub(crate) struct NoAllowedAddress(pub(crate) String);

impl std::fmt::Display for NoAllowedAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no address of {} is allowed (http.allow_loopback, http.allow_private)",
            self.0
        )
    }
}

impl std::error::Error for NoAllowedAddress {}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let targets = Arc::clone(&self.targets);
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let allowed: Vec<SocketAddr> =
                found.filter(|a| targets.address_allowed(a.ip())).collect();
            if allowed.is_empty() {
                return Err(Box::new(NoAllowedAddress(host)) as Box<_>);
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(toml: HttpConfig) -> Targets {
        Targets::new(&toml)
    }

    #[test]
    fn ranges_are_classified() {
        for (ip, expected) in [
            ("127.0.0.2", Reach::Loopback),
            ("0.0.0.0", Reach::Loopback),
            ("::1", Reach::Loopback),
            ("::ffff:127.0.0.1", Reach::Loopback),
            ("10.1.2.3", Reach::Private),
            ("169.254.169.254", Reach::Private),
            ("100.100.0.1", Reach::Private),
            ("192.0.2.2", Reach::Private),
            ("fd00::1", Reach::Private),
            ("fe80::1", Reach::Private),
            ("::ffff:192.168.1.1", Reach::Private),
            ("::127.0.0.1", Reach::Loopback),
            ("2002:7f00:1::", Reach::Loopback),
            ("64:ff9b::a00:1", Reach::Private),
            ("2001:0:4136:e378::1", Reach::Private),
            ("fec0::1", Reach::Private),
            ("8.8.8.8", Reach::Public),
            ("2606:4700::1111", Reach::Public),
        ] {
            assert_eq!(reach(ip.parse().unwrap()), expected, "{ip}");
        }
    }

    #[test]
    fn urls_are_checked_against_the_table() {
        let open = targets(HttpConfig::default());
        let url = |u: &str| Url::parse(u).unwrap();
        assert!(open.check_url(&url("http://127.0.0.1/")).is_ok());
        assert_eq!(
            open.check_url(&url("ftp://x/")).unwrap_err().message,
            "http/request only supports http and https URLs, got ftp"
        );
        let narrow = targets(HttpConfig {
            allowed_schemes: vec!["https".into()],
            allow_loopback: false,
            allow_private: false,
            allowed_hosts: vec![
                "*.example.com".into(),
                "api.test".into(),
                "127.0.0.1".into(),
            ],
            ..HttpConfig::default()
        });
        assert!(narrow.check_url(&url("https://a.example.com/")).is_ok());
        assert!(narrow.check_url(&url("https://API.test/")).is_ok());
        for refused in [
            "http://api.test/",
            "https://example.com/",
            "https://other.test/",
            "https://127.0.0.1/",
            "https://[::1]/",
        ] {
            let error = narrow.check_url(&url(refused)).unwrap_err();
            assert!(
                error
                    .message
                    .starts_with("http/request target is not allowed"),
                "{refused}: {error:?}"
            );
        }
    }
}

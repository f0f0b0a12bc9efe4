//! A proxy the client runs itself (CODEX-NETWORK.md §3.5): the loopback ports its proxy
//! variables name, which a managed child's network namespace gets forwarding listeners on.

use std::collections::BTreeSet;

use url::{Host, Url};

use crate::env::{ALL_PROXY_VARS, HTTP_PROXY_VARS};

/// Distinct ports one process may have bridged.
pub const MAX_BRIDGED_PORTS: usize = 16;

/// Why a start with `enforceManagedNetwork` and no `networkProxy` is refused; codex's
/// words for the first case.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientProxyError {
    #[error("failed to prepare host proxy routing bridge: managed proxy mode requires proxy environment variables")]
    NoProxy,
    #[error("failed to prepare host proxy routing bridge: {0} does not name a proxy on 127.0.0.1 or localhost, the only host a managed child's bridge reaches")]
    NotLoopback(String),
    #[error(
        "failed to prepare host proxy routing bridge: more than {MAX_BRIDGED_PORTS} proxy ports"
    )]
    TooManyPorts,
}

/// The ports of the proxies the variables in `env` name, joined with `extra` (the client's
/// `managedNetwork.loopbackPorts`), sorted and without duplicates. Every proxy variable
/// that is set must name `127.0.0.1` or `localhost`: inside the child's namespace nothing
/// else is reachable, and a variable pointing elsewhere would fail in the child instead.
pub fn loopback_proxy_ports<'a>(
    env: impl IntoIterator<Item = (&'a str, &'a str)>,
    extra: &[u16],
) -> Result<Vec<u16>, ClientProxyError> {
    let mut ports: BTreeSet<u16> = extra.iter().copied().filter(|&p| p != 0).collect();
    for (name, value) in env {
        if !is_proxy_var(name) || value.trim().is_empty() {
            continue;
        }
        let port = loopback_port(value.trim())
            .ok_or_else(|| ClientProxyError::NotLoopback(name.to_owned()))?;
        ports.insert(port);
    }
    if ports.is_empty() {
        return Err(ClientProxyError::NoProxy);
    }
    if ports.len() > MAX_BRIDGED_PORTS {
        return Err(ClientProxyError::TooManyPorts);
    }
    Ok(ports.into_iter().collect())
}

fn is_proxy_var(name: &str) -> bool {
    HTTP_PROXY_VARS.contains(&name) || ALL_PROXY_VARS.contains(&name)
}

/// The port of a proxy URL on `127.0.0.1` or `localhost` (`http://` is assumed without a
/// scheme, as curl does); `None` for anything else.
fn loopback_port(value: &str) -> Option<u16> {
    let url = match value.contains("://") {
        true => Url::parse(value).ok()?,
        false => Url::parse(&format!("http://{value}")).ok()?,
    };
    let loopback = match url.host()? {
        // Schemes the URL standard does not know (`socks5h:`) keep their host as text.
        Host::Domain(name) => name.eq_ignore_ascii_case("localhost") || name == "127.0.0.1",
        Host::Ipv4(address) => address == std::net::Ipv4Addr::LOCALHOST,
        Host::Ipv6(_) => false,
    };
    if !loopback {
        return None;
    }
    let port = url.port_or_known_default().or(match url.scheme() {
        "socks5" | "socks5h" | "socks4" | "socks4a" | "socks" => Some(1080),
        _ => None,
    })?;
    (port != 0).then_some(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_every_proxy_variable_and_the_extra_list() {
        let env = [
            ("HTTP_PROXY", "http://127.0.0.1:3128"),
            ("https_proxy", "http://localhost:3128/"),
            ("ALL_PROXY", "socks5h://127.0.0.1"),
            ("PIP_PROXY", "127.0.0.1:8080"),
            ("NO_PROXY", "example.com"),
            ("PATH", "/usr/bin"),
            ("FTP_PROXY", ""),
        ];
        assert_eq!(
            loopback_proxy_ports(env, &[43123, 0]),
            Ok(vec![1080, 3128, 8080, 43123])
        );
    }

    #[test]
    fn no_proxy_at_all_is_codex_s_refusal() {
        let error = loopback_proxy_ports([("PATH", "/bin")], &[]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "failed to prepare host proxy routing bridge: managed proxy mode requires proxy environment variables"
        );
    }

    #[test]
    fn a_proxy_off_loopback_is_named() {
        for value in [
            "http://proxy.corp:3128",
            "http://[::1]:3128",
            "http://127.0.0.2:3128",
            "http://user@10.0.0.1:80",
            "not a url at all",
            "http://127.0.0.1:0",
        ] {
            assert_eq!(
                loopback_proxy_ports([("HTTPS_PROXY", value)], &[]),
                Err(ClientProxyError::NotLoopback("HTTPS_PROXY".into())),
                "{value}"
            );
        }
    }

    #[test]
    fn ports_are_bounded() {
        let extra: Vec<u16> = (1..=17).collect();
        assert_eq!(
            loopback_proxy_ports([], &extra),
            Err(ClientProxyError::TooManyPorts)
        );
    }
}

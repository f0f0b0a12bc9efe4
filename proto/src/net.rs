//! Whether an address is this machine: the one loopback judgement of every listener and
//! URL check (a WebSocket listener without authentication, a rendezvous without tokens,
//! a `ws://` URL a token may travel to in clear).

use std::net::IpAddr;

/// Loopback in every spelling a socket accepts: 127.0.0.0/8, `::1`, and IPv4-mapped
/// `::ffff:127.x.y.z`. The unspecified addresses (`0.0.0.0`, `::`) are every interface.
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_in_every_spelling_is_loopback() {
        for text in ["127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(text.parse().unwrap()), "{text}");
        }
        for text in [
            "0.0.0.0",
            "::",
            "10.0.0.1",
            "::ffff:10.0.0.1",
            "fe80::1",
            "::127.0.0.1",
        ] {
            assert!(!is_loopback(text.parse().unwrap()), "{text}");
        }
    }
}

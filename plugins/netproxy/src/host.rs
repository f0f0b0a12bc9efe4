//! Host names and addresses: one normal form for matching, and the "non-public" test
//! of §3.3 step 2 (the ranges a sandboxed child must not reach without permission).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Lowercase, without IPv6 brackets or a trailing dot, so that `EXACT.TEST.`,
/// `exact.test` and `[::1]`/`::1` compare equal.
pub fn normalize_host(host: &str) -> String {
    let trimmed = host.trim();
    let unbracketed = trimmed
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(trimmed);
    unbracketed
        .strip_suffix('.')
        .unwrap_or(unbracketed)
        .to_ascii_lowercase()
}

/// The host as an IP literal, if it is one (after [`normalize_host`]).
pub fn ip_literal(host: &str) -> Option<IpAddr> {
    host.parse().ok()
}

/// `localhost` and its subdomains (RFC 6761) always name the local machine.
pub fn is_local_name(host: &str) -> bool {
    host == "localhost" || host.ends_with(".localhost")
}

/// True for every address outside the public unicast space.
pub fn is_non_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_non_public_v4(v4),
        IpAddr::V6(v6) => is_non_public_v6(v6),
    }
}

fn is_non_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_unspecified()
        || a == 0 // "this network"
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // TEST-NET-1
        || (a == 198 && b == 51 && c == 100) // TEST-NET-2
        || (a == 203 && b == 0 && c == 113) // TEST-NET-3
        || (a == 198 && (b == 18 || b == 19)) // benchmarking 198.18/15
        || ip.is_multicast()
        || a >= 240 // reserved and broadcast
}

fn is_non_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = embedded_v4(ip) {
        return is_non_public_v4(v4);
    }
    let seg = ip.segments();
    ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (seg[0] & 0xfe00) == 0xfc00 // ULA fc00::/7
        || (seg[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (seg[0] & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
        || (seg[0] == 0x2001 && seg[1] == 0x0db8) // documentation
        || (seg[0] == 0x2001 && seg[1] == 0) // Teredo: tunnels to anywhere
        || (seg[0] == 0x0100 && seg[1..4] == [0, 0, 0]) // discard 100::/64
}

/// The IPv4 address carried by IPv4-mapped, IPv4-compatible, NAT64 and 6to4 forms, so
/// that `::ffff:127.0.0.1` counts as loopback.
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let seg = ip.segments();
    let tail = || {
        Ipv4Addr::new(
            (seg[6] >> 8) as u8,
            seg[6] as u8,
            (seg[7] >> 8) as u8,
            seg[7] as u8,
        )
    };
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    if seg[..6] == [0; 6] && !ip.is_loopback() && !ip.is_unspecified() {
        return Some(tail()); // IPv4-compatible ::a.b.c.d
    }
    if seg[0] == 0x64 && seg[1] == 0xff9b && seg[2..6] == [0; 4] {
        return Some(tail()); // NAT64 64:ff9b::/96
    }
    if seg[0] == 0x2002 {
        let [a, b] = seg[1].to_be_bytes();
        let [c, d] = seg[2].to_be_bytes();
        return Some(Ipv4Addr::new(a, b, c, d)); // 6to4 2002::/16
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn non_public(text: &str) -> bool {
        is_non_public(text.parse().unwrap_or_else(|e| panic!("{text}: {e}")))
    }

    #[test]
    fn non_public_ranges() {
        let local = [
            "127.0.0.1",
            "127.0.0.2",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "192.0.2.2",
            "198.51.100.7",
            "203.0.113.9",
            "198.18.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.0.8",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2002:7f00:1::",
            "2001:db8::1",
            "::127.0.0.1",
        ];
        for text in local {
            assert!(non_public(text), "{text} must be non-public");
        }
        let public = [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.1",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ];
        for text in public {
            assert!(!non_public(text), "{text} must be public");
        }
    }

    #[test]
    fn normal_form() {
        assert_eq!(normalize_host("EXACT.Test."), "exact.test");
        assert_eq!(normalize_host("[::1]"), "::1");
        assert_eq!(ip_literal("::1"), Some(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert!(is_local_name("localhost") && is_local_name("a.localhost"));
        assert!(!is_local_name("localhost.example"));
    }
}

//! The `domains` map as allow and deny pattern lists, with codex's matching rules:
//! `exact.test` only itself, `*.x` subdomains only, `**.x` the apex and its subdomains,
//! all case-insensitive. A bare `*` or `**` matches every host.

use std::collections::BTreeMap;

use crate::config::DomainPermission;
use crate::host::{ip_literal, normalize_host};

#[derive(Debug, Clone, PartialEq, Eq)]
enum DomainPattern {
    Any,
    Exact(String),
    Subdomains(String),
    ApexAndSubdomains(String),
}

impl DomainPattern {
    fn parse(text: &str) -> Self {
        let text = normalize_host(text);
        if text == "*" || text == "**" {
            Self::Any
        } else if let Some(apex) = text.strip_prefix("**.") {
            Self::ApexAndSubdomains(apex.to_string())
        } else if let Some(apex) = text.strip_prefix("*.") {
            Self::Subdomains(apex.to_string())
        } else {
            Self::Exact(text)
        }
    }

    /// `host` must be in normal form.
    fn matches(&self, host: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(_) => self.matches_exactly(host),
            Self::Subdomains(apex) => is_subdomain(host, apex),
            Self::ApexAndSubdomains(apex) => host == apex || is_subdomain(host, apex),
        }
    }

    /// An exact entry for this host; IP literals compare as addresses (`::1` = `0::1`).
    fn matches_exactly(&self, host: &str) -> bool {
        let Self::Exact(entry) = self else {
            return false;
        };
        match (ip_literal(entry), ip_literal(host)) {
            (Some(a), Some(b)) => a == b,
            _ => entry == host,
        }
    }
}

fn is_subdomain(host: &str, apex: &str) -> bool {
    host.len() > apex.len() + 1
        && host.ends_with(apex)
        && host.as_bytes()[host.len() - apex.len() - 1] == b'.'
}

/// The allow and deny lists of a proxy; `none` entries are dropped (same as absent).
#[derive(Debug, Clone, Default)]
pub struct DomainRules {
    allow: Vec<DomainPattern>,
    deny: Vec<DomainPattern>,
}

impl DomainRules {
    pub fn from_map(domains: &BTreeMap<String, DomainPermission>) -> Self {
        let mut rules = Self::default();
        for (pattern, permission) in domains {
            let parsed = DomainPattern::parse(pattern);
            match permission {
                DomainPermission::Allow => rules.allow.push(parsed),
                DomainPermission::Deny => rules.deny.push(parsed),
                DomainPermission::None => {}
            }
        }
        rules
    }

    /// `host` must be in normal form here and below.
    pub fn is_denied(&self, host: &str) -> bool {
        self.deny.iter().any(|p| p.matches(host))
    }

    pub fn is_allowed(&self, host: &str) -> bool {
        self.allow.iter().any(|p| p.matches(host))
    }

    /// Allowed by an exact entry, not a wildcard: the only way a local IP literal or
    /// `localhost` passes the local check.
    pub fn is_allowed_exactly(&self, host: &str) -> bool {
        self.allow.iter().any(|p| p.matches_exactly(host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(entries: &[(&str, DomainPermission)]) -> DomainRules {
        let map = entries
            .iter()
            .map(|(p, v)| (p.to_string(), *v))
            .collect::<BTreeMap<_, _>>();
        DomainRules::from_map(&map)
    }

    #[test]
    fn pattern_rules() {
        use DomainPermission::Allow;
        let r = rules(&[
            ("exact.test", Allow),
            ("*.wild.test", Allow),
            ("**.dbl.test", Allow),
            ("127.0.0.1", Allow),
            ("[::1]", Allow),
        ]);
        let cases = [
            ("exact.test", true),
            ("sub.exact.test", false),
            ("wild.test", false),
            ("a.wild.test", true),
            ("a.b.wild.test", true),
            ("xwild.test", false),
            ("dbl.test", true),
            ("a.dbl.test", true),
            ("xdbl.test", false),
            ("other.test", false),
            ("127.0.0.1", true),
            ("0:0::1", true),
        ];
        for (host, expected) in cases {
            assert_eq!(r.is_allowed(host), expected, "{host}");
        }
        // Matching is case-insensitive: hosts are normalized before matching.
        assert!(r.is_allowed(&normalize_host("EXACT.TEST")));
        assert!(r.is_allowed_exactly("127.0.0.1"));
        assert!(!r.is_allowed_exactly("a.wild.test"));
    }

    #[test]
    fn none_is_no_entry_and_any_matches_all() {
        let r = rules(&[
            ("a.test", DomainPermission::None),
            ("*", DomainPermission::Deny),
        ]);
        assert!(!r.is_allowed("a.test"));
        assert!(r.is_denied("anything.test"));
    }
}

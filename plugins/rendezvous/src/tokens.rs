//! The configured bearer tokens (RELAY §8.3): their SHA-256 digests and what each grants.
//! Tokens stay in every node's configuration, whichever store holds the registrations:
//! nodes of one deployment share the `[rendezvous]` table, so each node checks tokens
//! without a round trip, and a store that is down does not lock the operator out of
//! `/metrics`.

use exec_server_core::config::secret::constant_time_eq;

use crate::capacity::Capacity;
use crate::config::{RendezvousConfig, TokenConfig, TokenRole};
use crate::store::TokenGrant;

/// One configured token: the SHA-256 of its bytes and what it grants.
struct TokenEntry {
    digest: [u8; 32],
    grant: TokenGrant,
}

/// Every configured token.
pub(crate) struct Tokens {
    entries: Vec<TokenEntry>,
    /// `rendezvous.insecure_no_auth`: every bearer token is the one entry.
    accept_any_token: bool,
}

/// `config` as the stores see it: with `insecure_no_auth`, one tenant that every bearer
/// token maps to (its digest is never compared).
pub(crate) fn effective_config(config: &RendezvousConfig) -> RendezvousConfig {
    let mut effective = config.clone();
    if config.insecure_no_auth {
        effective.tokens = vec![TokenConfig {
            name: "anonymous".to_owned(),
            sha256: "0".repeat(64),
            role: TokenRole::Any,
            environments: vec!["*".to_owned()],
            max_environments: None,
            max_harness_sockets: None,
        }];
    }
    effective
}

impl Tokens {
    /// The tokens of `config` (already passed through [`effective_config`]), each mapped
    /// to its tenant in `capacity`.
    pub(crate) fn new(config: &RendezvousConfig, capacity: &Capacity) -> Result<Self, String> {
        let mut entries = Vec::with_capacity(config.tokens.len());
        for (index, t) in config.tokens.iter().enumerate() {
            let mut digest = [0u8; 32];
            for (i, byte) in digest.iter_mut().enumerate() {
                *byte = t
                    .sha256
                    .get(i * 2..i * 2 + 2)
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                    .ok_or_else(|| "rendezvous token sha256 must be hex".to_owned())?;
            }
            entries.push(TokenEntry {
                digest,
                grant: TokenGrant {
                    name: t.name.clone(),
                    tenant: capacity.tenant_of_token(index),
                    role: t.role,
                    environments: t.environments.clone(),
                },
            });
        }
        Ok(Self {
            entries,
            accept_any_token: config.insecure_no_auth,
        })
    }

    /// The grant of the token whose SHA-256 is `digest`.
    pub(crate) fn authenticate(&self, digest: &[u8; 32]) -> Option<TokenGrant> {
        if self.accept_any_token {
            return self.entries.first().map(|entry| entry.grant.clone());
        }
        // Every digest is compared, so the time taken does not say which one matched.
        let mut found: Option<&TokenEntry> = None;
        for entry in &self.entries {
            if constant_time_eq(&entry.digest, digest) && found.is_none() {
                found = Some(entry);
            }
        }
        found.map(|entry| entry.grant.clone())
    }
}

//! What one policy step decided (§3.4's `scope`/`decision`/`source`/`reason`), and the
//! texts a blocked client sees for each reason (§3.5's table, in one place).

use serde::{Serialize, Serializer};

/// The three proxied protocols of §3.3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    Http,
    HttpsConnect,
    Socks5Tcp,
}

/// `domain` for host decisions, `non_domain` for the mode guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Domain,
    NonDomain,
}

/// The `decision` member: `ask` is a block the client's reviewer wants to hear about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    Deny,
    Ask,
}

/// Which layer decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    BaselinePolicy,
    Decider,
    ModeGuard,
}

/// The `reason` member. `Policy` carries a decider's own text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    Allow,
    Denied,
    NotAllowed,
    NotAllowedLocal,
    MethodNotAllowed,
    MitmRequired,
    Policy(String),
}

impl Reason {
    pub fn as_str(&self) -> &str {
        match self {
            Self::Allow => "allow",
            Self::Denied => "denied",
            Self::NotAllowed => "not_allowed",
            Self::NotAllowedLocal => "not_allowed_local",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::MitmRequired => "mitm_required",
            Self::Policy(text) => text,
        }
    }

    /// The `x-proxy-error` header of a blocked HTTP or CONNECT request.
    pub fn proxy_error(&self) -> &'static str {
        match self {
            Self::Allow | Self::NotAllowed | Self::NotAllowedLocal => "blocked-by-allowlist",
            Self::Denied => "blocked-by-denylist",
            Self::MethodNotAllowed => "blocked-by-method-policy",
            Self::MitmRequired => "blocked-by-mitm-required",
            Self::Policy(_) => "blocked-by-policy",
        }
    }

    /// The human message of a blocked request.
    pub fn message(&self) -> &'static str {
        match self {
            Self::Allow | Self::NotAllowed => "Domain not in allowlist.",
            Self::NotAllowedLocal => "Sandbox policy blocks local/private network addresses.",
            Self::Denied => "Domain denied by the sandbox policy.",
            Self::MethodNotAllowed => "Method not allowed in limited mode.",
            Self::MitmRequired => "MITM required for limited HTTPS.",
            Self::Policy(_) => "Request blocked by network policy.",
        }
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// One decision, as reported in `network/policyDecision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub scope: Scope,
    pub verdict: Verdict,
    pub source: Source,
    pub reason: Reason,
    /// True when the decider let through what the baseline allowlist did not.
    pub policy_override: bool,
}

impl Decision {
    pub(crate) fn allow(source: Source) -> Self {
        Self {
            scope: Scope::Domain,
            verdict: Verdict::Allow,
            source,
            reason: Reason::Allow,
            policy_override: source == Source::Decider,
        }
    }

    pub(crate) fn deny(scope: Scope, source: Source, reason: Reason) -> Self {
        Self {
            scope,
            verdict: Verdict::Deny,
            source,
            reason,
            policy_override: false,
        }
    }

    pub fn is_allow(&self) -> bool {
        self.verdict == Verdict::Allow
    }
}

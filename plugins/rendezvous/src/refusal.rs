//! The limits the rendezvous enforces, as refusals: for each, the HTTP status, the
//! `error.code` of RELAY §7.6, and the message that names the limit and the configuration
//! key that raises it. This is the one place that text lives; the handlers turn a
//! [`Refusal`] into a response and a log line.

use axum::http::StatusCode;

/// A request refused because a limit was reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `rendezvous.max_environments`: registrations the whole service holds.
    ServiceEnvironments { max: usize },
    /// A tenant's environments (`rendezvous.tokens[i].max_environments` or
    /// `rendezvous.max_environments_per_tenant`).
    TenantEnvironments {
        tenant: String,
        max: usize,
        key: String,
    },
    /// `rendezvous.max_harness_sockets_per_environment`.
    EnvironmentHarnessSockets { environment: String, max: usize },
    /// Harness sockets open to the environments a tenant registered
    /// (`rendezvous.tokens[i].max_harness_sockets` or
    /// `rendezvous.max_harness_sockets_per_tenant`).
    TenantHarnessSockets {
        tenant: String,
        max: usize,
        key: String,
    },
    /// The tenant's request rate (`rendezvous.rate_limit_per_tenant_*`).
    TenantRate {
        tenant: String,
        per_sec: u32,
        burst: u32,
        retry_after_secs: u64,
    },
    /// The peer address's request rate (`rendezvous.rate_limit_per_ip_*`).
    PeerRate {
        peer: String,
        per_sec: u32,
        burst: u32,
        retry_after_secs: u64,
    },
    /// `rendezvous.max_request_body_bytes`.
    RequestBody { max: usize },
}

impl Refusal {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::ServiceEnvironments { .. }
            | Self::TenantEnvironments { .. }
            | Self::EnvironmentHarnessSockets { .. }
            | Self::TenantHarnessSockets { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::TenantRate { .. } | Self::PeerRate { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::RequestBody { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    /// The `error.code` of the JSON body (and the `reason` of the log line).
    pub fn code(&self) -> &'static str {
        match self {
            // The service as a whole is full: §7.6 `overloaded`.
            Self::ServiceEnvironments { .. } | Self::EnvironmentHarnessSockets { .. } => {
                "overloaded"
            }
            // One tenant used up its own share; others are not affected.
            Self::TenantEnvironments { .. } | Self::TenantHarnessSockets { .. } => {
                "capacity_exhausted"
            }
            Self::TenantRate { .. } | Self::PeerRate { .. } => "rate_limited",
            Self::RequestBody { .. } => "payload_too_large",
        }
    }

    /// The configuration key(s) that raise the limit.
    pub fn config_key(&self) -> &str {
        match self {
            Self::ServiceEnvironments { .. } => "rendezvous.max_environments",
            Self::TenantEnvironments { key, .. } | Self::TenantHarnessSockets { key, .. } => key,
            Self::EnvironmentHarnessSockets { .. } => {
                "rendezvous.max_harness_sockets_per_environment"
            }
            Self::TenantRate { .. } => {
                "rendezvous.rate_limit_per_tenant_per_sec, rendezvous.rate_limit_per_tenant_burst"
            }
            Self::PeerRate { .. } => {
                "rendezvous.rate_limit_per_ip_per_sec, rendezvous.rate_limit_per_ip_burst"
            }
            Self::RequestBody { .. } => "rendezvous.max_request_body_bytes",
        }
    }

    /// The tenant whose limit was hit, if the limit is a tenant's.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Self::TenantEnvironments { tenant, .. }
            | Self::TenantHarnessSockets { tenant, .. }
            | Self::TenantRate { tenant, .. } => Some(tenant),
            _ => None,
        }
    }

    /// Seconds to announce in `Retry-After`.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::TenantRate {
                retry_after_secs, ..
            }
            | Self::PeerRate {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            _ => None,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = self.config_key();
        match self {
            Self::ServiceEnvironments { max } => {
                write!(f, "the service is at its limit of {max} environments ({key})")
            }
            Self::TenantEnvironments { tenant, max, .. } => write!(
                f,
                "tenant {tenant} is at its limit of {max} environments ({key})"
            ),
            Self::EnvironmentHarnessSockets { environment, max } => write!(
                f,
                "environment {environment} is at its limit of {max} harness sockets ({key})"
            ),
            Self::TenantHarnessSockets { tenant, max, .. } => write!(
                f,
                "the environments of tenant {tenant} are at their limit of {max} harness sockets ({key})"
            ),
            Self::TenantRate {
                tenant,
                per_sec,
                burst,
                ..
            } => write!(
                f,
                "tenant {tenant} is over its request rate limit of {per_sec} per second with bursts of {burst} ({key})"
            ),
            Self::PeerRate {
                peer,
                per_sec,
                burst,
                ..
            } => write!(
                f,
                "address {peer} is over its request rate limit of {per_sec} per second with bursts of {burst} ({key})"
            ),
            Self::RequestBody { max } => write!(
                f,
                "the request body is over the limit of {max} bytes ({key})"
            ),
        }
    }
}

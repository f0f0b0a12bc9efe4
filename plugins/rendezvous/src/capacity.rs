//! Capacity accounting of the memory store (RELAY §8.9): the environments the service and
//! each tenant hold, and the harness sockets open to each environment and to each tenant's
//! environments. It is the only place that counts them.
//!
//! Every unit of capacity is a [`Lease`] taken from a [`Gauge`] with a compare-and-add that
//! never passes the gauge's maximum, and given back when the lease is dropped. A
//! registration owns its [`EnvironmentSlot`] and a harness socket its [`HarnessSlot`], so
//! whatever ends them — deletion, expiry, replacement, a failed upgrade — releases exactly
//! what they took, exactly once, and concurrent requests can never over-admit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::config::{RendezvousConfig, TokenConfig};
use crate::refusal::Refusal;
use crate::store::TenantId;

/// A counter with a maximum.
#[derive(Debug)]
pub struct Gauge {
    held: AtomicUsize,
    max: usize,
    /// What a request that finds the gauge full is told.
    refusal: Refusal,
}

impl Gauge {
    fn new(max: usize, refusal: Refusal) -> Arc<Self> {
        Arc::new(Self {
            held: AtomicUsize::new(0),
            max,
            refusal,
        })
    }

    /// Takes one unit, unless the gauge is at its maximum.
    fn lease(self: &Arc<Self>) -> Result<Lease, Refusal> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < self.max).then_some(held + 1)
            })
            .map(|_| Lease(Arc::clone(self)))
            .map_err(|_| self.refusal.clone())
    }

    /// Units currently held.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

/// One unit of a [`Gauge`], given back on drop.
#[derive(Debug)]
pub struct Lease(Arc<Gauge>);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The capacity one registration holds: a service-wide slot and one of its tenant's.
#[derive(Debug)]
pub struct EnvironmentSlot {
    tenant: TenantId,
    _service: Lease,
    _tenant: Lease,
}

impl EnvironmentSlot {
    /// The tenant the environment is charged to.
    pub fn tenant(&self) -> TenantId {
        self.tenant
    }
}

/// The capacity one harness socket holds: a place at its environment and one among the
/// sockets of the environment owner's tenant.
#[derive(Debug)]
pub struct HarnessSlot {
    _environment: Lease,
    _tenant: Lease,
}

/// A tenant: every configured token that carries the same `name` (§8.3). Tokens that share
/// a name (an old and a new token during a rotation) share the tenant's quotas.
struct Tenant {
    name: String,
    environments: Arc<Gauge>,
    harness_sockets: Arc<Gauge>,
}

/// The service's capacity: the global environment limit, the tenants and their limits.
pub struct Capacity {
    environments: Arc<Gauge>,
    tenants: Vec<Tenant>,
    /// Tenant of each configured token, by position in `[[rendezvous.tokens]]`.
    token_tenants: Vec<TenantId>,
    harness_sockets_per_environment: usize,
}

/// The configured per-token value of a tenant (the first token of that name that sets
/// it, which configuration checks keep consistent) with its key, else the default's key.
fn tenant_limit(
    tokens: &[TokenConfig],
    name: &str,
    field: &str,
    per_token: impl Fn(&TokenConfig) -> Option<usize>,
    default: (usize, &str),
) -> (usize, String) {
    tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| t.name == name)
        .find_map(|(i, t)| per_token(t).map(|max| (max, format!("rendezvous.tokens[{i}].{field}"))))
        .unwrap_or_else(|| (default.0, default.1.to_owned()))
}

impl Capacity {
    pub fn new(config: &RendezvousConfig) -> Self {
        let mut tenants: Vec<Tenant> = Vec::new();
        let mut token_tenants = Vec::with_capacity(config.tokens.len());
        for token in &config.tokens {
            if let Some(i) = tenants.iter().position(|t| t.name == token.name) {
                token_tenants.push(TenantId(i));
                continue;
            }
            let (max_envs, envs_key) = tenant_limit(
                &config.tokens,
                &token.name,
                "max_environments",
                |t| t.max_environments,
                (
                    config.max_environments_per_tenant,
                    "rendezvous.max_environments_per_tenant",
                ),
            );
            let (max_sockets, sockets_key) = tenant_limit(
                &config.tokens,
                &token.name,
                "max_harness_sockets",
                |t| t.max_harness_sockets,
                (
                    config.max_harness_sockets_per_tenant,
                    "rendezvous.max_harness_sockets_per_tenant",
                ),
            );
            token_tenants.push(TenantId(tenants.len()));
            tenants.push(Tenant {
                name: token.name.clone(),
                environments: Gauge::new(
                    max_envs,
                    Refusal::TenantEnvironments {
                        tenant: token.name.clone(),
                        max: max_envs,
                        key: envs_key,
                    },
                ),
                harness_sockets: Gauge::new(
                    max_sockets,
                    Refusal::TenantHarnessSockets {
                        tenant: token.name.clone(),
                        max: max_sockets,
                        key: sockets_key,
                    },
                ),
            });
        }
        Self {
            environments: Gauge::new(
                config.max_environments,
                Refusal::ServiceEnvironments {
                    max: config.max_environments,
                },
            ),
            tenants,
            token_tenants,
            harness_sockets_per_environment: config.max_harness_sockets_per_environment,
        }
    }

    /// The tenant of the token at `index` of `[[rendezvous.tokens]]`.
    pub fn tenant_of_token(&self, index: usize) -> TenantId {
        self.token_tenants[index]
    }

    /// The tenant named `name`, as a store shared by several nodes records it.
    pub fn tenant_by_name(&self, name: &str) -> Option<TenantId> {
        self.tenants
            .iter()
            .position(|t| t.name == name)
            .map(TenantId)
    }

    pub fn tenant_name(&self, tenant: TenantId) -> &str {
        &self.tenants[tenant.0].name
    }

    pub fn tenant_count(&self) -> usize {
        self.tenants.len()
    }

    /// A slot for a new registration of `tenant`: the tenant's limit is checked first, so
    /// a tenant at its own limit is told so even when the service is full as well.
    pub fn lease_environment(&self, tenant: TenantId) -> Result<EnvironmentSlot, Refusal> {
        let tenant_lease = self.tenants[tenant.0].environments.lease()?;
        let service = self.environments.lease()?;
        Ok(EnvironmentSlot {
            tenant,
            _service: service,
            _tenant: tenant_lease,
        })
    }

    /// Charges an environment that changes hands (a takeover by another tenant's executor,
    /// §8.2) to `to`; the service-wide slot stays where it is.
    pub fn move_environment(
        &self,
        slot: &mut EnvironmentSlot,
        to: TenantId,
    ) -> Result<(), Refusal> {
        if slot.tenant != to {
            slot._tenant = self.tenants[to.0].environments.lease()?;
            slot.tenant = to;
        }
        Ok(())
    }

    /// The gauge of harness sockets of one environment.
    pub fn environment_sockets(&self, environment: &str) -> Arc<Gauge> {
        Gauge::new(
            self.harness_sockets_per_environment,
            Refusal::EnvironmentHarnessSockets {
                environment: exec_server_relay_core::proto::truncate_for_log(environment),
                max: self.harness_sockets_per_environment,
            },
        )
    }

    /// A place for one harness socket at an environment owned by `owner`.
    pub fn lease_harness_socket(
        &self,
        environment: &Arc<Gauge>,
        owner: TenantId,
    ) -> Result<HarnessSlot, Refusal> {
        let at_environment = environment.lease()?;
        let at_tenant = self.tenants[owner.0].harness_sockets.lease()?;
        Ok(HarnessSlot {
            _environment: at_environment,
            _tenant: at_tenant,
        })
    }

    /// The most environments `tenant` may hold, and what a registration over it is told
    /// (a store shared by several nodes counts them itself).
    pub fn tenant_environment_limit(&self, tenant: TenantId) -> (usize, Refusal) {
        let gauge = &self.tenants[tenant.0].environments;
        (gauge.max, gauge.refusal.clone())
    }

    /// The most environments the service may hold, and what a registration over it is told.
    pub fn service_environment_limit(&self) -> (usize, Refusal) {
        (self.environments.max, self.environments.refusal.clone())
    }

    /// Environments held service-wide.
    pub fn environments_held(&self) -> usize {
        self.environments.held()
    }

    /// Environments held by `tenant`.
    pub fn tenant_environments_held(&self, tenant: TenantId) -> usize {
        self.tenants[tenant.0].environments.held()
    }

    /// Harness sockets open to `tenant`'s environments.
    #[cfg(test)]
    pub fn tenant_harness_sockets_held(&self, tenant: TenantId) -> usize {
        self.tenants[tenant.0].harness_sockets.held()
    }
}

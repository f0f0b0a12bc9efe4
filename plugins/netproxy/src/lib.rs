//! The managed network of a process (CODEX-NETWORK.md §3): a policy proxy of its own.
//!
//! Each `process/start` with `networkProxy` gets a [`Proxy`]: an HTTP proxy (absolute-form
//! requests and CONNECT) and, with `enableSocks5`, a SOCKS5 proxy, both judged by the
//! §3.3 policy, every decision reported as a [`PolicyEvent`].
//!
//! Modules, one job each:
//! * [`config`]: the `networkProxy` wire types and their §3.1 errors.
//! * [`decision`]: scope/decision/source/reason and the texts a blocked client sees.
//! * [`host`]: host normal form and the non-public address ranges.
//! * [`pattern`]: the `domains` allow/deny patterns (`exact`, `*.x`, `**.x`).
//! * [`resolve`]: the [`Resolver`] trait, system and static resolvers.
//! * [`decider`]: the client reviewer ([`PolicyDecider`]) and its bounds.
//! * [`policy`]: the §3.3 evaluation order.
//! * [`event`]: the `network/policyDecision` members and logging.
//! * [`env`]: the child's proxy variables (§3.2).
//! * [`limits`]: sizes, counts and timeouts of one proxy.
//! * [`server`]: listeners, accept loops, shutdown.
//! * [`client_proxy`], [`bridge`]: a proxy the client runs itself, found in the child's
//!   variables and reached through forwarding listeners (no policy of ours).
//! * `http_proxy`, `socks`, `blocked`, `relay`, `upstream`, `context`: the
//!   connection handlers and their helpers.

mod blocked;
pub mod bridge;
pub mod client_proxy;
pub mod config;
mod context;
pub mod decider;
pub mod decision;
pub mod env;
pub mod event;
pub mod host;
mod http_proxy;
pub mod limits;
pub mod pattern;
pub mod policy;
mod relay;
pub mod resolve;
pub mod server;
pub mod socks;
mod upstream;

pub use bridge::Bridge;
pub use config::{ConfigError, NetworkProxyLaunchConfig};
pub use decider::{DeciderAnswer, PolicyDecider, PolicyRequest};
pub use decision::{Decision, Protocol, Reason, Scope, Source, Verdict};
pub use env::child_env;
pub use event::{EventSink, PolicyEvent};
pub use limits::{Admission, ProxyLimits};
pub use policy::{Evaluation, PolicyEngine, Target};
pub use resolve::{Resolver, StaticResolver, SystemResolver};
pub use server::{ListenerSource, Proxy, ProxyOptions};

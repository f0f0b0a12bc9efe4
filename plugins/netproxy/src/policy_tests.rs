use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::*;
use crate::config::{DomainPermission, ProxyConfig};
use crate::decider::{DeciderAnswer, PolicyRequest, MAX_PENDING_DECISIONS};
use crate::decision::Verdict;
use crate::resolve::StaticResolver;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn proxy(
    mode: NetworkMode,
    domains: &[(&str, DomainPermission)],
    allow_local: bool,
) -> ProxyConfig {
    ProxyConfig {
        enabled: true,
        enable_socks5: false,
        enable_socks5_udp: false,
        allow_upstream_proxy: false,
        dangerously_allow_all_unix_sockets: false,
        mode,
        domains: Some(domains.iter().map(|(p, v)| (p.to_string(), *v)).collect()),
        unix_sockets: None,
        allow_local_binding: allow_local,
        transparent_tcp: None,
        credential_masking: None,
        credential_providers: None,
    }
}

fn resolver() -> StaticResolver {
    StaticResolver::new()
        .with("public.test", &[ip("93.184.216.34")])
        .with("other.test", &[ip("93.184.216.35")])
        .with("vm", &[ip("127.0.0.1")])
        .with("mixed.test", &[ip("93.184.216.34"), ip("10.0.0.1")])
        .with("localhost", &[ip("127.0.0.1")])
}

fn engine(config: &ProxyConfig) -> PolicyEngine {
    PolicyEngine::new(
        config,
        None,
        Arc::new(resolver()),
        None,
        Duration::from_secs(5),
    )
}

fn http(host: &str, method: &str) -> Target {
    Target::new(Protocol::Http, host, 80, Some(method))
}

/// (scope, verdict, source, reason) of each decision.
fn summary(evaluation: &Evaluation) -> Vec<(Scope, Verdict, Source, String)> {
    evaluation
        .decisions
        .iter()
        .map(|d| (d.scope, d.verdict, d.source, d.reason.as_str().to_string()))
        .collect()
}

fn one(verdict: Verdict, source: Source, reason: &str) -> Vec<(Scope, Verdict, Source, String)> {
    vec![(Scope::Domain, verdict, source, reason.to_string())]
}

use DomainPermission::{Allow, Deny};
use NetworkMode::{Full, Limited};

#[tokio::test]
async fn baseline_steps_in_order() {
    let config = proxy(
        Full,
        &[
            ("**.evil.test", Allow),
            ("evil.test", Deny),
            ("public.test", Allow),
            ("vm", Allow),
            ("ghost.test", Allow),
            ("127.0.0.1", Allow),
            ("192.0.2.2", Allow),
            ("*.wild.test", Allow),
            ("mixed.test", Allow),
        ],
        false,
    );
    let engine = engine(&config);
    let base = Source::BaselinePolicy;
    let cases = [
        ("evil.test", one(Verdict::Deny, base, "denied")),
        ("public.test", one(Verdict::Allow, base, "allow")),
        ("other.test", one(Verdict::Deny, base, "not_allowed")),
        ("127.0.0.2", one(Verdict::Deny, base, "not_allowed_local")),
        ("::1", one(Verdict::Deny, base, "not_allowed_local")),
        (
            "[::ffff:127.0.0.1]",
            one(Verdict::Deny, base, "not_allowed_local"),
        ),
        ("192.0.2.3", one(Verdict::Deny, base, "not_allowed_local")),
        ("localhost", one(Verdict::Deny, base, "not_allowed_local")),
        ("127.0.0.1", one(Verdict::Allow, base, "allow")),
        ("192.0.2.2", one(Verdict::Allow, base, "allow")),
        // Allowlisted names resolving to local addresses stay blocked.
        ("vm", one(Verdict::Deny, base, "not_allowed_local")),
        ("mixed.test", one(Verdict::Deny, base, "not_allowed_local")),
        // Allowlisted but unresolvable: fail closed.
        ("ghost.test", one(Verdict::Deny, base, "not_allowed_local")),
    ];
    for (host, expected) in cases {
        assert_eq!(
            summary(&engine.evaluate(&http(host, "GET")).await),
            expected,
            "{host}"
        );
    }
    let allowed = engine.evaluate(&http("127.0.0.1", "GET")).await;
    assert_eq!(allowed.addrs, vec![ip("127.0.0.1")]);
}

#[tokio::test]
async fn localhost_exactly_allowlisted_passes_but_a_wildcard_does_not() {
    let exact = engine(&proxy(Full, &[("localhost", Allow)], false));
    let evaluation = exact.evaluate(&http("LOCALHOST", "GET")).await;
    assert_eq!(
        summary(&evaluation),
        one(Verdict::Allow, Source::BaselinePolicy, "allow")
    );
    assert_eq!(evaluation.addrs, vec![ip("127.0.0.1")]);
    let wildcard = engine(&proxy(Full, &[("*", Allow)], false));
    let evaluation = wildcard.evaluate(&http("127.0.0.1", "GET")).await;
    assert_eq!(
        summary(&evaluation),
        one(Verdict::Deny, Source::BaselinePolicy, "not_allowed_local")
    );
}

#[tokio::test]
async fn allow_local_binding_skips_the_local_check_but_not_the_allowlist() {
    let engine = engine(&proxy(Full, &[("vm", Allow), ("127.0.0.2", Allow)], true));
    let base = Source::BaselinePolicy;
    assert_eq!(
        summary(&engine.evaluate(&http("vm", "GET")).await),
        one(Verdict::Allow, base, "allow")
    );
    assert_eq!(
        summary(&engine.evaluate(&http("127.0.0.2", "GET")).await),
        one(Verdict::Allow, base, "allow")
    );
    assert_eq!(
        summary(&engine.evaluate(&http("127.0.0.3", "GET")).await),
        one(Verdict::Deny, base, "not_allowed")
    );
}

#[tokio::test]
async fn empty_or_none_domains_block_everything() {
    for domains in [&[][..], &[("public.test", DomainPermission::None)][..]] {
        let engine = engine(&proxy(Full, domains, false));
        assert_eq!(
            summary(&engine.evaluate(&http("public.test", "GET")).await),
            one(Verdict::Deny, Source::BaselinePolicy, "not_allowed")
        );
    }
}

#[tokio::test]
async fn limited_mode_guards_methods_connect_and_socks() {
    let engine = engine(&proxy(Limited, &[("public.test", Allow)], false));
    let allow = (
        Scope::Domain,
        Verdict::Allow,
        Source::BaselinePolicy,
        "allow".to_string(),
    );
    let guard = |reason: &str| {
        (
            Scope::NonDomain,
            Verdict::Deny,
            Source::ModeGuard,
            reason.to_string(),
        )
    };
    for method in ["GET", "HEAD", "OPTIONS"] {
        let evaluation = engine.evaluate(&http("public.test", method)).await;
        assert_eq!(summary(&evaluation), vec![allow.clone()], "{method}");
        assert!(evaluation.block().is_none());
    }
    for method in ["POST", "PUT", "DELETE", "get"] {
        let evaluation = engine.evaluate(&http("public.test", method)).await;
        assert_eq!(
            summary(&evaluation),
            vec![allow.clone(), guard("method_not_allowed")],
            "{method}"
        );
        assert!(evaluation.addrs.is_empty());
    }
    let connect = Target::new(Protocol::HttpsConnect, "public.test", 443, Some("CONNECT"));
    assert_eq!(
        summary(&engine.evaluate(&connect).await),
        vec![allow.clone(), guard("mitm_required")]
    );
    let socks = Target::new(Protocol::Socks5Tcp, "public.test", 443, None);
    assert_eq!(
        summary(&engine.evaluate(&socks).await),
        vec![allow, guard("method_not_allowed")]
    );
    // A blocked host never reaches the mode guard.
    let denied = engine.evaluate(&http("other.test", "POST")).await;
    assert_eq!(
        summary(&denied),
        one(Verdict::Deny, Source::BaselinePolicy, "not_allowed")
    );
}

/// A decider that answers from a script, counts its calls, and can hang forever.
struct ScriptedDecider {
    answer: Option<DeciderAnswer>,
    hang: bool,
    calls: AtomicUsize,
}

impl ScriptedDecider {
    fn new(answer: Option<DeciderAnswer>, hang: bool) -> Arc<Self> {
        Arc::new(Self {
            answer,
            hang,
            calls: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl PolicyDecider for ScriptedDecider {
    async fn decide(&self, _request: PolicyRequest) -> Option<DeciderAnswer> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.hang {
            std::future::pending::<()>().await;
        }
        self.answer.clone()
    }
}

fn with_decider(
    config: &ProxyConfig,
    decider: Arc<ScriptedDecider>,
    timeout_ms: Option<u64>,
) -> PolicyEngine {
    PolicyEngine::new(
        config,
        timeout_ms,
        Arc::new(resolver()),
        Some(decider),
        Duration::from_secs(5),
    )
}

#[tokio::test]
async fn decider_answers_map_to_decisions() {
    let config = proxy(Full, &[("evil.test", Deny)], false);
    let dec = Source::Decider;
    let cases = [
        (
            Some(DeciderAnswer::Allow),
            one(Verdict::Allow, dec, "allow"),
        ),
        (
            Some(DeciderAnswer::Deny {
                reason: Some("my_reason".into()),
            }),
            one(Verdict::Deny, dec, "my_reason"),
        ),
        (
            Some(DeciderAnswer::Deny { reason: None }),
            one(Verdict::Deny, dec, "not_allowed"),
        ),
        (
            Some(DeciderAnswer::Ask {
                reason: Some("r".into()),
            }),
            one(Verdict::Ask, dec, "r"),
        ),
        (None, one(Verdict::Deny, dec, "not_allowed")),
    ];
    for (answer, expected) in cases {
        let decider = ScriptedDecider::new(answer.clone(), false);
        let engine = with_decider(&config, decider.clone(), Some(1000));
        let evaluation = engine.evaluate(&http("public.test", "GET")).await;
        assert_eq!(summary(&evaluation), expected, "{answer:?}");
        assert_eq!(decider.calls.load(Ordering::SeqCst), 1);
        let allowed = answer == Some(DeciderAnswer::Allow);
        assert_eq!(evaluation.decisions[0].policy_override, allowed);
        assert_eq!(evaluation.addrs.is_empty(), !allowed);
    }
}

#[tokio::test]
async fn decider_is_asked_only_about_allowlist_misses() {
    let decider = ScriptedDecider::new(Some(DeciderAnswer::Allow), false);
    let config = proxy(
        Limited,
        &[("evil.test", Deny), ("public.test", Allow)],
        false,
    );
    let engine = with_decider(&config, decider.clone(), Some(1000));
    let base = Source::BaselinePolicy;
    assert_eq!(
        summary(&engine.evaluate(&http("evil.test", "GET")).await),
        one(Verdict::Deny, base, "denied")
    );
    assert_eq!(
        summary(&engine.evaluate(&http("127.0.0.2", "GET")).await),
        one(Verdict::Deny, base, "not_allowed_local")
    );
    let post = engine.evaluate(&http("public.test", "POST")).await;
    assert_eq!(post.decisions[1].reason, Reason::MethodNotAllowed);
    assert_eq!(decider.calls.load(Ordering::SeqCst), 0);
    // The decider's allow still goes through resolution and the mode guard.
    assert_eq!(
        summary(&engine.evaluate(&http("vm", "GET")).await),
        one(Verdict::Deny, base, "not_allowed_local")
    );
    let guarded = engine.evaluate(&http("other.test", "POST")).await;
    assert_eq!(guarded.decisions[0].source, Source::Decider);
    assert_eq!(guarded.decisions[1].reason, Reason::MethodNotAllowed);
    assert_eq!(decider.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn without_a_timeout_the_decider_is_not_used() {
    let decider = ScriptedDecider::new(Some(DeciderAnswer::Allow), false);
    let engine = with_decider(&proxy(Full, &[], false), decider.clone(), None);
    assert_eq!(
        summary(&engine.evaluate(&http("public.test", "GET")).await),
        one(Verdict::Deny, Source::BaselinePolicy, "not_allowed")
    );
    assert_eq!(decider.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_silent_decider_is_denied_after_timeout_plus_five_seconds() {
    let decider = ScriptedDecider::new(Some(DeciderAnswer::Allow), true);
    let engine = with_decider(&proxy(Full, &[], false), decider, Some(1000));
    let started = tokio::time::Instant::now();
    let evaluation = engine.evaluate(&http("public.test", "GET")).await;
    assert_eq!(
        summary(&evaluation),
        one(Verdict::Deny, Source::Decider, "not_allowed")
    );
    assert_eq!(started.elapsed(), Duration::from_secs(6));
}

#[tokio::test(start_paused = true)]
async fn more_than_256_pending_decisions_are_denied_at_once() {
    let decider = ScriptedDecider::new(Some(DeciderAnswer::Allow), true);
    let engine = Arc::new(with_decider(
        &proxy(Full, &[], false),
        decider.clone(),
        Some(60_000),
    ));
    let mut pending = Vec::new();
    for _ in 0..MAX_PENDING_DECISIONS {
        let engine = engine.clone();
        pending.push(tokio::spawn(async move {
            engine.evaluate(&http("public.test", "GET")).await
        }));
    }
    while decider.calls.load(Ordering::SeqCst) < MAX_PENDING_DECISIONS {
        tokio::task::yield_now().await;
    }
    let started = tokio::time::Instant::now();
    let overflow = engine.evaluate(&http("public.test", "GET")).await;
    assert_eq!(
        summary(&overflow),
        one(Verdict::Deny, Source::Decider, "not_allowed")
    );
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(decider.calls.load(Ordering::SeqCst), MAX_PENDING_DECISIONS);
    for task in pending {
        task.abort();
    }
}

/// Answers `first` once, then `later`; counts calls.
struct RebindingResolver {
    calls: AtomicUsize,
}

#[async_trait]
impl Resolver for RebindingResolver {
    async fn resolve(&self, _host: &str, _port: u16) -> std::io::Result<Vec<IpAddr>> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(vec![if call == 0 {
            ip("93.184.216.34")
        } else {
            ip("127.0.0.1")
        }])
    }
}

#[tokio::test]
async fn evaluation_resolves_once_and_returns_the_checked_addresses() {
    let resolver = Arc::new(RebindingResolver {
        calls: AtomicUsize::new(0),
    });
    let config = proxy(Full, &[("rebind.test", Allow)], false);
    let engine = PolicyEngine::new(
        &config,
        None,
        resolver.clone(),
        None,
        Duration::from_secs(5),
    );
    let evaluation = engine.evaluate(&http("rebind.test", "GET")).await;
    assert_eq!(evaluation.addrs, vec![ip("93.184.216.34")]);
    assert_eq!(resolver.calls.load(Ordering::SeqCst), 1);
}

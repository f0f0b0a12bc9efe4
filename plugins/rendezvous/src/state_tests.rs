//! Registration lifetimes and capacity accounting of the [`Hub`], under paused time: the
//! expiry rules of §8.2 plus the attach timeout, lazy expiry and the sweep, and the books
//! (every removal gives back exactly one slot) under random operations and thread races.

use super::*;
use crate::config::{TokenConfig, TokenRole};

const GRACE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(600);
const ATTACH: Duration = Duration::from_secs(60);

fn token(name: &str, max_environments: Option<usize>) -> TokenConfig {
    TokenConfig {
        name: name.to_owned(),
        sha256: "0".repeat(64),
        role: TokenRole::Executor,
        environments: vec!["*".to_owned()],
        max_environments,
        max_harness_sockets: None,
    }
}

/// A hub with tenants `a` (token 0) and `b` (token 1).
fn hub_with(edit: impl FnOnce(&mut RendezvousConfig)) -> Arc<Hub> {
    let mut config = RendezvousConfig {
        tokens: vec![token("a", None), token("b", None)],
        ..RendezvousConfig::default()
    };
    edit(&mut config);
    let capacity = Capacity::new(&config);
    Hub::new(&config, capacity, RouterTiming::default())
}

fn hub() -> Arc<Hub> {
    hub_with(|_| {})
}

fn tenant(hub: &Hub, token: usize) -> TenantId {
    hub.capacity().tenant_of_token(token)
}

fn key(n: u8) -> NoisePublicKey {
    NoisePublicKey::x25519([n; 32])
}

/// A socket handle whose frames land in a channel instead of a WebSocket.
fn socket(hub: &Hub) -> (SocketHandle, mpsc::Receiver<Out>) {
    let (tx, rx) = mpsc::channel(64);
    let handle = SocketHandle {
        id: hub.next_socket.fetch_add(1, Ordering::Relaxed),
        tx,
        kill: CancellationToken::new(),
        written: CancellationToken::new(),
    };
    (handle, rx)
}

fn register(hub: &Hub, id: &str, key: NoisePublicKey, token: usize) -> Result<String, Refusal> {
    match hub.register(id, key, None, tenant(hub, token)) {
        Ok(reg) => Ok(reg),
        Err(RegisterRefusal::Capacity(refusal)) => Err(refusal),
        Err(RegisterRefusal::Busy) => panic!("{id}: busy"),
    }
}

/// Registers and attaches an executor socket; returns the registration and the socket.
fn attached(hub: &Hub, id: &str, n: u8) -> (String, SocketHandle) {
    let reg = register(hub, id, key(n), 0).unwrap();
    let (handle, _) = socket(hub);
    assert!(hub.attach_executor(id, &reg, &handle));
    (reg, handle)
}

fn exists(hub: &Hub, id: &str) -> bool {
    !matches!(hub.connectable(id), Connectable::NotFound)
}

/// Environments held, as the books say (no lazy expiry on the way).
fn held(hub: &Hub) -> usize {
    hub.capacity().environments_held()
}

/// The books agree with the state: one service slot per environment entry, one tenant
/// slot per environment charged to that tenant, and no gauge above its limit.
fn assert_books(hub: &Hub) {
    let envs = hub.lock();
    let capacity = hub.capacity();
    assert_eq!(capacity.environments_held(), envs.len());
    for t in 0..capacity.tenant_count() {
        let id = capacity.tenant_of_token(t);
        let charged = envs
            .values()
            .filter(|e| e.registration.slot.tenant() == id)
            .count();
        assert_eq!(capacity.tenant_environments_held(id), charged, "tenant {t}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_registration_that_never_attaches_expires_after_the_attach_timeout() {
    let hub = hub();
    register(&hub, "idle", key(1), 0).unwrap();
    tokio::time::advance(ATTACH - Duration::from_millis(1)).await;
    assert!(matches!(hub.connectable("idle"), Connectable::Unavailable));
    assert_eq!(held(&hub), 1);
    tokio::time::advance(Duration::from_millis(1)).await;
    // Lazy expiry: the access itself deletes it.
    assert!(!exists(&hub, "idle"));
    assert_eq!(held(&hub), 0);
    assert_eq!(hub.capacity().tenant_environments_held(tenant(&hub, 0)), 0);
}

#[tokio::test(start_paused = true)]
async fn re_registering_does_not_extend_the_attach_timeout() {
    let hub = hub();
    let reg = register(&hub, "idle", key(1), 0).unwrap();
    tokio::time::advance(ATTACH / 2).await;
    assert_eq!(register(&hub, "idle", key(1), 0).unwrap(), reg);
    tokio::time::advance(ATTACH / 2).await;
    assert!(!exists(&hub, "idle"));
}

#[tokio::test(start_paused = true)]
async fn the_sweeper_expires_registrations_nobody_asks_about() {
    let hub = hub();
    let stop = CancellationToken::new();
    let sweeper = hub.spawn_sweeper(stop.clone());
    register(&hub, "idle", key(1), 0).unwrap();
    let (_, executor) = attached(&hub, "gone", 2);
    hub.detach_executor("gone", executor.id, false);
    assert_eq!(held(&hub), 2);
    // Paused time: sleeping lets the sweeper's ticks run in order.
    tokio::time::sleep(ATTACH + hub.timing.sweep_every).await;
    assert_eq!(held(&hub), 1, "the never-attached registration was swept");
    tokio::time::sleep(TTL).await;
    assert_eq!(held(&hub), 0, "the detached registration was swept");
    assert!(hub.lock().is_empty());
    stop.cancel();
    sweeper.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_detached_registration_lives_through_the_grace_and_dies_at_the_ttl() {
    let hub = hub();
    let (reg, executor) = attached(&hub, "env", 1);
    // Attached: nothing expires, however long.
    tokio::time::advance(TTL * 10).await;
    assert!(matches!(hub.connectable("env"), Connectable::Yes { .. }));
    hub.detach_executor("env", executor.id, false);
    tokio::time::advance(GRACE - Duration::from_millis(1)).await;
    assert!(matches!(hub.connectable("env"), Connectable::Yes { .. }));
    tokio::time::advance(Duration::from_millis(1)).await;
    // Past the grace: no harness may connect, but the executor may still come back.
    assert!(matches!(hub.connectable("env"), Connectable::Unavailable));
    assert_eq!(hub.admit_executor("env", &reg), Ok(()));
    tokio::time::advance(TTL - GRACE - Duration::from_millis(1)).await;
    assert_eq!(held(&hub), 1);
    assert!(exists(&hub, "env"));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(!exists(&hub, "env"));
    assert_eq!(held(&hub), 0);
    assert_eq!(hub.admit_executor("env", &reg), Err(StatusCode::NOT_FOUND));
}

#[tokio::test(start_paused = true)]
async fn a_reattached_executor_restarts_nothing_but_its_detach_clock() {
    let hub = hub();
    let (reg, executor) = attached(&hub, "env", 1);
    hub.detach_executor("env", executor.id, false);
    tokio::time::advance(TTL - Duration::from_secs(1)).await;
    let (again, _) = socket(&hub);
    assert!(hub.attach_executor("env", &reg, &again));
    hub.detach_executor("env", again.id, false);
    tokio::time::advance(TTL - Duration::from_secs(1)).await;
    assert!(exists(&hub, "env"));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(!exists(&hub, "env"));
}

#[tokio::test(start_paused = true)]
async fn an_executor_that_leaves_for_good_frees_its_slot_at_once() {
    let hub = hub();
    let (reg, executor) = attached(&hub, "env", 1);
    let (harness, mut harness_rx) = socket(&hub);
    assert!(hub.open_harness("env", &reg, &harness));
    hub.detach_executor("env", executor.id, true);
    assert_eq!(held(&hub), 0);
    assert!(!exists(&hub, "env"));
    // Its harness sockets are closed.
    assert!(matches!(harness_rx.recv().await, Some(Out::Close(1000))));
}

#[tokio::test(start_paused = true)]
async fn a_stale_socket_ending_does_not_touch_the_registration() {
    let hub = hub();
    let (reg, first) = attached(&hub, "env", 1);
    let (second, _) = socket(&hub);
    assert!(hub.attach_executor("env", &reg, &second));
    // The replaced socket closes with 1000: it is not the executor any more.
    hub.detach_executor("env", first.id, true);
    assert!(matches!(hub.connectable("env"), Connectable::Yes { .. }));
    assert_eq!(held(&hub), 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_service_frees_what_is_due_before_it_refuses() {
    // No sweeper runs: only the full-service sweep can find the expired registration.
    let hub = hub_with(|c| c.max_environments = 1);
    register(&hub, "idle", key(1), 0).unwrap();
    assert_eq!(
        register(&hub, "next", key(2), 0),
        Err(Refusal::ServiceEnvironments { max: 1 })
    );
    tokio::time::advance(ATTACH).await;
    register(&hub, "next", key(2), 0).unwrap();
    assert_books(&hub);
}

#[tokio::test(start_paused = true)]
async fn tenants_have_their_own_limits_inside_the_service_limit() {
    let hub = hub_with(|c| {
        c.max_environments = 4;
        c.max_environments_per_tenant = 3;
        c.tokens[0].max_environments = Some(1);
    });
    register(&hub, "a-1", key(1), 0).unwrap();
    let refusal = register(&hub, "a-2", key(1), 0).unwrap_err();
    assert_eq!(
        refusal,
        Refusal::TenantEnvironments {
            tenant: "a".into(),
            max: 1,
            key: "rendezvous.tokens[0].max_environments".into()
        }
    );
    assert_eq!(
        refusal.to_string(),
        "tenant a is at its limit of 1 environments (rendezvous.tokens[0].max_environments)"
    );
    for i in 0..3 {
        register(&hub, &format!("b-{i}"), key(2), 1).unwrap();
    }
    let refusal = register(&hub, "b-3", key(2), 1).unwrap_err();
    assert_eq!(
        refusal.config_key(),
        "rendezvous.max_environments_per_tenant"
    );
    assert_eq!(refusal.code(), "capacity_exhausted");
    assert_books(&hub);
}

#[tokio::test(start_paused = true)]
async fn a_takeover_moves_the_slot_to_the_new_tenant_or_changes_nothing() {
    let hub = hub_with(|c| {
        c.tokens[1].max_environments = Some(1);
    });
    let (a, b) = (tenant(&hub, 0), tenant(&hub, 1));
    register(&hub, "b-own", key(9), 1).unwrap();
    let (_, executor) = attached(&hub, "shared", 1);
    hub.detach_executor("shared", executor.id, false);
    tokio::time::advance(GRACE).await;
    // b is at its limit: the takeover is refused and the old registration stays a's.
    assert!(matches!(
        register(&hub, "shared", key(2), 1),
        Err(Refusal::TenantEnvironments { .. })
    ));
    assert_eq!(hub.capacity().tenant_environments_held(a), 1);
    assert_eq!(
        hub.current_registration("shared"),
        Some(registration_id("shared", &key(1)))
    );
    // With room, the environment changes hands: same service slot, b's tenant slot.
    let b_reg = register(&hub, "b-own", key(9), 1).unwrap();
    let (b_executor, _) = socket(&hub);
    assert!(hub.attach_executor("b-own", &b_reg, &b_executor));
    hub.detach_executor("b-own", b_executor.id, true);
    register(&hub, "shared", key(2), 1).unwrap();
    assert_eq!(hub.capacity().tenant_environments_held(a), 0);
    assert_eq!(hub.capacity().tenant_environments_held(b), 1);
    assert_eq!(held(&hub), 1);
    assert_eq!(
        hub.admit_executor("shared", &registration_id("shared", &key(1))),
        Err(StatusCode::GONE)
    );
    assert_books(&hub);
}

#[tokio::test(start_paused = true)]
async fn harness_places_are_taken_at_admission_and_given_back_on_drop() {
    let hub = hub_with(|c| {
        c.max_harness_sockets_per_environment = 2;
        c.max_harness_sockets_per_tenant = 3;
    });
    let (reg_1, _x1) = attached(&hub, "one", 1);
    let (reg_2, _x2) = attached(&hub, "two", 2);
    let first = hub.admit_harness("one", &reg_1).ok().unwrap();
    let _second = hub.admit_harness("one", &reg_1).ok().unwrap();
    match hub.admit_harness("one", &reg_1) {
        Err(UpgradeRefusal::Capacity(r)) => {
            assert_eq!(
                r.config_key(),
                "rendezvous.max_harness_sockets_per_environment"
            )
        }
        _ => panic!("a third socket at `one` was admitted"),
    }
    let _third = hub.admit_harness("two", &reg_2).ok().unwrap();
    match hub.admit_harness("two", &reg_2) {
        Err(UpgradeRefusal::Capacity(r)) => {
            assert_eq!(r.config_key(), "rendezvous.max_harness_sockets_per_tenant")
        }
        _ => panic!("a fourth socket of tenant a was admitted"),
    }
    let owner = tenant(&hub, 0);
    assert_eq!(hub.capacity().tenant_harness_sockets_held(owner), 3);
    drop(first);
    assert_eq!(hub.capacity().tenant_harness_sockets_held(owner), 2);
    assert!(hub.admit_harness("one", &reg_1).is_ok());
}

/// A small deterministic generator for the property test.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[tokio::test(start_paused = true)]
async fn random_lifetimes_keep_the_books_exact() {
    let hub = hub_with(|c| {
        c.max_environments = 6;
        c.max_environments_per_tenant = 4;
        c.grace_secs = 2;
        c.registration_ttl_secs = 5;
        c.attach_timeout_secs = 3;
    });
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    // The executor socket of each environment, when one is attached.
    let mut executors: HashMap<String, SocketHandle> = HashMap::new();
    let mut admitted = 0usize;
    let mut refused = 0usize;
    for _ in 0..20_000 {
        let env = format!("env-{}", rng.below(10));
        match rng.below(7) {
            0 | 1 => {
                let key = key(rng.below(3) as u8);
                match hub.register(&env, key, None, tenant(&hub, rng.below(2) as usize)) {
                    Ok(_) => admitted += 1,
                    Err(RegisterRefusal::Capacity(_)) => {
                        // A refusal is never caused by a registration that is due.
                        let now = Instant::now();
                        assert!(hub.lock().values().all(|e| hub.due(e, now).is_none()));
                        refused += 1;
                    }
                    Err(RegisterRefusal::Busy) => {}
                }
            }
            2 => {
                if let Some(reg) = hub.current_registration(&env) {
                    let (handle, _) = socket(&hub);
                    if hub.attach_executor(&env, &reg, &handle) {
                        executors.insert(env, handle);
                    }
                }
            }
            3 => {
                if let Some(handle) = executors.remove(&env) {
                    hub.detach_executor(&env, handle.id, rng.below(2) == 0);
                }
            }
            4 => {
                if let Some(reg) = hub.current_registration(&env) {
                    // Harness slots come and go; they never touch environment slots.
                    drop(hub.admit_harness(&env, &reg));
                }
            }
            5 => hub.sweep(Instant::now()),
            _ => tokio::time::advance(Duration::from_millis(rng.below(1_500))).await,
        }
        assert_books(&hub);
        assert!(held(&hub) <= 6);
        for t in 0..2 {
            assert!(hub.capacity().tenant_environments_held(tenant(&hub, t)) <= 4);
        }
    }
    // The run went through admissions and refusals alike.
    assert!(admitted > 100 && refused > 100, "{admitted} / {refused}");
}

#[test]
fn racing_threads_never_over_admit() {
    let hub = hub_with(|c| {
        c.max_environments = 50;
        c.max_environments_per_tenant = 200;
    });
    let admitted = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..8 {
            let (hub, admitted) = (&hub, &admitted);
            scope.spawn(move || {
                for i in 0..25 {
                    let id = format!("race-{t}-{i}");
                    if hub.register(&id, key(1), None, tenant(hub, t % 2)).is_ok() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(admitted.load(Ordering::Relaxed), 50);
    assert_books(&hub);
}

#[tokio::test(start_paused = true)]
async fn another_tenant_cannot_re_register_a_key_it_does_not_own() {
    let hub = hub();
    let (reg, _executor) = attached(&hub, "env", 1);
    // The executor key is public; re-registering it would hand out a fresh executor URL.
    assert!(matches!(
        hub.register("env", key(1), None, tenant(&hub, 1)),
        Err(RegisterRefusal::Busy)
    ));
    assert_eq!(register(&hub, "env", key(1), 0).unwrap(), reg);
    assert_books(&hub);
}

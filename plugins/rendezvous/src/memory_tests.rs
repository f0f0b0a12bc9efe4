//! Registration lifetimes and capacity accounting of the [`MemoryStore`], under paused
//! time: the expiry rules of §8.2 plus the attach timeout, lazy expiry and the sweep, the
//! books (every removal gives back exactly one slot) under random operations and thread
//! races, and the router closing the sockets of a registration the store ended.

use super::*;
use crate::config::{TokenConfig, TokenRole};
use crate::hub::Hub;
use crate::router::{Out, Router, RouterTiming, SocketHandle};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const GRACE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(600);
const ATTACH: Duration = Duration::from_secs(60);
/// Bytes queued towards one socket at most (the default).
const QUEUE_BYTES: usize = 8 * 1024 * 1024;

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

fn config_with(edit: impl FnOnce(&mut RendezvousConfig)) -> RendezvousConfig {
    let mut config = RendezvousConfig {
        tokens: vec![token("a", None), token("b", None)],
        ..RendezvousConfig::default()
    };
    edit(&mut config);
    config
}

/// A store with tenants `a` (token 0) and `b` (token 1).
fn store_with(edit: impl FnOnce(&mut RendezvousConfig)) -> Arc<MemoryStore> {
    Arc::new(MemoryStore::new(&config_with(edit)).unwrap())
}

fn store() -> Arc<MemoryStore> {
    store_with(|_| {})
}

fn tenant(store: &MemoryStore, token: usize) -> TenantId {
    store.capacity().tenant_of_token(token)
}

fn key(n: u8) -> NoisePublicKey {
    NoisePublicKey::x25519([n; 32])
}

fn now() -> Instant {
    Instant::now()
}

fn register(
    store: &MemoryStore,
    id: &str,
    key: NoisePublicKey,
    token: usize,
) -> Result<String, Refusal> {
    match store.register_now(id, key, None, tenant(store, token), now(), &mut Vec::new()) {
        Ok(reg) => Ok(reg),
        Err(RegisterRefusal::Capacity(refusal)) => Err(refusal),
        Err(RegisterRefusal::Busy) => panic!("{id}: busy"),
        Err(RegisterRefusal::StoreUnavailable) => panic!("{id}: the memory store is always there"),
    }
}

/// Registers and attaches an executor; returns the registration and its epoch.
fn attached(store: &MemoryStore, id: &str, n: u8) -> (String, Epoch) {
    let reg = register(store, id, key(n), 0).unwrap();
    let epoch = store.executor_attached_now(id, &reg).expect("attached");
    (reg, epoch)
}

fn detach(store: &MemoryStore, id: &str, epoch: Epoch, left_for_good: bool) -> Vec<Ended> {
    let mut ended = Vec::new();
    store.executor_detached_now(id, epoch, left_for_good, now(), &mut ended);
    ended
}

fn connectable(store: &MemoryStore, id: &str) -> Connectable {
    store.connectable_now(id, now(), &mut Vec::new())
}

fn exists(store: &MemoryStore, id: &str) -> bool {
    !matches!(connectable(store, id), Connectable::NotFound)
}

fn admit_executor(store: &MemoryStore, id: &str, reg: &str) -> Result<Epoch, StatusCode> {
    store.admit_executor_now(id, reg, now(), &mut Vec::new())
}

fn admit_harness(
    store: &MemoryStore,
    id: &str,
    reg: &str,
) -> Result<(Epoch, HarnessLease), UpgradeRefusal> {
    store.admit_harness_now(id, reg, now(), &mut Vec::new())
}

fn current(store: &MemoryStore, id: &str) -> Option<String> {
    store.current_registration_now(id, now(), &mut Vec::new())
}

/// Environments held, as the books say (no lazy expiry on the way).
fn held(store: &MemoryStore) -> usize {
    store.capacity().environments_held()
}

/// The books agree with the state: one service slot per environment record, one tenant
/// slot per environment charged to that tenant, and no gauge above its limit.
fn assert_books(store: &MemoryStore) {
    let envs = store.lock();
    let capacity = store.capacity();
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
    let store = store();
    register(&store, "idle", key(1), 0).unwrap();
    tokio::time::advance(ATTACH - Duration::from_millis(1)).await;
    assert!(matches!(
        connectable(&store, "idle"),
        Connectable::Unavailable
    ));
    assert_eq!(held(&store), 1);
    tokio::time::advance(Duration::from_millis(1)).await;
    // Lazy expiry: the access itself deletes it.
    assert!(!exists(&store, "idle"));
    assert_eq!(held(&store), 0);
    assert_eq!(
        store.capacity().tenant_environments_held(tenant(&store, 0)),
        0
    );
}

#[tokio::test(start_paused = true)]
async fn re_registering_does_not_extend_the_attach_timeout() {
    let store = store();
    let reg = register(&store, "idle", key(1), 0).unwrap();
    tokio::time::advance(ATTACH / 2).await;
    assert_eq!(register(&store, "idle", key(1), 0).unwrap(), reg);
    tokio::time::advance(ATTACH / 2).await;
    assert!(!exists(&store, "idle"));
}

#[tokio::test(start_paused = true)]
async fn the_sweeper_expires_registrations_nobody_asks_about() {
    let store = store();
    let timing = RouterTiming::default();
    let hub = Hub::new(
        Arc::clone(&store) as crate::store::SharedStore,
        Router::new(GRACE, 256, QUEUE_BYTES, timing),
    );
    let stop = CancellationToken::new();
    let sweeper = hub.spawn_sweeper(stop.clone());
    register(&store, "idle", key(1), 0).unwrap();
    let (_, epoch) = attached(&store, "gone", 2);
    detach(&store, "gone", epoch, false);
    assert_eq!(held(&store), 2);
    // Paused time: sleeping lets the sweeper's ticks run in order.
    tokio::time::sleep(ATTACH + timing.sweep_every).await;
    assert_eq!(held(&store), 1, "the never-attached registration was swept");
    tokio::time::sleep(TTL).await;
    assert_eq!(held(&store), 0, "the detached registration was swept");
    assert!(store.lock().is_empty());
    stop.cancel();
    sweeper.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_detached_registration_lives_through_the_grace_and_dies_at_the_ttl() {
    let store = store();
    let (reg, epoch) = attached(&store, "env", 1);
    // Attached: nothing expires, however long.
    tokio::time::advance(TTL * 10).await;
    assert!(matches!(
        connectable(&store, "env"),
        Connectable::Yes { .. }
    ));
    detach(&store, "env", epoch, false);
    tokio::time::advance(GRACE - Duration::from_millis(1)).await;
    assert!(matches!(
        connectable(&store, "env"),
        Connectable::Yes { .. }
    ));
    tokio::time::advance(Duration::from_millis(1)).await;
    // Past the grace: no harness may connect, but the executor may still come back.
    assert!(matches!(
        connectable(&store, "env"),
        Connectable::Unavailable
    ));
    assert_eq!(admit_executor(&store, "env", &reg), Ok(epoch));
    tokio::time::advance(TTL - GRACE - Duration::from_millis(1)).await;
    assert_eq!(held(&store), 1);
    assert!(exists(&store, "env"));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(!exists(&store, "env"));
    assert_eq!(held(&store), 0);
    assert_eq!(
        admit_executor(&store, "env", &reg),
        Err(StatusCode::NOT_FOUND)
    );
}

#[tokio::test(start_paused = true)]
async fn a_reattached_executor_restarts_nothing_but_its_detach_clock() {
    let store = store();
    let (reg, epoch) = attached(&store, "env", 1);
    detach(&store, "env", epoch, false);
    tokio::time::advance(TTL - Duration::from_secs(1)).await;
    assert_eq!(store.executor_attached_now("env", &reg), Some(epoch));
    detach(&store, "env", epoch, false);
    tokio::time::advance(TTL - Duration::from_secs(1)).await;
    assert!(exists(&store, "env"));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(!exists(&store, "env"));
}

#[tokio::test(start_paused = true)]
async fn an_executor_that_leaves_for_good_frees_its_slot_at_once() {
    let store = store();
    let router = Router::new(GRACE, 256, QUEUE_BYTES, RouterTiming::default());
    let (_, epoch) = attached(&store, "env", 1);
    let (executor_tx, _executor_rx) = mpsc::channel(64);
    let executor = SocketHandle::for_test(1, executor_tx, QUEUE_BYTES);
    assert!(router.attach_executor("env", epoch, &executor));
    let (harness_tx, mut harness_rx) = mpsc::channel(64);
    let harness = SocketHandle::for_test(2, harness_tx, QUEUE_BYTES);
    assert!(router.open_harness("env", epoch, &harness));
    let detached = router.detach_executor("env", executor.id);
    assert_eq!(detached, Some(epoch));
    router.registrations_ended(detach(&store, "env", epoch, true));
    assert_eq!(held(&store), 0);
    assert!(!exists(&store, "env"));
    // Its harness sockets are closed.
    assert!(matches!(harness_rx.recv().await, Some(Out::Close(1000))));
    // A harness socket admitted for the ended registration is refused.
    let (late_tx, _late_rx) = mpsc::channel(64);
    assert!(!router.open_harness(
        "env",
        epoch,
        &SocketHandle::for_test(3, late_tx, QUEUE_BYTES)
    ));
}

#[tokio::test(start_paused = true)]
async fn a_stale_socket_ending_does_not_touch_the_registration() {
    let store = store();
    let router = Router::new(GRACE, 256, QUEUE_BYTES, RouterTiming::default());
    let (_, epoch) = attached(&store, "env", 1);
    let (tx, _rx) = mpsc::channel(64);
    let first = SocketHandle::for_test(1, tx.clone(), QUEUE_BYTES);
    let second = SocketHandle::for_test(2, tx, QUEUE_BYTES);
    assert!(router.attach_executor("env", epoch, &first));
    assert!(router.attach_executor("env", epoch, &second));
    // The replaced socket closes with 1000: it is not the executor any more, so the
    // store is not told.
    assert_eq!(router.detach_executor("env", first.id), None);
    assert!(matches!(
        connectable(&store, "env"),
        Connectable::Yes { .. }
    ));
    assert_eq!(held(&store), 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_service_frees_what_is_due_before_it_refuses() {
    // No sweeper runs: only the full-service sweep can find the expired registration.
    let store = store_with(|c| c.max_environments = 1);
    register(&store, "idle", key(1), 0).unwrap();
    assert_eq!(
        register(&store, "next", key(2), 0),
        Err(Refusal::ServiceEnvironments { max: 1 })
    );
    tokio::time::advance(ATTACH).await;
    register(&store, "next", key(2), 0).unwrap();
    assert_books(&store);
}

#[tokio::test(start_paused = true)]
async fn tenants_have_their_own_limits_inside_the_service_limit() {
    let store = store_with(|c| {
        c.max_environments = 4;
        c.max_environments_per_tenant = 3;
        c.tokens[0].max_environments = Some(1);
    });
    register(&store, "a-1", key(1), 0).unwrap();
    let refusal = register(&store, "a-2", key(1), 0).unwrap_err();
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
        register(&store, &format!("b-{i}"), key(2), 1).unwrap();
    }
    let refusal = register(&store, "b-3", key(2), 1).unwrap_err();
    assert_eq!(
        refusal.config_key(),
        "rendezvous.max_environments_per_tenant"
    );
    assert_eq!(refusal.code(), "capacity_exhausted");
    assert_books(&store);
}

#[tokio::test(start_paused = true)]
async fn a_takeover_moves_the_slot_to_the_new_tenant_or_changes_nothing() {
    let store = store_with(|c| {
        c.tokens[1].max_environments = Some(1);
    });
    let (a, b) = (tenant(&store, 0), tenant(&store, 1));
    register(&store, "b-own", key(9), 1).unwrap();
    let (_, epoch) = attached(&store, "shared", 1);
    detach(&store, "shared", epoch, false);
    tokio::time::advance(GRACE).await;
    // b is at its limit: the takeover is refused and the old registration stays a's.
    assert!(matches!(
        register(&store, "shared", key(2), 1),
        Err(Refusal::TenantEnvironments { .. })
    ));
    assert_eq!(store.capacity().tenant_environments_held(a), 1);
    assert_eq!(
        current(&store, "shared"),
        Some(registration_id("shared", &key(1)))
    );
    // With room, the environment changes hands: same service slot, b's tenant slot.
    let b_reg = register(&store, "b-own", key(9), 1).unwrap();
    let b_epoch = store.executor_attached_now("b-own", &b_reg).unwrap();
    detach(&store, "b-own", b_epoch, true);
    let mut ended = Vec::new();
    store
        .register_now("shared", key(2), None, b, now(), &mut ended)
        .ok()
        .unwrap();
    // The old registration's sockets are to be closed.
    assert_eq!(
        ended,
        [Ended {
            environment: "shared".into(),
            epoch,
            why: Removal::Replaced
        }]
    );
    assert_eq!(store.capacity().tenant_environments_held(a), 0);
    assert_eq!(store.capacity().tenant_environments_held(b), 1);
    assert_eq!(held(&store), 1);
    assert_eq!(
        admit_executor(&store, "shared", &registration_id("shared", &key(1))),
        Err(StatusCode::GONE)
    );
    assert_books(&store);
}

#[tokio::test(start_paused = true)]
async fn harness_places_are_taken_at_admission_and_given_back_on_drop() {
    let store = store_with(|c| {
        c.max_harness_sockets_per_environment = 2;
        c.max_harness_sockets_per_tenant = 3;
    });
    let (reg_1, _) = attached(&store, "one", 1);
    let (reg_2, _) = attached(&store, "two", 2);
    let first = admit_harness(&store, "one", &reg_1).ok().unwrap();
    let _second = admit_harness(&store, "one", &reg_1).ok().unwrap();
    match admit_harness(&store, "one", &reg_1) {
        Err(UpgradeRefusal::Capacity(r)) => {
            assert_eq!(
                r.config_key(),
                "rendezvous.max_harness_sockets_per_environment"
            )
        }
        _ => panic!("a third socket at `one` was admitted"),
    }
    let _third = admit_harness(&store, "two", &reg_2).ok().unwrap();
    match admit_harness(&store, "two", &reg_2) {
        Err(UpgradeRefusal::Capacity(r)) => {
            assert_eq!(r.config_key(), "rendezvous.max_harness_sockets_per_tenant")
        }
        _ => panic!("a fourth socket of tenant a was admitted"),
    }
    let owner = tenant(&store, 0);
    assert_eq!(store.capacity().tenant_harness_sockets_held(owner), 3);
    drop(first);
    assert_eq!(store.capacity().tenant_harness_sockets_held(owner), 2);
    assert!(admit_harness(&store, "one", &reg_1).is_ok());
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
    let store = store_with(|c| {
        c.max_environments = 6;
        c.max_environments_per_tenant = 4;
        c.grace_secs = 2;
        c.registration_ttl_secs = 5;
        c.attach_timeout_secs = 3;
    });
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    // The epoch of each environment whose executor is attached.
    let mut executors: HashMap<String, Epoch> = HashMap::new();
    let mut admitted = 0usize;
    let mut refused = 0usize;
    for _ in 0..20_000 {
        let env = format!("env-{}", rng.below(10));
        match rng.below(7) {
            0 | 1 => {
                let key = key(rng.below(3) as u8);
                let tenant = tenant(&store, rng.below(2) as usize);
                match store.register_now(&env, key, None, tenant, now(), &mut Vec::new()) {
                    Ok(_) => admitted += 1,
                    Err(RegisterRefusal::Capacity(_)) => {
                        // A refusal is never caused by a registration that is due.
                        let now = now();
                        assert!(store.lock().values().all(|e| store.due(e, now).is_none()));
                        refused += 1;
                    }
                    Err(RegisterRefusal::Busy) => {}
                    Err(RegisterRefusal::StoreUnavailable) => {
                        panic!("the memory store is always there")
                    }
                }
            }
            2 => {
                if let Some(reg) = current(&store, &env) {
                    if let Some(epoch) = store.executor_attached_now(&env, &reg) {
                        executors.insert(env, epoch);
                    }
                }
            }
            3 => {
                if let Some(epoch) = executors.remove(&env) {
                    detach(&store, &env, epoch, rng.below(2) == 0);
                }
            }
            4 => {
                if let Some(reg) = current(&store, &env) {
                    // Harness slots come and go; they never touch environment slots.
                    drop(admit_harness(&store, &env, &reg));
                }
            }
            5 => store.sweep_now(now(), &mut Vec::new()),
            _ => tokio::time::advance(Duration::from_millis(rng.below(1_500))).await,
        }
        assert_books(&store);
        assert!(held(&store) <= 6);
        for t in 0..2 {
            assert!(store.capacity().tenant_environments_held(tenant(&store, t)) <= 4);
        }
    }
    // The run went through admissions and refusals alike.
    assert!(admitted > 100 && refused > 100, "{admitted} / {refused}");
}

#[test]
fn racing_threads_never_over_admit() {
    let store = store_with(|c| {
        c.max_environments = 50;
        c.max_environments_per_tenant = 200;
    });
    let admitted = std::sync::atomic::AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..8 {
            let (store, admitted) = (&store, &admitted);
            scope.spawn(move || {
                for i in 0..25 {
                    let id = format!("race-{t}-{i}");
                    let tenant = tenant(store, t % 2);
                    if store
                        .register_now(&id, key(1), None, tenant, start, &mut Vec::new())
                        .is_ok()
                    {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(admitted.load(Ordering::Relaxed), 50);
    assert_books(&store);
}

#[tokio::test(start_paused = true)]
async fn another_tenant_cannot_re_register_a_key_it_does_not_own() {
    let store = store();
    let (reg, _) = attached(&store, "env", 1);
    // The executor key is public; re-registering it would hand out a fresh executor URL.
    assert!(matches!(
        store.register_now(
            "env",
            key(1),
            None,
            tenant(&store, 1),
            now(),
            &mut Vec::new()
        ),
        Err(RegisterRefusal::Busy)
    ));
    assert_eq!(register(&store, "env", key(1), 0).unwrap(), reg);
    assert_books(&store);
}

/// A restarted executor (same tenant, new key) takes over at once once the old socket is
/// gone; while a socket is open it waits, and another tenant waits out the grace.
#[tokio::test(start_paused = true)]
async fn a_restarted_executor_takes_over_without_waiting_for_the_grace() {
    let store = store_with(|c| c.tokens.push(token("other", None)));
    let (reg, epoch) = attached(&store, "env", 1);
    let busy = |n: u8, token: usize| {
        matches!(
            store.register_now(
                "env",
                key(n),
                None,
                tenant(&store, token),
                now(),
                &mut Vec::new()
            ),
            Err(RegisterRefusal::Busy)
        )
    };
    assert!(busy(2, 0), "a second executor while the first is attached");
    // The first executor crashed: its socket ended without a close code.
    let ended = detach(&store, "env", epoch, false);
    assert!(ended.is_empty());
    assert!(busy(3, 1), "another tenant waits out the grace");
    let new = register(&store, "env", key(2), 0).expect("the restart takes over");
    assert_ne!(new, reg);
    assert_eq!(current(&store, "env").as_deref(), Some(new.as_str()));
    assert_books(&store);
}

/// A stream whose msg2 announced no reliable stream (codex semantics) ends with the
/// executor's socket: its harness is reset and closed at once. A reliable one is parked
/// for the executor's return, and a harness's msg1 sent meanwhile is held for it.
#[tokio::test(start_paused = true)]
async fn an_executor_socket_ending_resets_codex_streams_and_parks_reliable_ones() {
    use exec_server_relay_core::proto::{self, handshake_body_with, Body, StreamFeatures};
    let store = store();
    let router = Router::new(GRACE, 256, QUEUE_BYTES, RouterTiming::default());
    let (_, epoch) = attached(&store, "env", 1);
    let (executor_tx, mut executor_rx) = mpsc::channel(64);
    let executor = SocketHandle::for_test(1, executor_tx, QUEUE_BYTES);
    assert!(router.attach_executor("env", epoch, &executor));
    let mut harnesses = Vec::new();
    for (id, sid, features) in [
        (2, "codex-stream", StreamFeatures::NONE),
        (3, "reliable-stream", StreamFeatures::RELIABLE),
    ] {
        let (tx, rx) = mpsc::channel(64);
        let harness = SocketHandle::for_test(id, tx, QUEUE_BYTES);
        assert!(router.open_harness("env", epoch, &harness));
        assert!(router.bind_harness("env", "kh", &harness, sid));
        let msg1 = proto::frame(sid, 0, 0, handshake_body_with(vec![1; 96], features));
        assert!(router.forward_from_harness("env", &harness, proto::encode(&msg1), &msg1));
        let msg2 = proto::frame(sid, 0, 0, handshake_body_with(vec![2; 48], features));
        router.forward_from_executor("env", &executor, proto::encode(&msg2), &msg2);
        harnesses.push((harness, rx));
    }
    while executor_rx.try_recv().is_ok() {}
    for (_, rx) in &mut harnesses {
        assert!(matches!(rx.try_recv(), Ok(Out::Frame(_))), "msg2 delivered");
    }

    assert_eq!(router.detach_executor("env", executor.id), Some(epoch));
    let (_, codex_rx) = &mut harnesses[0];
    let Ok(Out::Frame(reset)) = codex_rx.try_recv() else {
        panic!("the codex stream's harness got no Reset");
    };
    let reset = proto::decode(&reset).unwrap();
    assert_eq!(reset.stream_id, "codex-stream");
    assert!(
        matches!(&reset.body, Some(Body::Reset(r)) if r.reason == "executor_unavailable"),
        "{reset:?}"
    );
    assert!(matches!(codex_rx.try_recv(), Ok(Out::Close(1000))));
    let (_, reliable_rx) = &mut harnesses[1];
    assert!(reliable_rx.try_recv().is_err(), "the reliable stream waits");

    // A new harness's msg1 while the executor is away reaches it once it is back.
    let (tx, _rx) = mpsc::channel(64);
    let newcomer = SocketHandle::for_test(4, tx, QUEUE_BYTES);
    assert!(router.open_harness("env", epoch, &newcomer));
    assert!(router.bind_harness("env", "kh", &newcomer, "new-stream"));
    let msg1 = proto::frame(
        "new-stream",
        0,
        0,
        handshake_body_with(vec![3; 96], StreamFeatures::NONE),
    );
    assert!(router.forward_from_harness("env", &newcomer, proto::encode(&msg1), &msg1));
    let (tx, mut back_rx) = mpsc::channel(64);
    let back = SocketHandle::for_test(5, tx, QUEUE_BYTES);
    assert!(router.attach_executor("env", epoch, &back));
    let Ok(Out::Frame(held)) = back_rx.try_recv() else {
        panic!("the held msg1 was not delivered");
    };
    assert_eq!(held, proto::encode(&msg1));
    assert!(back_rx.try_recv().is_err());
}

#[test]
fn a_socket_queue_holds_its_bytes_and_drops_what_does_not_fit() {
    let (tx, mut rx) = mpsc::channel(1_024);
    let socket = SocketHandle::for_test(1, tx, 1_000);
    for _ in 0..3 {
        socket.send(Bytes::from(vec![0u8; 400]));
    }
    // Two frames fit; the third would pass the bytes, though the channel has room.
    assert_eq!(socket.queued_bytes(), 800);
    assert!(matches!(rx.try_recv(), Ok(Out::Frame(f)) if f.len() == 400));
    assert!(matches!(rx.try_recv(), Ok(Out::Frame(f)) if f.len() == 400));
    assert!(
        rx.try_recv().is_err(),
        "the frame beyond the bytes was dropped"
    );
}

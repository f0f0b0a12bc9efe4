use std::sync::Mutex as StdMutex;

use super::*;

/// Lets every spawned task run until it waits.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_session_holds_at_most_its_share_and_all_at_most_the_total() {
    let slots = FairSlots::new("test_shares", 3, 2);
    let a1 = slots.acquire("a").await;
    let _a2 = slots.acquire("a").await;
    let a3 = tokio::spawn({
        let slots = slots.clone();
        async move { slots.acquire("a").await }
    });
    settle().await;
    assert!(
        !a3.is_finished(),
        "a is at its share although a slot is free"
    );
    assert_eq!((slots.running(), slots.queued()), (2, 1));

    let _b1 = slots.acquire("b").await;
    let b2 = tokio::spawn({
        let slots = slots.clone();
        async move { slots.acquire("b").await }
    });
    settle().await;
    assert!(!b2.is_finished(), "every slot is taken");
    assert_eq!((slots.running(), slots.queued()), (3, 2));

    // b waited while a was at its share: b's turn comes first.
    drop(a1);
    let _b2 = b2.await.unwrap();
    settle().await;
    assert!(!a3.is_finished());
    assert_eq!((slots.held_by("a"), slots.held_by("b")), (1, 2));
}

#[tokio::test]
async fn free_slots_go_round_robin_by_session() {
    let slots = FairSlots::new("test_turns", 1, 1);
    let holder = slots.acquire("holder").await;
    let order = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // Session a queues first and most; each grant is given back at once.
    for (session, n) in [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1), ("c", 2)] {
        let (slots, order) = (slots.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let _permit = slots.acquire(session).await;
            order.lock().unwrap().push(format!("{session}{n}"));
        }));
        settle().await;
    }
    assert_eq!(slots.queued(), 6);
    drop(holder);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        ["a1", "b1", "c1", "a2", "c2", "a3"],
        "one grant per session in turn, not in arrival order"
    );
    assert_eq!((slots.running(), slots.queued()), (0, 0));
}

#[tokio::test]
async fn a_queue_of_hundreds_does_not_delay_another_sessions_request() {
    let slots = FairSlots::new("test_flood", 4, 4);
    let mut held: Vec<SlotPermit> = Vec::new();
    for _ in 0..4 {
        held.push(slots.acquire("flood").await);
    }
    let mut flood = Vec::new();
    for _ in 0..300 {
        let slots = slots.clone();
        flood.push(tokio::spawn(async move { slots.acquire("flood").await }));
    }
    settle().await;
    let victim = tokio::spawn({
        let slots = slots.clone();
        async move { slots.acquire("victim").await }
    });
    settle().await;
    // The first slot that frees is the victim's, ahead of 300 earlier requests.
    drop(held.pop());
    let _victim = victim.await.unwrap();
    assert_eq!(slots.held_by("victim"), 1);
    assert_eq!(slots.queued(), 300);
    for task in &flood {
        task.abort();
    }
    for task in flood {
        let _ = task.await;
    }
    assert_eq!(slots.queued(), 0);
}

#[tokio::test]
async fn a_cancelled_wait_leaves_nothing_behind() {
    let slots = FairSlots::new("test_cancel", 1, 1);
    let holder = slots.acquire("a").await;
    let waiting = tokio::spawn({
        let slots = slots.clone();
        async move { slots.acquire("b").await }
    });
    settle().await;
    assert_eq!(slots.queued(), 1);
    waiting.abort();
    let _ = waiting.await;
    assert_eq!(slots.queued(), 0);
    drop(holder);
    assert_eq!(slots.running(), 0);
    // b's place was given up: the next request of anyone gets the slot at once.
    let _again = slots.acquire("c").await;
}

#[tokio::test]
async fn a_slot_granted_to_an_abandoned_request_comes_back() {
    let slots = FairSlots::new("test_abandoned", 1, 1);
    let holder = slots.acquire("a").await;
    let waiting = tokio::spawn({
        let slots = slots.clone();
        async move { slots.acquire("b").await }
    });
    settle().await;
    // The grant goes to b's request, which is dropped before it runs again.
    drop(holder);
    waiting.abort();
    let _ = waiting.await;
    assert_eq!((slots.running(), slots.queued()), (0, 0));
    let _next = slots.acquire("c").await;
}

#[test]
fn missed_deadlines_count_as_overdue_until_the_work_returns() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let slots = FairSlots::new("test_overdue", 2, 2);
    let permit = runtime.block_on(slots.acquire("a"));
    let report = permit.deadline();
    let series = |name: &str| {
        let text = metrics::render();
        let line = format!("{name}{{pool=\"test_overdue\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&line).map(str::to_owned))
            .unwrap_or_else(|| panic!("no {line} in {text}"))
    };
    report.missed();
    assert_eq!(series("exec_server_fair_slots_overdue"), "1");
    assert_eq!(series("exec_server_fair_slots_running"), "1");
    // Work stuck in the kernel keeps its slot; only its return gives it back.
    thread_returns(permit);
    assert_eq!(series("exec_server_fair_slots_overdue"), "0");
    assert_eq!(series("exec_server_fair_slots_running"), "0");
    // A deadline reported after the work returned is counted, but nothing is overdue.
    report.missed();
    assert_eq!(series("exec_server_fair_slots_overdue"), "0");
    assert_eq!(series("exec_server_fair_slots_timeouts_total"), "2");
    assert_eq!(series("exec_server_fair_slots_limit"), "2");
}

/// Drops `permit` on another thread, as the blocking work that owns it does.
fn thread_returns(permit: SlotPermit) {
    std::thread::spawn(move || drop(permit)).join().unwrap();
}

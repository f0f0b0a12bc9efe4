//! Bytes held for a peer, at the rendezvous (docs/SECURITY.md, "One budget per resource:
//! bytes held for a peer"): a harness binds a stream and then never reads its socket while
//! the executor side sends it records as fast as it can. The rendezvous must hold about
//! `rendezvous.socket_queue_bytes` for that socket, not what the executor sent (the old
//! queue was bounded at 1,024 frames whatever their size: 60 MiB of records); must close
//! the socket once it has taken nothing for `rendezvous.stalled_peer_timeout_ms`; and must
//! keep the executor's own socket, which carries every other stream, alive throughout.

use exec_server_relay_core::noise::NoiseIdentity;
use exec_server_relay_core::proto::{self, MAX_RECORD_CIPHERTEXT};

use super::slow_reader::rss_kib;
use crate::relay::fixtures::{
    assert_alive, harness_bundle, new_stream_id, open_raw, raw_close_code, registry_as, send_frame,
    start_rendezvous_logged_with, wait_for_log, EXECUTOR_TOKEN,
};

/// Records the executor side sends: 1,000 of the largest size, about 60 MiB.
const RECORDS: u32 = 1_000;
/// What the rendezvous may grow by while a harness does not read: its queue (8 MiB by
/// default), a frame in the WebSocket writer and allocator slack. The old code grew by
/// about 60 MiB.
const GROWTH_BOUND_KIB: u64 = 32 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harness_that_stops_reading_costs_the_rendezvous_its_queue_and_is_closed() {
    let mut rdv = start_rendezvous_logged_with("stalled_peer_timeout_ms = 2000").await;
    let pid = rdv.child.id().unwrap();
    let executor = registry_as(&rdv.url, EXECUTOR_TOKEN);
    let key = NoiseIdentity::generate().public();
    let registration = executor.register("env-stall", &key, None).await.unwrap();
    let mut executor_ws = open_raw(&registration.url).await;
    let bundle = harness_bundle(&rdv.url, "env-stall").await;
    let mut harness_ws = open_raw(&bundle.url).await;

    // The harness binds its stream, and from now on reads nothing.
    let stream = new_stream_id();
    send_frame(
        &mut harness_ws,
        &proto::frame(&stream, 0, 0, proto::resume_body(0)),
    )
    .await;
    assert_alive(&mut executor_ws).await;
    let baseline = rss_kib(pid);

    let payload = vec![0x5a; MAX_RECORD_CIPHERTEXT];
    let mut peak = baseline;
    for seq in 0..RECORDS {
        let record = proto::frame(&stream, 0, 0, proto::data_body(seq, payload.clone().into()));
        send_frame(&mut executor_ws, &record).await;
        if seq % 50 == 0 {
            peak = peak.max(rss_kib(pid));
        }
    }
    // Every record was read by the rendezvous: its socket to the executor still answers.
    assert_alive(&mut executor_ws).await;
    peak = peak.max(rss_kib(pid));
    eprintln!(
        "rendezvous: baseline {} MiB, peak {} MiB while a harness did not read",
        baseline / 1024,
        peak / 1024
    );
    assert!(
        peak.saturating_sub(baseline) < GROWTH_BOUND_KIB,
        "the rendezvous holds {} MiB more for a harness that does not read",
        peak.saturating_sub(baseline) / 1024
    );

    // The stalled socket is closed; reading what the kernel still holds ends at its end.
    wait_for_log(&rdv.log, "stalled_peer", 1).await;
    assert!(
        !matches!(raw_close_code(&mut harness_ws).await, Some(1000)),
        "the stalled harness socket ended normally"
    );
    assert_alive(&mut executor_ws).await;
    rdv.child.kill().await.unwrap();
}

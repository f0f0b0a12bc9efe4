//! Stream semantics between our own ends (CODEX-0169 §4.5 against RELAY §5): a harness that
//! announces reliable streams gets them from our executor; one that announces nothing —
//! as codex does — gets codex's rules from both ends. On a clean link neither loses nor
//! duplicates a message, and the frames show which rules each stream followed.

use exec_server_relay_core::proto::{self, Body, StreamFeatures};
use serde_json::{json, Value};

use super::fixtures::*;

/// The data seqs each side sent on `stream`, and whether any Ack or Resume was sent.
fn wire(proxy: &Proxy, stream: &str) -> (Vec<u32>, Vec<u32>, bool) {
    let frames = proxy.frames.lock().unwrap();
    let mut from_harness = Vec::new();
    let mut from_executor = Vec::new();
    let mut control = false;
    for captured in frames.iter().filter(|c| c.up) {
        let Ok(frame) = proto::decode(&captured.bytes) else {
            continue;
        };
        if frame.stream_id != stream {
            continue;
        }
        match &frame.body {
            Some(Body::Data(d)) => match captured.side {
                Side::Harness => from_harness.push(d.seq),
                Side::Executor => from_executor.push(d.seq),
            },
            Some(Body::AckFrame(_)) | Some(Body::Resume(_)) => control = true,
            _ => {}
        }
        control |= frame.ack != 0 || frame.ack_bits != 0;
    }
    (from_harness, from_executor, control)
}

/// 300 requests of growing size, each answered once and in order, plus a 1.5 MiB file
/// read back byte for byte (many records per message).
async fn exchange(client: &mut RelayClient, dir: &std::path::Path) {
    for i in 0..300usize {
        let path = dir.join(format!("f{i}"));
        let data = vec![b'a' + (i % 26) as u8; i * 37];
        let uri = format!("file://{}", path.display());
        client
            .call(
                "fs/writeFile",
                json!({"path": uri, "dataBase64": crate::util::b64(&data)}),
            )
            .await;
        let read = client.call("fs/readFile", json!({"path": uri})).await;
        assert_eq!(
            crate::util::b64decode(&read["dataBase64"]),
            data,
            "file {i}"
        );
    }
    let big: Vec<u8> = (0..3 * 512 * 1024u32).map(|i| (i % 253) as u8).collect();
    let path = dir.join("big");
    std::fs::write(&path, &big).unwrap();
    let read = client
        .call(
            "fs/readFile",
            json!({"path": format!("file://{}", path.display())}),
        )
        .await;
    assert_eq!(crate::util::b64decode(&read["dataBase64"]), big);
    assert!(
        client.pending.is_empty(),
        "nothing unexpected: {:?}",
        client.pending
    );
}

#[tokio::test]
async fn reliable_and_codex_streams_between_our_ends_lose_and_duplicate_nothing() {
    let (proxy, rdv) = proxied_rendezvous("").await;
    let _executor = start_executor(&rdv.direct, "env-semantics");
    let dir = tempfile::tempdir().unwrap();

    let mut reliable = RelayClient::open(harness_args(&rdv.direct, "env-semantics")).await;
    exchange(&mut reliable, dir.path()).await;
    let (up, down, control) = wire(&proxy, reliable.conn.stream_id());
    assert_eq!(up.first(), Some(&1), "reliable records count from 1");
    assert_eq!(down.first(), Some(&1));
    assert!(control, "a reliable stream acknowledges");

    let mut args = harness_args(&rdv.direct, "env-semantics");
    args.stream_features = StreamFeatures::NONE;
    let mut codex = RelayClient::open(args).await;
    exchange(&mut codex, dir.path()).await;
    let (up, down, control) = wire(&proxy, codex.conn.stream_id());
    assert_eq!(
        up,
        (0..up.len() as u32).collect::<Vec<_>>(),
        "from 0, no gaps, no repeats"
    );
    assert_eq!(down, (0..down.len() as u32).collect::<Vec<_>>());
    assert!(up.len() > 600 && down.len() > 600);
    assert!(!control, "codex streams carry no acks and no Resume");
    let _: Value = codex.call("environment/status", json!({})).await;
}

//! Streamed `http/request`s (CODEX-NETWORK.md §2.5) on both servers: the head as the
//! result, then `http/request/bodyDelta` notifications from `seq` 1, one per piece read,
//! and a separate terminal frame.

use serde_json::{json, Value};

use super::origin::Origin;
use super::Sides;
use crate::util::{b64decode, Client};

fn streamed(url: &str, id: &str) -> Value {
    json!({"method": "GET", "url": url, "requestId": id, "streamResponse": true})
}

/// The deltas of stream `id` up to and including its terminal frame.
async fn deltas(client: &mut Client, id: &str) -> Vec<Value> {
    let mut frames = Vec::new();
    loop {
        let delta = client.notification("http/request/bodyDelta").await;
        if delta["requestId"] != id {
            continue;
        }
        let done = delta["done"] == true;
        frames.push(delta);
        if done {
            return frames;
        }
    }
}

#[tokio::test]
async fn a_streamed_body_arrives_piece_by_piece_after_the_head() {
    let sides = Sides::new("a_streamed_body_arrives_piece_by_piece_after_the_head");
    let origin = Origin::start().await;
    for side in sides.all() {
        let mut client = sides.client(side, &[]).await;
        let id = client
            .send_request(
                "http/request",
                streamed(&origin.url("/sse?chunks=4&delay=150"), "s1"),
            )
            .await;
        let head = client.response(id).await.unwrap();
        assert_eq!(head["status"], 200, "{side:?}");
        assert_eq!(head["bodyBase64"], "", "{side:?}");
        // The head is answered before any delta.
        assert!(
            client.pending().iter().all(|m| m.get("method").is_none()),
            "{side:?}"
        );
        let frames = deltas(&mut client, "s1").await;
        let seqs: Vec<u64> = frames.iter().map(|f| f["seq"].as_u64().unwrap()).collect();
        assert_eq!(
            seqs,
            (1..=frames.len() as u64).collect::<Vec<_>>(),
            "{side:?}"
        );
        let (last, pieces) = frames.split_last().unwrap();
        assert_eq!(
            last,
            &json!({"requestId": "s1", "seq": frames.len(), "deltaBase64": "", "done": true, "error": null}),
            "{side:?}"
        );
        let texts: Vec<Vec<u8>> = pieces
            .iter()
            .map(|f| b64decode(&f["deltaBase64"]))
            .collect();
        assert_eq!(
            texts.len(),
            4,
            "{side:?}: one delta per chunk, none coalesced: {texts:?}"
        );
        assert_eq!(texts[2], b"data: 2 xx\n\n", "{side:?}");
        for piece in pieces {
            assert_eq!(piece["done"], false, "{side:?}");
            assert_eq!(piece["error"], Value::Null, "{side:?}");
        }
    }
}

#[tokio::test]
async fn an_active_id_is_refused_and_a_failing_body_ends_with_an_error_frame() {
    let sides = Sides::new("an_active_id_is_refused_and_a_failing_body_ends_with_an_error_frame");
    let origin = Origin::start().await;
    for side in sides.all() {
        let mut client = sides.client(side, &[]).await;
        let slow = origin.url("/sse?chunks=10&delay=200");
        let first = client
            .send_request("http/request", streamed(&slow, "dup"))
            .await;
        client.response(first).await.unwrap();
        let error = client
            .call_err("http/request", streamed(&slow, "dup"))
            .await;
        assert_eq!(error["code"], -32602, "{side:?}");
        assert_eq!(
            error["message"], "http/request streamResponse requestId `dup` is already active",
            "{side:?}"
        );
        // The first stream goes on undisturbed, and its id is free again once it ended.
        let frames = deltas(&mut client, "dup").await;
        assert_eq!(frames.last().unwrap()["error"], Value::Null, "{side:?}");
        assert_eq!(frames.len(), 11, "{side:?}");
        let again = client
            .send_request("http/request", streamed(&origin.url("/echo"), "dup"))
            .await;
        client.response(again).await.unwrap();
        deltas(&mut client, "dup").await;

        // A body cut short: the deltas so far, then `done` with the error and no data.
        let cut = client
            .send_request("http/request", streamed(&origin.url("/truncated"), "cut"))
            .await;
        client.response(cut).await.unwrap();
        let frames = deltas(&mut client, "cut").await;
        let last = frames.last().unwrap();
        assert_eq!(last["error"], "error decoding response body", "{side:?}");
        assert_eq!(last["deltaBase64"], "", "{side:?}");
        // A deadline in the body ends the stream the same way.
        let params = json!({"method": "GET", "url": origin.url("/sse?chunks=20&delay=100"),
                            "requestId": "late", "streamResponse": true, "timeoutMs": 500});
        let late = client.send_request("http/request", params).await;
        client.response(late).await.unwrap();
        let frames = deltas(&mut client, "late").await;
        assert_eq!(
            frames.last().unwrap()["error"],
            "error decoding response body",
            "{side:?}"
        );
        assert!(frames.len() < 20, "{side:?}");
    }
}

#[tokio::test]
async fn a_streamed_gzip_body_is_decoded() {
    let sides = Sides::new("a_streamed_gzip_body_is_decoded");
    let origin = Origin::start().await;
    for side in sides.all() {
        let mut client = sides.client(side, &[]).await;
        let id = client
            .send_request("http/request", streamed(&origin.url("/gzip"), "g"))
            .await;
        let head = client.response(id).await.unwrap();
        let names: Vec<&str> = head["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["name"].as_str().unwrap())
            .collect();
        assert!(!names.contains(&"content-encoding"), "{side:?}: {names:?}");
        let body: Vec<u8> = deltas(&mut client, "g")
            .await
            .iter()
            .flat_map(|f| b64decode(&f["deltaBase64"]))
            .collect();
        assert_eq!(body, b"gzip body", "{side:?}");
    }
}

#[tokio::test]
async fn a_large_body_is_cut_into_deltas_of_at_most_one_mebibyte() {
    let sides = Sides::new("a_large_body_is_cut_into_deltas_of_at_most_one_mebibyte");
    let origin = Origin::start().await;
    for side in sides.all() {
        let mut client = sides.client(side, &[]).await;
        let bytes = 5_000_000;
        let id = client
            .send_request(
                "http/request",
                streamed(&origin.url(&format!("/big?bytes={bytes}")), "big"),
            )
            .await;
        client.response(id).await.unwrap();
        let frames = deltas(&mut client, "big").await;
        let mut total = 0;
        for frame in &frames {
            let piece = b64decode(&frame["deltaBase64"]).len();
            assert!(piece <= 1024 * 1024, "{side:?}: a delta of {piece} bytes");
            total += piece;
        }
        assert_eq!(total, bytes, "{side:?}");
    }
}

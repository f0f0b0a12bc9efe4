//! What the operator's `[http]` table restricts, and what `http/request` is bounded by:
//! this server's own additions (codex has none of them).

use serde_json::json;

use super::origin::Origin;
use super::ours_with;

#[tokio::test]
async fn narrowed_targets_refuse_loopback_literals_names_and_redirects_to_them() {
    let origin = Origin::start().await;
    let port = origin.base.rsplit(':').next().unwrap().to_owned();
    let (mut client, _config) = ours_with("[http]\nallow_loopback = false\n").await;
    for url in [
        origin.url("/echo"),
        format!("http://localhost:{port}/echo"),
        format!("http://[::ffff:127.0.0.1]:{port}/echo"),
        format!("http://0.0.0.0:{port}/echo"),
    ] {
        let error = client
            .call_err(
                "http/request",
                json!({"method": "GET", "url": url, "requestId": "r"}),
            )
            .await;
        assert_eq!(error["code"], -32602, "{url}: {error}");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .starts_with("http/request target is not allowed: "),
            "{url}: {error}"
        );
    }
    assert!(
        origin.seen().is_empty(),
        "a refused request reached the origin"
    );

    // Only the listed host: a redirect away from it is refused at its hop.
    let (mut client, _config) = ours_with("[http]\nallowed_hosts = [\"localhost\"]\n").await;
    let result = client
        .call("http/request", json!({"method": "GET", "url": format!("http://localhost:{port}/echo"), "requestId": "r"}))
        .await;
    assert_eq!(result["status"], 200);
    let away = format!("http://localhost:{port}/redirect/302?to=http://127.0.0.1:{port}/echo");
    let error = client
        .call_err(
            "http/request",
            json!({"method": "GET", "url": away, "requestId": "r"}),
        )
        .await;
    assert_eq!(
        error["message"],
        "http/request target is not allowed: 127.0.0.1 is not in http.allowed_hosts"
    );
}

#[tokio::test]
async fn buffered_bodies_and_streams_are_bounded() {
    let origin = Origin::start().await;
    let (mut client, _config) =
        ours_with("[http]\nmax_buffered_body_bytes = 1000\nmax_streams_per_connection = 1\n").await;
    let error = client
        .call_err(
            "http/request",
            json!({"method": "GET", "url": origin.url("/big?bytes=1001"), "requestId": "r"}),
        )
        .await;
    assert_eq!(error["code"], -32603);
    assert_eq!(
        error["message"],
        "failed to read http/request response body: it is larger than 1000 bytes \
         (http.max_buffered_body_bytes; ask for streamResponse)"
    );
    let ok = client
        .call(
            "http/request",
            json!({"method": "GET", "url": origin.url("/big?bytes=1000"), "requestId": "r"}),
        )
        .await;
    assert_eq!(ok["status"], 200);

    let slow = origin.url("/sse?chunks=5&delay=200");
    let first = client
        .send_request(
            "http/request",
            json!({"method": "GET", "url": slow, "requestId": "a", "streamResponse": true}),
        )
        .await;
    client.response(first).await.unwrap();
    let error = client
        .call_err(
            "http/request",
            json!({"method": "GET", "url": slow, "requestId": "b", "streamResponse": true}),
        )
        .await;
    assert_eq!(
        error["message"],
        "http/request: 1 streamed responses are already active on this connection \
         (http.max_streams_per_connection)"
    );
}

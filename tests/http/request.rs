//! Buffered `http/request`s (CODEX-NETWORK.md §2.1–§2.4, §2.6) on both servers.

use serde_json::{json, Value};

use super::origin::{echoed, Origin};
use super::{Side, Sides};
use crate::util::{b64, b64decode};

fn get(url: &str) -> Value {
    json!({"method": "GET", "url": url, "requestId": "r1"})
}

/// The header pairs of an answer.
fn header_pairs(result: &Value) -> Vec<(String, String)> {
    result["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["name"].as_str().unwrap().to_owned(),
                h["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_get_returns_status_headers_and_body_and_sends_codex_s_headers() {
    let sides = Sides::new("a_get_returns_status_headers_and_body_and_sends_codex_s_headers");
    let origin = Origin::start().await;
    for side in sides.all() {
        let mut client = sides.client(side, &[]).await;
        let params = json!({"method": "GET", "url": origin.url("/echo"), "requestId": "r1",
                            "headers": [{"name": "X-A", "value": "1"}, {"name": "x-a", "value": "2"}]});
        let result = client.call("http/request", params).await;
        assert_eq!(result["status"], 200, "{side:?}");
        let seen = origin.last();
        assert_eq!(seen.request_line, "GET /echo HTTP/1.1", "{side:?}");
        let names: Vec<&str> = seen.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["x-a", "x-a", "accept", "accept-encoding", "host"],
            "{side:?}"
        );
        assert_eq!(seen.header("accept"), ["*/*"], "{side:?}");
        assert_eq!(seen.header("accept-encoding"), ["zstd,gzip"], "{side:?}");
        assert!(seen.header("user-agent").is_empty(), "{side:?}");
        assert_eq!(echoed(&result)["requestLine"], "GET /echo HTTP/1.1");

        // Every status is a result; repeated headers stay apart; non-UTF-8 values vanish.
        let missing = client
            .call("http/request", get(&origin.url("/status/503")))
            .await;
        assert_eq!(missing["status"], 503, "{side:?}");
        let headers = client
            .call("http/request", get(&origin.url("/headers")))
            .await;
        let pairs = header_pairs(&headers);
        let multi: Vec<_> = pairs
            .iter()
            .filter(|(n, _)| n == "x-multi")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(multi, ["a", "b"], "{side:?}");
        assert!(
            pairs.iter().all(|(n, _)| n != "x-bin"),
            "{side:?}: {pairs:?}"
        );
        assert!(pairs.contains(&("x-ok".into(), "yes".into())), "{side:?}");

        // A method is sent as spelled; a body goes with any method.
        let params = json!({"method": "get", "url": origin.url("/echo"), "requestId": "r2",
                            "bodyBase64": b64("hello")});
        let result = client.call("http/request", params).await;
        assert_eq!(
            echoed(&result)["requestLine"],
            "get /echo HTTP/1.1",
            "{side:?}"
        );
        assert_eq!(
            b64decode(&echoed(&result)["bodyBase64"]),
            b"hello",
            "{side:?}"
        );
        assert_eq!(origin.last().header("content-length"), ["5"], "{side:?}");
    }
}

#[tokio::test]
async fn refusals_have_codex_s_codes_and_texts() {
    let sides = Sides::new("refusals_have_codex_s_codes_and_texts");
    let origin = Origin::start().await;
    let url = origin.url("/echo");
    let cases = [
        (
            json!({"method": "GET", "url": url}),
            "missing field `requestId`",
        ),
        (
            json!({"method": "GET", "url": url, "requestId": null}),
            "invalid type: null, expected a string",
        ),
        (
            json!({"url": url, "requestId": "r"}),
            "missing field `method`",
        ),
        (
            json!({"method": "GET", "url": "/relative", "requestId": "r"}),
            "http/request url is invalid: relative URL without a base",
        ),
        (
            json!({"method": "GET", "url": "ftp://h/x", "requestId": "r"}),
            "http/request only supports http and https URLs, got ftp",
        ),
        (
            json!({"method": "GET", "url": "file:///etc/passwd", "requestId": "r"}),
            "http/request only supports http and https URLs, got file",
        ),
        (
            json!({"method": "BAD METHOD", "url": url, "requestId": "r"}),
            "http/request method is invalid: invalid HTTP method",
        ),
        (
            json!({"method": "GET", "url": url, "requestId": "r", "headers": [{"name": "bad name", "value": "x"}]}),
            "http/request header name is invalid: invalid HTTP header name",
        ),
        (
            json!({"method": "GET", "url": url, "requestId": "r", "headers": [{"name": "x-a", "value": "a\r\nb"}]}),
            "http/request header value is invalid for x-a: failed to parse header value",
        ),
        (
            json!({"method": "GET", "url": url, "requestId": "r", "headers": [{"name": "x-a"}]}),
            "missing field `value`",
        ),
        (
            json!({"method": "GET", "url": url, "requestId": "r", "redirectPolicy": "none"}),
            "unknown variant `none`, expected `follow` or `stop`",
        ),
    ];
    for side in sides.all() {
        let mut client = sides.client(side, &[]).await;
        for (params, message) in &cases {
            let error = client.call_err("http/request", params.clone()).await;
            assert_eq!(error["code"], -32602, "{side:?}: {params}");
            assert_eq!(error["message"], *message, "{side:?}: {params}");
        }
        // A refused connection is -32603 naming the URL.
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let url = format!("http://{closed}/x");
        let error = client.call_err("http/request", get(&url)).await;
        assert_eq!(error["code"], -32603, "{side:?}");
        assert_eq!(
            error["message"],
            format!("http/request failed: error sending request for url ({url})"),
            "{side:?}"
        );
    }
}

#[tokio::test]
async fn value_env_var_reads_the_server_s_own_environment_behind_a_denylist() {
    let sides = Sides::new("value_env_var_reads_the_server_s_own_environment_behind_a_denylist");
    let origin = Origin::start().await;
    let env = [
        ("MY_TOKEN", "sekrit"),
        ("EMPTY_TOKEN", ""),
        ("OPENAI_API_KEY", "sk-real"),
    ];
    let header = |value: &str, var: &str| {
        json!({"method": "GET", "url": origin.url("/echo"), "requestId": "r",
               "headers": [{"name": "authorization", "value": value, "valueEnvVar": var}]})
    };
    for side in sides.all() {
        let mut client = sides.client(side, &env).await;
        client
            .call("http/request", header("Bearer ", "MY_TOKEN"))
            .await;
        assert_eq!(
            origin.last().header("authorization"),
            ["Bearer sekrit"],
            "{side:?}"
        );
        client.call("http/request", header("", "MY_TOKEN")).await;
        assert_eq!(
            origin.last().header("authorization"),
            ["sekrit"],
            "{side:?}"
        );
        let with_null = json!({"method": "GET", "url": origin.url("/echo"), "requestId": "r",
               "headers": [{"name": "x-plain", "value": "v", "valueEnvVar": null}]});
        client.call("http/request", with_null).await;
        assert_eq!(origin.last().header("x-plain"), ["v"], "{side:?}");
        for (var, expected) in [
            ("OPENAI_API_KEY", "http/request header authorization cannot use executor environment variable OPENAI_API_KEY"),
            ("openai_api_key", "http/request header authorization cannot use executor environment variable openai_api_key"),
            ("AWS_SECRET_ACCESS_KEY", "http/request header authorization cannot use executor environment variable AWS_SECRET_ACCESS_KEY"),
            ("NOT_SET_ANYWHERE", "http/request header authorization requires executor environment variable NOT_SET_ANYWHERE"),
            ("EMPTY_TOKEN", "http/request header authorization requires a non-empty executor environment variable EMPTY_TOKEN"),
        ] {
            let error = client.call_err("http/request", header("Bearer ", var)).await;
            assert_eq!(error["code"], -32602, "{side:?}: {var}");
            assert_eq!(error["message"], expected, "{side:?}: {var}");
        }
    }
    // This server's own variables (its tokens) are never sent either.
    let mut ours = sides
        .client(Side::Ours, &[("EXEC_SERVER_SECRET_FOR_TEST", "x")])
        .await;
    let error = ours
        .call_err("http/request", header("", "EXEC_SERVER_SECRET_FOR_TEST"))
        .await;
    assert_eq!(
        error["message"],
        "http/request header authorization cannot use executor environment variable EXEC_SERVER_SECRET_FOR_TEST"
    );
    // [diff] A secret read from the environment stays with the origin it was sent to,
    // whatever the header's name (codex sends an `x-api-key` on across origins).
    let other = Origin::start().await;
    let mut ours = sides.client(Side::Ours, &env).await;
    let to = other.url("/echo");
    let params = json!({"method": "GET", "url": origin.url(&format!("/redirect/307?to={to}")),
        "requestId": "r", "headers": [{"name": "x-api-key", "value": "", "valueEnvVar": "MY_TOKEN"},
                                      {"name": "x-plain", "value": "v"}]});
    ours.call("http/request", params).await;
    assert_eq!(origin.last().header("x-api-key"), ["sekrit"]);
    let seen = other.last();
    assert!(seen.header("x-api-key").is_empty(), "{seen:?}");
    assert_eq!(seen.header("x-plain"), ["v"]);
}

#[tokio::test]
async fn redirects_follow_codex_s_rules() {
    let sides = Sides::new("redirects_follow_codex_s_rules");
    let origin = Origin::start().await;
    let other = Origin::start().await;
    for side in sides.all() {
        let mut client = sides.client(side, &[]).await;
        // Another origin: authorization dropped, the referer is the origin only.
        let to = other.url("/echo");
        let params = json!({"method": "GET", "url": origin.url(&format!("/redirect/302?to={to}")),
                            "requestId": "r", "headers": [{"name": "authorization", "value": "Bearer t"}]});
        let result = client.call("http/request", params).await;
        assert_eq!(result["status"], 200, "{side:?}");
        let seen = other.last();
        assert!(
            seen.header("authorization").is_empty(),
            "{side:?}: {seen:?}"
        );
        assert_eq!(
            seen.header("referer"),
            [format!("{}/", origin.base)],
            "{side:?}"
        );
        // The same origin: authorization kept, the whole URL as referer.
        let params = json!({"method": "GET", "url": origin.url("/redirect/307?to=/echo"),
                            "requestId": "r", "headers": [{"name": "authorization", "value": "Bearer t"}]});
        client.call("http/request", params).await;
        let seen = origin.last();
        assert_eq!(seen.header("authorization"), ["Bearer t"], "{side:?}");
        assert_eq!(
            seen.header("referer"),
            [origin.url("/redirect/307?to=/echo")],
            "{side:?}"
        );
        // 303 turns a POST into a GET without its body; 307 replays it.
        let post = |code: u16| {
            json!({"method": "POST", "url": origin.url(&format!("/redirect/{code}?to=/echo")),
                                     "requestId": "r", "bodyBase64": b64("payload")})
        };
        let result = client.call("http/request", post(303)).await;
        assert_eq!(
            echoed(&result)["requestLine"],
            "GET /echo HTTP/1.1",
            "{side:?}"
        );
        let result = client.call("http/request", post(307)).await;
        assert_eq!(
            echoed(&result)["requestLine"],
            "POST /echo HTTP/1.1",
            "{side:?}"
        );
        assert_eq!(
            b64decode(&echoed(&result)["bodyBase64"]),
            b"payload",
            "{side:?}"
        );
        // `stop` answers with the redirect itself.
        let params = json!({"method": "GET", "url": origin.url("/redirect/302?to=/echo"),
                            "requestId": "r", "redirectPolicy": "stop"});
        let result = client.call("http/request", params).await;
        assert_eq!(result["status"], 302, "{side:?}");
        assert!(
            header_pairs(&result).contains(&("location".into(), "/echo".into())),
            "{side:?}"
        );
        // Ten redirects are followed, the eleventh fails the request.
        let before = origin.seen().len();
        let error = client
            .call_err("http/request", get(&origin.url("/loop/0")))
            .await;
        assert_eq!(error["code"], -32603, "{side:?}");
        assert_eq!(
            error["message"], "http/request failed: too many redirects",
            "{side:?}"
        );
        let loops: Vec<String> = origin.seen()[before..]
            .iter()
            .map(|s| s.request_line.clone())
            .collect();
        assert_eq!(loops.len(), 11, "{side:?}: {loops:?}");
        assert_eq!(loops.last().unwrap(), "GET /loop/10 HTTP/1.1", "{side:?}");
    }
}

#[tokio::test]
async fn gzip_and_zstd_bodies_are_decoded_and_a_corrupt_one_fails() {
    let sides = Sides::new("gzip_and_zstd_bodies_are_decoded_and_a_corrupt_one_fails");
    let origin = Origin::start().await;
    for side in sides.all() {
        let mut client = sides.client(side, &[]).await;
        for (path, body) in [("/gzip", &b"gzip body"[..]), ("/zstd", b"zstd body")] {
            let result = client.call("http/request", get(&origin.url(path))).await;
            assert_eq!(b64decode(&result["bodyBase64"]), body, "{side:?} {path}");
            let names: Vec<String> = header_pairs(&result).into_iter().map(|(n, _)| n).collect();
            assert!(
                !names.contains(&"content-encoding".to_owned()),
                "{side:?} {path}: {names:?}"
            );
            assert!(
                !names.contains(&"content-length".to_owned()),
                "{side:?} {path}: {names:?}"
            );
        }
        let error = client
            .call_err("http/request", get(&origin.url("/badgzip")))
            .await;
        assert_eq!(error["code"], -32603, "{side:?}");
        assert_eq!(
            error["message"],
            "failed to read http/request response body: error decoding response body",
            "{side:?}"
        );
        let error = client
            .call_err("http/request", get(&origin.url("/truncated")))
            .await;
        assert_eq!(
            error["message"],
            "failed to read http/request response body: error decoding response body",
            "{side:?}"
        );
    }
}

#[tokio::test]
async fn one_deadline_covers_the_head_and_the_body() {
    let sides = Sides::new("one_deadline_covers_the_head_and_the_body");
    let origin = Origin::start().await;
    for side in sides.all() {
        let mut client = sides.client(side, &[]).await;
        for timeout in [0, 300] {
            let url = origin.url("/hang");
            let params =
                json!({"method": "GET", "url": url, "requestId": "r", "timeoutMs": timeout});
            let error = client.call_err("http/request", params).await;
            assert_eq!(error["code"], -32603, "{side:?} {timeout}");
            // codex's text depends on which of its two timers fires first; ours is always
            // the first (docs/PROTOCOL.md, "http/request").
            let timed_out = "http/request failed: route-aware request timed out";
            let codex_other = format!("http/request failed: error sending request for url ({url})");
            let message = error["message"].as_str().unwrap();
            match side {
                Side::Ours => assert_eq!(message, timed_out, "{timeout}"),
                Side::Codex => assert!(
                    message == timed_out || message == codex_other,
                    "{timeout}: {message}"
                ),
            }
        }
        // The head comes at once, the body takes 2 s: the 500 ms deadline ends it.
        let params = json!({"method": "GET", "url": origin.url("/sse?chunks=20&delay=100"),
                            "requestId": "r", "timeoutMs": 500});
        let error = client.call_err("http/request", params).await;
        assert_eq!(
            error["message"],
            "failed to read http/request response body: error decoding response body",
            "{side:?}"
        );
        // No timeout: a slow body is read to its end.
        let params = json!({"method": "GET", "url": origin.url("/sse?chunks=3&delay=200"), "requestId": "r", "timeoutMs": null});
        let result = client.call("http/request", params).await;
        assert_eq!(
            b64decode(&result["bodyBase64"]),
            b"data: 0 xx\n\ndata: 1 xx\n\ndata: 2 xx\n\n",
            "{side:?}"
        );
    }
}

//! Plain HTTP through the proxy: forwarding, hop-by-hop headers, the §3.5 blocked
//! responses, limited mode, the request-head bound.

use serde_json::json;

use crate::util::*;

#[tokio::test]
async fn absolute_form_get_is_forwarded_without_hop_by_hop_headers() -> TestResult {
    let upstream = upstream_http().await?;
    let mut started = start(config("full", json!({"127.0.0.1": "allow"}), false)).await?;
    let authority = upstream.addr.to_string();
    let request = format!(
        "GET http://{authority}/path?q=1 HTTP/1.1\r\nHost: wrong.test\r\nProxy-Connection: keep-alive\r\n\
         Proxy-Authorization: Basic eDp5\r\nConnection: close, x-drop\r\nX-Drop: 1\r\nX-Keep: yes\r\n\r\n"
    );
    let reply = send_raw(started.proxy.http_addr(), request.as_bytes()).await?;
    assert_eq!(reply.status(), "200", "{}", reply.head);
    assert_eq!(reply.header("x-upstream").as_deref(), Some("yes"));
    assert_eq!(
        reply.header("keep-alive"),
        None,
        "hop-by-hop response header forwarded"
    );
    let seen = reply.body.to_ascii_lowercase();
    assert!(
        seen.starts_with("seen:get /path?q=1 http/1.1\r\n"),
        "{seen}"
    );
    assert!(seen.contains(&format!("host: {authority}")), "{seen}");
    assert!(seen.contains("x-keep: yes"), "{seen}");
    for dropped in [
        "proxy-connection",
        "proxy-authorization",
        "x-drop",
        "wrong.test",
    ] {
        assert!(!seen.contains(dropped), "{dropped} forwarded: {seen}");
    }
    let event = started.next_event().await?;
    assert_eq!(event["scope"], "domain");
    assert_eq!(event["decision"], "allow");
    assert_eq!(event["source"], "baseline_policy");
    assert_eq!(event["reason"], "allow");
    assert_eq!(event["protocol"], "http");
    assert_eq!(event["host"], "127.0.0.1");
    assert_eq!(event["port"], upstream.addr.port());
    assert_eq!(event["method"], "GET");
    assert_eq!(event["policyOverride"], false);
    assert!(event["client"]
        .as_str()
        .is_some_and(|c| c.starts_with("127.0.0.1:")));
    let timestamp = event["timestamp"].as_str().unwrap_or_default();
    assert_eq!(
        (timestamp.len(), &timestamp[10..11], &timestamp[19..20]),
        (24, "T", "."),
        "{timestamp}"
    );
    assert!(timestamp.ends_with('Z'));
    assert!(started.no_more_events());
    Ok(())
}

#[tokio::test]
async fn post_body_is_forwarded_in_full_mode() -> TestResult {
    let upstream = upstream_http().await?;
    let started = start(config("full", json!({"up.test": "allow"}), true)).await?;
    let authority = format!("up.test:{}", upstream.addr.port());
    let request = format!(
        "POST http://{authority}/submit HTTP/1.1\r\nHost: {authority}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
         5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    );
    let reply = send_raw(started.proxy.http_addr(), request.as_bytes()).await?;
    assert_eq!(reply.status(), "200", "{}", reply.head);
    assert!(
        reply.body.contains("POST /submit HTTP/1.1"),
        "{}",
        reply.body
    );
    // The body has no length, so it goes on chunked; the chunks arrive intact.
    assert!(
        reply
            .body
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{}",
        reply.body
    );
    // The fixture puts a bare "\n" between the head it saw and the body.
    let separator = reply
        .body
        .char_indices()
        .find(|(i, c)| *c == '\n' && !reply.body[..*i].ends_with('\r'));
    let chunked = &reply.body[separator.ok_or("no body")?.0 + 1..];
    let chunks = decode_chunked(chunked)?;
    assert_eq!(chunks, "hello world");
    Ok(())
}

/// Each §3.5 reason row for plain HTTP: status, headers and the exact JSON body.
#[tokio::test]
async fn blocked_requests_get_the_spec_json() -> TestResult {
    let started = start(config(
        "limited",
        json!({"evil.test": "deny", "**.evil.test": "allow", "127.0.0.1": "allow"}),
        false,
    ))
    .await?;
    let proxy = started.proxy.http_addr();
    let cases = [
        (
            "other.test",
            "GET",
            "not_allowed",
            "baseline_policy",
            "blocked-by-allowlist",
            "Domain not in allowlist.",
        ),
        (
            "evil.test",
            "GET",
            "denied",
            "baseline_policy",
            "blocked-by-denylist",
            "Domain denied by the sandbox policy.",
        ),
        (
            "127.0.0.2",
            "GET",
            "not_allowed_local",
            "baseline_policy",
            "blocked-by-allowlist",
            "Sandbox policy blocks local/private network addresses.",
        ),
        (
            "127.0.0.1",
            "POST",
            "method_not_allowed",
            "mode_guard",
            "blocked-by-method-policy",
            "Method not allowed in limited mode.",
        ),
    ];
    for (host, method, reason, source, proxy_error, message) in cases {
        let reply = get(proxy, host, method).await?;
        assert_eq!(reply.status(), "403", "{host}: {}", reply.head);
        assert!(
            reply.head.starts_with("HTTP/1.1 403 Forbidden"),
            "{}",
            reply.head
        );
        assert_eq!(
            reply.header("content-type").as_deref(),
            Some("application/json")
        );
        assert_eq!(
            reply.header("x-proxy-error").as_deref(),
            Some(proxy_error),
            "{host}"
        );
        let expected = format!(
            r#"{{"status":"blocked","host":"{host}","reason":"{reason}","decision":"deny","source":"{source}","protocol":"http","port":80,"message":"{message}"}}"#
        );
        assert_eq!(reply.body, expected);
    }
    Ok(())
}

#[tokio::test]
async fn limited_mode_reports_the_domain_allow_then_the_guard() -> TestResult {
    let upstream = upstream_http().await?;
    let mut started = start(config("limited", json!({"127.0.0.1": "allow"}), false)).await?;
    let authority = upstream.addr.to_string();
    for method in ["GET", "HEAD", "OPTIONS"] {
        let request = format!("{method} http://{authority}/ HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
        let mut stream = tokio::net::TcpStream::connect(started.proxy.http_addr()).await?;
        tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes()).await?;
        let (head, _) = read_head(&mut stream).await?;
        assert!(head.starts_with("HTTP/1.1 200"), "{method}: {head}");
        assert_eq!(started.next_event().await?["decision"], "allow");
    }
    let reply = get(started.proxy.http_addr(), &authority, "PUT").await?;
    assert_eq!(reply.status(), "403");
    let first = started.next_event().await?;
    let second = started.next_event().await?;
    assert_eq!(
        (&first["scope"], &first["decision"]),
        (&json!("domain"), &json!("allow"))
    );
    assert_eq!(
        (
            &second["scope"],
            &second["decision"],
            &second["source"],
            &second["reason"],
            &second["method"]
        ),
        (
            &json!("non_domain"),
            &json!("deny"),
            &json!("mode_guard"),
            &json!("method_not_allowed"),
            &json!("PUT")
        )
    );
    Ok(())
}

#[tokio::test]
async fn an_oversized_request_head_is_refused() -> TestResult {
    let started = start(config("full", json!({"127.0.0.1": "allow"}), false)).await?;
    let filler = "a".repeat(70 * 1024);
    let request =
        format!("GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {filler}\r\n\r\n");
    let mut stream = tokio::net::TcpStream::connect(started.proxy.http_addr()).await?;
    // The proxy may answer and close before all of it is written.
    let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes()).await;
    let reply = tokio::time::timeout(HANG_GUARD, read_reply(&mut stream)).await??;
    assert_eq!(reply.status(), "431", "{}", reply.head);
    Ok(())
}

#[tokio::test]
async fn origin_form_and_https_urls_are_bad_requests() -> TestResult {
    let started = start(config("full", json!({"127.0.0.1": "allow"}), false)).await?;
    let proxy = started.proxy.http_addr();
    let origin = send_raw(
        proxy,
        b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await?;
    assert_eq!(origin.status(), "400");
    let https = send_raw(
        proxy,
        b"GET https://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await?;
    assert_eq!(https.status(), "400");
    Ok(())
}

/// The data of a chunked body.
fn decode_chunked(mut text: &str) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let mut data = String::new();
    loop {
        let (size, rest) = text.split_once("\r\n").ok_or("truncated chunk")?;
        let size = usize::from_str_radix(size.trim(), 16)?;
        if size == 0 {
            return Ok(data);
        }
        data.push_str(rest.get(..size).ok_or("short chunk")?);
        text = rest.get(size + 2..).ok_or("short chunk")?;
    }
}

#[tokio::test]
async fn userinfo_stays_out_of_the_forwarded_host() -> TestResult {
    let upstream = upstream_http().await?;
    let started = start(config("full", json!({"127.0.0.1": "allow"}), false)).await?;
    let authority = upstream.addr.to_string();
    let request =
        format!("GET http://user:secret@{authority}/ HTTP/1.1\r\nConnection: close\r\n\r\n");
    let reply = send_raw(started.proxy.http_addr(), request.as_bytes()).await?;
    assert_eq!(reply.status(), "200", "{}", reply.head);
    let host_line = format!("host: {authority}");
    assert!(
        reply.body.lines().any(|line| line.trim_end() == host_line),
        "{}",
        reply.body
    );
    assert!(!reply.body.contains("secret"), "{}", reply.body);
    Ok(())
}

#[tokio::test]
async fn the_proxy_does_not_proxy_to_itself() -> TestResult {
    let mut value = config("full", json!({"127.0.0.1": "allow"}), true);
    value["proxy"]["enableSocks5"] = json!(false);
    let looping = start(value).await?;
    let own = looping.proxy.http_addr();
    let reply = get(own, &own.to_string(), "GET").await?;
    assert_eq!(reply.status(), "502", "{}", reply.head);
    Ok(())
}

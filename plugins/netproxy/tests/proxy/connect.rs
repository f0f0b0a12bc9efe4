//! CONNECT tunnels: bytes through an allowed tunnel, the §3.5 rows for CONNECT.

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::util::*;

/// Opens a CONNECT tunnel and returns the stream and the response head.
/// Opens a CONNECT tunnel; returns the stream, the response head and any body bytes
/// read with it.
pub async fn open_tunnel_raw(
    proxy: std::net::SocketAddr,
    authority: &str,
) -> Result<(TcpStream, String, Vec<u8>), Box<dyn std::error::Error + Send + Sync>> {
    let mut stream = TcpStream::connect(proxy).await?;
    let request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let (head, rest) = tokio::time::timeout(HANG_GUARD, read_head(&mut stream)).await??;
    Ok((stream, head, rest))
}

pub async fn open_tunnel(
    proxy: std::net::SocketAddr,
    authority: &str,
) -> Result<(TcpStream, String), Box<dyn std::error::Error + Send + Sync>> {
    let (stream, head, rest) = open_tunnel_raw(proxy, authority).await?;
    assert!(rest.is_empty());
    Ok((stream, head))
}

pub async fn echo_round_trip(stream: &mut TcpStream, payload: &[u8]) -> TestResult {
    stream.write_all(payload).await?;
    let mut echoed = vec![0u8; payload.len()];
    tokio::time::timeout(HANG_GUARD, stream.read_exact(&mut echoed)).await??;
    assert_eq!(echoed, payload);
    Ok(())
}

#[tokio::test]
async fn connect_tunnels_bytes_both_ways() -> TestResult {
    let echo = echo_server().await?;
    let mut started = start(config("full", json!({"127.0.0.1": "allow"}), false)).await?;
    let (mut stream, head) = open_tunnel(started.proxy.http_addr(), &echo.addr.to_string()).await?;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    echo_round_trip(&mut stream, b"hello through the tunnel").await?;
    echo_round_trip(&mut stream, &[7u8; 100_000]).await?;
    let event = started.next_event().await?;
    assert_eq!(
        (&event["protocol"], &event["method"], &event["decision"]),
        (&json!("https_connect"), &json!("CONNECT"), &json!("allow"))
    );
    Ok(())
}

#[tokio::test]
async fn blocked_connect_gets_text_and_the_spec_header() -> TestResult {
    let echo = echo_server().await?;
    let limited = start(config(
        "limited",
        json!({"evil.test": "deny", "127.0.0.1": "allow"}),
        false,
    ))
    .await?;
    let port = echo.addr.port();
    let cases = [
        (
            format!("other.test:{port}"),
            "blocked-by-allowlist",
            "Domain not in allowlist.",
        ),
        (
            format!("evil.test:{port}"),
            "blocked-by-denylist",
            "Domain denied by the sandbox policy.",
        ),
        (
            format!("[::1]:{port}"),
            "blocked-by-allowlist",
            "Sandbox policy blocks local/private network addresses.",
        ),
        (
            format!("127.0.0.1:{port}"),
            "blocked-by-mitm-required",
            "MITM required for limited HTTPS.",
        ),
    ];
    for (authority, proxy_error, message) in cases {
        let (mut stream, head, mut body) =
            open_tunnel_raw(limited.proxy.http_addr(), &authority).await?;
        assert!(
            head.starts_with("HTTP/1.1 403 Forbidden"),
            "{authority}: {head}"
        );
        assert_eq!(header(&head, "content-type").as_deref(), Some("text/plain"));
        assert_eq!(
            header(&head, "x-proxy-error").as_deref(),
            Some(proxy_error),
            "{authority}"
        );
        let length: usize = header(&head, "content-length")
            .ok_or("no length")?
            .parse()?;
        while body.len() < length {
            let mut chunk = [0u8; 1024];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(String::from_utf8(body)?, message);
    }
    Ok(())
}

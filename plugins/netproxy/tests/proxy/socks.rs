//! SOCKS5 spoken by hand: greeting, CONNECT with each address type, the reply codes.

use std::net::SocketAddr;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::connect::echo_round_trip;
use crate::util::*;

/// Greets with no-auth and returns the method the proxy chose.
async fn greet(
    proxy: SocketAddr,
    methods: &[u8],
) -> Result<(TcpStream, u8), Box<dyn std::error::Error + Send + Sync>> {
    let mut stream = TcpStream::connect(proxy).await?;
    let mut greeting = vec![5, methods.len() as u8];
    greeting.extend_from_slice(methods);
    stream.write_all(&greeting).await?;
    let mut choice = [0u8; 2];
    stream.read_exact(&mut choice).await?;
    assert_eq!(choice[0], 5);
    Ok((stream, choice[1]))
}

/// Sends a request with `address` (ATYP + DST.ADDR) and returns the reply code.
async fn request(
    stream: &mut TcpStream,
    command: u8,
    address: &[u8],
    port: u16,
) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    let mut message = vec![5, command, 0];
    message.extend_from_slice(address);
    message.extend_from_slice(&port.to_be_bytes());
    stream.write_all(&message).await?;
    let mut reply = [0u8; 4];
    tokio::time::timeout(HANG_GUARD, stream.read_exact(&mut reply)).await??;
    let address_length = match reply[3] {
        1 => 4,
        4 => 16,
        other => return Err(format!("reply address type {other}").into()),
    };
    let mut bound = vec![0u8; address_length + 2];
    stream.read_exact(&mut bound).await?;
    Ok(reply[1])
}

fn domain(name: &str) -> Vec<u8> {
    let mut address = vec![3, name.len() as u8];
    address.extend_from_slice(name.as_bytes());
    address
}

fn ipv4(ip: [u8; 4]) -> Vec<u8> {
    let mut address = vec![1];
    address.extend_from_slice(&ip);
    address
}

#[tokio::test]
async fn connect_by_domain_and_by_ipv4_relays_bytes() -> TestResult {
    let echo = echo_server().await?;
    let mut started = start(config(
        "full",
        json!({"up.test": "allow", "127.0.0.1": "allow"}),
        false,
    ))
    .await?;
    let socks = started.proxy.socks_addr().ok_or("no socks listener")?;
    let port = echo.addr.port();

    // up.test resolves to loopback, which only an allowlisted literal may reach.
    let (mut stream, method) = greet(socks, &[0x02, 0x00]).await?;
    assert_eq!(method, 0x00);
    assert_eq!(
        request(&mut stream, 1, &domain("up.test"), port).await?,
        0x02
    );
    let event = started.next_event().await?;
    assert_eq!(
        (&event["reason"], &event["protocol"]),
        (&json!("not_allowed_local"), &json!("socks5_tcp"))
    );
    assert!(
        event.get("method").is_none(),
        "socks5_tcp events carry no method: {event}"
    );

    let (mut stream, _) = greet(socks, &[0x00]).await?;
    assert_eq!(
        request(&mut stream, 1, &ipv4([127, 0, 0, 1]), port).await?,
        0x00
    );
    echo_round_trip(&mut stream, b"socks bytes").await?;
    let event = started.next_event().await?;
    assert_eq!(
        (&event["decision"], &event["host"], &event["port"]),
        (&json!("allow"), &json!("127.0.0.1"), &json!(port))
    );
    Ok(())
}

#[tokio::test]
async fn connect_by_domain_with_local_binding() -> TestResult {
    let echo = echo_server().await?;
    let started = start(config("full", json!({"UP.test": "allow"}), true)).await?;
    let socks = started.proxy.socks_addr().ok_or("no socks listener")?;
    let (mut stream, _) = greet(socks, &[0x00]).await?;
    assert_eq!(
        request(&mut stream, 1, &domain("up.TEST"), echo.addr.port()).await?,
        0x00
    );
    echo_round_trip(&mut stream, b"by name").await?;
    Ok(())
}

#[tokio::test]
async fn blocked_hosts_get_not_allowed_by_ruleset() -> TestResult {
    let started = start(config(
        "limited",
        json!({"evil.test": "deny", "127.0.0.1": "allow"}),
        false,
    ))
    .await?;
    let socks = started.proxy.socks_addr().ok_or("no socks listener")?;
    let mut ipv6_loopback = vec![4];
    ipv6_loopback.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
    // Denied, not allowed, local IPv6, and (limited mode) the mode guard.
    for address in [
        domain("evil.test"),
        domain("other.test"),
        ipv6_loopback,
        ipv4([127, 0, 0, 1]),
    ] {
        let (mut stream, _) = greet(socks, &[0x00]).await?;
        assert_eq!(
            request(&mut stream, 1, &address, 443).await?,
            0x02,
            "{address:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn unsupported_methods_and_commands_are_refused() -> TestResult {
    let started = start(config("full", json!({"127.0.0.1": "allow"}), false)).await?;
    let socks = started.proxy.socks_addr().ok_or("no socks listener")?;
    let (_, method) = greet(socks, &[0x02]).await?;
    assert_eq!(method, 0xff);
    let (mut stream, _) = greet(socks, &[0x00]).await?;
    assert_eq!(
        request(&mut stream, 3, &ipv4([127, 0, 0, 1]), 53).await?,
        0x07,
        "UDP ASSOCIATE"
    );
    let (mut stream, _) = greet(socks, &[0x00]).await?;
    stream.write_all(&[5, 1, 0, 9]).await?;
    let mut reply = [0u8; 2];
    stream.read_exact(&mut reply).await?;
    assert_eq!(reply, [5, 0x08], "unknown address type");
    Ok(())
}

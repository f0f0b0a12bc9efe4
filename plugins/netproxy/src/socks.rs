//! The SOCKS5 listener's connections (RFC 1928): no authentication, CONNECT only, with
//! domain, IPv4 and IPv6 addresses. A blocked destination gets reply 0x02, "connection
//! not allowed by ruleset" (codex's code is unverified; 0x02 is the RFC's meaning).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::context::ProxyContext;
use crate::decision::Protocol;
use crate::policy::Target;
use crate::relay::relay;

const VERSION: u8 = 5;
const NO_AUTH: u8 = 0x00;
const NO_ACCEPTABLE_METHOD: u8 = 0xff;
const CMD_CONNECT: u8 = 0x01;

/// Reply codes.
pub const REPLY_SUCCEEDED: u8 = 0x00;
pub const REPLY_GENERAL_FAILURE: u8 = 0x01;
pub const REPLY_NOT_ALLOWED: u8 = 0x02;
pub const REPLY_NETWORK_UNREACHABLE: u8 = 0x03;
pub const REPLY_HOST_UNREACHABLE: u8 = 0x04;
pub const REPLY_CONNECTION_REFUSED: u8 = 0x05;
pub const REPLY_COMMAND_NOT_SUPPORTED: u8 = 0x07;
pub const REPLY_ADDRESS_TYPE_NOT_SUPPORTED: u8 = 0x08;

pub(crate) async fn serve_socks(mut stream: TcpStream, client: SocketAddr, ctx: Arc<ProxyContext>) {
    let handshake =
        tokio::time::timeout(ctx.limits.handshake_timeout, read_request(&mut stream)).await;
    let (host, port) = match handshake {
        Ok(Ok(Some(destination))) => destination,
        Ok(Ok(None)) => return,
        Ok(Err(error)) => {
            tracing::debug!(%client, %error, "network proxy: SOCKS5 handshake failed");
            return;
        }
        Err(_) => return,
    };
    let target = Target::new(Protocol::Socks5Tcp, &host, port, None);
    let evaluation = ctx.evaluate(&target, client).await;
    if evaluation.block().is_some() {
        let _ = reply(&mut stream, REPLY_NOT_ALLOWED, None).await;
        return;
    }
    let upstream = match ctx.connect(&target, &evaluation).await {
        Ok(upstream) => upstream,
        Err(error) => {
            let _ = reply(&mut stream, connect_failure_code(&error), None).await;
            return;
        }
    };
    if reply(&mut stream, REPLY_SUCCEEDED, upstream.local_addr().ok())
        .await
        .is_ok()
    {
        relay(stream, upstream, ctx.limits.tunnel_idle_timeout).await;
    }
}

/// The greeting and the request; `None` when the client was already answered with a
/// refusal (or spoke another protocol) and the connection should just close.
async fn read_request(stream: &mut TcpStream) -> io::Result<Option<(String, u16)>> {
    let [version, method_count] = read_array::<2>(stream).await?;
    if version != VERSION {
        return Ok(None);
    }
    let mut methods = vec![0u8; usize::from(method_count)];
    stream.read_exact(&mut methods).await?;
    if !methods.contains(&NO_AUTH) {
        stream.write_all(&[VERSION, NO_ACCEPTABLE_METHOD]).await?;
        return Ok(None);
    }
    stream.write_all(&[VERSION, NO_AUTH]).await?;
    let [version, command, _reserved, address_type] = read_array::<4>(stream).await?;
    if version != VERSION {
        return Ok(None);
    }
    let Some(host) = read_address(stream, address_type).await? else {
        reply(stream, REPLY_ADDRESS_TYPE_NOT_SUPPORTED, None).await?;
        return Ok(None);
    };
    let port = u16::from_be_bytes(read_array::<2>(stream).await?);
    if command != CMD_CONNECT {
        // BIND and UDP ASSOCIATE (enableSocks5Udp) are not offered.
        reply(stream, REPLY_COMMAND_NOT_SUPPORTED, None).await?;
        return Ok(None);
    }
    Ok(Some((host, port)))
}

/// DST.ADDR as a host string; `None` for an unknown type or an unusable name.
async fn read_address(stream: &mut TcpStream, address_type: u8) -> io::Result<Option<String>> {
    match address_type {
        0x01 => Ok(Some(
            Ipv4Addr::from(read_array::<4>(stream).await?).to_string(),
        )),
        0x04 => Ok(Some(
            Ipv6Addr::from(read_array::<16>(stream).await?).to_string(),
        )),
        0x03 => {
            let [length] = read_array::<1>(stream).await?;
            let mut name = vec![0u8; usize::from(length)];
            stream.read_exact(&mut name).await?;
            Ok(String::from_utf8(name).ok().filter(|name| !name.is_empty()))
        }
        _ => Ok(None),
    }
}

async fn read_array<const N: usize>(stream: &mut TcpStream) -> io::Result<[u8; N]> {
    let mut buffer = [0u8; N];
    stream.read_exact(&mut buffer).await?;
    Ok(buffer)
}

async fn reply(stream: &mut TcpStream, code: u8, bound: Option<SocketAddr>) -> io::Result<()> {
    let bound = bound.unwrap_or_else(|| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
    let mut message = vec![VERSION, code, 0];
    match bound.ip() {
        IpAddr::V4(ip) => {
            message.push(0x01);
            message.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            message.push(0x04);
            message.extend_from_slice(&ip.octets());
        }
    }
    message.extend_from_slice(&bound.port().to_be_bytes());
    stream.write_all(&message).await
}

fn connect_failure_code(error: &io::Error) -> u8 {
    match error.kind() {
        io::ErrorKind::ConnectionRefused => REPLY_CONNECTION_REFUSED,
        io::ErrorKind::TimedOut | io::ErrorKind::HostUnreachable => REPLY_HOST_UNREACHABLE,
        io::ErrorKind::NetworkUnreachable => REPLY_NETWORK_UNREACHABLE,
        _ => REPLY_GENERAL_FAILURE,
    }
}

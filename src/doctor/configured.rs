//! The `doctor` checks of what the configuration names: a Redis store, TLS files.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use exec_server_config::ConfigSource;
use exec_server_proto::log_text::printable;
use exec_server_rendezvous::store_url::{redis_endpoint, RedisEndpoint};

use super::Finding;

/// How long the store check waits for Redis.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

pub(super) fn checks(source: &ConfigSource) -> Vec<Finding> {
    let mut findings = Vec::new();
    if let Some(store) = source
        .string_value("rendezvous.store")
        .filter(|s| s != "memory")
    {
        findings.push(redis(&store));
    }
    let cert = source.string_value("rendezvous.tls_cert_file");
    let key = source.string_value("rendezvous.tls_key_file");
    if let (Some(cert), Some(key)) = (cert, key) {
        findings.push(tls_files(&cert, &key));
    }
    findings
}

/// Connects to the store's Redis and sends `PING`.
fn redis(store: &str) -> Finding {
    let shown = exec_server_rendezvous::store_url::redacted_url(store);
    let Some(endpoint) = redis_endpoint(store) else {
        return Finding::fail(
            "redis",
            format!("rendezvous.store `{shown}` names no Redis server"),
        );
    };
    match ping(&endpoint) {
        Ok(answer) if answer.starts_with("+PONG") => Finding::ok("redis", format!("{shown} answers PING: the nodes can share registrations")),
        Ok(answer) if answer.starts_with("-NOAUTH") => Finding::ok("redis", format!("{shown} is reachable and asks for a password (the store URL's credentials are used by the service)")),
        Ok(answer) => Finding::fail("redis", format!("{shown} answered `{}` to PING: the rendezvous cannot use it", printable(answer.trim()))),
        Err(error) => Finding::fail("redis", format!("{shown} unreachable ({error}): the rendezvous answers 503 until it is. Fix: start Redis or correct rendezvous.store")),
    }
}

/// Sends `PING` and returns the start of the answer.
fn ping(endpoint: &RedisEndpoint) -> std::io::Result<String> {
    match endpoint {
        RedisEndpoint::Tcp(address) => {
            let target = address
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| std::io::Error::other("no address"))?;
            let stream = TcpStream::connect_timeout(&target, STORE_TIMEOUT)?;
            stream.set_read_timeout(Some(STORE_TIMEOUT))?;
            exchange(stream)
        }
        RedisEndpoint::Unix(path) => {
            let stream = UnixStream::connect(path)?;
            stream.set_read_timeout(Some(STORE_TIMEOUT))?;
            exchange(stream)
        }
    }
}

fn exchange(mut stream: impl Read + Write) -> std::io::Result<String> {
    stream.write_all(b"PING\r\n")?;
    let mut answer = [0u8; 64];
    let n = stream.read(&mut answer)?;
    Ok(String::from_utf8_lossy(&answer[..n]).into_owned())
}

fn tls_files(cert: &str, key: &str) -> Finding {
    match exec_server_rendezvous::tls::server_config(cert.as_ref(), key.as_ref()) {
        Ok(_) => Finding::ok(
            "tls files",
            format!("{cert} and {key} load and match; the key is owner-only"),
        ),
        Err(error) => Finding::fail("tls files", error.to_string()),
    }
}

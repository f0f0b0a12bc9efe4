//! The proxy's life: caller-supplied listeners, shutdown and drop closing everything,
//! idle limits, no DNS rebinding, the child's variables.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use exec_server_netproxy::{ListenerSource, Resolver};
use serde_json::json;
use tokio::net::TcpStream;

use crate::connect::{echo_round_trip, open_tunnel};
use crate::util::*;

#[tokio::test]
async fn shutdown_closes_listeners_and_open_tunnels() -> TestResult {
    let echo = echo_server().await?;
    let started = start(config("full", json!({"127.0.0.1": "allow"}), false)).await?;
    let (http, socks) = (
        started.proxy.http_addr(),
        started.proxy.socks_addr().ok_or("no socks")?,
    );
    let (mut tunnel, _) = open_tunnel(http, &echo.addr.to_string()).await?;
    echo_round_trip(&mut tunnel, b"before").await?;
    started.proxy.shutdown().await;
    wait_closed(&mut tunnel).await?;
    for addr in [http, socks] {
        let refused = TcpStream::connect(addr).await;
        assert!(refused.is_err(), "{addr} still accepts");
    }
    Ok(())
}

#[tokio::test]
async fn dropping_the_proxy_closes_its_tunnels() -> TestResult {
    let echo = echo_server().await?;
    let started = start(config("full", json!({"127.0.0.1": "allow"}), false)).await?;
    let (mut tunnel, _) = open_tunnel(started.proxy.http_addr(), &echo.addr.to_string()).await?;
    echo_round_trip(&mut tunnel, b"before").await?;
    drop(started);
    wait_closed(&mut tunnel).await?;
    Ok(())
}

#[tokio::test]
async fn caller_supplied_listeners_are_used() -> TestResult {
    let upstream = upstream_http().await?;
    let http = std::net::TcpListener::bind("127.0.0.1:0")?;
    let socks = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let (http_addr, socks_addr) = (http.local_addr()?, socks.local_addr()?);
    let config = exec_server_netproxy::NetworkProxyLaunchConfig::from_value(config(
        "full",
        json!({"127.0.0.1": "allow"}),
        false,
    ))?;
    let mut options = exec_server_netproxy::ProxyOptions::new(Arc::new(|_| {}));
    options.http_listener = ListenerSource::from(http);
    options.socks_listener = ListenerSource::from(socks);
    let proxy = exec_server_netproxy::Proxy::start(&config, options).await?;
    assert_eq!(
        (proxy.http_addr(), proxy.socks_addr()),
        (http_addr, Some(socks_addr))
    );
    let reply = get(http_addr, &upstream.addr.to_string(), "GET").await?;
    assert_eq!(reply.status(), "200");
    let env: std::collections::HashMap<_, _> = proxy.child_env().into_iter().collect();
    assert_eq!(
        env["HTTP_PROXY"],
        format!("http://127.0.0.1:{}", http_addr.port())
    );
    assert_eq!(
        env["ALL_PROXY"],
        format!("socks5h://127.0.0.1:{}", socks_addr.port())
    );
    assert_eq!(env["NO_PROXY"], "");
    Ok(())
}

#[tokio::test]
async fn idle_connections_and_tunnels_are_closed() -> TestResult {
    let echo = echo_server().await?;
    let options = StartOptions {
        tweak: |options| {
            options.limits.header_read_timeout = Duration::from_millis(200);
            options.limits.tunnel_idle_timeout = Duration::from_millis(200);
        },
        ..StartOptions::default()
    };
    let started = start_with(
        config("full", json!({"127.0.0.1": "allow"}), false),
        options,
    )
    .await?;
    let mut silent = TcpStream::connect(started.proxy.http_addr()).await?;
    wait_closed(&mut silent).await?;
    let (mut tunnel, _) = open_tunnel(started.proxy.http_addr(), &echo.addr.to_string()).await?;
    echo_round_trip(&mut tunnel, b"then silence").await?;
    wait_closed(&mut tunnel).await?;
    Ok(())
}

/// First answer: the real upstream on 127.0.0.1; every later one: 127.0.0.2, where
/// nothing listens. A proxy that resolved again to connect would fail.
struct RebindingResolver {
    calls: AtomicUsize,
}

#[async_trait]
impl Resolver for RebindingResolver {
    async fn resolve(&self, _host: &str, _port: u16) -> std::io::Result<Vec<IpAddr>> {
        let first = self.calls.fetch_add(1, Ordering::SeqCst) == 0;
        Ok(vec![IpAddr::from(if first {
            [127, 0, 0, 1]
        } else {
            [127, 0, 0, 2]
        })])
    }
}

#[tokio::test]
async fn the_proxy_connects_to_the_checked_address_without_resolving_again() -> TestResult {
    let upstream = upstream_http().await?;
    let resolver = Arc::new(RebindingResolver {
        calls: AtomicUsize::new(0),
    });
    let options = StartOptions {
        resolver: resolver.clone(),
        ..StartOptions::default()
    };
    let started = start_with(
        config("full", json!({"rebind.test": "allow"}), true),
        options,
    )
    .await?;
    let reply = get(
        started.proxy.http_addr(),
        &format!("rebind.test:{}", upstream.addr.port()),
        "GET",
    )
    .await?;
    assert_eq!(reply.status(), "200", "{}", reply.head);
    assert_eq!(resolver.calls.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn an_invalid_config_is_refused_with_the_spec_text() -> TestResult {
    let mut value = config("full", json!({}), false);
    value["proxy"]["enabled"] = json!(false);
    let error = match start(value).await {
        Ok(_) => return Err("a disabled proxy started".into()),
        Err(error) => error.to_string(),
    };
    assert_eq!(error, "invalid network proxy config: executor-local network proxy launch requires an enabled proxy");
    Ok(())
}

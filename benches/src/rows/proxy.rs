//! `proxy_out`: a child downloading through its managed network proxy (`process/start`
//! with `networkProxy`, CODEX-NETWORK §3) against the same download made directly. Both
//! sides are `curl` writing to `/dev/null`, and both rates are curl's own (bytes over
//! `time_total`), so process start and output handling are left out: what is measured is
//! the proxy in the path.

use std::process::Command;

use serde_json::{json, Value};

use super::http::Origin;
use crate::report::{Row, Unit};
use crate::target::WsProcess;
use crate::wire::{self, Rpc};

const BYTES: usize = 64 << 20;

/// curl's report: `<bytes> <seconds>`.
const WRITE_OUT: &str = "%{size_download} %{time_total}";

pub async fn proxy_out() -> Row {
    let origin = Origin::start(BYTES).await;
    let url = origin.url();
    let floor = direct(&url);
    let server = WsProcess::exec_server(&[]).await;
    let rate = proxied(&server.url, &url).await;
    drop(server);
    let peer = crate::peer::measure("proxy_out", move |codex| async move {
        proxied(&codex.url, &url).await
    })
    .await;
    Row {
        key: "proxy_out",
        what: "curl of 64 MiB through the process's managed proxy vs direct",
        unit: Unit::BytesPerSecond,
        median: rate,
        p99: None,
        floor: Some(floor),
        target: "≥ 0.5× floor",
        met: rate >= 0.5 * floor,
        peer,
    }
}

/// curl's rate for `url` with no proxy at all.
fn direct(url: &str) -> f64 {
    let output = Command::new("curl")
        .args([
            "-s",
            "--noproxy",
            "*",
            "-o",
            "/dev/null",
            "-w",
            WRITE_OUT,
            url,
        ])
        .output()
        .expect("run curl");
    rate_of(&String::from_utf8_lossy(&output.stdout))
}

/// curl's rate for `url` run by the server at `server`, through the proxy `networkProxy`
/// gives it (its variables point curl there); a policy decision proves the path.
async fn proxied(server: &str, url: &str) -> f64 {
    let mut ws = wire::ws_connect(server).await;
    wire::handshake(&mut ws).await;
    let proxy = json!({"proxy": {"enabled": true, "enableSocks5": false,
        "enableSocks5Udp": false, "allowUpstreamProxy": false,
        "dangerouslyAllowAllUnixSockets": false, "mode": "full",
        "domains": {"127.0.0.1": "allow"}, "allowLocalBinding": false}});
    let params = json!({"processId": "curl", "cwd": "file:///tmp", "tty": false,
        "argv": ["curl", "-s", "-o", "/dev/null", "-w", WRITE_OUT, url],
        "env": {"PATH": "/usr/bin:/bin"}, "networkProxy": proxy});
    wire::call(&mut ws, 1, "process/start", params).await;
    let mut output = Vec::new();
    let mut decided = false;
    loop {
        let message: Value = serde_json::from_str(&ws.recv_text().await).expect("JSON");
        match message["method"].as_str() {
            Some("network/policyDecision") => decided |= message["params"]["decision"] == "allow",
            Some("process/output") => {
                let mut chunk = Vec::new();
                wire::decode_into(
                    message["params"]["chunk"].as_str().expect("chunk"),
                    &mut chunk,
                );
                output.extend_from_slice(&chunk);
            }
            Some("process/closed") => break,
            _ => {}
        }
    }
    assert!(decided, "curl did not go through the proxy");
    rate_of(&String::from_utf8_lossy(&output))
}

fn rate_of(report: &str) -> f64 {
    let mut fields = report.split_whitespace();
    let bytes: f64 = fields
        .next()
        .and_then(|f| f.parse().ok())
        .expect("curl's size");
    let seconds: f64 = fields
        .next()
        .and_then(|f| f.parse().ok())
        .expect("curl's time");
    assert_eq!(bytes as usize, BYTES, "curl got the whole body: {report}");
    bytes / seconds
}

//! The variables that point a child at its proxy (§3.2).

/// Variables that always name the HTTP proxy.
pub(crate) const HTTP_PROXY_VARS: [&str; 21] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "WS_PROXY",
    "WSS_PROXY",
    "ws_proxy",
    "wss_proxy",
    "NPM_CONFIG_PROXY",
    "NPM_CONFIG_HTTP_PROXY",
    "NPM_CONFIG_HTTPS_PROXY",
    "npm_config_proxy",
    "npm_config_http_proxy",
    "npm_config_https_proxy",
    "YARN_HTTP_PROXY",
    "YARN_HTTPS_PROXY",
    "BUNDLE_HTTP_PROXY",
    "BUNDLE_HTTPS_PROXY",
    "DOCKER_HTTP_PROXY",
    "DOCKER_HTTPS_PROXY",
    "PIP_PROXY",
];

/// Variables that name the SOCKS5 proxy when there is one, else the HTTP proxy.
pub(crate) const ALL_PROXY_VARS: [&str; 4] = ["ALL_PROXY", "all_proxy", "FTP_PROXY", "ftp_proxy"];

const NO_PROXY_VARS: [&str; 5] = [
    "NO_PROXY",
    "no_proxy",
    "NPM_CONFIG_NOPROXY",
    "npm_config_noproxy",
    "BUNDLE_NO_PROXY",
];

/// What bypasses the proxy when local binding is allowed.
const LOCAL_NO_PROXY: &str = "localhost,127.0.0.1,::1,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16";

/// The child's proxy variables for proxies reachable at `127.0.0.1:<port>` (inside a
/// network namespace these are the bridged ports, which may differ from the proxy's).
pub fn child_env(
    http_port: u16,
    socks_port: Option<u16>,
    allow_local_binding: bool,
) -> Vec<(&'static str, String)> {
    let http = format!("http://127.0.0.1:{http_port}");
    let all = socks_port.map_or_else(
        || http.clone(),
        |port| format!("socks5h://127.0.0.1:{port}"),
    );
    let no_proxy = if allow_local_binding {
        LOCAL_NO_PROXY
    } else {
        ""
    };
    let mut env = Vec::new();
    env.extend(HTTP_PROXY_VARS.iter().map(|name| (*name, http.clone())));
    env.extend(ALL_PROXY_VARS.iter().map(|name| (*name, all.clone())));
    env.extend(
        NO_PROXY_VARS
            .iter()
            .map(|name| (*name, no_proxy.to_string())),
    );
    let local = if allow_local_binding { "1" } else { "0" };
    env.push(("CODEX_NETWORK_ALLOW_LOCAL_BINDING", local.to_string()));
    env.push(("CODEX_NETWORK_PROXY_ACTIVE", "1".to_string()));
    env.push(("ELECTRON_GET_USE_PROXY", "true".to_string()));
    env.push(("NODE_USE_ENV_PROXY", "1".to_string()));
    env
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn variables_follow_the_spec_table() {
        let env: HashMap<_, _> = child_env(3128, Some(8081), false).into_iter().collect();
        assert_eq!(env.len(), 21 + 4 + 5 + 4);
        assert_eq!(env["HTTPS_PROXY"], "http://127.0.0.1:3128");
        assert_eq!(env["PIP_PROXY"], "http://127.0.0.1:3128");
        assert_eq!(env["ALL_PROXY"], "socks5h://127.0.0.1:8081");
        assert_eq!(env["ftp_proxy"], "socks5h://127.0.0.1:8081");
        assert_eq!(env["NO_PROXY"], "");
        assert_eq!(env["CODEX_NETWORK_ALLOW_LOCAL_BINDING"], "0");
        assert_eq!(env["CODEX_NETWORK_PROXY_ACTIVE"], "1");
        assert_eq!(env["ELECTRON_GET_USE_PROXY"], "true");
        assert_eq!(env["NODE_USE_ENV_PROXY"], "1");
    }

    #[test]
    fn without_socks_and_with_local_binding() {
        let env: HashMap<_, _> = child_env(3128, None, true).into_iter().collect();
        assert_eq!(env["all_proxy"], "http://127.0.0.1:3128");
        assert_eq!(env["BUNDLE_NO_PROXY"], LOCAL_NO_PROXY);
        assert_eq!(env["npm_config_noproxy"], LOCAL_NO_PROXY);
        assert_eq!(env["CODEX_NETWORK_ALLOW_LOCAL_BINDING"], "1");
    }
}

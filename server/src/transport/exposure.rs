//! Whether a WebSocket listener may serve without authentication: only on a loopback
//! address, unless the operator said otherwise in so many words
//! (`websocket.dangerously_listen_without_auth`, `--dangerously-listen-without-auth`).
//!
//! A `ws://` listener without a credential runs any command for anyone who reaches it, so
//! `exec-server --listen ws://0.0.0.0:9000` with no auth is refused at start, not served.

use std::net::SocketAddr;

use exec_server_proto::net::is_loopback;

use crate::router::StartupError;

/// The key and the flag that allow an unauthenticated listener off loopback.
pub const ALLOW_KEY: &str = "websocket.dangerously_listen_without_auth";
pub const ALLOW_FLAG: &str = "--dangerously-listen-without-auth";

/// What start-up does with a listener on `addr`.
#[derive(Debug, PartialEq, Eq)]
pub enum Exposure {
    /// Authenticated, or reachable from this machine only.
    Safe,
    /// Unauthenticated off loopback, allowed explicitly: served with a warning.
    AllowedUnsafe,
}

/// Decides for a listener on `addr`; refuses an unauthenticated one off loopback unless
/// `allowed`.
pub fn check(
    addr: SocketAddr,
    authenticated: bool,
    allowed: bool,
) -> Result<Exposure, StartupError> {
    if authenticated || is_loopback(addr.ip()) {
        return Ok(Exposure::Safe);
    }
    if allowed {
        return Ok(Exposure::AllowedUnsafe);
    }
    Err(StartupError(format!(
        "refusing to listen on ws://{addr} without authentication: anyone who can reach \
         that address could run commands as this user. Listen on 127.0.0.1, set a \
         credential (`--ws-auth capability-token --ws-token-file FILE`, or `[websocket]` \
         in the config), or, behind a firewall you trust, pass `{ALLOW_FLAG}` \
         (`{ALLOW_KEY} = true`)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn an_unauthenticated_listener_off_loopback_is_refused_unless_allowed() {
        let open = addr("0.0.0.0:9000");
        let refused = check(open, false, false).unwrap_err().0;
        assert!(refused.contains("ws://0.0.0.0:9000"), "{refused}");
        assert!(refused.contains(ALLOW_FLAG), "{refused}");
        assert_eq!(check(open, false, true).unwrap(), Exposure::AllowedUnsafe);
        assert_eq!(check(open, true, false).unwrap(), Exposure::Safe);
        assert_eq!(
            check(addr("127.0.0.1:0"), false, false).unwrap(),
            Exposure::Safe
        );
        assert!(check(addr("[::]:0"), false, false).is_err());
    }
}

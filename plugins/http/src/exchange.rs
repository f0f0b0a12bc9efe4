//! Sending a request and following its redirects: every hop is checked against the
//! operator's limits before it is sent.

use std::error::Error as _;

use exec_server_core::proto::RpcError;

use crate::redirect::{next_hop, Hop, MAX_REDIRECTS};
use crate::state::HttpState;
use crate::targets::NoAllowedAddress;
use crate::wire;

/// The final answer's head (its body not read yet): after following up to
/// [`MAX_REDIRECTS`] redirects when `follow`, or the first answer.
pub(crate) async fn exchange(
    state: &HttpState,
    mut hop: Hop,
    follow: bool,
) -> Result<reqwest::Response, RpcError> {
    let client = state.client()?;
    let mut redirects = 0;
    loop {
        state.targets.check_url(&hop.url)?;
        let response = send(client, &hop).await?;
        if !follow {
            return Ok(response);
        }
        let Some(next) = next_hop(&hop, response.status(), response.headers())? else {
            return Ok(response);
        };
        if redirects == MAX_REDIRECTS {
            return Err(wire::too_many_redirects());
        }
        redirects += 1;
        hop = next;
    }
}

async fn send(client: &reqwest::Client, hop: &Hop) -> Result<reqwest::Response, RpcError> {
    let mut request = client
        .request(hop.method.clone(), hop.url.clone())
        .headers(hop.headers.clone());
    if let Some(body) = &hop.body {
        request = request.body(body.clone());
    }
    request.send().await.map_err(|e| send_error(&e, hop))
}

/// A failed send: refused by the operator's limits (found in the error's causes), or the
/// codex text that names the URL. The causes are logged, never sent: they may name
/// addresses of the executor's network.
fn send_error(error: &reqwest::Error, hop: &Hop) -> RpcError {
    let mut cause = error.source();
    while let Some(inner) = cause {
        if let Some(refused) = inner.downcast_ref::<NoAllowedAddress>() {
            return wire::target_refused(&refused.to_string());
        }
        cause = inner.source();
    }
    tracing::debug!(error = %format_causes(error), "http/request could not be sent");
    wire::sending_failed(hop.url.as_str())
}

fn format_causes(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    exec_server_relay_core::proto::truncate_for_log(&text)
}

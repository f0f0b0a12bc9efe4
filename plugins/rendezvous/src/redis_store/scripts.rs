//! The Lua scripts of the Redis store, one per registry operation, each run atomically by
//! Redis, and the decoding of their replies. Every script starts with `lua/prelude.lua`
//! (keys, clock, expiry); the store passes the same leading arguments to all of them.
//!
//! A reply is whatever Redis sends back, so the decoders trust none of it: a reply of
//! another shape than its script's is the store failing ([`Connectable::StoreUnavailable`],
//! 503), never a panic.

use axum::http::StatusCode;
use exec_server_relay_core::noise::NoisePublicKey;
use redis::{Script, Value};

use crate::refusal::Refusal;
use crate::store::{
    Connectable, Ended, Epoch, Held, Lost, RegisterRefusal, Removal, UpgradeRefusal,
};

/// Every script, compiled once per process (Redis caches them by SHA-1; a restarted
/// Redis gets them again on the first `NOSCRIPT`).
pub(crate) struct Scripts {
    pub register: Script,
    pub connect: Script,
    pub current: Script,
    pub admit_executor: Script,
    pub admit_harness: Script,
    pub attached: Script,
    pub detached: Script,
    pub sweep: Script,
    pub heartbeat: Script,
}

const PRELUDE: &str = include_str!("lua/prelude.lua");

fn with_prelude(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            register: with_prelude(include_str!("lua/register.lua")),
            connect: with_prelude(include_str!("lua/connect.lua")),
            current: with_prelude(include_str!("lua/current.lua")),
            admit_executor: with_prelude(include_str!("lua/admit_executor.lua")),
            admit_harness: with_prelude(include_str!("lua/admit_harness.lua")),
            attached: with_prelude(include_str!("lua/attached.lua")),
            detached: with_prelude(include_str!("lua/detached.lua")),
            sweep: with_prelude(include_str!("lua/sweep.lua")),
            heartbeat: with_prelude(include_str!("lua/heartbeat.lua")),
        }
    }
}

/// A reply element as text: bulk strings and integers (empty for anything else).
pub(crate) fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

/// The elements of an array reply (none for anything else).
pub(crate) fn items(value: &Value) -> &[Value] {
    match value {
        Value::Array(items) => items,
        _ => &[],
    }
}

/// Element `i` of an array reply as text.
pub(crate) fn field(value: &Value, i: usize) -> String {
    items(value).get(i).map(text).unwrap_or_default()
}

fn removal(why: &str) -> Option<Removal> {
    match why {
        "executor_left" => Some(Removal::ExecutorLeft),
        "attach_timeout" => Some(Removal::AttachTimeout),
        "registration_ttl" => Some(Removal::RegistrationTtl),
        "replaced" => Some(Removal::Replaced),
        _ => None,
    }
}

/// The registrations a script ended: `{environment, epoch, why}` each.
pub(crate) fn ended(value: &Value) -> Vec<Ended> {
    items(value)
        .iter()
        .filter_map(|entry| {
            Some(Ended {
                environment: field(entry, 0),
                epoch: field(entry, 1).parse::<Epoch>().ok()?,
                why: removal(&field(entry, 2))?,
            })
        })
        .collect()
}

/// The `ended` list that closes a script's array reply at position `i`.
pub(crate) fn ended_at(value: &Value, i: usize) -> Vec<Ended> {
    items(value).get(i).map(ended).unwrap_or_default()
}

/// `register.lua`: `{'ok' | 'busy' | 'tenant_full' | 'service_full', registration id,
/// ended}`; the refusals are those of the tenant's and the service's limits. An `ok`
/// without a registration id is no reply of the script.
pub(crate) fn register_reply(
    reply: &Value,
    tenant_refusal: Refusal,
    service_refusal: Refusal,
) -> Result<String, RegisterRefusal> {
    match field(reply, 0).as_str() {
        "ok" => Some(field(reply, 1))
            .filter(|reg| !reg.is_empty())
            .ok_or(RegisterRefusal::StoreUnavailable),
        "busy" => Err(RegisterRefusal::Busy),
        "tenant_full" => Err(RegisterRefusal::Capacity(tenant_refusal)),
        "service_full" => Err(RegisterRefusal::Capacity(service_refusal)),
        _ => Err(RegisterRefusal::StoreUnavailable),
    }
}

/// `connect.lua`: `{'yes' | 'not_found' | 'unavailable', registration id, executor key,
/// owner, ended}`. The owner is handed out only when it is another node than `node`; a
/// `yes` without a registration id or a valid key is no reply of the script.
pub(crate) fn connect_reply(reply: &Value, node: &str) -> Connectable {
    match field(reply, 0).as_str() {
        "yes" => {
            let key = serde_json::from_str(&field(reply, 2))
                .ok()
                .and_then(|value| NoisePublicKey::from_json(&value).ok());
            let reg = field(reply, 1);
            let owner = field(reply, 3);
            match key {
                Some(key) if !reg.is_empty() => Connectable::Yes {
                    reg,
                    key,
                    node: (!owner.is_empty() && owner != node).then_some(owner),
                },
                _ => Connectable::StoreUnavailable,
            }
        }
        "not_found" => Connectable::NotFound,
        "unavailable" => Connectable::Unavailable,
        _ => Connectable::StoreUnavailable,
    }
}

/// `current.lua`: `{registration id or '', ended}`.
pub(crate) fn current_reply(reply: &Value) -> Option<String> {
    let reg = field(reply, 0);
    (!reg.is_empty()).then_some(reg)
}

/// `admit_executor.lua`: `{'ok' | '404' | '410', epoch, ended}`.
pub(crate) fn admit_executor_reply(reply: &Value) -> Result<Epoch, StatusCode> {
    match field(reply, 0).as_str() {
        "ok" => field(reply, 1)
            .parse()
            .map_err(|_| StatusCode::SERVICE_UNAVAILABLE),
        "410" => Err(StatusCode::GONE),
        "404" => Err(StatusCode::NOT_FOUND),
        _ => Err(StatusCode::SERVICE_UNAVAILABLE),
    }
}

/// `admit_harness.lua`: `{'ok', epoch, tenant, ended}`, `{'404' | '410' | '503', …}` or
/// `{'elsewhere', owner, '', ended}`; the epoch and the name of the owner's tenant.
pub(crate) fn admit_harness_reply(reply: &Value) -> Result<(Epoch, String), UpgradeRefusal> {
    let unavailable = UpgradeRefusal::Status(StatusCode::SERVICE_UNAVAILABLE);
    match field(reply, 0).as_str() {
        "ok" => {}
        "elsewhere" => return Err(UpgradeRefusal::Elsewhere(field(reply, 1))),
        "404" => return Err(UpgradeRefusal::Status(StatusCode::NOT_FOUND)),
        "410" => return Err(UpgradeRefusal::Status(StatusCode::GONE)),
        _ => return Err(unavailable),
    }
    let epoch = field(reply, 1).parse().map_err(|_| unavailable)?;
    Ok((epoch, field(reply, 2)))
}

/// `attached.lua`: the epoch, or `''` when the registration is no longer current.
pub(crate) fn attached_reply(reply: &Value) -> Option<Epoch> {
    text(reply).parse().ok()
}

/// `heartbeat.lua`: `{environment, 'moved' | 'ended'}` for environments of `batch` this
/// node no longer holds; entries naming other environments are ignored.
pub(crate) fn heartbeat_reply(reply: &Value, batch: &[Held]) -> Vec<Lost> {
    let mut lost = Vec::new();
    for entry in items(reply) {
        let environment = field(entry, 0);
        let Some(h) = batch.iter().find(|h| h.environment == environment) else {
            continue;
        };
        lost.push(match field(entry, 1).as_str() {
            "moved" => Lost::Moved(environment),
            _ => Lost::Ended(Ended {
                environment,
                epoch: h.epoch,
                why: Removal::Replaced,
            }),
        });
    }
    lost
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn refusal() -> Refusal {
        Refusal::ServiceEnvironments { max: 1 }
    }

    /// Whatever Redis sends back that is not its script's reply is the store failing
    /// (503), never a panic or a made-up answer: a success without a registration id
    /// used to be answered with an empty one.
    #[test]
    fn replies_of_another_shape_are_the_store_failing() {
        let key = r#"{"suite":"Noise_IK_25519_AESGCM_SHA256","x25519_public_key":"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="}"#;
        for reply in [
            Value::Nil,
            Value::Int(3),
            bulk("ok"),
            Value::Array(vec![]),
            Value::Array(vec![Value::Nil, bulk("12")]),
            Value::Array(vec![bulk("ok"), bulk(""), bulk("exec")]),
            Value::Array(vec![bulk("yes"), bulk("reg-1"), bulk("{"), bulk("")]),
            Value::Array(vec![bulk("yes"), bulk(""), bulk(key), bulk("")]),
            Value::Array(vec![bulk("yes"), bulk("reg-1"), bulk(r#"{"suite":5}"#)]),
        ] {
            assert!(
                matches!(
                    connect_reply(&reply, "ws://a"),
                    Connectable::StoreUnavailable
                ),
                "{reply:?}"
            );
            assert!(matches!(
                register_reply(&reply, refusal(), refusal()),
                Err(RegisterRefusal::StoreUnavailable)
            ));
            assert_eq!(
                admit_executor_reply(&reply),
                Err(StatusCode::SERVICE_UNAVAILABLE)
            );
            assert!(matches!(
                admit_harness_reply(&reply),
                Err(UpgradeRefusal::Status(StatusCode::SERVICE_UNAVAILABLE))
            ));
        }
        // An owner is handed out only when it is another node.
        for (owner, handed_out) in [("ws://b", Some("ws://b")), ("ws://a", None), ("", None)] {
            let reply = Value::Array(vec![bulk("yes"), bulk("reg-1"), bulk(key), bulk(owner)]);
            let Connectable::Yes { node, .. } = connect_reply(&reply, "ws://a") else {
                panic!("{owner}: a valid reply");
            };
            assert_eq!(node.as_deref(), handed_out);
        }
    }
}

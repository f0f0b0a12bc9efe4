//! The Lua scripts of the Redis store, one per registry operation, each run atomically by
//! Redis, and the decoding of their replies. Every script starts with `lua/prelude.lua`
//! (keys, clock, expiry); the store passes the same leading arguments to all of them.

use redis::{Script, Value};

use crate::store::{Ended, Epoch, Removal};

/// Every script, compiled once per process (Redis caches them by SHA-1; a restarted
/// Redis gets them again on the first `NOSCRIPT`).
pub(super) struct Scripts {
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
pub(super) fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

/// The elements of an array reply (none for anything else).
pub(super) fn items(value: &Value) -> &[Value] {
    match value {
        Value::Array(items) => items,
        _ => &[],
    }
}

/// Element `i` of an array reply as text.
pub(super) fn field(value: &Value, i: usize) -> String {
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
pub(super) fn ended(value: &Value) -> Vec<Ended> {
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
pub(super) fn ended_at(value: &Value, i: usize) -> Vec<Ended> {
    items(value).get(i).map(ended).unwrap_or_default()
}

//! The plugin API: how a method family registers itself and its handlers.
//!
//! A plugin is a `static` [`Plugin`] record submitted to `inventory`. It declares its
//! methods up front (so a disabled plugin's methods stay known and answer "disabled"), and
//! its `install` function — run only when the plugin is enabled — reads the plugin's config
//! table, builds its state and attaches a handler to every declared method.
//!
//! ```ignore
//! inventory::submit! {
//!     Plugin {
//!         name: "hello",
//!         summary: "says hello",
//!         methods: &[MethodDecl { name: "hello/greet", family: "hello" }],
//!         config: Some(typed_section::<HelloConfig>),
//!         install,
//!     }
//! }
//! ```

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use exec_server_config::{ConfigError, ConfigSource, CoreConfig};
use exec_server_proto::environment::{Capabilities, EnvironmentInfo};
use exec_server_proto::RpcError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::call::Call;

/// One method a plugin answers.
#[derive(Debug, Clone, Copy)]
pub struct MethodDecl {
    /// Wire name, e.g. `process/start`.
    pub name: &'static str,
    /// Family label used in handshake gating errors, e.g. `exec` (PROTOCOL §2.10).
    pub family: &'static str,
}

/// Decodes a plugin's config table (named by the `&str`) into its effective value.
pub type ConfigSectionFn = fn(&ConfigSource, &str) -> Result<Value, ConfigError>;

/// A method family, registered with `inventory::submit!`.
#[derive(Debug)]
pub struct Plugin {
    /// The plugin's name: its `[plugins.<name>]` switch and its own config table `[<name>]`.
    pub name: &'static str,
    /// One line for `exec-server methods`.
    pub summary: &'static str,
    /// Every method the plugin answers.
    pub methods: &'static [MethodDecl],
    /// Decodes the plugin's config table into its effective value (defaults filled in), or
    /// `None` if the plugin has no table. Run at start-up whether or not the plugin is
    /// enabled, so a misspelt key is always an error; see [`typed_section`].
    pub config: Option<ConfigSectionFn>,
    /// Builds the plugin's state and registers its handlers. Runs only when enabled.
    pub install: fn(&mut Install<'_>) -> Result<(), InstallError>,
}

inventory::collect!(Plugin);

/// Every plugin linked into this binary, sorted by name.
pub fn plugins() -> Vec<&'static Plugin> {
    let mut all: Vec<&'static Plugin> = inventory::iter::<Plugin>.into_iter().collect();
    all.sort_by_key(|p| p.name);
    all
}

/// The `config` function of a plugin whose table decodes into `T` (use
/// `#[serde(default, deny_unknown_fields)]` on `T` to refuse misspelt keys).
pub fn typed_section<T: DeserializeOwned + Serialize>(
    source: &ConfigSource,
    table: &str,
) -> Result<Value, ConfigError> {
    let typed: T = source.section(table)?;
    Ok(serde_json::to_value(typed).expect("a config section always serializes"))
}

/// A plugin config table whose values need checks beyond what serde expresses (limits that
/// must not be zero, values that must agree with each other).
pub trait CheckedSection: DeserializeOwned + Serialize {
    /// Refuses unusable values, with errors built by [`ConfigSource::invalid`] or
    /// [`ConfigSource::require_positive`] so they name the key and where it was set.
    fn check(&self, source: &ConfigSource, table: &str) -> Result<(), ConfigError>;
}

/// Decodes a table as `T` and runs its checks.
pub fn load_checked<T: CheckedSection>(
    source: &ConfigSource,
    table: &str,
) -> Result<T, ConfigError> {
    let typed: T = source.section(table)?;
    typed.check(source, table)?;
    Ok(typed)
}

/// The `config` function of a plugin whose table decodes into a [`CheckedSection`].
pub fn checked_section<T: CheckedSection>(
    source: &ConfigSource,
    table: &str,
) -> Result<Value, ConfigError> {
    let typed: T = load_checked(source, table)?;
    Ok(serde_json::to_value(typed).expect("a config section always serializes"))
}

/// A plugin could not be installed; the server does not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InstallError(pub String);

impl From<ConfigError> for InstallError {
    fn from(e: ConfigError) -> Self {
        Self(e.0)
    }
}

/// A type-erased method handler. Most plugins use the typed adapters on [`Install`]
/// instead of implementing this directly.
#[async_trait]
pub trait Method: Send + Sync + 'static {
    /// Answers one request; the result is already serialized.
    async fn call(&self, cx: Call, params: Value) -> Result<Box<RawValue>, RpcError>;
}

/// Builds the `environment/info` object from the server's capability flags; `initialize`
/// carries the same object as `environmentInfo` (CODEX-0169 §2.2).
pub type EnvironmentInfoFn = fn(&Capabilities) -> EnvironmentInfo;

/// A capability flag a plugin provides, and the methods it needs: the flag is reported
/// `true` only while every one of them is enabled.
#[derive(Debug, Clone)]
pub(crate) struct CapabilityDecl {
    pub(crate) flag: &'static str,
    pub(crate) requires: Vec<&'static str>,
}

/// An extension of ours whose notifications reference clients do not know: they are sent
/// only to connections that named `name` in `initialize.params.extensions`.
#[derive(Debug, Clone)]
pub(crate) struct ExtensionDecl {
    pub(crate) name: &'static str,
    pub(crate) notifications: &'static [&'static str],
}

/// What `install` gets: the configuration and the place to register handlers.
pub struct Install<'a> {
    pub(crate) plugin: &'static Plugin,
    pub(crate) source: &'a ConfigSource,
    pub(crate) core: &'a CoreConfig,
    pub(crate) handlers: Vec<(&'static str, Arc<dyn Method>)>,
    pub(crate) capabilities: Vec<CapabilityDecl>,
    pub(crate) extensions: Vec<ExtensionDecl>,
    pub(crate) environment_info: Option<(&'static str, EnvironmentInfoFn)>,
    pub(crate) errors: Vec<String>,
    /// What each method's audit events record ([`Install::audit_method`]).
    pub(crate) audits: Vec<(&'static str, crate::audit::MethodAudit)>,
    /// Services several plugins of this server use together (one of each type).
    pub(crate) shared: &'a crate::extensions::Extensions,
}

impl<'a> Install<'a> {
    /// The plugin being installed.
    pub fn plugin(&self) -> &'static Plugin {
        self.plugin
    }

    /// The plugin's own config table `[<plugin name>]`, decoded as `T`.
    pub fn config<T: DeserializeOwned>(&self) -> Result<T, InstallError> {
        Ok(self.source.section(self.plugin.name)?)
    }

    /// The plugin's own config table decoded as `T`, with `T`'s checks applied.
    pub fn checked_config<T: CheckedSection>(&self) -> Result<T, InstallError> {
        Ok(load_checked(self.source, self.plugin.name)?)
    }

    /// The layered configuration, for plugins that read other tables.
    pub fn config_source(&self) -> &'a ConfigSource {
        self.source
    }

    /// The one value of type `T` this server's plugins share, created by the first plugin
    /// that asks (with `init`). For services whose limits are server-wide — the sandbox
    /// runtime and its fs helper slots, say — so that every plugin draws from one pool.
    pub fn shared<T: std::any::Any + Send + Sync>(
        &self,
        init: impl FnOnce() -> Result<T, InstallError>,
    ) -> Result<Arc<T>, InstallError> {
        self.shared.get_or_try_insert_with(init)
    }

    /// The core configuration (limits, session TTL, …).
    pub fn core_config(&self) -> &'a CoreConfig {
        self.core
    }

    /// Registers a type-erased handler for a declared method.
    pub fn method_raw(&mut self, name: &'static str, handler: Arc<dyn Method>) {
        if !self.plugin.methods.iter().any(|m| m.name == name) {
            self.errors.push(format!(
                "plugin `{}` registers `{name}`, which it does not declare",
                self.plugin.name
            ));
        }
        if self.handlers.iter().any(|(n, _)| *n == name) {
            self.errors.push(format!(
                "plugin `{}` registers `{name}` twice",
                self.plugin.name
            ));
        }
        self.handlers.push((name, handler));
    }

    /// Declares that this plugin provides the capability flag `flag` (a name of
    /// `exec_server_proto::environment::capability`) through `requires`, methods it
    /// declares. The flag is reported `true` only while the plugin is installed and every
    /// method in `requires` is enabled, so an operator switch turns it off with them.
    pub fn capability(&mut self, flag: &'static str, requires: &[&'static str]) {
        if !Capabilities::is_known(flag) {
            self.errors.push(format!(
                "plugin `{}` provides the unknown capability flag `{flag}`",
                self.plugin.name
            ));
        }
        for method in requires {
            if !self.plugin.methods.iter().any(|m| m.name == *method) {
                self.errors.push(format!(
                    "plugin `{}` ties capability `{flag}` to `{method}`, which it does not declare",
                    self.plugin.name
                ));
            }
        }
        self.capabilities.push(CapabilityDecl {
            flag,
            requires: requires.to_vec(),
        });
    }

    /// Declares an extension: notifications reference clients do not know, which the core
    /// sends only to connections that opted in to `name` at `initialize`
    /// (`"extensions": ["<name>"]`). [`crate::Session::notify`] drops them silently for
    /// every other connection; a method that starts such a stream should check
    /// [`crate::Call::client_accepts`] first and refuse.
    pub fn extension(&mut self, name: &'static str, notifications: &'static [&'static str]) {
        self.extensions.push(ExtensionDecl {
            name,
            notifications,
        });
    }

    /// Declares that `method` (one of this plugin's) answers the `environment/info` object
    /// built by `describe`; `initialize` then carries the same object as
    /// `environmentInfo` while `method` is enabled.
    pub fn environment_info(&mut self, method: &'static str, describe: EnvironmentInfoFn) {
        if !self.plugin.methods.iter().any(|m| m.name == method) {
            self.errors.push(format!(
                "plugin `{}` describes the environment through `{method}`, which it does not declare",
                self.plugin.name
            ));
        }
        self.environment_info = Some((method, describe));
    }

    /// Declares what the audit trail records of `method` (one of this plugin's): whether
    /// it changes the machine and how its request is described. A method not declared
    /// counts as changing, and its events name only its params' members.
    pub fn audit_method(&mut self, method: &'static str, audit: crate::audit::MethodAudit) {
        if !self.plugin.methods.iter().any(|m| m.name == method) {
            self.errors.push(format!(
                "plugin `{}` declares the audit of `{method}`, which it does not declare",
                self.plugin.name
            ));
        }
        self.audits.push((method, audit));
    }

    /// Registers a typed handler: params decode from JSON as `P` (-32602 with the decoder's
    /// text on failure) and the result is serialized from `R`.
    pub fn method<P, R, F, Fut>(&mut self, name: &'static str, handler: F)
    where
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        F: Fn(Call, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, RpcError>> + Send + 'static,
    {
        self.method_raw(
            name,
            Arc::new(TypedMethod {
                handler,
                _types: std::marker::PhantomData,
            }),
        );
    }

    /// Like [`Install::method`] for handlers written as `async fn(Arc<S>, Call, P)` on a
    /// plugin's shared state.
    pub fn method_with<S, P, R, F, Fut>(&mut self, name: &'static str, state: &Arc<S>, handler: F)
    where
        S: Send + Sync + 'static,
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        F: Fn(Arc<S>, Call, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, RpcError>> + Send + 'static,
    {
        let state = Arc::clone(state);
        self.method(name, move |cx, params| {
            handler(Arc::clone(&state), cx, params)
        });
    }
}

struct TypedMethod<F, P, R> {
    handler: F,
    _types: std::marker::PhantomData<fn(P) -> R>,
}

#[async_trait]
impl<P, R, F, Fut> Method for TypedMethod<F, P, R>
where
    P: DeserializeOwned + Send + 'static,
    R: Serialize + Send + 'static,
    F: Fn(Call, P) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, RpcError>> + Send + 'static,
{
    async fn call(&self, cx: Call, params: Value) -> Result<Box<RawValue>, RpcError> {
        let params = decode_params::<P>(params)?;
        let result = (self.handler)(cx, params).await?;
        encode_owned_result(result)
    }
}

/// Like [`encode_result`], but a handler that already made its answer's JSON (a
/// `Box<RawValue>`, e.g. a whole file as base64) hands it on as it is: re-serializing it
/// would copy every byte once more.
fn encode_owned_result<R: Serialize + 'static>(result: R) -> Result<Box<RawValue>, RpcError> {
    let mut slot = Some(result);
    let any: &mut dyn std::any::Any = &mut slot;
    if let Some(raw) = any.downcast_mut::<Option<Box<RawValue>>>() {
        return Ok(raw.take().expect("the slot was filled above"));
    }
    encode_result(slot.as_ref().expect("only a raw value is taken out"))
}

/// Decodes `params` as `P`; failures are -32602 with the decoder's text (PROTOCOL §2.3).
pub fn decode_params<P: DeserializeOwned>(params: Value) -> Result<P, RpcError> {
    if matches!(params, Value::Array(_)) {
        return Err(RpcError::invalid_params("params must be an object"));
    }
    serde_json::from_value(params).map_err(|e| RpcError::invalid_params(e.to_string()))
}

/// Serializes a result once, into the raw JSON the response frame embeds.
pub fn encode_result<R: Serialize>(result: &R) -> Result<Box<RawValue>, RpcError> {
    serde_json::value::to_raw_value(result)
        .map_err(|e| RpcError::internal(format!("failed to encode result: {e}")))
}

/// Params of methods that take none: a missing `params`, `null`, or any object
/// (PROTOCOL §2.3).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoParams;

impl<'de> serde::Deserialize<'de> for NoParams {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Null | Value::Object(_) => Ok(NoParams),
            _ => Err(serde::de::Error::custom(
                "params must be null or an object for a method without parameters",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_answer_is_handed_on_and_any_other_is_serialized() {
        let raw = RawValue::from_string(r#"{"dataBase64":"aGk="}"#.to_owned()).unwrap();
        let address = raw.get().as_ptr();
        let passed = encode_owned_result(raw).unwrap();
        // The same buffer, not a copy of it.
        assert_eq!(passed.get().as_ptr(), address);
        assert_eq!(passed.get(), r#"{"dataBase64":"aGk="}"#);
        let encoded = encode_owned_result(serde_json::json!({"a": [1, 2]})).unwrap();
        assert_eq!(encoded.get(), r#"{"a":[1,2]}"#);
    }
}

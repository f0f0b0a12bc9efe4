//! `hello/*`: the smallest useful exec-server plugin, written the way a team outside the
//! project would write one — only against the public plugin API.
//!
//! It has one method with typed params (`hello/greet`), per-session state (how many
//! greetings this session got), one extension notification sent after the response
//! (`hello/greeted`, only to clients that opted in to the `hello` extension), and one
//! checked config key (`[hello] greeting`). `echo` beside it is the smallest complete
//! plugin. `docs/PLUGINS.md` walks through both; every snippet there is an excerpt of this
//! crate.

mod echo;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use exec_server_core::config::{ConfigError, ConfigSource};
use exec_server_core::proto::RpcError;
use exec_server_core::{
    checked_section, inventory, Call, CheckedSection, Install, InstallError, MethodDecl, Plugin,
    SessionState,
};
use serde::{Deserialize, Serialize};

/// The method this plugin answers.
pub const GREET: &str = "hello/greet";
/// The notification sent after each greeting.
pub const GREETED: &str = "hello/greeted";
/// The extension a client names in `initialize` to receive `hello/greeted`.
pub const EXTENSION: &str = "hello";

inventory::submit! {
    Plugin {
        name: "hello",                       // [plugins.hello] switch and [hello] config table
        summary: "greets people (an example plugin)", // shown by `exec-server methods`
        methods: &[MethodDecl { name: GREET, family: "hello" }],
        config: Some(checked_section::<HelloConfig>),
        install,
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HelloConfig {
    pub greeting: String,
}

impl Default for HelloConfig {
    fn default() -> Self {
        Self { greeting: "Hello".into() }
    }
}

impl CheckedSection for HelloConfig {
    fn check(&self, source: &ConfigSource, table: &str) -> Result<(), ConfigError> {
        if self.greeting.trim().is_empty() {
            return Err(source.invalid(&format!("{table}.greeting"), "must not be empty"));
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")] // wire names are camelCase; never deny_unknown_fields
struct GreetParams {
    name: String,
    #[serde(default)]
    shout: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GreetResult {
    greeting: String,
    count: u64, // greetings this session has had, this one included
}

#[derive(Default)]
struct Greetings(AtomicU64);

impl SessionState for Greetings {
    // `session_ended` has a default that does nothing. Override it to release what the
    // session owns: the process plugin kills its process groups there.
}

struct Hello {
    greeting: String,
}

fn install(install: &mut Install<'_>) -> Result<(), InstallError> {
    let config: HelloConfig = install.checked_config()?;
    let hello = Arc::new(Hello { greeting: config.greeting });
    install.method_with(GREET, &hello, Hello::greet);
    install.extension(EXTENSION, &[GREETED]);
    Ok(())
}

impl Hello {
    async fn greet(self: Arc<Self>, cx: Call, p: GreetParams) -> Result<GreetResult, RpcError> {
        if p.name.is_empty() {
            return Err(RpcError::invalid_params("name must not be empty"));
        }
        let count = cx.session().state(Greetings::default).0.fetch_add(1, Ordering::Relaxed) + 1;
        let mut greeting = format!("{}, {}!", self.greeting, p.name);
        if p.shout {
            greeting = greeting.to_uppercase();
        }
        // The notification must follow the response: wait until it is queued.
        let session = Arc::clone(cx.session());
        let queued = cx.response_queued();
        tokio::spawn(async move {
            queued.wait().await;
            session.notify(GREETED, &serde_json::json!({ "count": count })).await;
        });
        Ok(GreetResult { greeting, count })
    }
}

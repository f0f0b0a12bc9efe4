//! `hello/*`: the smallest useful exec-server plugin, written the way a team outside the
//! project would write one — only against the public plugin API.
//!
//! It has one method with typed params (`hello/greet`), per-session state (how many
//! greetings this session got), one notification sent after the response
//! (`hello/greeted`), and one config key (`[hello] greeting`). `docs/PLUGINS.md` walks
//! through it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use exec_server_core::proto::RpcError;
use exec_server_core::{
    inventory, typed_section, Call, Install, InstallError, MethodDecl, Plugin, SessionState,
};
use serde::{Deserialize, Serialize};

/// The method this plugin answers.
pub const GREET: &str = "hello/greet";
/// The notification sent after each greeting.
pub const GREETED: &str = "hello/greeted";

inventory::submit! {
    Plugin {
        name: "hello",
        summary: "greets people (an example plugin)",
        methods: &[MethodDecl { name: GREET, family: "hello" }],
        config: Some(typed_section::<HelloConfig>),
        install,
    }
}

/// The `[hello]` config table.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HelloConfig {
    /// The word to greet with.
    pub greeting: String,
}

impl Default for HelloConfig {
    fn default() -> Self {
        Self {
            greeting: "Hello".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GreetParams {
    name: String,
    #[serde(default)]
    shout: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct GreetResult {
    greeting: String,
    /// Greetings this session has had, this one included.
    count: u64,
}

#[derive(Debug, Serialize)]
struct Greeted {
    count: u64,
}

/// Per-session state: survives reconnects, ends with the session.
#[derive(Default)]
struct Greetings(AtomicU64);

impl SessionState for Greetings {}

struct Hello {
    greeting: String,
}

fn install(install: &mut Install<'_>) -> Result<(), InstallError> {
    let config: HelloConfig = install.config()?;
    if config.greeting.trim().is_empty() {
        return Err(install
            .config_source()
            .invalid("hello.greeting", "must not be empty")
            .into());
    }
    let hello = Arc::new(Hello {
        greeting: config.greeting,
    });
    install.method_with(GREET, &hello, Hello::greet);
    Ok(())
}

impl Hello {
    async fn greet(self: Arc<Self>, cx: Call, p: GreetParams) -> Result<GreetResult, RpcError> {
        if p.name.is_empty() {
            return Err(RpcError::invalid_params("name must not be empty"));
        }
        let count = cx
            .session()
            .state(Greetings::default)
            .0
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        let mut greeting = format!("{}, {}!", self.greeting, p.name);
        if p.shout {
            greeting = greeting.to_uppercase();
        }
        // The notification must follow the response: wait until it is queued.
        let session = Arc::clone(cx.session());
        let queued = cx.response_queued();
        tokio::spawn(async move {
            queued.wait().await;
            session.notify(GREETED, &Greeted { count }).await;
        });
        Ok(GreetResult { greeting, count })
    }
}

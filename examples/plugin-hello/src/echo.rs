//! The whole of a plugin, nothing left out: one method that answers with what it was sent.

use std::sync::Arc;

use exec_server_core::proto::RpcError;
use exec_server_core::{inventory, Call, Install, InstallError, MethodDecl, Plugin};
use serde::{Deserialize, Serialize};

inventory::submit! {
    Plugin {
        name: "echo",
        summary: "answers with what it was sent (the smallest plugin)",
        methods: &[MethodDecl { name: "echo/say", family: "echo" }],
        config: None,
        install,
    }
}

#[derive(Deserialize, Serialize)]
struct Say {
    text: String,
}

fn install(install: &mut Install<'_>) -> Result<(), InstallError> {
    install.method_with("echo/say", &Arc::new(()), say);
    Ok(())
}

async fn say(_: Arc<()>, _cx: Call, p: Say) -> Result<Say, RpcError> {
    Ok(p)
}

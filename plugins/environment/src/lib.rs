//! The `environment/*` plugin (PROTOCOL §6, CODEX-0169 §2.2, §2.5): `environment/info`
//! describes the host as the server sees it (and `initialize` carries the same object),
//! `environment/status` is a cheap liveness probe.
//!
//! It is written only against the public plugin API, like any third-party family.
//!
//! * `host` — the `environment/info` object: shell, home, temporary directories, build
//!   identity.

mod host;

use exec_server_core::proto::environment::EnvironmentStatus;
use exec_server_core::proto::RpcError;
use exec_server_core::{Call, Install, InstallError, MethodDecl, NoParams, Plugin};

pub use host::host_info;

pub const INFO: &str = "environment/info";
pub const STATUS: &str = "environment/status";

exec_server_core::inventory::submit! {
    Plugin {
        name: "environment",
        summary: "host information (environment/info) and a liveness probe (environment/status)",
        methods: &[
            MethodDecl { name: INFO, family: "environment info" },
            MethodDecl { name: STATUS, family: "environment status" },
        ],
        config: None,
        install,
    }
}

fn install(install: &mut Install<'_>) -> Result<(), InstallError> {
    install.environment_info(INFO, host_info);
    install.method(INFO, |cx: Call, _: NoParams| async move {
        Ok::<_, RpcError>(host_info(cx.capabilities()))
    });
    install.method(STATUS, |_: Call, _: NoParams| async {
        Ok::<_, RpcError>(EnvironmentStatus {
            status: "ready".into(),
        })
    });
    Ok(())
}

//! The `environment/*` plugin (PROTOCOL §6, CODEX-0169 §2.2, §2.5): `environment/info`
//! describes the host as the server sees it (and `initialize` carries the same object),
//! `environment/status` is a cheap liveness probe, and `environmentConfig/read` returns
//! selected keys of the host's own codex configuration layers.
//!
//! It is written only against the public plugin API, like any third-party family.
//!
//! * `host` — the `environment/info` object: shell, home, temporary directories, build
//!   identity.
//! * `config` — the `[environment]` table.
//! * `config_read` — `environmentConfig/read`.

mod config;
pub mod config_read;
mod host;

use std::sync::Arc;

use exec_server_core::proto::environment::{capability, EnvironmentStatus};
use exec_server_core::proto::RpcError;
use exec_server_core::{
    checked_section, Call, Install, InstallError, MethodDecl, NoParams, Plugin,
};

pub use config::EnvironmentConfig;
pub use host::host_info;

pub const INFO: &str = "environment/info";
pub const STATUS: &str = "environment/status";
pub use config_read::METHOD as CONFIG_READ;

exec_server_core::inventory::submit! {
    Plugin {
        name: "environment",
        summary: "host information (environment/info) and a liveness probe (environment/status)",
        methods: &[
            MethodDecl { name: INFO, family: "environment info" },
            MethodDecl { name: STATUS, family: "environment status" },
            MethodDecl { name: CONFIG_READ, family: "environment config" },
        ],
        config: Some(checked_section::<EnvironmentConfig>),
        install,
    }
}

fn install(install: &mut Install<'_>) -> Result<(), InstallError> {
    let config: EnvironmentConfig = install.checked_config()?;
    let settings = Arc::new(config_read::Reads::new(config_read::ReadSettings {
        system_dir: config.codex_system_dir,
        max_file_bytes: config.config_max_file_bytes,
        max_total_bytes: config.config_max_total_bytes,
    }));
    install.capability(capability::ENVIRONMENT_CONFIG_READ, &[CONFIG_READ]);
    install.method_with(CONFIG_READ, &settings, config_read::handle);
    install.environment_info(INFO, host_info);
    install.method(INFO, |cx: Call, _: NoParams| async move {
        Ok::<_, RpcError>(host_info(cx.capabilities()))
    });
    install.method(STATUS, |_: Call, _: NoParams| async {
        Ok::<_, RpcError>(EnvironmentStatus {
            status: "ready".into(),
        })
    });
    install.audit_method(INFO, exec_server_core::audit::MethodAudit::READ_ONLY);
    install.audit_method(STATUS, exec_server_core::audit::MethodAudit::READ_ONLY);
    install.audit_method(CONFIG_READ, exec_server_core::audit::MethodAudit::READ_ONLY);
    Ok(())
}

//! The capability discovery plugin (CODEX-0169 §2.6, §2.7): which codex plugins and skills
//! exist on this host, so a harness can load them without reading whole trees itself.
//!
//! * `wire` — params, results, and the texts of warnings and errors.
//! * `config` — the `[capabilities]` table: sizes and traversal limits.
//! * `source` — reading directly, or through the fs helper under a request's sandbox.
//! * `scan` — what one scanned tree holds: plugin files, skills, manifests.
//! * `frontmatter` — the YAML front matter of `SKILL.md`.
//! * `roots` — `capabilityRoots/discoverV1`.
//! * `installed` — `capabilities/discoverV2`.

mod config;
mod frontmatter;
mod installed;
mod roots;
mod scan;
mod source;
mod wire;

use std::sync::Arc;

use exec_server_core::proto::environment::capability;
use exec_server_core::{
    checked_section, Install, InstallError, MethodDecl, Plugin, SlottedThreads,
};
use exec_server_sandbox::SandboxRuntime;

pub use config::CapabilitiesConfig;
pub use wire::{DISCOVER_V1, DISCOVER_V2, FAMILY_LABEL};

exec_server_core::inventory::submit! {
    Plugin {
        name: "capabilities",
        summary: "codex plugin and skill discovery (capabilityRoots/discoverV1, capabilities/discoverV2)",
        methods: &[
            MethodDecl { name: DISCOVER_V1, family: FAMILY_LABEL },
            MethodDecl { name: DISCOVER_V2, family: FAMILY_LABEL },
        ],
        config: Some(checked_section::<CapabilitiesConfig>),
        install,
    }
}

/// The plugin's state: its limits, the threads unsandboxed discoveries read on, and the
/// sandbox that confines sandboxed ones.
pub(crate) struct Discovery {
    pub(crate) config: CapabilitiesConfig,
    pub(crate) threads: SlottedThreads,
    pub(crate) sandbox: std::sync::Arc<SandboxRuntime>,
}

/// Unsandboxed discovery reads of all sessions at once, and of one session: a client that
/// asks for many trees waits for its own share, and holds no more threads.
const THREADS_TOTAL: usize = 4;
const THREADS_PER_SESSION: usize = 1;

fn install(install: &mut Install<'_>) -> Result<(), InstallError> {
    let discovery = Arc::new(Discovery {
        config: install.checked_config()?,
        threads: SlottedThreads::new("capabilities", THREADS_TOTAL, THREADS_PER_SESSION),
        sandbox: SandboxRuntime::shared(install)?,
    });
    // V1 applies each root's `sandbox` (through the fs helper, or refusing the root).
    install.capability(capability::CAPABILITY_DISCOVERY_SANDBOX, &[DISCOVER_V1]);
    install.capability(capability::CAPABILITY_DISCOVERY_V2, &[DISCOVER_V2]);
    install.method_with(DISCOVER_V1, &discovery, roots::handle);
    install.method_with(DISCOVER_V2, &discovery, installed::handle);
    install.audit_method(DISCOVER_V1, exec_server_core::audit::MethodAudit::READ_ONLY);
    install.audit_method(DISCOVER_V2, exec_server_core::audit::MethodAudit::READ_ONLY);
    Ok(())
}

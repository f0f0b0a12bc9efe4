//! The `process/*` plugin (PROTOCOL §4): managed processes on pipes or pseudo-terminals,
//! owned by the session that started them, with retained output, long-poll reads, ordered
//! deduplicated writes, signals, resizing and termination.
//!
//! * [`config`] — the `[process]` table.
//! * `start`, `read`, `write` (and `closeStdin`), `signal`, `resize`, `terminate` — one
//!   module per method.
//! * `admission` — fair share before a request goes ahead: the session's process and
//!   pending-write quotas, the descriptors a process holds.
//! * `table` — the per-session process table: reservation, lookup, kill on session end.
//! * `managed` — one process as the methods see it: events, stdin writer, group, terminal.
//! * `retention` — the `seq` counter, retained chunks and the read snapshot algorithm.
//! * `output_budget` — retained output of all processes: the per-session cap and the
//!   server's budget, evicting the oldest output of the largest holder.
//! * `pump` — the per-process task that collects output and exit and sends notifications.
//! * `spawn` — the spawner threads that create a keeper per process with `clone(CLONE_VM)`.
//! * `spawn_queue` — the spawner's queue, where sessions take turns.
//! * `keeper` — the keeper: creates the target, reports its exit, kills its whole tree.
//! * `keepers` — the session's live keepers: killed with the session, reaped when they exit.
//! * `strays` — orphans of a keeper its own tree killed: adopted by the server and ended.
//! * `raw` — raw system calls for code that runs in the server's memory outside its threads.
//! * `environment` — the child's environment (`env`, `envPolicy`, scrub) and program lookup.
//! * `terminal` — pseudo-terminal pairs.
//! * `sys` — thin wrappers over the system calls used on the server side.

mod admission;
mod audit;
pub mod config;
mod environment;
mod keeper;
mod keepers;
mod managed;
mod network;
mod output_budget;
mod pump;
mod raw;
mod read;
mod resize;
mod retention;
mod signal;
mod spawn;
mod spawn_queue;
mod start;
mod strays;
mod sys;
mod table;
mod terminal;
mod terminate;
mod write;

use std::sync::Arc;

use exec_server_core::proto::environment::capability;
use exec_server_core::proto::process::{
    CLOSE_STDIN, FAMILY_LABEL, READ, RESIZE, SIGNAL, START, TERMINATE, WRITE,
};
use exec_server_core::{checked_section, Call, Install, InstallError, MethodDecl, Plugin};
use serde::Deserialize;

pub use config::ProcessConfig;
pub use read::WireBytes;

exec_server_core::inventory::submit! {
    Plugin {
        name: "process",
        summary: "managed processes: start, read, write, closeStdin, signal, resize, terminate",
        methods: &[
            MethodDecl { name: START, family: FAMILY_LABEL },
            MethodDecl { name: READ, family: FAMILY_LABEL },
            MethodDecl { name: WRITE, family: FAMILY_LABEL },
            MethodDecl { name: SIGNAL, family: FAMILY_LABEL },
            MethodDecl { name: RESIZE, family: FAMILY_LABEL },
            MethodDecl { name: TERMINATE, family: FAMILY_LABEL },
            MethodDecl { name: CLOSE_STDIN, family: FAMILY_LABEL },
        ],
        config: Some(checked_section::<ProcessConfig>),
        install,
    }
}

/// State shared by every handler of the plugin.
pub(crate) struct ProcessPlugin {
    config: ProcessConfig,
    /// The retained output of every session's processes together.
    output_budget: Arc<output_budget::OutputBudget>,
    /// Where sandboxed starts go: the launcher and its settings.
    sandbox: Arc<exec_server_sandbox::SandboxRuntime>,
    /// The variable named by `relay.token_env`, never inherited through `envPolicy`.
    relay_token_env: Option<String>,
}

/// The one `relay` key this plugin reads; the relay transport owns the table.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RelayTokenEnv {
    token_env: Option<String>,
}

fn install(install: &mut Install<'_>) -> Result<(), InstallError> {
    let config: ProcessConfig = install.checked_config()?;
    let relay_token_env = install
        .config_source()
        .section::<RelayTokenEnv>("relay")
        .ok()
        .and_then(|relay| relay.token_env);
    let sandbox = exec_server_sandbox::SandboxRuntime::shared(install)?;
    let plugin = Arc::new(ProcessPlugin {
        output_budget: output_budget::OutputBudget::new(
            config.max_retained_output_bytes_per_session,
            config.retained_output_budget_bytes,
        ),
        config,
        sandbox,
        relay_token_env,
    });
    install.method_with(START, &plugin, start::start);
    install.method_with(READ, &plugin, read::read);
    install.method_with(WRITE, &plugin, write::write);
    install.method_with(SIGNAL, &plugin, signal::signal);
    install.method_with(RESIZE, &plugin, resize::resize);
    install.method_with(TERMINATE, &plugin, terminate::terminate);
    install.method_with(CLOSE_STDIN, &plugin, write::close_stdin);
    audit::declare(install);
    // `networkProxy` with `enforceManagedNetwork` (the child confined to its proxy in a
    // network namespace of its own), and `network/policyRequest` for allowlist misses.
    install.capability(capability::NETWORK_PROXY_LAUNCH, &[START]);
    install.capability(capability::NETWORK_PROXY_REVIEW_DOMAINS, &[START]);
    Ok(())
}

/// The calling session's process table.
fn table(plugin: &ProcessPlugin, cx: &Call) -> Arc<table::ProcessTable> {
    cx.session().state(|| {
        let budget = output_budget::SessionBudget::new(&plugin.output_budget);
        table::ProcessTable::new(Some(budget))
    })
}

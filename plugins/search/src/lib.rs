//! The `search/*` plugin: text search over a directory tree, with results streamed as
//! notifications. Built on ripgrep's library crates — `ignore` walks (honouring
//! `.gitignore` and include/exclude globs), `grep-searcher` reads and `grep-regex` matches —
//! and written only against the public plugin API.
//!
//! * `wire` — method names, params, results, notifications and their error constructors.
//! * `config` — the `[search]` table: result, concurrency, line and file-size limits.
//! * `state` — the plugin's state: its limits and the threads searches share.
//! * `start` — `search/start`: validation, the sandbox decision, and the forwarding task
//!   that turns matches into notifications with back-pressure.
//! * `cancel` — `search/cancel`.
//! * `table` — the searches of one session, by `searchId`.
//! * `engine` — the walk and the search, on a blocking thread.
//! * `line` — a matched line as sent: decoded, cut, offsets mapped.

mod cancel;
mod config;
mod engine;
mod line;
mod start;
mod state;
mod table;
mod wire;

use std::sync::Arc;

/// The engine for the `search` fuzz target (`fuzz/`): matcher and override compilation and
/// the search itself, with the trait and token types they need.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::engine::{build_matcher, build_overrides, FoundMatch, SearchEnd, SearchJob};
    pub use grep_matcher::Matcher;
    pub use tokio_util::sync::CancellationToken;
}

use exec_server_core::{checked_section, Install, InstallError, MethodDecl, Plugin};

use crate::state::SearchState;

pub use config::SearchConfig;
pub use wire::{CANCEL, DONE, EXTENSION, FAMILY_LABEL, MATCH, START};

exec_server_core::inventory::submit! {
    Plugin {
        name: "search",
        summary: "text search over a tree, streamed as notifications (search/start, search/cancel)",
        methods: &[
            MethodDecl { name: START, family: FAMILY_LABEL },
            MethodDecl { name: CANCEL, family: FAMILY_LABEL },
        ],
        config: Some(checked_section::<SearchConfig>),
        install,
    }
}

fn install(install: &mut Install<'_>) -> Result<(), InstallError> {
    let state = Arc::new(SearchState::new(install.checked_config()?));
    install.extension(EXTENSION, &[MATCH, DONE]);
    install.method_with(START, &state, start::handle);
    install.method(CANCEL, cancel::handle);
    install.audit_method(START, exec_server_core::audit::MethodAudit::READ_ONLY);
    install.audit_method(CANCEL, exec_server_core::audit::MethodAudit::READ_ONLY);
    Ok(())
}

//! The plugin's state: its `[search]` limits, and the search threads all sessions share —
//! each running search holds a blocking thread, so at most `search.max_searches_total` run
//! at once, taking turns by session (`FairSlots`, pool `search`).

use std::ops::Deref;

use exec_server_core::FairSlots;

use crate::config::SearchConfig;

#[derive(Debug)]
pub(crate) struct SearchState {
    pub(crate) config: SearchConfig,
    /// One slot per running search thread.
    pub(crate) threads: FairSlots,
}

impl SearchState {
    pub(crate) fn new(config: SearchConfig) -> Self {
        let threads = FairSlots::new(
            "search",
            config.max_searches_total,
            config.max_concurrent_searches,
        );
        Self { config, threads }
    }
}

impl Deref for SearchState {
    type Target = SearchConfig;

    fn deref(&self) -> &SearchConfig {
        &self.config
    }
}

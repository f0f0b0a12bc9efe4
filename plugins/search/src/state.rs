//! The plugin's state: its `[search]` limits, and the search threads all sessions share —
//! each running search holds a thread, so at most `search.max_searches_total` run at once,
//! taking turns by session (`FairSlots`, pool `search`), on worker threads that never
//! outnumber those slots.

use std::ops::Deref;

use exec_server_core::{FairSlots, WorkerThreads};

use crate::config::SearchConfig;

#[derive(Debug)]
pub(crate) struct SearchState {
    pub(crate) config: SearchConfig,
    /// One slot per running search.
    pub(crate) slots: FairSlots,
    /// The threads searches run on.
    pub(crate) threads: WorkerThreads,
}

impl SearchState {
    pub(crate) fn new(config: SearchConfig) -> Self {
        let slots = FairSlots::new(
            "search",
            config.max_searches_total,
            config.max_concurrent_searches,
        );
        Self {
            config,
            slots,
            threads: WorkerThreads::new("exec-search"),
        }
    }
}

impl Deref for SearchState {
    type Target = SearchConfig;

    fn deref(&self) -> &SearchConfig {
        &self.config
    }
}

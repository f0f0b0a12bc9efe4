//! The searches of one session, by `searchId`: what makes ids unique while a search runs,
//! bounds how many run at once (the session quota [`SEARCHES`]), and lets `search/cancel`
//! and the session's end stop them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use exec_server_core::proto::RpcError;
use exec_server_core::{descriptors, Quota, QuotaLease, Session, SessionState};
use tokio_util::sync::CancellationToken;

use crate::wire::search_already_running;

/// Searches one session runs at once: `search.max_concurrent_searches`.
pub(crate) static SEARCHES: Quota = Quota::new(
    "searches",
    "running searches",
    "search.max_concurrent_searches",
);

/// Descriptors a search thread holds at most: the directories the `ignore` walker keeps
/// open (`walkdir`'s default `max_open`, 10) and the file being searched. Charged to the session's descriptor
/// budget with the search's quota unit, and given back with it when the thread returns.
const SEARCH_DESCRIPTORS: u64 = 11;

/// One registered search. It stays in the table until its `search/done` is queued (or
/// could not be sent), so its id is not reused while notifications for it may still come.
#[derive(Debug, Default)]
pub(crate) struct RunningSearch {
    /// Cancelled by `search/cancel`, by the session's end, or when a notification could
    /// not be delivered; the search thread and the forwarding task both watch it.
    pub(crate) stop: CancellationToken,
    /// Set once the search thread has returned and only `search/done` is left to send:
    /// the search no longer counts against `search.max_concurrent_searches`, and a
    /// `search/start` reusing its id waits for `done_queued` instead of being refused.
    finishing: AtomicBool,
    /// Cancelled after `search/done` was queued (or could not be sent) and the entry was
    /// removed; `search/cancel` waits for it.
    pub(crate) done_queued: CancellationToken,
    /// The search's unit of [`SEARCHES`] and its descriptors, given back once the search
    /// thread has returned.
    lease: Mutex<Option<QuotaLease>>,
}

impl RunningSearch {
    pub(crate) fn set_finishing(&self) {
        self.finishing.store(true, Ordering::SeqCst);
        self.release_quota();
    }

    fn release_quota(&self) {
        let lease = self.lease.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(lease);
    }

    fn is_finishing(&self) -> bool {
        self.finishing.load(Ordering::SeqCst)
    }
}

/// Session state: the session's searches.
#[derive(Debug, Default)]
pub(crate) struct SessionSearches {
    running: Mutex<HashMap<String, Arc<RunningSearch>>>,
}

impl SessionState for SessionSearches {
    /// A search is registered until its `search/done` is queued.
    fn has_live_work(&self) -> bool {
        !self.lock().is_empty()
    }

    /// Nobody can receive the results any more: stop every search.
    fn session_ended(&self) {
        for search in self.lock().values() {
            search.stop.cancel();
        }
    }
}

impl SessionSearches {
    /// Registers `search_id` for `session`, refusing an id that is running and a search
    /// beyond `limit` (the quota's refusal). An id whose search has ended but whose
    /// `search/done` is still being queued is waited for: a client may reuse an id as soon
    /// as it has seen `search/done`.
    pub(crate) async fn register(
        &self,
        session: &Session,
        search_id: &str,
        limit: usize,
    ) -> Result<Arc<RunningSearch>, RpcError> {
        loop {
            let finishing = {
                let mut running = self.lock();
                match running.get(search_id) {
                    Some(search) if search.is_finishing() => Arc::clone(search),
                    Some(_) => return Err(search_already_running(search_id)),
                    None => {
                        let mut lease = SEARCHES.acquire(session, limit, 1)?;
                        lease.hold_descriptors(descriptors::charge(
                            session.id(),
                            SEARCH_DESCRIPTORS,
                            "a search",
                        )?);
                        let search = Arc::new(RunningSearch {
                            lease: Mutex::new(Some(lease)),
                            ..RunningSearch::default()
                        });
                        running.insert(search_id.to_owned(), Arc::clone(&search));
                        return Ok(search);
                    }
                }
            };
            finishing.done_queued.cancelled().await;
        }
    }

    /// The search registered as `search_id`, if any.
    pub(crate) fn get(&self, search_id: &str) -> Option<Arc<RunningSearch>> {
        self.lock().get(search_id).cloned()
    }

    /// Removes `search` (and only that search, should its id have been reused since),
    /// then wakes whoever waits for its `search/done`.
    pub(crate) fn finish(&self, search_id: &str, search: &Arc<RunningSearch>) {
        search.release_quota();
        {
            let mut running = self.lock();
            if running
                .get(search_id)
                .is_some_and(|current| Arc::ptr_eq(current, search))
            {
                running.remove(search_id);
            }
        }
        search.done_queued.cancel();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<RunningSearch>>> {
        self.running.lock().expect("search table lock")
    }
}

#[cfg(test)]
mod tests {
    use exec_server_core::outbound::outbound_queue;
    use exec_server_core::session::SessionRegistry;

    use super::*;

    fn session() -> Arc<Session> {
        let registry = SessionRegistry::new(std::time::Duration::from_secs(30));
        let (outbound, _drain) = outbound_queue(1, None);
        registry.create(outbound).0
    }

    #[tokio::test]
    async fn ids_are_unique_while_running_and_free_after_done() {
        let session = session();
        let table = SessionSearches::default();
        let first = table.register(&session, "a", 2).await.unwrap();
        assert_eq!(
            table.register(&session, "a", 2).await.unwrap_err(),
            search_already_running("a")
        );
        table.finish("a", &first);
        assert!(first.done_queued.is_cancelled());
        assert!(table.get("a").is_none());
        table.register(&session, "a", 2).await.unwrap();
    }

    #[tokio::test]
    async fn the_quota_counts_searches_that_still_run() {
        let session = session();
        let table = SessionSearches::default();
        let a = table.register(&session, "a", 1).await.unwrap();
        let refused = table.register(&session, "b", 1).await.unwrap_err();
        assert_eq!(
            refused.message,
            "session quota reached: at most 1 running searches at once (search.max_concurrent_searches)"
        );
        a.set_finishing();
        table.register(&session, "b", 1).await.unwrap();
        assert_eq!(SEARCHES.used(&session), 1);
    }

    #[tokio::test]
    async fn reusing_a_finishing_id_waits_for_its_done() {
        let session = session();
        let table = Arc::new(SessionSearches::default());
        let first = table.register(&session, "a", 4).await.unwrap();
        first.set_finishing();
        let waiter = tokio::spawn({
            let (table, session) = (Arc::clone(&table), Arc::clone(&session));
            async move { table.register(&session, "a", 4).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        table.finish("a", &first);
        waiter.await.unwrap().unwrap();
        assert!(!Arc::ptr_eq(&table.get("a").unwrap(), &first));
    }

    #[tokio::test]
    async fn the_session_end_stops_every_search() {
        let session = session();
        let table = SessionSearches::default();
        let a = table.register(&session, "a", 4).await.unwrap();
        let b = table.register(&session, "b", 4).await.unwrap();
        table.session_ended();
        assert!(a.stop.is_cancelled() && b.stop.is_cancelled());
    }
}

//! The process table of one session (PROTOCOL §3.4, §4.1): which ids are *starting* or
//! started, id reservation and release, and killing everything when the session ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use exec_server_core::proto::RpcError;
use exec_server_core::{QuotaLease, SessionState};
use tokio_util::sync::CancellationToken;

use crate::keepers::KeeperRegistry;
use crate::managed::ManagedProcess;
use crate::output_budget::SessionBudget;
use crate::spawn_queue::Owner;

/// What a `processId` currently names in a session.
pub(crate) enum Lookup {
    Unknown,
    Starting,
    Started(Arc<ManagedProcess>),
}

enum Slot {
    Starting(Arc<StartTicket>),
    /// Running, exited or closed (until its retention ends).
    Started(Arc<ManagedProcess>),
}

/// Identifies one pending start; `process/terminate` cancels it.
struct StartTicket {
    cancelled: CancellationToken,
}

pub(crate) struct ProcessTable {
    slots: Mutex<HashMap<String, Slot>>,
    /// Cancelled when the session ends: output collection stops and no new process may be
    /// added.
    ended: CancellationToken,
    /// Every keeper of the session not reaped yet, including those of removed processes.
    pub keepers: Arc<KeeperRegistry>,
    /// Processes whose output is still being collected: until their `process/closed` is
    /// queued they will send notifications.
    collecting: Arc<AtomicUsize>,
    /// The session's share of the server's retained output budget; `None` in unit tests.
    pub output_budget: Option<SessionBudget>,
    /// The session's key at the spawner, where sessions take turns.
    pub spawn_owner: Owner,
}

impl ProcessTable {
    pub fn new(output_budget: Option<SessionBudget>) -> Self {
        static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);
        Self {
            slots: Mutex::default(),
            ended: CancellationToken::new(),
            keepers: Arc::default(),
            collecting: Arc::default(),
            output_budget,
            spawn_owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().expect("process table lock")
    }

    pub fn lookup(&self, id: &str) -> Lookup {
        match self.slots().get(id) {
            None => Lookup::Unknown,
            Some(Slot::Starting(_)) => Lookup::Starting,
            Some(Slot::Started(process)) => Lookup::Started(Arc::clone(process)),
        }
    }

    /// Row 10 of §4.2.3: reserves `id` in the *starting* state, if `share` (the session's
    /// process quota) admits one more process; a refusal leaves nothing behind. The
    /// reservation is released when dropped uncommitted (a failed, cancelled or abandoned
    /// start).
    pub fn reserve(
        self: &Arc<Self>,
        id: &str,
        share: impl FnOnce() -> Result<QuotaLease, RpcError>,
    ) -> Result<Reservation, RpcError> {
        let mut slots = self.slots();
        if slots.contains_key(id) {
            return Err(RpcError::process_exists(id));
        }
        let share = share()?;
        let ticket = Arc::new(StartTicket {
            cancelled: CancellationToken::new(),
        });
        slots.insert(id.to_owned(), Slot::Starting(Arc::clone(&ticket)));
        Ok(Reservation {
            table: Arc::clone(self),
            id: id.to_owned(),
            ticket,
            share: Some(share),
            committed: false,
        })
    }

    /// `process/terminate` of a *starting* process: cancels the start and frees the id.
    /// Returns false if `id` is not starting.
    pub fn cancel_start(&self, id: &str) -> bool {
        let mut slots = self.slots();
        let Some(Slot::Starting(ticket)) = slots.get(id) else {
            return false;
        };
        ticket.cancelled.cancel();
        slots.remove(id);
        true
    }

    /// Removes a closed process once its retention time is over (unless the id was freed
    /// and reused meanwhile).
    pub fn remove(&self, process: &Arc<ManagedProcess>) {
        let mut slots = self.slots();
        if let Some(Slot::Started(current)) = slots.get(&process.id) {
            if Arc::ptr_eq(current, process) {
                slots.remove(&process.id);
            }
        }
    }

    /// Counts one process as collecting output until the guard is dropped.
    pub fn collecting(&self) -> CollectingGuard {
        self.collecting.fetch_add(1, Ordering::SeqCst);
        CollectingGuard(Arc::clone(&self.collecting))
    }

    /// True once the session has ended (its processes are being killed).
    pub fn session_has_ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    /// Resolves when the session has ended.
    pub fn ended(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.ended.cancelled()
    }

    pub fn has_ended(&self) -> bool {
        self.ended.is_cancelled()
    }
}

/// One process whose output is still being collected (see [`ProcessTable::collecting`]).
pub(crate) struct CollectingGuard(Arc<AtomicUsize>);

impl Drop for CollectingGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SessionState for ProcessTable {
    /// A process is starting, or one has not sent its `process/closed` yet.
    fn has_live_work(&self) -> bool {
        self.collecting.load(Ordering::SeqCst) > 0
            || self
                .slots()
                .values()
                .any(|slot| matches!(slot, Slot::Starting(_)))
    }

    /// Session expiry, stdio end or shutdown: SIGKILL every process group that may still
    /// have members, make every keeper kill its tree, and cancel pending starts.
    fn session_ended(&self) {
        let slots: Vec<Slot> = {
            let mut slots = self.slots();
            self.ended.cancel();
            slots.drain().map(|(_, slot)| slot).collect()
        };
        for slot in slots {
            match slot {
                Slot::Starting(ticket) => ticket.cancelled.cancel(),
                Slot::Started(process) if !process.is_closed() => process.kill_group(),
                Slot::Started(_) => {}
            }
        }
        self.keepers.kill_all();
    }
}

/// A *starting* id, held by the `process/start` that reserved it.
pub(crate) struct Reservation {
    table: Arc<ProcessTable>,
    id: String,
    ticket: Arc<StartTicket>,
    /// The process's share of the session's quota, until its keeper takes it over.
    share: Option<QuotaLease>,
    committed: bool,
}

impl Reservation {
    /// The process's share of the session's quota, for its keeper to hold until its tree is
    /// gone.
    pub fn take_share(&mut self) -> Option<QuotaLease> {
        self.share.take()
    }

    /// Resolves when `process/terminate` cancels the start or the session ends.
    pub async fn cancelled(&self) {
        tokio::select! {
            _ = self.ticket.cancelled.cancelled() => {}
            _ = self.table.ended() => {}
        }
    }

    /// Moves the id to the started state. Fails (leaving the caller to kill the child)
    /// when the start was cancelled or the session ended meanwhile.
    pub fn commit(mut self, process: &Arc<ManagedProcess>) -> Result<(), RpcError> {
        let mut slots = self.table.slots();
        let ours =
            matches!(slots.get(&self.id), Some(Slot::Starting(t)) if Arc::ptr_eq(t, &self.ticket));
        if !ours || self.table.has_ended() {
            return Err(RpcError::start_cancelled(&self.id));
        }
        slots.insert(self.id.clone(), Slot::Started(Arc::clone(process)));
        drop(slots);
        self.committed = true;
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        let mut slots = self.table.slots();
        if matches!(slots.get(&self.id), Some(Slot::Starting(t)) if Arc::ptr_eq(t, &self.ticket)) {
            slots.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exec_server_core::outbound::outbound_queue;
    use exec_server_core::session::SessionRegistry;
    use exec_server_core::Quota;

    static TEST_PROCESSES: Quota = Quota::new("test_processes", "processes", "test.max");

    fn table() -> Arc<ProcessTable> {
        Arc::new(ProcessTable::new(None))
    }

    /// A lease of a quota with room for everything, for tests about ids.
    fn roomy() -> Result<QuotaLease, RpcError> {
        static SESSION: std::sync::OnceLock<Arc<exec_server_core::Session>> =
            std::sync::OnceLock::new();
        let session = SESSION.get_or_init(|| {
            let registry = SessionRegistry::new(std::time::Duration::from_secs(30));
            let (outbound, _drain) = outbound_queue(1, None);
            registry.create(outbound).0
        });
        TEST_PROCESSES.acquire(session, usize::MAX, 1)
    }

    #[test]
    fn reservations_block_the_id_until_released() {
        let table = table();
        let reservation = table.reserve("a", roomy).unwrap();
        assert!(matches!(table.lookup("a"), Lookup::Starting));
        assert_eq!(
            table.reserve("a", roomy).err().unwrap().message,
            "process a already exists"
        );
        drop(reservation);
        assert!(matches!(table.lookup("a"), Lookup::Unknown));
    }

    #[test]
    fn cancelling_a_start_frees_the_id_for_a_new_start() {
        let table = table();
        let first = table.reserve("a", roomy).unwrap();
        assert!(table.cancel_start("a"));
        assert!(!table.cancel_start("a"));
        let second = table.reserve("a", roomy).unwrap();
        // The cancelled start's clean-up must not free the new reservation.
        drop(first);
        assert!(matches!(table.lookup("a"), Lookup::Starting));
        drop(second);
        assert!(matches!(table.lookup("a"), Lookup::Unknown));
    }

    #[test]
    fn commit_after_cancel_fails_with_the_cancel_message() {
        let table = table();
        let reservation = table.reserve("a", roomy).unwrap();
        table.cancel_start("a");
        let process = ManagedProcess::new(
            "a".into(),
            crate::managed::ProcessParts {
                pid: 1,
                keeper: crate::keepers::LiveKeeper::for_tests(),
                stdin_mode: crate::managed::StdinMode::Closed,
                stdin: None,
                retention: crate::ProcessConfig::default().retention(),
                write_id_history: 0,
                budget: None,
            },
        );
        let err = reservation.commit(&process).unwrap_err();
        assert_eq!(err.message, "process a start was cancelled");
        assert_eq!(err.code, -32600);
    }
}

#[cfg(test)]
mod quota_tests {
    use super::*;
    use exec_server_core::outbound::outbound_queue;
    use exec_server_core::session::SessionRegistry;
    use exec_server_core::Quota;

    static LIMITED: Quota = Quota::new("test_limited_processes", "processes", "test.max");

    #[test]
    fn a_start_refused_by_the_quota_reserves_nothing() {
        let registry = SessionRegistry::new(std::time::Duration::from_secs(30));
        let (outbound, _drain) = outbound_queue(1, None);
        let session = registry.create(outbound).0;
        let table = Arc::new(ProcessTable::new(None));
        let share = || LIMITED.acquire(&session, 1, 1);
        let mut first = table.reserve("a", share).unwrap();
        let refused = table.reserve("b", share).err().unwrap();
        assert_eq!(
            refused.message,
            "session quota reached: at most 1 processes at once (test.max)"
        );
        assert!(matches!(table.lookup("b"), Lookup::Unknown));
        // The share outlives the reservation when taken over (by the keeper).
        let kept = first.take_share();
        drop(first);
        assert!(table.reserve("b", share).is_err());
        drop(kept);
        assert!(table.reserve("b", share).is_ok());
    }
}

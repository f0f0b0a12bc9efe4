//! The process table of one session (PROTOCOL §3.4, §4.1): which ids are *starting* or
//! started, id reservation and release, and killing everything when the session ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use exec_server_core::proto::RpcError;
use exec_server_core::SessionState;
use tokio_util::sync::CancellationToken;

use crate::keepers::KeeperRegistry;
use crate::managed::ManagedProcess;

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

#[derive(Default)]
pub(crate) struct ProcessTable {
    slots: Mutex<HashMap<String, Slot>>,
    /// Cancelled when the session ends: output collection stops and no new process may be
    /// added.
    ended: CancellationToken,
    /// Every keeper of the session not reaped yet, including those of removed processes.
    pub keepers: Arc<KeeperRegistry>,
}

impl ProcessTable {
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

    /// Row 10 of §4.2.3: reserves `id` in the *starting* state. The reservation is released
    /// when dropped uncommitted (a failed, cancelled or abandoned start).
    pub fn reserve(self: &Arc<Self>, id: &str) -> Result<Reservation, RpcError> {
        let mut slots = self.slots();
        if slots.contains_key(id) {
            return Err(RpcError::process_exists(id));
        }
        let ticket = Arc::new(StartTicket {
            cancelled: CancellationToken::new(),
        });
        slots.insert(id.to_owned(), Slot::Starting(Arc::clone(&ticket)));
        Ok(Reservation {
            table: Arc::clone(self),
            id: id.to_owned(),
            ticket,
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

    /// Resolves when the session has ended.
    pub fn ended(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.ended.cancelled()
    }

    pub fn has_ended(&self) -> bool {
        self.ended.is_cancelled()
    }
}

impl SessionState for ProcessTable {
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
    committed: bool,
}

impl Reservation {
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

    #[test]
    fn reservations_block_the_id_until_released() {
        let table = Arc::new(ProcessTable::default());
        let reservation = table.reserve("a").unwrap();
        assert!(matches!(table.lookup("a"), Lookup::Starting));
        assert_eq!(
            table.reserve("a").err().unwrap().message,
            "process a already exists"
        );
        drop(reservation);
        assert!(matches!(table.lookup("a"), Lookup::Unknown));
    }

    #[test]
    fn cancelling_a_start_frees_the_id_for_a_new_start() {
        let table = Arc::new(ProcessTable::default());
        let first = table.reserve("a").unwrap();
        assert!(table.cancel_start("a"));
        assert!(!table.cancel_start("a"));
        let second = table.reserve("a").unwrap();
        // The cancelled start's clean-up must not free the new reservation.
        drop(first);
        assert!(matches!(table.lookup("a"), Lookup::Starting));
        drop(second);
        assert!(matches!(table.lookup("a"), Lookup::Unknown));
    }

    #[test]
    fn commit_after_cancel_fails_with_the_cancel_message() {
        let table = Arc::new(ProcessTable::default());
        let reservation = table.reserve("a").unwrap();
        table.cancel_start("a");
        let process = Arc::new(ManagedProcess::new(
            "a".into(),
            1,
            crate::keepers::LiveKeeper::for_tests(),
            crate::managed::StdinMode::Closed,
            None,
            crate::ProcessConfig::default().retention(),
            0,
        ));
        let err = reservation.commit(&process).unwrap_err();
        assert_eq!(err.message, "process a start was cancelled");
        assert_eq!(err.code, -32600);
    }
}

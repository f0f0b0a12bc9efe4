//! Sessions and the registry that outlives connections (PROTOCOL §3.4).
//!
//! A session is created by `initialize`, attached to one connection at a time, detached when
//! that connection ends and either resumed by a later `initialize{resumeSessionId}` or
//! expired after `session.detached_ttl_ms`. Plugins keep per-session state in it and send
//! notifications through it, to whichever connection it is attached to at that moment.

use std::collections::HashMap;

use crate::sparse_map::shrink_when_sparse;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exec_server_proto::RpcError;
use serde::Serialize;
use tokio::time::Instant;

use crate::audit::{AuditScope, Auditor, Level, Who};
use crate::client_requests::{ClientAnswer, ClientRequests, NoAnswer};
use crate::extensions::{Extensions, SessionState};
use crate::metrics;
pub use crate::outbound::Outbound;

struct Attachment {
    /// Bumped on every attach, so a connection can tell it was superseded.
    generation: u64,
    /// `Some` while attached.
    outbound: Option<Outbound>,
    /// Set while detached: when the session expires.
    deadline: Option<Instant>,
    ended: bool,
}

/// One session: its id, its attachment, and the plugins' state.
pub struct Session {
    id: String,
    attachment: Mutex<Attachment>,
    extensions: Extensions,
    /// Requests sent to the client that wait for its answer.
    client_requests: Arc<ClientRequests>,
    /// Who the session's last connection was, for the events of its end.
    who: Mutex<Arc<Who>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Session {
    fn new(id: String, outbound: Outbound) -> Self {
        Self {
            id,
            attachment: Mutex::new(Attachment {
                generation: 1,
                outbound: Some(outbound),
                deadline: None,
                ended: false,
            }),
            extensions: Extensions::default(),
            client_requests: Arc::default(),
            who: Mutex::new(Arc::new(Who::default())),
        }
    }

    /// Records who the attached connection is (audit events of the session's end).
    pub(crate) fn set_who(&self, who: &Arc<Who>) {
        *self.who.lock().unwrap_or_else(|p| p.into_inner()) = Arc::clone(who);
    }

    /// Who the last connection attached to the session was.
    pub(crate) fn who(&self) -> Arc<Who> {
        Arc::clone(&self.who.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The session id (a UUID v4).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The plugin state of type `T` for this session, created by `init` on first use. Its
    /// [`SessionState::session_ended`] hook runs when the session ends.
    pub fn state<T: SessionState>(&self, init: impl FnOnce() -> T) -> Arc<T> {
        self.extensions.get_or_insert_state(init)
    }

    /// A value of type `T` kept with the session (no end hook), created by `init` on
    /// first use.
    pub fn extension<T: std::any::Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Arc<T> {
        self.extensions.get_or_insert_with(init)
    }

    /// The plugin state of type `T`, if it was created.
    pub fn existing_state<T: SessionState>(&self) -> Option<Arc<T>> {
        self.extensions.get::<T>()
    }

    /// True while a connection is attached.
    pub fn is_attached(&self) -> bool {
        self.lock().outbound.is_some()
    }

    /// True once the session expired or the server shut down.
    pub fn is_ended(&self) -> bool {
        self.lock().ended
    }

    /// The current attach generation; compare with [`crate::Call::generation`].
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Whether a plugin still has work under way for this session that will send
    /// notifications ([`SessionState::has_live_work`]).
    pub fn has_live_work(&self) -> bool {
        self.extensions.any_live_work()
    }

    /// Sends a notification to the attached connection, waiting for room in its outbound
    /// queue (back-pressure). Returns `false` when nothing was sent: the session is
    /// detached (notifications are not produced then, PROTOCOL §3.4), the connection went
    /// away, or the notification belongs to an extension the connection did not opt in to.
    pub async fn notify<P: Serialize + ?Sized>(&self, method: &str, params: &P) -> bool {
        let Some(outbound) = self.lock().outbound.clone() else {
            return false;
        };
        outbound.notify(method, params).await
    }

    /// Like [`Session::notify`], but makes the params only once the outbound queue has
    /// room for the notification (and not at all while the session is detached): a
    /// producer waiting for a slow client holds no encoded message meanwhile.
    pub async fn notify_with<P: Serialize>(
        &self,
        method: &str,
        params: impl FnOnce() -> P,
    ) -> bool {
        let Some(outbound) = self.lock().outbound.clone() else {
            return false;
        };
        outbound.notify_with(method, params).await
    }

    /// Like [`Session::notify_with`], for a producer that encodes the whole message itself
    /// (`{"method":…,"params":…}`), typically to write a large payload straight into its
    /// final buffer.
    pub async fn notify_frame_with(
        &self,
        method: &str,
        frame: impl FnOnce() -> Result<String, serde_json::Error>,
    ) -> bool {
        let Some(outbound) = self.lock().outbound.clone() else {
            return false;
        };
        outbound.notify_frame_with(method, frame).await
    }

    /// Sends the client a request and waits for its answer (the caller bounds the wait;
    /// dropping the future gives the request up). Sent to whichever connection the session
    /// is attached to; the answer must come back on an attached connection of the session.
    /// `owner` (a process id) names whose share of the pending table it takes
    /// ([`crate::client_requests`]).
    pub async fn request_client<P: Serialize>(
        &self,
        owner: &str,
        method: &str,
        params: &P,
    ) -> Result<ClientAnswer, NoAnswer> {
        let pending = self.client_requests.register(owner)?;
        let frame = || {
            serde_json::to_string(&serde_json::json!({
                "id": pending.id,
                "method": method,
                "params": params,
            }))
        };
        if !self.notify_frame_with(method, frame).await {
            return Err(NoAnswer::Disconnected);
        }
        let mut pending = pending;
        (&mut pending.answer)
            .await
            .map_err(|_| NoAnswer::Disconnected)
    }

    /// Hands the client's answer to request `id`; `false` when nothing waits for it.
    pub fn client_answered(&self, id: i64, answer: ClientAnswer) -> bool {
        self.client_requests.answer(id, answer)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Attachment> {
        self.attachment.lock().expect("session lock")
    }
}

/// All sessions of the server, shared by every listener.
/// Why a session ended, as its audit event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Expired,
    ClosedByClient,
    ConnectionEnded,
    Shutdown,
}

pub struct SessionRegistry {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    detached_ttl: Duration,
    /// Where the ends of sessions are recorded.
    audit: Arc<Auditor>,
    /// `exec_server_sessions{state="attached"}`.
    attached: metrics::Gauge,
    /// `exec_server_sessions{state="detached"}`: waiting for a resume or their expiry.
    detached: metrics::Gauge,
}

impl SessionRegistry {
    pub fn new(detached_ttl: Duration) -> Arc<Self> {
        Self::with_audit(detached_ttl, Auditor::disabled())
    }

    /// A registry whose sessions' ends are recorded in `audit`.
    pub fn with_audit(detached_ttl: Duration, audit: Arc<Auditor>) -> Arc<Self> {
        // Sessions are live in the descriptor budget from the first one on.
        crate::descriptors::register();
        let gauge = |state| {
            metrics::gauge(
                "exec_server_sessions",
                "Sessions open now, attached to a connection or detached.",
                &[("state", state)],
            )
        };
        Arc::new(Self {
            sessions: Mutex::new(HashMap::new()),
            detached_ttl,
            audit,
            attached: gauge("attached"),
            detached: gauge("detached"),
        })
    }

    /// Creates a session attached to `outbound`; returns it with its attach generation.
    pub fn create(&self, outbound: Outbound) -> (Arc<Session>, u64) {
        let id = uuid::Uuid::new_v4().to_string();
        let session = Arc::new(Session::new(id.clone(), outbound));
        crate::fair_budget::session_started(&id);
        self.lock().insert(id, Arc::clone(&session));
        self.attached.inc();
        (session, 1)
    }

    /// Takes over a detached session (PROTOCOL §3.4, checks in the spec's order).
    pub fn resume(&self, id: &str, outbound: Outbound) -> Result<(Arc<Session>, u64), RpcError> {
        let session = self
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| RpcError::unknown_session(id))?;
        let mut attachment = session.lock();
        if attachment.ended {
            return Err(RpcError::unknown_session(id));
        }
        if attachment.deadline.is_some_and(|d| d <= Instant::now()) {
            drop(attachment);
            self.end_because(&session, Ending::Expired);
            return Err(RpcError::unknown_session(id));
        }
        if attachment.outbound.is_some() {
            return Err(RpcError::session_attached(id));
        }
        attachment.generation += 1;
        attachment.outbound = Some(outbound);
        attachment.deadline = None;
        let generation = attachment.generation;
        drop(attachment);
        self.detached.dec();
        self.attached.inc();
        Ok((session, generation))
    }

    /// Detaches `session` from the connection of `generation` (a no-op if another
    /// connection took it over since) and starts its expiry timer.
    pub fn detach(self: &Arc<Self>, session: &Arc<Session>, generation: u64) {
        let deadline = Instant::now() + self.detached_ttl;
        {
            let mut attachment = session.lock();
            if attachment.generation != generation || attachment.ended {
                return;
            }
            attachment.outbound = None;
            attachment.deadline = Some(deadline);
        }
        self.attached.dec();
        self.detached.inc();
        tracing::debug!(session = %session.id, "session detached");
        let registry = Arc::downgrade(self);
        let session = Arc::downgrade(session);
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            let (Some(registry), Some(session)) = (registry.upgrade(), session.upgrade()) else {
                return;
            };
            let expired = {
                let attachment = session.lock();
                attachment.generation == generation && attachment.outbound.is_none()
            };
            if expired {
                tracing::info!(session = %session.id, "detached session expired");
                registry.end_because(&session, Ending::Expired);
            }
        });
    }

    /// Ends a session: removes it and runs the plugins' `session_ended` hooks.
    pub fn end(&self, session: &Arc<Session>) {
        self.end_because(session, Ending::ConnectionEnded);
    }

    /// Ends `session` (as [`SessionRegistry::end`]) and records why.
    pub fn end_because(&self, session: &Arc<Session>, why: Ending) {
        {
            let mut attachment = session.lock();
            if attachment.ended {
                return;
            }
            attachment.ended = true;
            let was_attached = attachment.outbound.take().is_some();
            if was_attached {
                self.attached.dec();
            } else {
                self.detached.dec();
            }
        }
        {
            let mut sessions = self.lock();
            sessions.remove(&session.id);
            shrink_when_sparse(&mut sessions);
        }
        self.record_end(session, why);
        session.extensions.end_all();
        crate::fair_budget::session_ended(&session.id);
        crate::memory_trim::session_ended();
    }

    /// Ends every session (server shutdown).
    pub fn end_all(&self) {
        let all: Vec<Arc<Session>> = self.lock().values().cloned().collect();
        for session in all {
            self.end_because(&session, Ending::Shutdown);
        }
    }

    /// `session.expired` or `session.closed` with the reason.
    fn record_end(&self, session: &Session, why: Ending) {
        let scope = AuditScope::connection(&self.audit, session.who(), Some(session.id.clone()));
        let (kind, reason) = match why {
            Ending::Expired => (
                "session.expired",
                "detached longer than session.detached_ttl_ms",
            ),
            Ending::ClosedByClient => ("session.closed", "session/close"),
            Ending::ConnectionEnded => ("session.closed", "its connection ended"),
            Ending::Shutdown => ("session.closed", "the server shut down"),
        };
        scope.emit(kind, |_: Level| {
            let mut details = serde_json::Map::new();
            details.insert("reason".into(), reason.into());
            details
        });
    }

    /// Number of live sessions.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when there are no sessions.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many sessions the registry has room for without growing.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.lock().capacity()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.sessions.lock().expect("session registry lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::outbound::{outbound_queue, OutboundDrain};

    fn outbound() -> (Outbound, OutboundDrain) {
        outbound_queue(4, None)
    }

    #[derive(Default)]
    struct Counter(Arc<AtomicUsize>);
    impl SessionState for Counter {
        fn session_ended(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn detach_resume_and_expire() {
        let registry = SessionRegistry::new(Duration::from_secs(30));
        let (out, _rx) = outbound();
        let (session, generation) = registry.create(out);
        let ended = Arc::new(AtomicUsize::new(0));
        session.state(|| Counter(ended.clone()));
        let id = session.id().to_owned();

        let (out2, _rx2) = outbound();
        let err = registry.resume(&id, out2.clone()).unwrap_err();
        assert_eq!(err.code, -32010);

        registry.detach(&session, generation);
        tokio::time::advance(Duration::from_secs(29)).await;
        let (resumed, generation2) = registry.resume(&id, out2).unwrap();
        assert_eq!(generation2, 2);
        assert!(Arc::ptr_eq(&resumed, &session));

        registry.detach(&session, generation2);
        tokio::time::advance(Duration::from_secs(31)).await;
        tokio::task::yield_now().await;
        assert_eq!(ended.load(Ordering::SeqCst), 1);
        let (out3, _rx3) = outbound();
        assert_eq!(
            registry.resume(&id, out3).unwrap_err().message,
            format!("unknown session id {id}")
        );
        assert!(registry.is_empty());
    }

    #[tokio::test]
    async fn the_session_map_gives_back_its_room_after_a_mass_close() {
        let registry = SessionRegistry::new(Duration::from_secs(30));
        let mut sessions = Vec::new();
        let mut queues = Vec::new();
        for _ in 0..2_000 {
            let (out, rx) = outbound();
            sessions.push(registry.create(out).0);
            queues.push(rx);
        }
        let peak = registry.capacity();
        assert!(peak >= 2_000, "{peak}");
        // The survivors stay reachable through every shrink.
        let kept: Vec<Arc<Session>> = sessions.split_off(1_990);
        for session in &sessions {
            registry.end(session);
        }
        assert_eq!(registry.len(), kept.len());
        assert!(
            registry.capacity() <= crate::sparse_map::MIN_SHRUNK_CAPACITY * 2,
            "{}",
            registry.capacity()
        );
        for session in &kept {
            let (out, _rx) = outbound();
            registry.detach(session, 1);
            let (resumed, _) = registry.resume(session.id(), out).unwrap();
            assert!(Arc::ptr_eq(&resumed, session));
        }
    }

    #[tokio::test]
    async fn notifications_go_to_the_attached_connection_only() {
        let registry = SessionRegistry::new(Duration::from_secs(30));
        let (out, mut rx) = outbound();
        let (session, generation) = registry.create(out);
        assert!(session.notify("a/b", &serde_json::json!({"x": 1})).await);
        assert_eq!(
            rx.recv().await.unwrap(),
            r#"{"method":"a/b","params":{"x":1}}"#
        );
        registry.detach(&session, generation);
        assert!(!session.notify("a/b", &serde_json::json!({})).await);
    }

    #[tokio::test]
    async fn extension_notifications_reach_only_connections_that_opted_in() {
        let registry = SessionRegistry::new(Duration::from_secs(30));
        let (out, mut rx) = outbound();
        let blocked = out.blocking(HashSet::from(["ext/event"]));
        let (session, _) = registry.create(blocked);
        assert!(!session.notify("ext/event", &serde_json::json!({})).await);
        assert!(session.notify("a/b", &serde_json::json!({})).await);
        assert_eq!(rx.recv().await.unwrap(), r#"{"method":"a/b","params":{}}"#);
        assert!(rx.try_recv().is_none());
    }

    #[tokio::test]
    async fn lazy_notifications_are_made_only_when_there_is_room() {
        let registry = SessionRegistry::new(Duration::from_secs(30));
        let (out, mut rx) = outbound_queue(1, None);
        let (session, generation) = registry.create(out);
        let made = Arc::new(AtomicUsize::new(0));
        let make = |n: u32| {
            let made = Arc::clone(&made);
            move || {
                made.fetch_add(1, Ordering::SeqCst);
                serde_json::json!({ "n": n })
            }
        };
        assert!(session.notify_with("a/b", make(1)).await);
        // The queue is full: the second waits without making its params.
        let second = tokio::spawn({
            let session = Arc::clone(&session);
            let make = make(2);
            async move { session.notify_with("a/b", make).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(made.load(Ordering::SeqCst), 1);
        assert_eq!(
            rx.recv().await.unwrap(),
            r#"{"method":"a/b","params":{"n":1}}"#
        );
        assert!(second.await.unwrap());
        assert_eq!(
            rx.recv().await.unwrap(),
            r#"{"method":"a/b","params":{"n":2}}"#
        );
        // Detached: nothing is made at all.
        registry.detach(&session, generation);
        assert!(!session.notify_with("a/b", make(3)).await);
        assert_eq!(made.load(Ordering::SeqCst), 2);
    }
}

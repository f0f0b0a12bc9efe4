//! A typed map of per-plugin state (like `http::Extensions`), shared behind `Arc`s.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type Entry = (Arc<dyn Any + Send + Sync>, Option<Arc<dyn SessionState>>);

/// State a plugin keeps per session. `session_ended` runs once when the session ends
/// (expiry, stdio end, server shutdown), so the plugin can release what it holds — kill
/// process groups, close handles.
pub trait SessionState: Any + Send + Sync {
    fn session_ended(&self) {}

    /// `true` while this state has work under way that will still send the session
    /// notifications (a running process, a running search). A stdio connection whose input
    /// ended waits for it, within its drain window, before the session ends.
    fn has_live_work(&self) -> bool {
        false
    }
}

/// One value per type.
#[derive(Default)]
pub struct Extensions {
    entries: Mutex<HashMap<TypeId, Entry>>,
}

impl Extensions {
    /// The value of type `T`, inserting `init()` if there is none.
    pub fn get_or_insert_with<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Arc<T> {
        self.get_or_insert_inner(init, |_| None)
    }

    /// Like [`Extensions::get_or_insert_with`], remembering `T` for [`Extensions::end_all`].
    pub fn get_or_insert_state<T: SessionState>(&self, init: impl FnOnce() -> T) -> Arc<T> {
        self.get_or_insert_inner(init, |arc| Some(arc as Arc<dyn SessionState>))
    }

    fn get_or_insert_inner<T: Any + Send + Sync>(
        &self,
        init: impl FnOnce() -> T,
        hook: impl FnOnce(Arc<T>) -> Option<Arc<dyn SessionState>>,
    ) -> Arc<T> {
        let mut entries = self.entries.lock().expect("extensions lock");
        if let Some((any, _)) = entries.get(&TypeId::of::<T>()) {
            return Arc::clone(any)
                .downcast()
                .expect("entry stored under its own TypeId");
        }
        let value = Arc::new(init());
        let hook = hook(Arc::clone(&value));
        entries.insert(TypeId::of::<T>(), (value.clone(), hook));
        value
    }

    /// The value of type `T`, inserting the result of `init()` if there is none; an error
    /// of `init` inserts nothing.
    pub fn get_or_try_insert_with<T: Any + Send + Sync, E>(
        &self,
        init: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E> {
        let mut entries = self.entries.lock().expect("extensions lock");
        if let Some((any, _)) = entries.get(&TypeId::of::<T>()) {
            return Ok(Arc::clone(any)
                .downcast()
                .expect("entry stored under its own TypeId"));
        }
        let value = Arc::new(init()?);
        entries.insert(TypeId::of::<T>(), (value.clone(), None));
        Ok(value)
    }

    /// The value of type `T`, if present.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let entries = self.entries.lock().expect("extensions lock");
        entries.get(&TypeId::of::<T>()).map(|(any, _)| {
            Arc::clone(any)
                .downcast()
                .expect("entry stored under its own TypeId")
        })
    }

    /// Whether any state has [`SessionState::has_live_work`].
    pub fn any_live_work(&self) -> bool {
        let hooks: Vec<Arc<dyn SessionState>> = {
            let entries = self.entries.lock().expect("extensions lock");
            entries
                .values()
                .filter_map(|(_, hook)| hook.clone())
                .collect()
        };
        hooks.iter().any(|state| state.has_live_work())
    }

    /// Removes every value, running the `session_ended` hooks.
    pub fn end_all(&self) {
        let drained: Vec<Entry> = {
            let mut entries = self.entries.lock().expect("extensions lock");
            entries.drain().map(|(_, e)| e).collect()
        };
        for (_, hook) in drained {
            if let Some(hook) = hook {
                hook.session_ended();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_value_is_created_once_and_a_failed_init_inserts_nothing() {
        let shared = Extensions::default();
        let failed: Result<Arc<String>, &str> = shared.get_or_try_insert_with(|| Err("no"));
        assert_eq!(failed.unwrap_err(), "no");
        assert!(shared.get::<String>().is_none());
        let first = shared
            .get_or_try_insert_with(|| Ok::<_, ()>("one".to_owned()))
            .unwrap();
        let second = shared
            .get_or_try_insert_with(|| Ok::<_, ()>("two".to_owned()))
            .unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(*second, "one");
    }
}

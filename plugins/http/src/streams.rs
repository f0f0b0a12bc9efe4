//! The streamed responses running on one connection, by `requestId`: an id is refused while
//! a stream with it runs, and a connection runs at most `http.max_streams_per_connection`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use exec_server_core::proto::RpcError;

use crate::wire;

#[derive(Debug, Default)]
pub(crate) struct ActiveStreams {
    ids: Mutex<HashSet<String>>,
}

/// A stream's place in its connection's table, given back when dropped.
#[derive(Debug)]
pub(crate) struct StreamSlot {
    streams: Arc<ActiveStreams>,
    id: String,
}

impl ActiveStreams {
    pub(crate) fn claim(self: &Arc<Self>, id: &str, limit: usize) -> Result<StreamSlot, RpcError> {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        if ids.contains(id) {
            return Err(wire::stream_id_active(id));
        }
        if ids.len() >= limit {
            return Err(wire::too_many_streams(limit));
        }
        ids.insert(id.to_owned());
        Ok(StreamSlot {
            streams: Arc::clone(self),
            id: id.to_owned(),
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut ids = self.streams.ids.lock().unwrap_or_else(|e| e.into_inner());
        ids.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_taken_while_its_stream_runs_and_the_count_is_bounded() {
        let streams = Arc::new(ActiveStreams::default());
        let first = streams.claim("s1", 2).unwrap();
        assert_eq!(
            streams.claim("s1", 2).unwrap_err().message,
            "http/request streamResponse requestId `s1` is already active"
        );
        let _second = streams.claim("s2", 2).unwrap();
        assert!(streams.claim("s3", 2).is_err());
        drop(first);
        assert!(streams.claim("s1", 2).is_ok());
    }
}

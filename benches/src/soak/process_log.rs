//! What the soak saw of one managed process, from notifications and `process/read`
//! answers alike, and the check that nothing was lost: every `seq` from 1 to the close
//! event accounted for exactly once (a chunk, the exit or the close), the close last, and
//! a chunk seen twice (a notification and a read after a resume) seen with the same bytes.

use std::collections::BTreeMap;

use serde_json::Value;

use super::session::Session;
use super::Failure;
use crate::wire::decode_into;

/// One process's events by `seq`.
#[derive(Default)]
pub(super) struct ProcessLog {
    pub id: String,
    chunks: BTreeMap<u64, (String, Vec<u8>)>,
    /// The exit code, and the exit event's `seq` once a notification told it (a read
    /// reports the exit without its `seq`).
    exited: Option<(Option<u64>, i64)>,
    sandbox_denied: bool,
    closed: Option<u64>,
}

impl ProcessLog {
    pub(super) fn new(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            ..Self::default()
        }
    }

    /// True for a notification about this process.
    pub(super) fn concerns(&self, message: &Value) -> bool {
        message["method"]
            .as_str()
            .is_some_and(|m| m.starts_with("process/"))
            && message["params"]["processId"] == self.id.as_str()
    }

    fn add_chunk(&mut self, seq: u64, stream: &str, base64: &str) -> Result<(), Failure> {
        let mut bytes = Vec::new();
        decode_into(base64, &mut bytes);
        match self.chunks.get(&seq) {
            Some((seen_stream, seen)) if *seen != bytes || seen_stream != stream => {
                Err(Failure::new(format!(
                    "process {}: seq {seq} arrived twice with different bytes",
                    self.id
                )))
            }
            Some(_) => Ok(()),
            None => {
                self.chunks.insert(seq, (stream.to_owned(), bytes));
                Ok(())
            }
        }
    }

    /// Takes in one `process/*` notification about this process.
    pub(super) fn absorb(&mut self, message: &Value) -> Result<(), Failure> {
        let params = &message["params"];
        let seq = params["seq"]
            .as_u64()
            .ok_or_else(|| Failure::new(format!("a process event without seq: {message}")))?;
        match message["method"].as_str() {
            Some("process/output") => self.add_chunk(
                seq,
                params["stream"].as_str().unwrap_or(""),
                params["chunk"].as_str().unwrap_or(""),
            ),
            Some("process/exited") => {
                let code = params["exitCode"].as_i64().unwrap_or(i64::MIN);
                self.exited = Some((Some(seq), code));
                self.sandbox_denied = params["sandboxDenied"] == true;
                Ok(())
            }
            Some("process/closed") => {
                self.closed = Some(seq);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Takes in a `process/read` result.
    pub(super) fn absorb_read(&mut self, result: &Value) -> Result<(), Failure> {
        for chunk in result["chunks"].as_array().into_iter().flatten() {
            let seq = chunk["seq"]
                .as_u64()
                .ok_or_else(|| Failure::new(format!("a chunk without seq: {chunk}")))?;
            self.add_chunk(
                seq,
                chunk["stream"].as_str().unwrap_or(""),
                chunk["chunk"].as_str().unwrap_or(""),
            )?;
        }
        if result["exited"] == true && self.exited.is_none() {
            self.exited = Some((None, result["exitCode"].as_i64().unwrap_or(i64::MIN)));
            self.sandbox_denied = result["sandboxDenied"] == true;
        }
        if result["closed"] == true {
            let next = result["nextSeq"]
                .as_u64()
                .ok_or_else(|| Failure::new(format!("a read without nextSeq: {result}")))?;
            self.closed = Some(next - 1);
        }
        Ok(())
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// The highest `seq` up to which every event has been seen: the cursor to read after.
    pub(super) fn seen_through(&self) -> u64 {
        let exit_seq = self.exited.and_then(|(seq, _)| seq);
        let mut seq = 0;
        while self.chunks.contains_key(&(seq + 1)) || exit_seq == Some(seq + 1) {
            seq += 1;
        }
        seq
    }

    /// Checks that every event arrived once and returns the exit code.
    pub(super) fn complete(&self) -> Result<i64, Failure> {
        let lost = |what: String| Failure::new(format!("process {}: {what}", self.id));
        let closed = self
            .closed
            .ok_or_else(|| lost("no process/closed".into()))?;
        let (exit_seq, code) = self
            .exited
            .ok_or_else(|| lost("closed without an exit".into()))?;
        if let Some((&last, _)) = self.chunks.last_key_value() {
            if last >= closed {
                return Err(lost(format!(
                    "output seq {last} after the close ({closed})"
                )));
            }
        }
        let missing: Vec<u64> = (1..closed)
            .filter(|seq| !self.chunks.contains_key(seq) && exit_seq != Some(*seq))
            .collect();
        // A read reports the exit without its seq: exactly one gap is then the exit.
        let allowed = usize::from(exit_seq.is_none());
        if missing.len() != allowed {
            return Err(lost(format!(
                "events lost: seq {missing:?} of 1..={closed} never arrived"
            )));
        }
        Ok(code)
    }

    /// The bytes of `stream` (`stdout`, `stderr`, `pty`) in `seq` order.
    pub(super) fn output(&self, stream: &str) -> Vec<u8> {
        self.chunks
            .values()
            .filter(|(s, _)| s == stream)
            .flat_map(|(_, bytes)| bytes.iter().copied())
            .collect()
    }

    pub(super) fn sandbox_denied(&self) -> bool {
        self.sandbox_denied
    }

    /// Waits for this process's notifications until its close.
    pub(super) async fn follow_to_close(&mut self, session: &mut Session) -> Result<(), Failure> {
        while !self.is_closed() {
            let what = format!("process/closed of {}", self.id);
            let message = session.notification(&what, |m| self.concerns(m)).await?;
            self.absorb(&message)?;
        }
        Ok(())
    }

    /// Catches up after a resume: `process/read` from the last event seen, long-polling,
    /// together with the notifications the new connection receives, until the close.
    pub(super) async fn catch_up_to_close(&mut self, session: &mut Session) -> Result<(), Failure> {
        loop {
            for message in session.take_kept(|m| self.concerns(m)) {
                self.absorb(&message)?;
            }
            if self.is_closed() {
                return Ok(());
            }
            let params = serde_json::json!({"processId": self.id,
                "afterSeq": self.seen_through(), "waitMs": 2000});
            let result = session.call("process/read", params).await?;
            self.absorb_read(&result)?;
        }
    }
}

/// Fails unless `got` is `expected`, naming where they first differ.
pub(super) fn same_bytes(what: &str, got: &[u8], expected: &[u8]) -> Result<(), Failure> {
    if got == expected {
        return Ok(());
    }
    let at = got
        .iter()
        .zip(expected)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(expected.len()));
    let around = |bytes: &[u8]| {
        let end = bytes.len().min(at + 24);
        String::from_utf8_lossy(&bytes[at.min(end)..end]).into_owned()
    };
    Err(Failure::new(format!(
        "{what}: {} bytes where {} were expected, first difference at byte {at} (got {:?}, expected {:?})",
        got.len(),
        expected.len(),
        around(got),
        around(expected)
    )))
}

//! The `[process]` configuration table (PROTOCOL §7).

use exec_server_core::config::{ConfigError, ConfigSource};
use exec_server_core::CheckedSection;
use serde::{Deserialize, Serialize};

use crate::retention::RetentionLimits;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessConfig {
    /// Upper bound for `process/read`'s `waitMs` (§4.5).
    pub max_wait_ms: u64,
    /// Retained output bytes per process (§4.6).
    pub retained_output_bytes: usize,
    /// Retained output chunks per process (§4.6).
    pub retained_output_chunks: usize,
    /// How long a closed process stays readable (§4.6).
    pub closed_retention_ms: u64,
    /// Remembered `writeId`s per process (§4.7).
    pub write_id_history: usize,
    /// Maximum bytes per output chunk (§4.3): the size of one read from the child.
    pub output_chunk_bytes: usize,
    /// Live processes one session may have: from `process/start` until the process's
    /// whole tree is gone (fair share).
    pub max_processes_per_session: usize,
    /// Retained output one session's processes may hold together; beyond it the oldest
    /// output of the session's largest holder is evicted (fair share).
    pub max_retained_output_bytes_per_session: usize,
    /// Retained output all sessions may hold together; beyond it the oldest output of the
    /// largest holder is evicted (fair share).
    pub retained_output_budget_bytes: usize,
    /// `process/write` bytes one session may have waiting for its processes to read them;
    /// a write beyond it is refused (fair share).
    pub max_pending_write_bytes_per_session: usize,
    /// Removed: process starts are charged to the descriptor budget (`[descriptors]`).
    /// Kept only to refuse a configuration that still sets it, with a message that says so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fd_reserve: Option<usize>,
}

impl Default for ProcessConfig {
    fn default() -> Self {
        Self {
            max_wait_ms: 300_000,
            retained_output_bytes: 1_048_576,
            retained_output_chunks: 50_000,
            closed_retention_ms: 30_000,
            write_id_history: 4_096,
            // 64 KiB rather than the protocol document's 8 KiB, chosen by measurement
            // (exec-server-bench, same run, 2 cores): 256 MiB from `head -c` reached a
            // websocket client at 523 MiB/s with 8 KiB chunks and 701 MiB/s with 64 KiB
            // (0.33 -> 0.48 of reading the pipe directly); through the relay 175 -> 341
            // MiB/s. A pipe holds 64 KiB, so one read takes what the child wrote; reads never
            // wait for a full chunk, so interactive output is not delayed.
            output_chunk_bytes: 65_536,
            // A process costs the server 3 to 5 descriptors (its output pipes or terminal,
            // the keeper's status pipe and pidfd, stdin with `pipeStdin`) and the host two
            // tasks (keeper and target): 256 processes are at most 1,280 descriptors and 512
            // tasks, which a server with the recommended 65,536 descriptors can give dozens
            // of sessions, and more than interactive or CI clients run at once.
            max_processes_per_session: 256,
            max_retained_output_bytes_per_session: 64 << 20,
            // Four sessions at their cap; 256 processes at the reference retention of 1 MiB.
            retained_output_budget_bytes: 256 << 20,
            // One write of the largest message (64 MiB of base64 is 48 MiB of bytes) fits.
            max_pending_write_bytes_per_session: 64 << 20,
            fd_reserve: None,
        }
    }
}

impl CheckedSection for ProcessConfig {
    /// Zero is refused where it cannot work. It is meaningful for the wait bound (no long
    /// polls), the closed retention (remove at once) and the write-id history (no dedupe).
    fn check(&self, source: &ConfigSource, table: &str) -> Result<(), ConfigError> {
        if self.fd_reserve.is_some() {
            return Err(source.invalid(
                &format!("{table}.fd_reserve"),
                "was removed: process starts are charged to the descriptor budget, whose reserve is descriptors.reserve; delete the key",
            ));
        }
        source.require_positive(
            table,
            &[
                ("retained_output_bytes", self.retained_output_bytes as u64),
                ("retained_output_chunks", self.retained_output_chunks as u64),
                ("output_chunk_bytes", self.output_chunk_bytes as u64),
                (
                    "max_processes_per_session",
                    self.max_processes_per_session as u64,
                ),
                (
                    "max_retained_output_bytes_per_session",
                    self.max_retained_output_bytes_per_session as u64,
                ),
                (
                    "retained_output_budget_bytes",
                    self.retained_output_budget_bytes as u64,
                ),
                (
                    "max_pending_write_bytes_per_session",
                    self.max_pending_write_bytes_per_session as u64,
                ),
            ],
        )
    }
}

impl ProcessConfig {
    pub(crate) fn retention(&self) -> RetentionLimits {
        RetentionLimits {
            max_bytes: self.retained_output_bytes,
            max_chunks: self.retained_output_chunks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exec_server_core::plugin::load_checked;

    #[test]
    fn defaults_follow_the_spec_and_zero_is_refused_where_meaningless() {
        let load = |toml: &str| {
            let source = ConfigSource::from_toml_str(toml);
            load_checked::<ProcessConfig>(&source, "process")
        };
        assert_eq!(load("").unwrap(), ProcessConfig::default());

        let err = load("[process]\noutput_chunk_bytes = 0\n").unwrap_err();
        assert!(
            err.0.starts_with(
                "invalid config: process.output_chunk_bytes must be greater than zero"
            ),
            "{err}"
        );

        assert!(load("[process]\nmax_wait_ms = 0\nwrite_id_history = 0\n").is_ok());
        let err = load("[process]\nmax_processes_per_session = 0\n").unwrap_err();
        assert!(
            err.0.starts_with(
                "invalid config: process.max_processes_per_session must be greater than zero"
            ),
            "{err}"
        );

        let err = load("[process]\nfd_reserve = 64\n").unwrap_err();
        assert!(err.0.contains("process.fd_reserve was removed"), "{err}");

        let err = load("[process]\nmax_wait = 1\n").unwrap_err();
        assert!(err.0.contains("unknown key process.max_wait"), "{err}");
    }
}

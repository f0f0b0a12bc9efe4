//! The resource monitor and the growth rule.
//!
//! Every few seconds the monitor records the server's and the rendezvous's resident set
//! (`VmRSS`), open descriptors (`/proc/<pid>/fd`), threads (`/proc/<pid>/task`) and the
//! live processes the server started (every descendant of the soak but the two servers,
//! zombies included: see [`super::procs`]).
//!
//! **The growth rule.** The samples are split in thirds. A metric grew without bound when
//! the maximum of the last third exceeds the maximum of the first third by more than its
//! slack: `last_max > first_max × (1 + relative) + absolute`. Maxima, not means: the
//! workload is the same all run long, so each third sees the same peaks of in-flight work
//! (a process starting, a file being read, a helper kept), and a leak lifts the peaks as
//! it lifts everything else; the first third's maximum also already includes the warm-up
//! (thread pools, allocator arenas, caches filled once). The slack is what one peak can
//! differ from another without anything leaking:
//!
//! * RSS: 10 % + 16 MiB (server), 10 % + 8 MiB (rendezvous). glibc's allocator keeps freed
//!   memory in per-thread arenas and returns it lazily, and a sample can land while a
//!   client's ~1 MiB of process output, a 256 KiB file and their base64 copies are in
//!   flight for each of several clients at once. A leak of 1 KiB per request (~50
//!   requests/s) adds ~3 MiB a minute: past the slack within a 10-minute run.
//! * descriptors: 10 % + 24 (server), 10 % + 8 (rendezvous). Most of the server's are held
//!   for the processes of abandoned sessions (below: a few each, pipes and keeper status);
//!   each client's one operation in flight adds fewer than 6 (a sandboxed start with its
//!   launcher, a process's pipes, a kept fs helper, a second connection).
//! * threads: 10 % + 8. Tokio's blocking pool grows with bursts of blocking work (file
//!   system calls, searches) and lets idle threads go after 10 s.
//! * processes: 10 % + 8. Most belong to abandoned sessions: a `sleep` and its keeper each,
//!   until the session ends — at once after `session/close`, after the 10 s detach window
//!   otherwise — so how many there are depends on how many sessions were dropped in the last
//!   10 s (about 80 processes at a time on a 2-core machine). Counting processes is
//!   otherwise exact: a leak of one keeper in a hundred sessions adds hundreds by the end.
//!
//! After the workload every session has ended, so every such process must be gone within
//! 30 s (the drain check in [`super`]); that catches what the thirds cannot in a short run.

use std::time::Duration;

use super::procs::{self, Usage};

/// One sample of every metric.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Time since the workload started.
    pub at: Duration,
    pub server: Usage,
    pub rendezvous: Usage,
    /// Live processes the server started, at any depth.
    pub processes: f64,
}

impl Sample {
    /// Reads `/proc` now; `server` and `rendezvous` are their pids.
    pub fn take(at: Duration, server: u32, rendezvous: u32) -> Self {
        procs::reap_orphans(&[server, rendezvous]);
        Self {
            at,
            server: Usage::of(server),
            rendezvous: Usage::of(rendezvous),
            processes: procs::workload_processes(&[server, rendezvous]).len() as f64,
        }
    }
}

/// How much a metric's last-third maximum may exceed its first-third maximum.
#[derive(Debug, Clone, Copy)]
pub struct Slack {
    pub relative: f64,
    pub absolute: f64,
}

/// One row of the verdict.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub metric: &'static str,
    pub unit: &'static str,
    pub first_median: f64,
    pub first_max: f64,
    pub last_median: f64,
    pub last_max: f64,
    /// The highest last-third maximum that passes.
    pub limit: f64,
    pub grew: bool,
}

/// A metric: its name, its unit, how to read it from a sample (in that unit), its slack.
type MetricSpec = (&'static str, &'static str, fn(&Sample) -> f64, Slack);

const MIB: f64 = 1024.0;

/// The metrics judged, with the slack the module documentation explains.
pub const METRICS: [MetricSpec; 7] = [
    (
        "server RSS",
        "MiB",
        |s| s.server.rss_kib / MIB,
        slack(0.10, 16.0),
    ),
    (
        "server descriptors",
        "",
        |s| s.server.descriptors,
        slack(0.10, 24.0),
    ),
    ("server threads", "", |s| s.server.threads, slack(0.10, 8.0)),
    ("server processes", "", |s| s.processes, slack(0.10, 8.0)),
    (
        "rendezvous RSS",
        "MiB",
        |s| s.rendezvous.rss_kib / MIB,
        slack(0.10, 8.0),
    ),
    (
        "rendezvous descriptors",
        "",
        |s| s.rendezvous.descriptors,
        slack(0.10, 8.0),
    ),
    (
        "rendezvous threads",
        "",
        |s| s.rendezvous.threads,
        slack(0.10, 8.0),
    ),
];

const fn slack(relative: f64, absolute: f64) -> Slack {
    Slack { relative, absolute }
}

/// The fewest samples the rule is applied to (three per third).
pub const MIN_SAMPLES: usize = 9;

/// Applies the growth rule to one series.
pub fn judge_series(values: &[f64], slack: Slack) -> (f64, f64, f64, f64, f64, bool) {
    let third = values.len() / 3;
    let (first, last) = (&values[..third], &values[values.len() - third..]);
    let first_max = first.iter().copied().fold(f64::MIN, f64::max);
    let last_max = last.iter().copied().fold(f64::MIN, f64::max);
    let limit = first_max * (1.0 + slack.relative) + slack.absolute;
    (
        median(first),
        first_max,
        median(last),
        last_max,
        limit,
        last_max > limit,
    )
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// The verdict of every metric over `samples` (at least [`MIN_SAMPLES`]).
pub fn judge(samples: &[Sample]) -> Vec<Verdict> {
    METRICS
        .iter()
        .map(|(metric, unit, read, slack)| {
            let values: Vec<f64> = samples.iter().map(read).collect();
            let (first_median, first_max, last_median, last_max, limit, grew) =
                judge_series(&values, *slack);
            Verdict {
                metric,
                unit,
                first_median,
                first_max,
                last_median,
                last_max,
                limit,
                grew,
            }
        })
        .collect()
}

/// The verdicts as a Markdown table, with the baseline (before the workload) and the
/// final value (after every session ended) beside them.
pub fn table(verdicts: &[Verdict], baseline: &Sample, last: &Sample) -> String {
    let mut out = String::from(
        "| metric                 | before | first ⅓ median | first ⅓ max | last ⅓ median | last ⅓ max | limit  | after  | verdict |\n\
         |------------------------|--------|----------------|-------------|---------------|------------|--------|--------|---------|\n",
    );
    for (verdict, (_, _, read, _)) in verdicts.iter().zip(METRICS.iter()) {
        let name = if verdict.unit.is_empty() {
            verdict.metric.to_owned()
        } else {
            format!("{} ({})", verdict.metric, verdict.unit)
        };
        out.push_str(&format!(
            "| {name:<22} | {:>6} | {:>14} | {:>11} | {:>13} | {:>10} | {:>6} | {:>6} | {:<7} |\n",
            short(read(baseline)),
            short(verdict.first_median),
            short(verdict.first_max),
            short(verdict.last_median),
            short(verdict.last_max),
            short(verdict.limit),
            short(read(last)),
            if verdict.grew { "GREW" } else { "ok" },
        ));
    }
    out
}

fn short(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_leak_grows_and_noise_does_not() {
        let slack = slack(0.10, 8.0);
        // Noise around 100 with a warm-up ramp: within the slack.
        let noisy: Vec<f64> = (0..60)
            .map(|i| 100.0 + f64::from(i % 7) - if i < 5 { 30.0 } else { 0.0 })
            .collect();
        assert!(!judge_series(&noisy, slack).5);
        // One unit per sample: 40 more by the last third.
        let leaking: Vec<f64> = (0..60).map(|i| 100.0 + f64::from(i)).collect();
        let (_, first_max, _, last_max, limit, grew) = judge_series(&leaking, slack);
        assert!(grew, "{first_max} → {last_max}, limit {limit}");
    }
}

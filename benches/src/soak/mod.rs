//! The soak test (`scripts/soak.sh MINUTES`, binary `exec-server-soak`): one server under a
//! mixed workload for minutes, failing when its resources grow without bound, when a
//! request errs that should not, or when output is lost.
//!
//! **Set-up.** One `exec-server rendezvous` and one `exec-server` (the release binaries
//! beside this one) that listens on a WebSocket *and* is registered in remote mode with that
//! rendezvous, so the same server carries direct and relayed sessions. Both run in process
//! groups of their own. Two settings are shortened so that the workload reaches its steady
//! state early in the first third of even a 2-minute run: `process.closed_retention_ms` 5 s
//! (30 s by default: closed processes stay readable that long) and
//! `session.detached_ttl_ms` 10 s (30 s: abandoned sessions live that long); what they
//! bound is the same, only sooner.
//!
//! **Workload.** Clients (default 3 over the WebSocket, 2 over relay streams, each relay
//! client's socket routed through a [`cut::Cutter`] of its own) each loop until the
//! deadline over every operation below in a shuffled order, on one session each (ids, sizes
//! and bytes from a seeded generator). Every request must succeed unless noted, and each
//! operation checks:
//!
//! | operation | what it checks |
//! |---|---|
//! | process output (pipes) | `seq 1 N` (N up to 60 000) plus a line on stderr: both streams byte for byte |
//! | process stdin (pipes) | `cat` fed 1–6 random writes (one sent twice with its `writeId`), `process/closeStdin`: the bytes back once, in order |
//! | process on a terminal | `cat` on a PTY with echo off: three lines written, each back once; a `process/resize`; ^D ends it with 0 |
//! | fs round trip | write, `fs/readFile`, `fs/open` + `fs/readBlock`, metadata, `fs/readDirectory`, `fs/walk`, recursive and file `fs/copy`, `fs/remove`: every answer against what was written; metadata of the removed tree must answer -32004 |
//! | fs/watch | a file written into a watched directory: its `fs/changed` arrives |
//! | search | `search/start` over a planted tree: each match once and `search/done` counting them (every other time with `maxResults` 5, `truncated`) |
//! | sandboxed process + fs | under Landlock + seccomp confined to the client's directory: a process writing there (its output checked), one writing beside it (must fail, no file), a sandboxed `fs/readFile` and `fs/writeFile` there, one beside it (must be refused, no file) |
//! | disconnect + resume | a process whose output spans a dropped connection (WebSocket closed, or relay stream reset): the session taken over with `resumeSessionId` (retrying -32010), the rest caught up with `process/read`; the whole output byte for byte |
//! | abandoned session | a second session starts `sleep 60`, then ends with `session/close` or just disconnects (expiring after the detach window); the sleep must go (process count, final drain) |
//! | relay socket cut | relay clients only: the harness's physical socket cut mid-output; the stream resumes (RELAY §5.8), a request after the cut is answered, every output notification arrives in order |
//!
//! Every process's events are checked for loss by `seq` ([`process_log`]). A wait longer
//! than [`session::STEP_TIMEOUT`] fails the run. The first failure stops every client.
//!
//! **Monitor and growth rule.** [`monitor`]: samples every few seconds; the last third of
//! the samples is compared with the first. After the workload every session has ended, so
//! the server's processes must drain to none within 30 s.
//!
//! **Stopping everything.** The soak is a child subreaper ([`procs`]); at the end (success,
//! failure, SIGINT or SIGTERM) the server and the rendezvous get SIGTERM (SIGKILL after
//! 10 s) and every descendant left is killed. Each process the workload starts carries
//! `EXEC_SERVER_SOAK_RUN` in its environment, by which `scripts/soak.sh` finds any that
//! escaped even that.
//!
//! * [`session`] — one client's JSON-RPC session over a WebSocket or a relay stream.
//! * [`process_log`] — one process's events and the loss check.
//! * [`workload`] — the clients and their operations.
//! * [`cut`] — cutting a relay harness's socket.
//! * [`monitor`] — samples, the growth rule, the table.
//! * [`procs`] — `/proc` reading and stopping processes.

mod cut;
pub mod monitor;
mod process_log;
pub mod procs;
mod session;
mod workload;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::process::Command;
use tokio::time::Instant;

use self::monitor::Sample;
use self::session::Dial;
use self::workload::Worker;
use crate::target::{Rendezvous, WsProcess, EXECUTOR_TOKEN};

/// The environment variable that marks every process of one soak run.
pub const RUN_MARKER: &str = "EXEC_SERVER_SOAK_RUN";

/// The environment the server registers as.
const ENVIRONMENT: &str = "env-soak";

/// How long the server's processes may take to drain once every session has ended: the
/// detach window of the last abandoned session (10 s), a kept fs helper's idle time
/// (10 s), and margin.
const DRAIN: Duration = Duration::from_secs(30);

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub duration: Duration,
    pub ws_clients: usize,
    pub relay_clients: usize,
    pub sample_every: Duration,
}

/// A reason the soak failed.
#[derive(Debug)]
pub struct Failure(String);

impl Failure {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }

    /// The same failure, prefixed with where it happened.
    pub fn context(self, context: impl std::fmt::Display) -> Self {
        Self(format!("{context}: {}", self.0))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Counts shared by every client: operations by kind, requests by method, notable events.
#[derive(Clone, Default)]
pub struct Tally(Arc<Mutex<Counts>>);

#[derive(Default, Clone)]
struct Counts {
    operations: BTreeMap<&'static str, u64>,
    requests: BTreeMap<String, u64>,
    events: BTreeMap<&'static str, u64>,
}

impl Tally {
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn request(&self, method: &str) {
        *self.counts().requests.entry(method.to_owned()).or_default() += 1;
    }

    fn operation(&self, kind: &'static str) {
        *self.counts().operations.entry(kind).or_default() += 1;
    }

    fn event(&self, what: &'static str, count: u64) {
        *self.counts().events.entry(what).or_default() += count;
    }

    fn total_operations(&self) -> u64 {
        self.counts().operations.values().sum()
    }
}

/// The servers under test.
struct Servers {
    server: WsProcess,
    rendezvous: Rendezvous,
}

impl Servers {
    async fn start() -> Result<Self, Failure> {
        let rendezvous = Rendezvous::start_with("soak", |cmd| {
            cmd.process_group(0);
        })
        .await;
        let remote = ["--remote", &rendezvous.url, "--environment-id", ENVIRONMENT];
        let env = [
            ("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN),
            ("EXEC_SERVER_PROCESS__CLOSED_RETENTION_MS", "5000"),
            ("EXEC_SERVER_SESSION__DETACHED_TTL_MS", "10000"),
        ];
        let mut cmd: Command = WsProcess::exec_server_command(&remote, &env);
        cmd.process_group(0);
        let server = WsProcess::start(cmd).await;
        Ok(Self { server, rendezvous })
    }

    fn pids(&self) -> (u32, u32) {
        (
            self.server.child.id().unwrap_or(0),
            self.rendezvous.child.id().unwrap_or(0),
        )
    }

    /// Which of the two has exited, and how.
    fn exited(&mut self) -> Vec<String> {
        let mut gone = Vec::new();
        if let Ok(Some(status)) = self.server.child.try_wait() {
            gone.push(format!("the server exited ({status})"));
        }
        if let Ok(Some(status)) = self.rendezvous.child.try_wait() {
            gone.push(format!("the rendezvous exited ({status})"));
        }
        gone
    }

    /// SIGTERM to both (SIGKILL after 10 s), then every descendant left is killed; returns
    /// the descendants that were left.
    async fn stop(mut self) -> Vec<String> {
        let (server, rendezvous) = self.pids();
        let child = &mut self.server.child;
        procs::stop_group(server, Duration::from_secs(10), || {
            matches!(child.try_wait(), Ok(Some(_)))
        })
        .await;
        let child = &mut self.rendezvous.child;
        procs::stop_group(rendezvous, Duration::from_secs(10), || {
            matches!(child.try_wait(), Ok(Some(_)))
        })
        .await;
        drop(self);
        procs::kill_all_descendants()
    }
}

/// What a run found.
pub struct Outcome {
    pub failures: Vec<String>,
    pub interrupted: bool,
}

/// Runs the soak and prints its report; the caller turns the outcome into an exit code and
/// sets [`RUN_MARKER`] before any thread starts.
pub async fn run(options: Options) -> Outcome {
    procs::become_subreaper();
    let root = std::env::temp_dir().join(format!("exec-server-soak-{}", std::process::id()));
    let mut failures = Vec::new();
    let stop = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicBool::new(false));
    let signals = watch_signals(Arc::clone(&stop), Arc::clone(&interrupted));
    match Servers::start().await {
        Ok(servers) => {
            let (found, leftover) = drive(&options, servers, &root, &stop, &interrupted).await;
            failures.extend(found);
            if !leftover.is_empty() {
                failures.push(format!(
                    "processes were still running after the servers stopped: {}",
                    leftover.join("; ")
                ));
            }
        }
        Err(failure) => failures.push(failure.to_string()),
    }
    signals.abort();
    let _ = std::fs::remove_dir_all(&root);
    Outcome {
        failures,
        interrupted: interrupted.load(Ordering::Relaxed),
    }
}

/// Sets `stop` and `interrupted` on SIGINT or SIGTERM.
fn watch_signals(
    stop: Arc<AtomicBool>,
    interrupted: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        eprintln!("soak: interrupted; stopping the clients and the servers");
        interrupted.store(true, Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
    })
}

/// The run proper, between starting the servers and stopping them: returns the failures
/// and the processes left once the servers stopped.
async fn drive(
    options: &Options,
    mut servers: Servers,
    root: &std::path::Path,
    stop: &Arc<AtomicBool>,
    interrupted: &Arc<AtomicBool>,
) -> (Vec<String>, Vec<String>) {
    let mut failures = Vec::new();
    let (server_pid, rendezvous_pid) = servers.pids();
    let tally = Tally::default();
    let workers = match start_workers(options, &servers, root, &tally).await {
        Ok(workers) => workers,
        Err(failure) => {
            failures.push(failure.to_string());
            return (failures, servers.stop().await);
        }
    };
    // Settle: the connections are open, nothing runs yet.
    let started = Instant::now();
    let baseline = Sample::take(Duration::ZERO, server_pid, rendezvous_pid);
    let until = started + options.duration;
    eprintln!(
        "soak: {} clients ({} websocket, {} relay) for {:.1} min; server pid {server_pid}, rendezvous pid {rendezvous_pid}",
        workers.len(),
        options.ws_clients,
        options.relay_clients,
        options.duration.as_secs_f64() / 60.0
    );
    let handles: Vec<_> = workers
        .into_iter()
        .map(|worker| {
            let name = worker.name.clone();
            let stop = Arc::clone(stop);
            let task = tokio::spawn(async move {
                let result = worker.run(until, Arc::clone(&stop)).await;
                if result.is_err() {
                    stop.store(true, Ordering::Relaxed);
                }
                result
            });
            (name, task)
        })
        .collect();

    let samples = monitor_until_done(
        options,
        started,
        &handles,
        (server_pid, rendezvous_pid),
        &tally,
        stop,
    )
    .await;
    for (name, task) in handles {
        if interrupted.load(Ordering::Relaxed) && !task.is_finished() {
            task.abort();
        }
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(failure)) => failures.push(failure.to_string()),
            Err(e) if e.is_panic() => failures.push(format!("{name} panicked: {}", panic_text(e))),
            Err(_) => {}
        }
    }
    failures.extend(servers.exited());
    let interrupted = interrupted.load(Ordering::Relaxed);
    if !failures.is_empty() && !interrupted {
        eprintln!("soak: FAILED:\n  {}", failures.join("\n  "));
    }

    let last = drain(server_pid, rendezvous_pid, &mut failures, interrupted).await;
    report(
        options,
        &samples,
        &baseline,
        &last,
        &tally,
        &mut failures,
        interrupted,
    );
    (failures, servers.stop().await)
}

/// Starts the rendezvous-side forwarders and opens every client's session.
async fn start_workers(
    options: &Options,
    servers: &Servers,
    root: &std::path::Path,
    tally: &Tally,
) -> Result<Vec<Worker>, Failure> {
    std::fs::create_dir_all(root.join("outside"))
        .map_err(|e| Failure::new(format!("create {}: {e}", root.display())))?;
    let mut workers = Vec::new();
    for i in 0..options.ws_clients {
        let dial = Dial::Ws(servers.server.url.clone());
        let name = format!("ws-{}", i + 1);
        workers.push(
            Worker::start(name, workers.len() as u64, dial, None, root, tally.clone()).await?,
        );
    }
    let upstream = cut::socket_address(&servers.rendezvous.url)?;
    for i in 0..options.relay_clients {
        let cutter = cut::Cutter::start(upstream).await?;
        let args = cut::harness_args(&servers.rendezvous.url, ENVIRONMENT, &cutter)?;
        let name = format!("relay-{}", i + 1);
        let index = workers.len() as u64;
        workers.push(
            Worker::start(
                name,
                index,
                Dial::Relay(Box::new(args)),
                Some(cutter),
                root,
                tally.clone(),
            )
            .await?,
        );
    }
    Ok(workers)
}

/// Samples every `options.sample_every` until every client is done; prints a progress
/// line every minute.
async fn monitor_until_done<T>(
    options: &Options,
    started: Instant,
    handles: &[(String, tokio::task::JoinHandle<T>)],
    (server, rendezvous): (u32, u32),
    tally: &Tally,
    stop: &Arc<AtomicBool>,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut next_progress = Duration::from_secs(60);
    let mut tick = tokio::time::interval(options.sample_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if handles.iter().all(|(_, task)| task.is_finished()) {
            return samples;
        }
        // Samples taken while the clients wind down (after a failure, an interrupt or the
        // deadline) are not of the steady workload.
        if stop.load(Ordering::Relaxed) || started.elapsed() >= options.duration {
            continue;
        }
        let sample = Sample::take(started.elapsed(), server, rendezvous);
        if sample.at >= next_progress {
            next_progress += Duration::from_secs(60);
            eprintln!(
                "soak: {:>5.1} min, {} operations; server RSS {:.1} MiB, {} descriptors, {} threads, {} processes",
                sample.at.as_secs_f64() / 60.0,
                tally.total_operations(),
                sample.server.rss_kib / 1024.0,
                sample.server.descriptors,
                sample.server.threads,
                sample.processes
            );
        }
        samples.push(sample);
    }
}

/// Waits for the server's processes to go now that every session has ended; returns the
/// last sample.
async fn drain(
    server: u32,
    rendezvous: u32,
    failures: &mut Vec<String>,
    interrupted: bool,
) -> Sample {
    let started = Instant::now();
    loop {
        let sample = Sample::take(started.elapsed(), server, rendezvous);
        let left = procs::workload_processes(&[server, rendezvous]);
        if left.is_empty() || interrupted {
            return sample;
        }
        if started.elapsed() >= DRAIN {
            let described: Vec<String> = left.into_iter().map(procs::describe).collect();
            failures.push(format!(
                "{} processes still ran {} s after every session ended: {}",
                described.len(),
                DRAIN.as_secs(),
                described.join("; ")
            ));
            return sample;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Prints the table of samples and counts, and adds the growth rule's failures.
fn report(
    options: &Options,
    samples: &[Sample],
    baseline: &Sample,
    last: &Sample,
    tally: &Tally,
    failures: &mut Vec<String>,
    interrupted: bool,
) {
    let counts = tally.counts().clone();
    let mut out = format!(
        "\n## soak: {:.1} min, {} websocket + {} relay clients, {} samples every {} s\n\n",
        options.duration.as_secs_f64() / 60.0,
        options.ws_clients,
        options.relay_clients,
        samples.len(),
        options.sample_every.as_secs_f64()
    );
    if samples.len() >= monitor::MIN_SAMPLES {
        let verdicts = monitor::judge(samples);
        out.push_str(&monitor::table(&verdicts, baseline, last));
        if !interrupted {
            for verdict in verdicts.iter().filter(|v| v.grew) {
                failures.push(format!(
                    "{} grew: last third's maximum {:.1} above the limit {:.1} (first third's maximum {:.1})",
                    verdict.metric, verdict.last_max, verdict.limit, verdict.first_max
                ));
            }
        }
    } else {
        out.push_str(&format!(
            "(only {} samples: the growth rule needs {})\n",
            samples.len(),
            monitor::MIN_SAMPLES
        ));
        if !interrupted && failures.is_empty() {
            failures.push("too few samples for the growth rule: run longer".into());
        }
    }
    out.push_str("\n| operation | count |\n|---|---|\n");
    for (kind, count) in &counts.operations {
        out.push_str(&format!("| {kind} | {count} |\n"));
    }
    out.push_str("\n| request | count |\n|---|---|\n");
    for (method, count) in &counts.requests {
        out.push_str(&format!("| {method} | {count} |\n"));
    }
    for (what, count) in &counts.events {
        out.push_str(&format!("| ({what}) | {count} |\n"));
    }
    println!("{out}");
}

fn panic_text(error: tokio::task::JoinError) -> String {
    let payload = error.into_panic();
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(no message)".into())
}

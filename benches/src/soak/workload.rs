//! The soak's clients: each loops over every kind of operation in a shuffled order until
//! the deadline, on one session of its own, and fails on the first request that errs when
//! it should not (or succeeds when it should not), on output that differs by one byte from
//! what the command writes, and on a gap in a process's events. The module documentation
//! of [`super`] lists the operations and what each checks.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::cut::Cutter;
use super::process_log::{same_bytes, ProcessLog};
use super::session::{Dial, Session};
use super::{Failure, Tally, RUN_MARKER};
use crate::wire::{confined_sandbox, decode_into};

/// One kind of operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    PipeOutput,
    Stdin,
    Pty,
    Files,
    Watch,
    Search,
    Sandboxed,
    Resume,
    Abandon,
    RelayCut,
}

impl Op {
    /// Every operation a client over `relay` (or a WebSocket) runs in one round.
    fn round(relay: bool) -> Vec<Op> {
        let mut ops = vec![
            Op::PipeOutput,
            Op::Stdin,
            Op::Pty,
            Op::Files,
            Op::Watch,
            Op::Search,
            Op::Sandboxed,
            Op::Resume,
            Op::Abandon,
        ];
        if relay {
            ops.push(Op::RelayCut);
        }
        ops
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Op::PipeOutput => "process output (pipes)",
            Op::Stdin => "process stdin (pipes)",
            Op::Pty => "process on a terminal",
            Op::Files => "fs round trip",
            Op::Watch => "fs/watch",
            Op::Search => "search",
            Op::Sandboxed => "sandboxed process + fs",
            Op::Resume => "disconnect + resume",
            Op::Abandon => "abandoned session",
            Op::RelayCut => "relay socket cut",
        }
    }
}

/// A small deterministic generator (xorshift64*): sizes, bytes and orders differ from round
/// to round and from client to client, and a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// One client.
pub(super) struct Worker {
    pub name: String,
    dial: Dial,
    session: Session,
    /// This client's directory: its files, its search tree, the only place its sandboxed
    /// requests may write.
    dir: PathBuf,
    /// A directory beside every client's, which sandboxed requests must not write.
    outside: PathBuf,
    /// Matches of this client's needle in its search tree.
    needles: u64,
    cutter: Option<Arc<Cutter>>,
    rng: Rng,
    serial: u64,
    tally: Tally,
}

impl Worker {
    /// A client named `name`, its files under `root`, connected through `dial`.
    pub(super) async fn start(
        name: String,
        index: u64,
        dial: Dial,
        cutter: Option<Arc<Cutter>>,
        root: &Path,
        tally: Tally,
    ) -> Result<Self, Failure> {
        let dir = root.join(&name);
        std::fs::create_dir_all(&dir)
            .map_err(|e| Failure::new(format!("create {}: {e}", dir.display())))?;
        let needles = plant_search_tree(&dir.join("search"), &needle(&name))?;
        let session = Session::open(dial.clone(), tally.clone())
            .await
            .map_err(|f| f.context(format!("{name}: opening its session")))?;
        Ok(Self {
            name,
            dial,
            session,
            dir,
            outside: root.join("outside"),
            needles,
            cutter,
            rng: Rng(0x9e37_79b9_7f4a_7c15 ^ (index + 1).wrapping_mul(0x1000_0000_01b3)),
            serial: 0,
            tally,
        })
    }

    /// Runs rounds of every operation until `until` or `stop`, then closes the session.
    pub(super) async fn run(
        mut self,
        until: Instant,
        stop: Arc<AtomicBool>,
    ) -> Result<(), Failure> {
        let mut ops = Op::round(self.cutter.is_some());
        let mut round = 0u64;
        'rounds: loop {
            round += 1;
            self.rng.shuffle(&mut ops);
            for &op in &ops {
                if Instant::now() >= until || stop.load(Ordering::Relaxed) {
                    break 'rounds;
                }
                self.run_op(op).await.map_err(|f| {
                    f.context(format!("{} round {round}, {}", self.name, op.name()))
                })?;
                self.tally.operation(op.name());
                self.session.forget_kept();
            }
        }
        self.session
            .close()
            .await
            .map_err(|f| f.context(format!("{}: closing its session", self.name)))
    }

    async fn run_op(&mut self, op: Op) -> Result<(), Failure> {
        self.serial += 1;
        match op {
            Op::PipeOutput => self.pipe_output().await,
            Op::Stdin => self.stdin().await,
            Op::Pty => self.pty().await,
            Op::Files => self.files().await,
            Op::Watch => self.watch().await,
            Op::Search => self.search().await,
            Op::Sandboxed => self.sandboxed().await,
            Op::Resume => self.resume().await,
            Op::Abandon => self.abandon().await,
            Op::RelayCut => self.relay_cut().await,
        }
    }

    fn process_id(&self, what: &str) -> String {
        format!("{what}-{}", self.serial)
    }

    /// `process/start` on this client's session; checks the answer.
    async fn start_process(
        &mut self,
        id: &str,
        argv: Value,
        how: Start,
    ) -> Result<(ProcessLog, Value), Failure> {
        let result = start_process(&mut self.session, &self.dir, id, argv, how).await?;
        Ok((ProcessLog::new(id), result))
    }

    /// `seq 1 N` on stdout and one line on stderr; both compared byte for byte.
    async fn pipe_output(&mut self) -> Result<(), Failure> {
        let lines = 1 + self.rng.below(60_000);
        let id = self.process_id("out");
        let script = "seq 1 \"$1\"; echo soak-stderr >&2";
        let argv = json!(["sh", "-c", script, "sh", lines.to_string()]);
        let (mut log, _) = self.start_process(&id, argv, Start::pipes()).await?;
        log.follow_to_close(&mut self.session).await?;
        exit_zero(&log)?;
        same_bytes("stdout", &log.output("stdout"), &seq_text(1, lines))?;
        same_bytes("stderr", &log.output("stderr"), b"soak-stderr\n")
    }

    /// `cat` with piped stdin: random writes (one repeated with its `writeId`, which must
    /// not be written twice), `process/closeStdin`, every byte back in order.
    async fn stdin(&mut self) -> Result<(), Failure> {
        let id = self.process_id("cat");
        let how = Start {
            pipe_stdin: true,
            ..Start::pipes()
        };
        let (mut log, _) = self.start_process(&id, json!(["cat"]), how).await?;
        let mut sent = Vec::new();
        let writes = 1 + self.rng.below(6);
        for write in 1..=writes {
            let len = 1 + self.rng.below(32 * 1024) as usize;
            let data = self.rng.bytes(len);
            let repeats = if write == 1 { 2 } else { 1 };
            for _ in 0..repeats {
                write_stdin(&mut self.session, &id, &data, &write.to_string()).await?;
            }
            sent.extend_from_slice(&data);
        }
        let closed = self
            .session
            .call("process/closeStdin", json!({"processId": id}))
            .await?;
        expect_member(&closed, "status", "accepted", "process/closeStdin")?;
        log.follow_to_close(&mut self.session).await?;
        exit_zero(&log)?;
        same_bytes("cat's stdout", &log.output("stdout"), &sent)
    }

    /// `cat` on a terminal with echo off: each line written comes back once (with the
    /// terminal's CR LF), a resize on the way, ^D ends it.
    async fn pty(&mut self) -> Result<(), Failure> {
        let id = self.process_id("pty");
        let argv = json!(["sh", "-c", "stty -echo; echo ready; exec cat"]);
        let how = Start {
            tty: true,
            ..Start::pipes()
        };
        let (mut log, _) = self.start_process(&id, argv, how).await?;
        let mut expected = b"ready\r\n".to_vec();
        wait_for_pty(&mut self.session, &mut log, &expected).await?;
        for line in 1..=3 {
            let text = format!("pty-{}-{line}", self.serial);
            write_stdin(
                &mut self.session,
                &id,
                format!("{text}\n").as_bytes(),
                &line.to_string(),
            )
            .await?;
            expected.extend_from_slice(format!("{text}\r\n").as_bytes());
            wait_for_pty(&mut self.session, &mut log, &expected).await?;
            if line == 2 {
                let size = json!({"processId": id, "rows": 30 + line, "cols": 100});
                self.session.call("process/resize", size).await?;
            }
        }
        write_stdin(&mut self.session, &id, b"\x04", "eof").await?;
        log.follow_to_close(&mut self.session).await?;
        exit_zero(&log)?;
        same_bytes("the terminal's output", &log.output("pty"), &expected)
    }

    /// Write, read (whole and in blocks), metadata, list, walk, copy and remove in a tree
    /// of this client's, every answer compared with what was written.
    async fn files(&mut self) -> Result<(), Failure> {
        let base = self.dir.join(format!("files-{}", self.serial));
        let s = &mut self.session;
        s.call("fs/createDirectory", json!({"path": uri(&base)}))
            .await?;
        let len = self.rng.below(256 * 1024) as usize;
        let data = self.rng.bytes(len);
        let a = base.join("a.bin");
        write_file(s, &a, &data).await?;
        same_bytes("fs/readFile", &read_file(s, &a).await?, &data)?;
        same_bytes(
            "fs/readBlock",
            &read_blocks(s, &a, self.serial).await?,
            &data,
        )?;
        let meta = s.call("fs/getMetadata", json!({"path": uri(&a)})).await?;
        if meta["size"] != data.len() || meta["isFile"] != true {
            return Err(Failure::new(format!(
                "fs/getMetadata of a {}-byte file: {meta}",
                data.len()
            )));
        }
        let sub = base.join("sub");
        s.call("fs/createDirectory", json!({"path": uri(&sub)}))
            .await?;
        let text = format!("file {} of {}\n", self.serial, self.name).into_bytes();
        write_file(s, &sub.join("b.txt"), &text).await?;
        expect_listing(s, &base, &["a.bin", "sub"]).await?;
        let walk = s
            .call(
                "fs/walk",
                json!({"path": uri(&base), "options": {"maxDepth": 4,
                "maxDirectories": 16, "maxEntries": 64, "followDirectorySymlinks": false}}),
            )
            .await?;
        let mut walked: Vec<String> = walk["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                format!(
                    "{} {}",
                    e["kind"].as_str().unwrap_or("?"),
                    e["path"].as_str().unwrap_or("?")
                )
            })
            .collect();
        walked.sort();
        let expected = [
            format!("directory {}", uri(&sub)),
            format!("file {}", uri(&a)),
            format!("file {}", uri(&sub.join("b.txt"))),
        ];
        if walked != expected || walk["truncated"] != false || walk["errors"] != json!([]) {
            return Err(Failure::new(format!(
                "fs/walk of {}: {walk}",
                base.display()
            )));
        }
        let copy = base.join("sub-copy");
        s.call(
            "fs/copy",
            json!({"sourcePath": uri(&sub), "destinationPath": uri(&copy), "recursive": true}),
        )
        .await?;
        same_bytes(
            "the copied tree's file",
            &read_file(s, &copy.join("b.txt")).await?,
            &text,
        )?;
        let a_copy = base.join("a-copy.bin");
        s.call(
            "fs/copy",
            json!({"sourcePath": uri(&a), "destinationPath": uri(&a_copy), "recursive": false}),
        )
        .await?;
        same_bytes("the copied file", &read_file(s, &a_copy).await?, &data)?;
        s.call("fs/remove", json!({"path": uri(&copy)})).await?;
        expect_listing(s, &base, &["a-copy.bin", "a.bin", "sub"]).await?;
        s.call("fs/remove", json!({"path": uri(&base), "recursive": true}))
            .await?;
        let gone = s
            .call_expecting_error("fs/getMetadata", json!({"path": uri(&base)}))
            .await?;
        expect_code(&gone, -32004, "fs/getMetadata of a removed directory")
    }

    /// `fs/watch` on a new directory, a file written into it, its `fs/changed` awaited.
    async fn watch(&mut self) -> Result<(), Failure> {
        let dir = self.dir.join(format!("watch-{}", self.serial));
        let watch_id = format!("w{}", self.serial);
        let s = &mut self.session;
        s.call("fs/createDirectory", json!({"path": uri(&dir)}))
            .await?;
        s.call("fs/watch", json!({"watchId": watch_id, "path": uri(&dir)}))
            .await?;
        let file = dir.join("new.txt");
        write_file(s, &file, b"watched\n").await?;
        let suffix = "/new.txt";
        s.notification("fs/changed for the new file", |m| {
            m["method"] == "fs/changed"
                && m["params"]["watchId"] == watch_id.as_str()
                && m["params"]["changes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["path"].as_str().is_some_and(|p| p.ends_with(suffix)))
        })
        .await?;
        s.call("fs/unwatch", json!({"watchId": watch_id})).await?;
        s.call("fs/remove", json!({"path": uri(&dir)})).await?;
        Ok(())
    }

    /// `search/start` over this client's tree: every match reported once, the count in
    /// `search/done` equal to the matches planted; every other round with `maxResults`.
    async fn search(&mut self) -> Result<(), Failure> {
        let search_id = format!("s{}", self.serial);
        let limited = self.serial % 2 == 0;
        let mut params = json!({"searchId": search_id, "path": uri(&self.dir.join("search")),
                                "pattern": needle(&self.name)});
        let expected = if limited {
            params["maxResults"] = json!(5);
            5
        } else {
            self.needles
        };
        let s = &mut self.session;
        s.call("search/start", params).await?;
        let mut matches = 0;
        loop {
            let message = s
                .notification("search/done", |m| {
                    m["params"]["searchId"] == search_id.as_str()
                        && matches!(m["method"].as_str(), Some("search/match" | "search/done"))
                })
                .await?;
            if message["method"] == "search/match" {
                matches += 1;
                continue;
            }
            let done = &message["params"];
            if matches != expected
                || done["matches"] != expected
                || done["truncated"] != limited
                || done["cancelled"] != false
                || done.get("error").is_some()
            {
                return Err(Failure::new(format!(
                    "search of {} planted matches (maxResults {}): {matches} search/match, then {message}",
                    self.needles,
                    if limited { "5" } else { "unset" }
                )));
            }
            return Ok(());
        }
    }

    /// Sandboxed (Landlock + seccomp, writes confined to the client's directory): a
    /// process that writes there and reads it back, one that must be refused a write
    /// beside it, and an fs helper's read, write and refused write.
    async fn sandboxed(&mut self) -> Result<(), Failure> {
        let sandbox = confined_sandbox(&self.dir);
        let inside = self.dir.join(format!("sbx-{}.txt", self.serial));
        let outside = self
            .outside
            .join(format!("{}-{}.txt", self.name, self.serial));
        let id = self.process_id("sbx");
        let script = "echo sandboxed-$1 > \"$2\" && cat \"$2\"";
        let argv = json!(["sh", "-c", script, "sh", self.serial.to_string(), inside]);
        let how = Start {
            sandbox: Some(sandbox.clone()),
            ..Start::pipes()
        };
        let (mut log, started) = self.start_process(&id, argv, how.clone()).await?;
        expect_member(
            &started,
            "sandboxType",
            "linuxSeccomp",
            "sandboxed process/start",
        )?;
        log.follow_to_close(&mut self.session).await?;
        exit_zero(&log)?;
        let content = format!("sandboxed-{}\n", self.serial).into_bytes();
        same_bytes(
            "the sandboxed process's stdout",
            &log.output("stdout"),
            &content,
        )?;

        let id = self.process_id("sbx-denied");
        let argv = json!(["sh", "-c", "echo escaped > \"$1\"", "sh", outside]);
        let (mut log, _) = self.start_process(&id, argv, how).await?;
        log.follow_to_close(&mut self.session).await?;
        if log.complete()? == 0 || outside.exists() {
            return Err(Failure::new(format!(
                "a sandboxed process wrote {} outside its writable directory",
                outside.display()
            )));
        }

        let s = &mut self.session;
        let read = s
            .call(
                "fs/readFile",
                json!({"path": uri(&inside), "sandbox": sandbox}),
            )
            .await?;
        same_bytes(
            "the sandboxed fs/readFile",
            &decode(&read["dataBase64"]),
            &content,
        )?;
        let written = self.dir.join(format!("sbx-fs-{}.txt", self.serial));
        let params =
            json!({"path": uri(&written), "dataBase64": encode(&content), "sandbox": sandbox});
        s.call("fs/writeFile", params).await?;
        let on_disk = std::fs::read(&written).unwrap_or_default();
        same_bytes(
            "the file a sandboxed fs/writeFile wrote",
            &on_disk,
            &content,
        )?;
        let params =
            json!({"path": uri(&outside), "dataBase64": encode(&content), "sandbox": sandbox});
        s.call_expecting_error("fs/writeFile", params).await?;
        if outside.exists() {
            return Err(Failure::new(format!(
                "a sandboxed fs/writeFile wrote {} outside its writable directory",
                outside.display()
            )));
        }
        for file in [inside, written] {
            s.call("fs/remove", json!({"path": uri(&file)})).await?;
        }
        Ok(())
    }

    /// Starts `seq 1 8000` with a pause after 4000 (the output spans whatever the caller
    /// does next) and returns its log once the first output has arrived.
    async fn start_split_output(&mut self, label: &str) -> Result<ProcessLog, Failure> {
        let id = self.process_id(label);
        let argv = json!(["sh", "-c", "seq 1 4000; sleep 0.3; seq 4001 8000"]);
        let (mut log, _) = self.start_process(&id, argv, Start::pipes()).await?;
        let first = self
            .session
            .notification("the first output", |m| log.concerns(m))
            .await?;
        log.absorb(&first)?;
        Ok(log)
    }

    /// A process whose output spans a disconnect: the connection is dropped after its first
    /// chunk, the session taken over from a new connection, the rest read with
    /// `process/read` (and the new connection's notifications), nothing lost or doubled.
    async fn resume(&mut self) -> Result<(), Failure> {
        let mut log = self.start_split_output("resume").await?;
        self.session.disconnect();
        let pause = self.rng.below(300);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let still_attached = self.session.resume().await?;
        self.tally
            .event("resume answered -32010 (retried)", still_attached.into());
        log.catch_up_to_close(&mut self.session).await?;
        exit_zero(&log)?;
        same_bytes(
            "the resumed process's stdout",
            &log.output("stdout"),
            &seq_text(1, 8000),
        )
    }

    /// A second session that starts a long `sleep` and goes away: every other round it
    /// ends with `session/close` (the process is killed at once), otherwise its connection
    /// just drops (the session expires after the detach window and the process is killed
    /// then). The monitor's process count and the final drain check that it was.
    async fn abandon(&mut self) -> Result<(), Failure> {
        let mut other = Session::open(self.dial.clone(), self.tally.clone()).await?;
        let id = self.process_id("abandoned");
        start_process(
            &mut other,
            &self.dir,
            &id,
            json!(["sleep", "60"]),
            Start::pipes(),
        )
        .await?;
        if self.serial % 2 == 0 {
            other.close().await
        } else {
            other.disconnect();
            Ok(())
        }
    }

    /// A relay client's physical socket cut while a process's output flows: the stream
    /// resumes on a new socket (RELAY §5.8) and every event still arrives, as
    /// notifications, once and in order; a request after the cut is answered.
    async fn relay_cut(&mut self) -> Result<(), Failure> {
        let Some(cutter) = self.cutter.clone() else {
            return Ok(());
        };
        let mut log = self.start_split_output("cut").await?;
        let sockets = cutter.cut();
        self.tally.event("relay sockets cut", sockets as u64);
        let status = self.session.call("environment/status", json!({})).await?;
        expect_member(&status, "status", "ready", "environment/status after a cut")?;
        log.follow_to_close(&mut self.session).await?;
        exit_zero(&log)?;
        same_bytes(
            "stdout across the cut",
            &log.output("stdout"),
            &seq_text(1, 8000),
        )
    }
}

/// How a process is started.
#[derive(Clone)]
struct Start {
    tty: bool,
    pipe_stdin: bool,
    sandbox: Option<Value>,
}

impl Start {
    fn pipes() -> Self {
        Self {
            tty: false,
            pipe_stdin: false,
            sandbox: None,
        }
    }
}

/// `process/start` of `argv` in `cwd` with the run's marker in its environment (so a
/// process that escapes every clean-up can still be found); checks the answer.
async fn start_process(
    session: &mut Session,
    cwd: &Path,
    id: &str,
    argv: Value,
    how: Start,
) -> Result<Value, Failure> {
    let marker = std::env::var(RUN_MARKER).unwrap_or_default();
    let mut params = json!({"processId": id, "argv": argv, "cwd": uri(cwd),
        "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", RUN_MARKER: marker},
        "tty": how.tty, "pipeStdin": how.pipe_stdin});
    if how.tty {
        params["size"] = json!({"rows": 24, "cols": 80});
    }
    if let Some(sandbox) = how.sandbox {
        params["sandbox"] = sandbox;
    }
    let result = session.call("process/start", params).await?;
    expect_member(&result, "processId", id, "process/start")?;
    Ok(result)
}

async fn write_stdin(
    session: &mut Session,
    id: &str,
    data: &[u8],
    write_id: &str,
) -> Result<(), Failure> {
    let params = json!({"processId": id, "chunk": encode(data), "writeId": write_id});
    let result = session.call("process/write", params).await?;
    expect_member(&result, "status", "accepted", "process/write")
}

/// Follows a terminal process until its output is `expected`.
async fn wait_for_pty(
    session: &mut Session,
    log: &mut ProcessLog,
    expected: &[u8],
) -> Result<(), Failure> {
    loop {
        let got = log.output("pty");
        if got.len() >= expected.len() {
            return same_bytes("the terminal's output", &got, expected);
        }
        if log.is_closed() {
            return same_bytes("the terminal's output before it closed", &got, expected);
        }
        let message = session
            .notification("the terminal's output", |m| log.concerns(m))
            .await?;
        log.absorb(&message)?;
    }
}

fn exit_zero(log: &ProcessLog) -> Result<(), Failure> {
    match log.complete()? {
        0 => Ok(()),
        code => Err(Failure::new(format!(
            "process {} exited with {code} (sandbox denied: {}); stderr: {}",
            log.id,
            log.sandbox_denied(),
            String::from_utf8_lossy(&log.output("stderr"))
        ))),
    }
}

fn expect_member(result: &Value, member: &str, expected: &str, what: &str) -> Result<(), Failure> {
    if result[member] == expected {
        Ok(())
    } else {
        Err(Failure::new(format!(
            "{what}: {member} should be {expected:?}, the answer was {result}"
        )))
    }
}

fn expect_code(error: &Value, code: i64, what: &str) -> Result<(), Failure> {
    if error["code"] == code {
        Ok(())
    } else {
        Err(Failure::new(format!(
            "{what}: expected error {code}, got {error}"
        )))
    }
}

async fn write_file(session: &mut Session, path: &Path, data: &[u8]) -> Result<(), Failure> {
    let params = json!({"path": uri(path), "dataBase64": encode(data)});
    session.call("fs/writeFile", params).await.map(drop)
}

async fn read_file(session: &mut Session, path: &Path) -> Result<Vec<u8>, Failure> {
    let result = session
        .call("fs/readFile", json!({"path": uri(path)}))
        .await?;
    Ok(decode(&result["dataBase64"]))
}

/// Reads `path` with `fs/open`, `fs/readBlock` of 64 KiB until `eof`, `fs/close`.
async fn read_blocks(session: &mut Session, path: &Path, serial: u64) -> Result<Vec<u8>, Failure> {
    let handle = format!("h{serial}");
    session
        .call("fs/open", json!({"handleId": handle, "path": uri(path)}))
        .await?;
    let mut data = Vec::new();
    loop {
        let params = json!({"handleId": handle, "offset": data.len(), "len": 64 * 1024});
        let block = session.call("fs/readBlock", params).await?;
        data.extend(decode(&block["chunk"]));
        if block["eof"] == true {
            break;
        }
    }
    session
        .call("fs/close", json!({"handleId": handle}))
        .await?;
    Ok(data)
}

/// `fs/readDirectory` of `dir` must list exactly `names` (sorted).
async fn expect_listing(session: &mut Session, dir: &Path, names: &[&str]) -> Result<(), Failure> {
    let listing = session
        .call("fs/readDirectory", json!({"path": uri(dir)}))
        .await?;
    let mut got: Vec<&str> = listing["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["fileName"].as_str())
        .collect();
    got.sort_unstable();
    if got == names {
        Ok(())
    } else {
        Err(Failure::new(format!(
            "fs/readDirectory of {} listed {got:?}, expected {names:?}",
            dir.display()
        )))
    }
}

fn uri(path: &Path) -> String {
    format!("file://{}", path.display())
}

fn encode(data: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(data)
}

fn decode(value: &Value) -> Vec<u8> {
    let mut data = Vec::new();
    decode_into(value.as_str().unwrap_or(""), &mut data);
    data
}

/// What `seq FIRST LAST` prints.
fn seq_text(first: u64, last: u64) -> Vec<u8> {
    (first..=last)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect()
}

/// The text a client searches for: its own, so one client's files never match another's.
fn needle(client: &str) -> String {
    format!("needle-{client}")
}

/// Writes a tree of text files with a known number of lines holding `needle` (a nested
/// directory, several files, lines with and without it) and returns that number.
fn plant_search_tree(root: &Path, needle: &str) -> Result<u64, Failure> {
    let mut planted = 0;
    for file in 0..10u64 {
        let dir = if file < 7 {
            root.to_path_buf()
        } else {
            root.join("nested")
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| Failure::new(format!("create {}: {e}", dir.display())))?;
        let mut text = String::new();
        for line in 0..40u64 {
            if (file * 7 + line) % 5 == 0 {
                text.push_str(&format!("line {line} holds {needle} once\n"));
                planted += 1;
            } else {
                text.push_str(&format!("line {line} holds nothing\n"));
            }
        }
        let path = dir.join(format!("file-{file}.txt"));
        std::fs::write(&path, text)
            .map_err(|e| Failure::new(format!("write {}: {e}", path.display())))?;
    }
    Ok(planted)
}

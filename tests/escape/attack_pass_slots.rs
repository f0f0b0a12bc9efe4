//! Shared slots and peers (docs/SECURITY.md, "Shared slots and peers"), attacked from the
//! code: a slot shared by every session must be held for the server's own work, never for
//! as long as someone outside the server chooses.
//!
//! The spawner threads that create every process wait for the target's `execve`. An exec
//! opens the program, and an open of a file on which another process holds a write lease
//! (`F_SETLEASE`, which root or the file's owner may take) waits until the holder lets go
//! or `/proc/sys/fs/lease-break-time` (45 s) has passed. A few sessions starting a leased
//! program held every spawner thread for that long, and every other session's
//! `process/start` waited behind them.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::util::{WsServer, STEP_TIMEOUT};

/// Starts of the leased program, one per attacker session: twice the server's spawner
/// threads (4), so that even an unfair queue could not serve the victim first.
const ATTACKERS: usize = 8;
/// The spawner threads the server has; the attack needs them all stuck.
const SPAWNER_THREADS: usize = 4;
/// How long the victim's start may take: far below the kernel's lease-break time, which is
/// how long each stuck exec held its spawner thread on the old code.
const VICTIM_DEADLINE: Duration = Duration::from_secs(15);

fn start_params(id: &str, program: &str) -> Value {
    json!({
        "processId": id,
        "argv": [program],
        "cwd": "file:///tmp",
        "env": {"PATH": "/usr/bin:/bin"},
        "tty": false,
    })
}

/// Takes a write lease on `path` for as long as the returned descriptor is open: every
/// other open of the file (an `execve` too) waits until it is closed or the kernel breaks
/// the lease.
fn hold_write_lease(path: &Path) -> OwnedFd {
    let file = std::fs::File::open(path).unwrap();
    let fd = file.as_raw_fd();
    // SAFETY: F_SETLEASE and F_SETOWN only change the state of this open descriptor.
    unsafe {
        assert_eq!(
            libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK),
            0,
            "write lease on {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        // No owner: a lease break sends no SIGIO (whose default would end this test).
        assert_eq!(libc::fcntl(fd, libc::F_SETOWN, 0), 0);
    }
    file.into()
}

/// How many opens wait for the lease on the file with inode `inode`: `/proc/locks` lists
/// each as a `-> LEASE` line under the lease's number.
fn lease_waiters(inode: u64) -> usize {
    let locks = std::fs::read_to_string("/proc/locks").unwrap();
    let suffix = format!(":{inode}");
    let Some(number) = locks.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let number = fields.next()?;
        let is_ours = line.contains("LEASE") && fields.any(|f| f.ends_with(&suffix));
        is_ours.then(|| number.to_owned())
    }) else {
        return 0;
    };
    locks
        .lines()
        .filter(|line| line.starts_with(&number) && line.contains("-> LEASE"))
        .count()
}

fn lease_break_seconds() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/lease-break-time")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execs_that_wait_for_a_lease_holder_leave_the_spawners_to_other_sessions() {
    assert!(
        Duration::from_secs(lease_break_seconds()) >= VICTIM_DEADLINE * 2,
        "the kernel's lease-break time must be well above the victim's deadline"
    );
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("leased-true");
    std::fs::copy("/bin/true", &program).unwrap();
    let inode = std::fs::metadata(&program).unwrap().ino();
    let program = program.to_str().unwrap().to_owned();
    let server = WsServer::start(&[]).await;

    let lease = hold_write_lease(Path::new(&program));
    let mut attackers = Vec::new();
    for n in 0..ATTACKERS {
        let mut client = server.connect_initialized().await;
        let id = client
            .send_request(
                "process/start",
                start_params(&format!("leased-{n}"), &program),
            )
            .await;
        attackers.push((client, id));
    }
    // Every spawner thread is now inside an exec of the leased program.
    let stuck = async {
        while lease_waiters(inode) < SPAWNER_THREADS {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(STEP_TIMEOUT, stuck)
        .await
        .expect("the attackers' execs wait for the lease");

    let mut victim = server.connect_initialized().await;
    let started = tokio::time::timeout(
        VICTIM_DEADLINE,
        victim.request("process/start", start_params("victim", "/bin/true")),
    )
    .await
    .expect("another session's process/start is answered while execs wait for a lease");
    assert!(started.is_ok(), "the victim's start failed: {started:?}");

    // Once the holder lets go, the stuck starts complete as usual.
    drop(lease);
    for (client, id) in &mut attackers {
        let answer: Result<Value, Value> = client.response(*id).await;
        assert!(answer.is_ok(), "a leased start failed: {answer:?}");
    }
    let mut server = server;
    server.child.kill().await.unwrap();
}

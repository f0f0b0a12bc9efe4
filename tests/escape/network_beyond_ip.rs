//! "Network restricted" closes every way out, not only TCP/IP: a UNIX datagram socket can
//! address any bound socket by path through `sendmsg` (whose address no seccomp filter can
//! read), and path sockets are not scoped by network namespaces. The host listens on a path
//! datagram socket (think `/dev/log`, journald, `NOTIFY_SOCKET`) and on a path stream
//! socket, readable to the sandbox; a network-restricted process tries every way to reach
//! them and nothing may arrive.

use std::os::unix::net::{UnixDatagram, UnixListener};

use serde_json::json;

use crate::sandbox::{
    client, default_policy, landlock_available, run_to_exit, start_sandboxed, Tree,
};

/// Each attempt prints its outcome; none may deliver.
const ATTEMPTS: &str = r#"
import socket, sys
target = sys.argv[1]
stream = sys.argv[2]
def attempt(name, f):
    try:
        f()
        print(name, "sent")
    except OSError as e:
        print(name, "refused", e.errno)
def from_socket(kind):
    def send():
        s = socket.socket(socket.AF_UNIX, kind)
        s.sendmsg([b"leak-" + name_of(kind)], [], 0, target)
    return send
def name_of(kind):
    return str(int(kind)).encode()
def from_pair(kind):
    def send():
        a, b = socket.socketpair(socket.AF_UNIX, kind)
        a.sendmsg([b"leak-pair-" + name_of(kind)], [], 0, target)
    return send
def sendto():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b"leak-sendto", target)
def connect_stream():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(stream)
    s.sendall(b"leak-stream")
for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET):
    attempt("socket-%d" % kind, from_socket(kind))
    attempt("pair-%d" % kind, from_pair(kind))
attempt("sendto", sendto)
attempt("connect-stream", connect_stream)
pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
pair[0].sendmsg([b"ok"])
print("stream pair works:", pair[1].recv(2))
"#;

#[tokio::test]
async fn a_network_restricted_process_reaches_no_host_unix_socket() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let target = tree.t.join("outside/log.sock");
    let host = UnixDatagram::bind(&target).unwrap();
    host.set_nonblocking(true).unwrap();
    let stream = tree.t.join("outside/stream.sock");
    let listener = UnixListener::bind(&stream).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::fs::write(tree.t.join("allowed/attempts.py"), ATTEMPTS).unwrap();

    let mut client = client().await;
    let argv = json!(["python3", "attempts.py", target, stream]);
    let started = start_sandboxed(
        &mut client,
        "p",
        argv,
        &tree.path("allowed"),
        &default_policy(&tree),
    )
    .await;
    assert_eq!(started["sandboxType"], "linuxSeccomp");
    let (output, exited) = run_to_exit(&mut client, "p").await;
    assert_eq!(exited["exitCode"], 0, "{output}");
    // Ordinary UNIX stream pairs, which tools rely on, still work.
    assert!(output.contains("stream pair works: b'ok'"), "{output}");
    let mut buf = [0u8; 64];
    if let Ok(n) = host.recv(&mut buf) {
        panic!(
            "a datagram reached the host: {:?}\n{output}",
            String::from_utf8_lossy(&buf[..n])
        );
    }
    assert!(
        listener.accept().is_err(),
        "a stream connection reached the host\n{output}"
    );
    // Datagram sockets cannot even be made (a sequenced-packet pair ignores the address
    // and delivers to its own peer, which is harmless).
    for refused in [
        "socket-2",
        "pair-2",
        "socket-3",
        "pair-3",
        "sendto",
        "connect-stream",
    ] {
        assert!(
            output.contains(&format!("{refused} refused")),
            "{refused}: {output}"
        );
    }
}

/// Host channels that are not sockets: other processes' pseudo-terminals, the host's
/// `/dev/shm` and its other devices. A sandboxed process keeps its own terminal, a
/// `/dev/shm` of its own and the harmless devices.
#[tokio::test]
async fn a_sandboxed_process_reaches_no_other_terminal_and_no_host_shared_memory() {
    if !landlock_available() {
        return;
    }
    let tree = Tree::new();
    let mut client = client().await;
    // Another session's process on a terminal, waiting for its input.
    let victim = json!({"processId": "victim", "argv": ["/bin/sh", "-c", "tty; read line; echo got $line"],
        "cwd": tree.path("allowed"), "env": {"PATH": "/usr/bin:/bin"}, "tty": true});
    client.call("process/start", victim).await;
    let victim_tty = loop {
        let read = client
            .call(
                "process/read",
                json!({"processId": "victim", "afterSeq": 0, "waitMs": 1000}),
            )
            .await;
        let text: Vec<u8> = read["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| crate::util::b64decode(&c["chunk"]))
            .collect();
        let text = String::from_utf8_lossy(&text).into_owned();
        if let Some(line) = text.lines().find(|l| l.starts_with("/dev/pts/")) {
            break line.trim().to_owned();
        }
    };
    let marker = format!("/dev/shm/exec-server-escape-{}", std::process::id());
    let script = format!(
        "tty; echo stolen > {victim_tty} && echo WROTE-OTHER-TERMINAL; \
         (exec 3< {victim_tty}) && echo READ-OTHER-TERMINAL; \
         echo x > {marker} && echo WROTE-SHM; echo DEV: $(ls /dev); \
         head -c 1048576 /dev/zero > /dev/shm/big && echo ROOMY-SHM; true"
    );
    let mut sandboxed = crate::sandbox::client().await;
    let params = json!({"processId": "p", "argv": ["/bin/sh", "-c", script],
        "cwd": tree.path("allowed"), "env": {"PATH": "/usr/bin:/bin"}, "tty": true,
        "sandbox": default_policy(&tree)});
    let started = sandboxed.call("process/start", params).await;
    assert_eq!(started["sandboxType"], "linuxSeccomp");
    let (output, _) = run_to_exit(&mut sandboxed, "p").await;
    // Its own terminal still works (`tty` names it).
    assert!(
        output
            .lines()
            .next()
            .is_some_and(|l| l.starts_with("/dev/pts/")),
        "{output}"
    );
    assert!(!output.contains("WROTE-OTHER-TERMINAL"), "{output}");
    assert!(!output.contains("READ-OTHER-TERMINAL"), "{output}");
    // Shared memory works, in a `/dev/shm` of its own.
    assert!(output.contains("WROTE-SHM"), "{output}");
    assert!(output.contains("ROOMY-SHM"), "{output}");
    assert!(
        !std::path::Path::new(&marker).exists(),
        "the host's /dev/shm was written"
    );
    // No other device of the host is there to open (a root server's disks, consoles).
    let kept = [
        "null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm", "fd", "stdin",
        "stdout", "stderr",
    ];
    let dev = output
        .lines()
        .find_map(|l| l.strip_prefix("DEV:"))
        .unwrap_or_default();
    assert!(dev.contains("null"), "{output}");
    for name in dev.split_whitespace() {
        assert!(kept.contains(&name), "/dev/{name} is visible: {output}");
    }
    client
        .call("process/terminate", json!({"processId": "victim"}))
        .await;
}

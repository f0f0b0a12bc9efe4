//! Enforcement probes against the real kernel (SANDBOX.md §10.4). This test binary has its
//! own `main`: re-executed with `--probe <policy JSON> <T>`, it applies the fs helper's
//! enforcement on its only thread (the same `enforce::apply` the helper calls) and then
//! makes raw system calls, printing each result; without arguments it runs the probe and
//! checks the results.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

use exec_server_sandbox::enforce::{self, HelperKind};
use exec_server_sandbox::policy::{Enforcement, SandboxPolicy};
use serde_json::{json, Value};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--probe") {
        probe(&args[2], Path::new(&args[3]));
        return;
    }
    if enforce::landlock_abi() == 0 {
        assert!(
            std::env::var_os("EXEC_SERVER_REQUIRE_SANDBOX_TESTS").is_none(),
            "Landlock is required but not available"
        );
        println!("SKIP: Landlock is not available on this host");
        return;
    }
    check_probes();
    println!("enforcement probes: ok");
}

/// The errno of a failed call, 0 for success.
fn errno_of(rc: i64) -> i32 {
    if rc < 0 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    } else {
        0
    }
}

fn c(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

fn status_field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or("")
        .trim()
        .to_owned()
}

fn probe(policy: &str, t: &Path) {
    let threads_before = status_field(
        &std::fs::read_to_string("/proc/self/status").unwrap(),
        "Threads",
    );
    let (policy, _) = SandboxPolicy::from_helper_json(policy).unwrap();
    enforce::apply(
        &policy,
        HelperKind::FsHelper,
        Enforcement::Require,
        false,
        &[],
    )
    .expect("enforced");
    let mut results = serde_json::Map::new();
    let mut record = |name: &str, value: Value| {
        results.insert(name.to_owned(), value);
    };
    // SAFETY (all blocks below): raw system calls with valid arguments; descriptors that
    // are created are leaked, the process exits right after.
    unsafe {
        for (name, domain) in [
            ("socket_inet", libc::AF_INET),
            ("socket_inet6", libc::AF_INET6),
            ("socket_netlink", libc::AF_NETLINK),
        ] {
            record(
                name,
                json!(errno_of(libc::socket(domain, libc::SOCK_STREAM, 0) as i64)),
            );
        }
        let unix = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
        record("socket_unix", json!(errno_of(unix as i64)));
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as u16;
        for (i, b) in t
            .join("allowed/sock")
            .as_os_str()
            .as_bytes()
            .iter()
            .enumerate()
        {
            addr.sun_path[i] = *b as libc::c_char;
        }
        let rc = libc::connect(
            unix,
            std::ptr::addr_of!(addr).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as u32,
        );
        record("connect_unix", json!(errno_of(rc as i64)));
        let mut pair = [0; 2];
        let rc = libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr());
        record("socketpair_unix", json!(errno_of(rc as i64)));
        // Datagram sockets can send to any bound path with `sendmsg`: none may be made.
        for (name, kind) in [
            ("dgram", libc::SOCK_DGRAM),
            ("raw", libc::SOCK_RAW),
            ("dgram_cloexec", libc::SOCK_DGRAM | libc::SOCK_CLOEXEC),
        ] {
            let rc = libc::socket(libc::AF_UNIX, kind, 0);
            record(&format!("socket_unix_{name}"), json!(errno_of(rc as i64)));
            let rc = libc::socketpair(libc::AF_UNIX, kind, 0, pair.as_mut_ptr());
            record(
                &format!("socketpair_unix_{name}"),
                json!(errno_of(rc as i64)),
            );
        }
        let rc = libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, pair.as_mut_ptr());
        record("socketpair_unix_seqpacket", json!(errno_of(rc as i64)));
        record(
            "ptrace",
            json!(errno_of(libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0))),
        );
        let mut params = [0u8; 120];
        record(
            "io_uring_setup",
            json!(errno_of(libc::syscall(
                libc::SYS_io_uring_setup,
                1,
                params.as_mut_ptr()
            ))),
        );
        let mut buf = [0u8; 8];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: 8,
        };
        let remote = libc::iovec {
            iov_base: 0x1000 as *mut libc::c_void,
            iov_len: 8,
        };
        record(
            "process_vm_readv",
            json!(errno_of(
                libc::process_vm_readv(libc::getppid(), &local, 1, &remote, 1, 0) as i64
            )),
        );
        record(
            "bpf",
            json!(errno_of(libc::syscall(libc::SYS_bpf, 0, 0, 0))),
        );
        record(
            "init_module",
            json!(errno_of(libc::syscall(libc::SYS_init_module, 0, 0, 0))),
        );
        let fd = libc::open(
            c(&t.join("outside/x")).as_ptr(),
            libc::O_CREAT | libc::O_WRONLY,
            0o644,
        );
        record("create_outside", json!(errno_of(fd as i64)));
        let rc = libc::mknod(
            c(&t.join("allowed/blk")).as_ptr(),
            libc::S_IFBLK | 0o600,
            libc::makedev(8, 0),
        );
        record("mknod_block", json!(errno_of(rc as i64)));
        let rc = libc::link(
            c(&t.join("outside/secret.txt")).as_ptr(),
            c(&t.join("allowed/hl2")).as_ptr(),
        );
        record("link_outside", json!(errno_of(rc as i64)));
        let rc = libc::truncate(c(&t.join("outside/secret.txt")).as_ptr(), 0);
        record("truncate_outside", json!(errno_of(rc as i64)));
        record(
            "kill_parent",
            json!(errno_of(libc::kill(libc::getppid(), 0) as i64)),
        );
        // Group C and the host name (no private UTS namespace here).
        let name = std::fs::read("/proc/sys/kernel/hostname").unwrap();
        let name = name.trim_ascii_end();
        let containment: [(&str, i64); 13] = [
            ("keyctl", libc::syscall(libc::SYS_keyctl, 0, -3i32, 0)),
            (
                "mount",
                libc::syscall(
                    libc::SYS_mount,
                    0usize,
                    c"/".as_ptr(),
                    0usize,
                    0usize,
                    0usize,
                ),
            ),
            (
                "unshare",
                libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUTS),
            ),
            ("setns", libc::syscall(libc::SYS_setns, 0, 0)),
            ("syslog", libc::syscall(libc::SYS_syslog, 10, 0usize, 0)),
            ("acct", libc::syscall(libc::SYS_acct, 0usize)),
            ("userfaultfd", libc::syscall(libc::SYS_userfaultfd, 0)),
            ("pidfd_getfd", libc::syscall(libc::SYS_pidfd_getfd, 0, 0, 0)),
            ("kcmp", libc::syscall(libc::SYS_kcmp, 0, 0, 0, 0, 0)),
            (
                "fanotify_init",
                libc::syscall(libc::SYS_fanotify_init, 0, 0),
            ),
            (
                "clock_settime",
                libc::syscall(libc::SYS_clock_settime, libc::CLOCK_REALTIME, 0usize),
            ),
            (
                "name_to_handle_at",
                libc::syscall(libc::SYS_name_to_handle_at, 0, 0usize, 0usize, 0usize, 0),
            ),
            (
                "sethostname",
                libc::syscall(libc::SYS_sethostname, name.as_ptr(), name.len()),
            ),
        ];
        for (name, rc) in containment {
            record(name, json!(errno_of(rc)));
        }
        // x32 numbers of denied calls (their own program): refused before the kernel even
        // looks at whether it runs x32 code.
        #[cfg(target_arch = "x86_64")]
        {
            const X32: libc::c_long = 0x4000_0000;
            record(
                "x32_keyctl",
                json!(errno_of(libc::syscall(X32 | libc::SYS_keyctl, 0, -3i32, 0))),
            );
            record(
                "x32_ptrace",
                json!(errno_of(libc::syscall(X32 | 521, 0, 0, 0, 0))),
            );
        }
        // clone with CLONE_NEWUSER is refused; a child that slipped through exits at once.
        let rc = libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        );
        if rc == 0 {
            libc::_exit(0);
        }
        record("clone_newuser", json!(errno_of(rc)));
        let rc = libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize);
        if rc == 0 {
            libc::_exit(0);
        }
        record("clone3", json!(errno_of(rc)));
        // A plain fork still works (glibc's fork uses clone).
        let child = libc::fork();
        if child == 0 {
            libc::_exit(0);
        }
        libc::waitpid(child, std::ptr::null_mut(), 0);
        record("fork", json!(errno_of(child as i64)));
        // The parent's secrets under /proc: Landlock's ptrace scope.
        let environ = format!("/proc/{}/environ\0", libc::getppid());
        let fd = libc::open(environ.as_ptr().cast(), libc::O_RDONLY);
        record("parent_environ", json!(errno_of(fd as i64)));
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    record("no_new_privs", json!(status_field(&status, "NoNewPrivs")));
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        record(set, json!(status_field(&status, set)));
    }
    record("seccomp", json!(status_field(&status, "Seccomp")));
    record("threads", json!(threads_before));
    println!("{}", Value::Object(results));
}

fn check_probes() {
    let dir = tempfile::Builder::new()
        .prefix("exec-server-sbx-")
        .tempdir()
        .unwrap();
    let t = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir(t.join("allowed")).unwrap();
    std::fs::create_dir(t.join("outside")).unwrap();
    std::fs::write(t.join("outside/secret.txt"), "secret").unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(t.join("allowed/sock")).unwrap();
    let policy = json!({"version": 1, "readable": "all",
        "writable": [format!("file://{}", t.join("allowed").display())],
        "readOnly": [], "deniedPaths": [], "deniedGlobs": [],
        "network": "restricted", "enforcement": "require"});
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--probe", &policy.to_string(), t.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Value = serde_json::from_slice(&output.stdout).unwrap();
    let expect = |name: &str, allowed: &[i32]| {
        let got = results[name].as_i64().unwrap() as i32;
        assert!(
            allowed.contains(&got),
            "{name}: errno {got}, expected {allowed:?}"
        );
    };
    // L1–L4
    for name in ["socket_inet", "socket_inet6", "socket_netlink"] {
        expect(name, &[libc::EPERM]);
    }
    expect("socket_unix", &[0]);
    expect("connect_unix", &[libc::EPERM]);
    expect("socketpair_unix", &[0]);
    expect("socketpair_unix_seqpacket", &[0]);
    for kind in ["dgram", "raw", "dgram_cloexec"] {
        expect(&format!("socket_unix_{kind}"), &[libc::EPERM]);
        expect(&format!("socketpair_unix_{kind}"), &[libc::EPERM]);
    }
    for name in [
        "ptrace",
        "io_uring_setup",
        "process_vm_readv",
        "bpf",
        "init_module",
    ] {
        expect(name, &[libc::EPERM]);
    }
    // L5, L11
    assert_eq!(results["no_new_privs"], "1");
    assert_eq!(results["seccomp"], "2");
    assert_eq!(results["threads"], "1");
    // L6–L9: Landlock alone holds the boundary.
    expect("create_outside", &[libc::EACCES]);
    assert!(!t.join("outside/x").exists());
    expect("mknod_block", &[libc::EACCES]);
    expect("link_outside", &[libc::EXDEV, libc::EACCES]);
    assert!(!t.join("allowed/hl2").exists());
    expect("truncate_outside", &[libc::EACCES, libc::EPERM]);
    assert_eq!(
        std::fs::read_to_string(t.join("outside/secret.txt")).unwrap(),
        "secret"
    );
    // L10: signal scope (ABI ≥ 6).
    if enforce::landlock_abi() >= 6 {
        expect("kill_parent", &[libc::EPERM]);
    }
    // Group C, host names, clone flags.
    for name in [
        "keyctl",
        "mount",
        "unshare",
        "setns",
        "syslog",
        "acct",
        "userfaultfd",
        "pidfd_getfd",
        "kcmp",
        "fanotify_init",
        "clock_settime",
        "name_to_handle_at",
        "sethostname",
        "clone_newuser",
    ] {
        expect(name, &[libc::EPERM]);
    }
    expect("clone3", &[libc::ENOSYS]);
    #[cfg(target_arch = "x86_64")]
    for name in ["x32_keyctl", "x32_ptrace"] {
        expect(name, &[libc::EPERM]);
    }
    expect("fork", &[0]);
    expect("parent_environ", &[libc::EACCES, libc::EPERM]);
    // The fs helper keeps only file access: DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER (as far
    // as it had them).
    // SAFETY: geteuid has no preconditions.
    let kept = if unsafe { libc::geteuid() } == 0 {
        "000000000000000e"
    } else {
        "0000000000000000"
    };
    assert_eq!(results["CapEff"], kept, "{results}");
    assert_eq!(results["CapPrm"], kept, "{results}");
    assert_eq!(results["CapInh"], "0000000000000000", "{results}");
    assert_eq!(results["CapAmb"], "0000000000000000", "{results}");
    if kept != "0000000000000000" {
        assert_eq!(results["CapBnd"], kept, "{results}");
    }
}

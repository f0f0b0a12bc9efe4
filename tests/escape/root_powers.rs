//! A sandboxed process keeps no capability, even when the server runs as root.
//!
//! The attacker is a sandboxed process of a root server. It looks at its own capability
//! sets, then uses the powers root would have: renaming the host, reading the kernel log
//! (through `/dev/kmsg` and through `syslog(2)`), creating a user namespace to regain
//! capabilities there, mounting. Each must fail.
//!
//! Renaming the host is tried with the host's current name, so that a regression shows as a
//! success without renaming the machine the tests run on.

use serde_json::json;

use crate::sandbox::{
    client, default_policy, landlock_available, run_to_exit, start_sandboxed, Tree,
};

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned()
}

#[tokio::test]
async fn a_root_servers_sandboxed_process_has_no_root_powers() {
    if !landlock_available() {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: the attack needs a server running as root");
        return;
    }
    let tree = Tree::new();
    std::fs::create_dir(tree.t.join("allowed/mnt")).unwrap();
    let before = host_name();
    let script = format!(
        r#"grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status
hostname '{before}' 2>/dev/null && echo "POWER sethostname"
dmesg >/dev/null 2>&1 && echo "POWER kmsg"
dmesg --syslog >/dev/null 2>&1 && echo "POWER syslog"
unshare --user true 2>/dev/null && echo "POWER unshare-user"
unshare --user --map-root-user true 2>/dev/null && echo "POWER unshare-root"
mount -t tmpfs none {mnt} 2>/dev/null && echo "POWER mount"
echo done
"#,
        mnt = tree.path("allowed/mnt")
    );
    let mut client = client().await;
    let started = start_sandboxed(
        &mut client,
        "root",
        json!(["/bin/sh", "-c", script]),
        &tree.path("allowed"),
        &default_policy(&tree),
    )
    .await;
    assert_eq!(started["sandboxType"], "linuxSeccomp");
    let (output, exited) = run_to_exit(&mut client, "root").await;
    assert_eq!(exited["exitCode"], 0, "{output}");
    assert!(output.contains("done"), "{output}");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            output.contains(&format!("{set}:\t0000000000000000")),
            "{set} is not empty:\n{output}"
        );
    }
    assert!(output.contains("NoNewPrivs:\t1"), "{output}");
    let powers: Vec<&str> = output.lines().filter(|l| l.starts_with("POWER")).collect();
    assert!(powers.is_empty(), "root powers left: {powers:?}\n{output}");
    assert_eq!(host_name(), before);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&tree.path("allowed/mnt")), "{mounts}");
}

use std::collections::BTreeSet;

use super::*;

fn scope(network_restricted: bool, landlock_abi: i32, private_uts: bool) -> FilterScope {
    let network = match network_restricted {
        true => NetworkFilter::Restricted,
        false => NetworkFilter::Open,
    };
    FilterScope {
        network,
        landlock_abi,
        private_uts,
    }
}

fn denied(arch: TargetArch, network_restricted: bool, landlock_abi: i32) -> BTreeSet<i64> {
    rules(arch, scope(network_restricted, landlock_abi, true))
        .into_keys()
        .collect()
}

fn column(arch: TargetArch, groups: &[Group]) -> BTreeSet<i64> {
    DENIED_CALLS
        .iter()
        .filter(|d| groups.contains(&d.group))
        .filter_map(|d| match arch {
            TargetArch::x86_64 => d.x86_64,
            _ => d.aarch64,
        })
        .collect()
}

#[test]
fn host_numbers_match_libc() {
    let expected: &[(&str, libc::c_long)] = &[
        ("connect", libc::SYS_connect),
        ("accept", libc::SYS_accept),
        ("accept4", libc::SYS_accept4),
        ("bind", libc::SYS_bind),
        ("listen", libc::SYS_listen),
        ("getpeername", libc::SYS_getpeername),
        ("getsockname", libc::SYS_getsockname),
        ("shutdown", libc::SYS_shutdown),
        ("sendto", libc::SYS_sendto),
        ("sendmmsg", libc::SYS_sendmmsg),
        ("recvmmsg", libc::SYS_recvmmsg),
        ("getsockopt", libc::SYS_getsockopt),
        ("setsockopt", libc::SYS_setsockopt),
        ("socket", libc::SYS_socket),
        ("socketpair", libc::SYS_socketpair),
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
        ("init_module", libc::SYS_init_module),
        ("finit_module", libc::SYS_finit_module),
        ("delete_module", libc::SYS_delete_module),
        ("kexec_load", libc::SYS_kexec_load),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("reboot", libc::SYS_reboot),
        ("swapon", libc::SYS_swapon),
        ("swapoff", libc::SYS_swapoff),
        ("truncate", libc::SYS_truncate),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("pivot_root", libc::SYS_pivot_root),
        ("move_mount", libc::SYS_move_mount),
        ("open_tree", libc::SYS_open_tree),
        ("fsopen", libc::SYS_fsopen),
        ("fsconfig", libc::SYS_fsconfig),
        ("fsmount", libc::SYS_fsmount),
        ("fspick", libc::SYS_fspick),
        ("mount_setattr", libc::SYS_mount_setattr),
        ("setns", libc::SYS_setns),
        ("unshare", libc::SYS_unshare),
        ("syslog", libc::SYS_syslog),
        ("acct", libc::SYS_acct),
        ("quotactl", libc::SYS_quotactl),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("settimeofday", libc::SYS_settimeofday),
        ("clock_settime", libc::SYS_clock_settime),
        ("clock_adjtime", libc::SYS_clock_adjtime),
        ("adjtimex", libc::SYS_adjtimex),
        ("vhangup", libc::SYS_vhangup),
        ("pidfd_getfd", libc::SYS_pidfd_getfd),
        ("kcmp", libc::SYS_kcmp),
        ("fanotify_init", libc::SYS_fanotify_init),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        ("clone", libc::SYS_clone),
        ("sethostname", libc::SYS_sethostname),
        ("setdomainname", libc::SYS_setdomainname),
        #[cfg(target_arch = "x86_64")]
        ("iopl", libc::SYS_iopl),
        #[cfg(target_arch = "x86_64")]
        ("ioperm", libc::SYS_ioperm),
    ];
    let arch = host_arch().expect("tests run on x86_64 or aarch64");
    for (name, number) in expected {
        let denied = DENIED_CALLS.iter().find(|d| d.name == *name).unwrap();
        let tabled = match arch {
            TargetArch::x86_64 => denied.x86_64,
            _ => denied.aarch64,
        };
        let number: i64 = *number;
        assert_eq!(tabled, Some(number), "{name}");
    }
    assert_eq!(
        DENIED_CALLS.len(),
        expected.len() + usize::from(cfg!(target_arch = "aarch64")) * 2
    );
    let clone3 = match arch {
        TargetArch::x86_64 => CLONE3.x86_64,
        _ => CLONE3.aarch64,
    };
    assert_eq!(clone3, Some(libc::SYS_clone3));
}

/// The documented table (SANDBOX.md §5.3 and `docs/PROTOCOL.md`): every call of the
/// containment and host-name groups, by name.
#[test]
fn containment_groups_match_the_documented_table() {
    let names = |group: Group| -> Vec<&str> {
        DENIED_CALLS
            .iter()
            .filter(|d| d.group == group)
            .map(|d| d.name)
            .collect()
    };
    assert_eq!(
        names(Group::Containment),
        [
            "keyctl",
            "add_key",
            "request_key",
            "mount",
            "umount2",
            "pivot_root",
            "move_mount",
            "open_tree",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "mount_setattr",
            "setns",
            "unshare",
            "syslog",
            "acct",
            "quotactl",
            "userfaultfd",
            "settimeofday",
            "clock_settime",
            "clock_adjtime",
            "adjtimex",
            "vhangup",
            "pidfd_getfd",
            "kcmp",
            "fanotify_init",
            "name_to_handle_at",
            "clone",
        ]
    );
    assert_eq!(names(Group::HostName), ["sethostname", "setdomainname"]);
    let clone = DENIED_CALLS.iter().find(|d| d.name == "clone").unwrap();
    assert_eq!(clone.condition, Condition::NewUserNamespace);
}

#[test]
fn host_names_are_denied_only_without_a_private_uts_namespace() {
    for arch in [TargetArch::x86_64, TargetArch::aarch64] {
        let host_name = column(arch, &[Group::HostName]);
        assert_eq!(host_name.len(), 2);
        let shared: BTreeSet<i64> = rules(arch, scope(false, 7, false)).into_keys().collect();
        let private: BTreeSet<i64> = rules(arch, scope(false, 7, true)).into_keys().collect();
        let expected: BTreeSet<i64> = host_name
            .iter()
            .flat_map(|n| match arch {
                TargetArch::x86_64 => vec![*n, n | X32_SYSCALL_BIT],
                _ => vec![*n],
            })
            .collect();
        let difference: BTreeSet<i64> = shared.difference(&private).copied().collect();
        assert_eq!(difference, expected);
        assert!(private.is_subset(&shared));
    }
}

#[test]
fn clone3_is_answered_with_enosys() {
    assert_eq!(
        clone3_numbers(TargetArch::x86_64),
        [435, 435 | X32_SYSCALL_BIT]
    );
    assert_eq!(clone3_numbers(TargetArch::aarch64), [435]);
    for arch in [TargetArch::x86_64, TargetArch::aarch64] {
        assert!(!rules(arch, scope(true, 1, false)).contains_key(&435));
        let program = compile(arch, scope(true, 1, false)).unwrap();
        let audit = audit_arch(arch).unwrap();
        for number in clone3_numbers(arch) {
            assert_eq!(
                bpf::run(&program, audit, number as u32, 0),
                bpf::ret_errno(libc::ENOSYS)
            );
        }
    }
}

#[test]
fn aarch64_groups_follow_the_abi_and_the_network() {
    let arch = TargetArch::aarch64;
    let always = column(
        arch,
        &[Group::Inspection, Group::Kernel, Group::Containment],
    );
    assert_eq!(
        denied(arch, true, 7),
        &always | &column(arch, &[Group::Network])
    );
    assert_eq!(denied(arch, false, 7), always);
    assert_eq!(
        denied(arch, false, 2),
        &always | &column(arch, &[Group::Truncate])
    );
    // No port I/O calls on aarch64; 29 containment calls.
    assert_eq!(always.len(), 17 + 29);
}

#[test]
fn x86_64_adds_x32_aliases_and_port_io() {
    let arch = TargetArch::x86_64;
    let native = column(
        arch,
        &[
            Group::Network,
            Group::Inspection,
            Group::Kernel,
            Group::Containment,
        ],
    );
    let x32: BTreeSet<i64> = native.iter().map(|n| n | X32_SYSCALL_BIT).collect();
    let x32_only: BTreeSet<i64> = [521, 528, 537, 538, 539, 540, 541, 542]
        .into_iter()
        .map(|n| n | X32_SYSCALL_BIT)
        .collect();
    let expected = &(&native | &x32) | &x32_only;
    assert_eq!(denied(arch, true, 7), expected);
    assert!(expected.contains(&172) && expected.contains(&173));
    let truncate = denied(arch, true, 2);
    assert!(truncate.contains(&76) && truncate.contains(&(76 | X32_SYSCALL_BIT)));
    assert!(!denied(arch, true, 3).contains(&76));
}

#[test]
fn only_socket_calls_and_clone_are_conditional() {
    for (number, condition) in rules(TargetArch::x86_64, scope(true, 7, false)) {
        let conditional = [41, 53, 56].contains(&(number & !X32_SYSCALL_BIT));
        assert_eq!(condition != Condition::Always, conditional, "{number}");
    }
}

#[test]
fn both_architectures_compile() {
    for arch in [TargetArch::x86_64, TargetArch::aarch64] {
        assert!(compile(arch, scope(true, 1, false)).unwrap().len() > 40);
    }
}

/// The compiled program does what the rule set says, for every number of both
/// architectures, and stays compact (about one instruction per number).
#[test]
fn the_program_decides_every_rule() {
    for arch in [TargetArch::x86_64, TargetArch::aarch64] {
        let scope = scope(true, 2, false);
        let program = compile(arch, scope).unwrap();
        let audit = audit_arch(arch).unwrap();
        let rules = rules(arch, scope);
        let eperm = bpf::ret_errno(libc::EPERM);
        for (number, condition) in &rules {
            let number = *number as u32;
            match condition {
                Condition::Always => assert_eq!(bpf::run(&program, audit, number, 0), eperm),
                Condition::UnlessUnixStream => {
                    let run = |domain, kind| bpf::run_with(&program, audit, number, [domain, kind]);
                    assert_eq!(run(2, 1), eperm);
                    assert_eq!(run(1, 1), bpf::RET_ALLOW);
                    assert_eq!(run(1, 5), bpf::RET_ALLOW);
                    assert_eq!(run(1, 2), eperm);
                    assert_eq!(run(1, 3), eperm);
                }
                Condition::NewUserNamespace => {
                    let flag = libc::CLONE_NEWUSER as u64;
                    assert_eq!(bpf::run(&program, audit, number, flag), eperm);
                    assert_eq!(bpf::run(&program, audit, number, 17), bpf::RET_ALLOW);
                }
                Condition::UnlessInet => unreachable!("only in the managed network's filter"),
            }
        }
        for number in 0..460u32 {
            if !rules.contains_key(&i64::from(number)) && number != 435 {
                assert_eq!(
                    bpf::run(&program, audit, number, 0),
                    bpf::RET_ALLOW,
                    "{number}"
                );
            }
        }
        assert_eq!(bpf::run(&program, 0x4000_0003, 0, 0), bpf::RET_KILL_PROCESS);
        // One instruction a number, seven for each conditional socket rule, the head and
        // the returns.
        assert!(
            program.len() < rules.len() + 60,
            "{} instructions",
            program.len()
        );
    }
}

#[test]
fn the_managed_network_allows_ip_sockets_and_no_unix_socket() {
    let arch = TargetArch::x86_64;
    let managed = FilterScope {
        network: NetworkFilter::Managed,
        landlock_abi: 7,
        private_uts: true,
    };
    let rules = rules(arch, managed);
    assert_eq!(rules.get(&41), Some(&Condition::UnlessInet), "socket");
    assert_eq!(
        rules.get(&53),
        Some(&Condition::UnlessUnixStream),
        "socketpair"
    );
    for call in ["connect", "bind", "sendto", "setsockopt"] {
        let number = DENIED_CALLS
            .iter()
            .find(|d| d.name == call)
            .unwrap()
            .x86_64
            .unwrap();
        assert!(
            !rules.contains_key(&number),
            "{call} is needed to reach the proxy"
        );
    }
    let program = compile(arch, managed).unwrap();
    let inet = libc::AF_INET as u64;
    let inet6 = libc::AF_INET6 as u64;
    let unix = libc::AF_UNIX as u64;
    let netlink = libc::AF_NETLINK as u64;
    let stream = libc::SOCK_STREAM as u64;
    let eperm = bpf::ret_errno(libc::EPERM);
    let audit = audit_arch(arch).unwrap();
    assert_eq!(
        bpf::run_with(&program, audit, 41, [inet, stream]),
        bpf::RET_ALLOW
    );
    assert_eq!(
        bpf::run_with(&program, audit, 41, [inet6, stream]),
        bpf::RET_ALLOW
    );
    assert_eq!(bpf::run_with(&program, audit, 41, [unix, stream]), eperm);
    assert_eq!(bpf::run_with(&program, audit, 41, [netlink, stream]), eperm);
}

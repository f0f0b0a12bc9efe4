use std::collections::BTreeSet;

use super::*;

fn numbers(arch: TargetArch, network_restricted: bool, landlock_abi: i32) -> BTreeSet<i64> {
    rules(
        arch,
        FilterScope {
            network_restricted,
            landlock_abi,
        },
    )
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
}

#[test]
fn aarch64_groups_follow_the_abi_and_the_network() {
    let arch = TargetArch::aarch64;
    let always = column(arch, &[Group::Inspection, Group::Kernel]);
    assert_eq!(
        numbers(arch, true, 7),
        &always | &column(arch, &[Group::Network])
    );
    assert_eq!(numbers(arch, false, 7), always);
    assert_eq!(
        numbers(arch, false, 2),
        &always | &column(arch, &[Group::Truncate])
    );
    // No port I/O calls on aarch64.
    assert_eq!(always.len(), 17);
}

#[test]
fn x86_64_adds_x32_aliases_and_port_io() {
    let arch = TargetArch::x86_64;
    let native = column(arch, &[Group::Network, Group::Inspection, Group::Kernel]);
    let x32: BTreeSet<i64> = native.iter().map(|n| n | X32_SYSCALL_BIT).collect();
    let x32_only: BTreeSet<i64> = [521, 528, 537, 538, 539, 540, 541, 542]
        .into_iter()
        .map(|n| n | X32_SYSCALL_BIT)
        .collect();
    let expected = &(&native | &x32) | &x32_only;
    assert_eq!(numbers(arch, true, 7), expected);
    assert!(expected.contains(&172) && expected.contains(&173));
    let truncate = numbers(arch, true, 2);
    assert!(truncate.contains(&76) && truncate.contains(&(76 | X32_SYSCALL_BIT)));
    assert!(!numbers(arch, true, 3).contains(&76));
}

#[test]
fn only_socket_calls_are_conditional() {
    for (number, chain) in rules(
        TargetArch::x86_64,
        FilterScope {
            network_restricted: true,
            landlock_abi: 7,
        },
    ) {
        let conditional = [41, 53].contains(&(number & !X32_SYSCALL_BIT));
        assert_eq!(chain.len(), usize::from(conditional), "{number}");
    }
}

#[test]
fn both_architectures_compile() {
    for arch in [TargetArch::x86_64, TargetArch::aarch64] {
        let scope = FilterScope {
            network_restricted: true,
            landlock_abi: 1,
        };
        assert!(compile(arch, scope).unwrap().len() > 40);
    }
}

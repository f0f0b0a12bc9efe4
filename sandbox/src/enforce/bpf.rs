//! The seccomp program of a deny list, in classic BPF: one comparison per system call
//! number, shared return instructions, native and x32 numbers in separate chains.
//!
//! seccompiler spends five instructions on every unconditional rule and lays all of them out
//! in one chain. The kernel converts and JIT-compiles the whole program when a filter is
//! installed, and runs it once per system call number to fill its action cache, so the
//! install cost grows with the program's length; with the containment group the
//! seccompiler program grew to ~700 instructions and made every fs helper ~0.2 ms slower.
//! This layout needs about one instruction per number, and a native call never walks the
//! x32 chain.
//!
//! ```text
//! load arch; arch == expected ? continue : kill process
//! load nr;   nr >= 0x4000_0000 ? goto x32 : continue
//! (native chain)  nr == n ? goto <verdict> : next …   allow
//! x32: (x32 chain)                                     allow
//! allow; errno e1; errno e2; …
//! ```
//!
//! Conditional rules load argument 0 (its low 32 bits: the socket domain is an `int`, and
//! `clone` only uses the low half of its flags), and for sockets argument 1 (the type), and
//! decide between allow and the errno.

use seccompiler::{sock_filter, BpfProgram};

/// Bit that marks an x32 system call number on x86_64.
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// When a denied number matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Condition {
    Always,
    /// Unless argument 0 (the socket domain, as a 32-bit value) is `AF_UNIX` and argument
    /// 1 (the type, without its flags) is `SOCK_STREAM` or `SOCK_SEQPACKET`. UNIX datagram
    /// sockets (and `SOCK_RAW`, which the kernel turns into one) can address any bound
    /// socket by path with `sendmsg`, which no filter can read; the other two cannot.
    UnlessUnixStream,
    /// Argument 0 (`clone`'s flags) contains `CLONE_NEWUSER`.
    NewUserNamespace,
    /// Unless argument 0 (the socket domain) is `AF_INET` or `AF_INET6`: the managed
    /// network, whose network namespace holds only loopback and the proxy's listeners, lets
    /// a process open IP sockets there and no UNIX socket at all (a UNIX socket reaches the
    /// host's sockets by path, whatever the namespace).
    UnlessInet,
}

/// One denied number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rule {
    pub number: u32,
    pub condition: Condition,
    /// The errno the call fails with.
    pub errno: i32,
}

// Classic BPF opcodes (linux/bpf_common.h): class | size or operation | source.
/// `BPF_LD | BPF_W | BPF_ABS`.
pub(crate) const LD_W_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
pub(crate) const JEQ_K: u16 = 0x15;
/// `BPF_JMP | BPF_JGE | BPF_K`.
pub(crate) const JGE_K: u16 = 0x35;
/// `BPF_ALU | BPF_AND | BPF_K`.
pub(crate) const AND_K: u16 = 0x54;
/// `BPF_RET | BPF_K`.
pub(crate) const RET_K: u16 = 0x06;

// Offsets in `struct seccomp_data`.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;
/// The low 32 bits of argument 0 (both supported architectures are little-endian).
const ARG0_LOW_OFFSET: u32 = 16;
/// The low 32 bits of argument 1.
const ARG1_LOW_OFFSET: u32 = 24;
/// `SOCK_TYPE_MASK`: the socket type without `SOCK_NONBLOCK`/`SOCK_CLOEXEC`.
const SOCK_TYPE_MASK: u32 = 0xf;

pub(crate) const RET_KILL_PROCESS: u32 = 0x8000_0000;
pub(crate) const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;

/// The return value that fails a call with `errno`.
pub(crate) fn ret_errno(errno: i32) -> u32 {
    RET_ERRNO | (errno as u32 & 0xffff)
}

/// Where a jump goes, resolved once the layout is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// The next instruction.
    Next,
    /// `n` instructions further than the next one.
    Skip(u8),
    /// The x32 chain.
    X32,
    Allow,
    Errno(i32),
}

#[derive(Debug, Clone, Copy)]
enum Insn {
    Stmt(u16, u32),
    Jump(u16, u32, Target, Target),
    /// Start of the x32 chain (emits nothing).
    X32Label,
}

/// The program for `rules` on the architecture with audit value `audit_arch`.
pub(crate) fn program(audit_arch: u32, rules: &[Rule]) -> Result<BpfProgram, String> {
    let mut insns = vec![
        Insn::Stmt(LD_W_ABS, ARCH_OFFSET),
        Insn::Jump(JEQ_K, audit_arch, Target::Skip(1), Target::Next),
        Insn::Stmt(RET_K, RET_KILL_PROCESS),
        Insn::Stmt(LD_W_ABS, NR_OFFSET),
    ];
    let (x32, native): (Vec<&Rule>, Vec<&Rule>) =
        rules.iter().partition(|r| r.number & X32_SYSCALL_BIT != 0);
    if !x32.is_empty() {
        insns.push(Insn::Jump(
            JGE_K,
            X32_SYSCALL_BIT,
            Target::X32,
            Target::Next,
        ));
    }
    for rule in &native {
        push_rule(&mut insns, rule);
    }
    insns.push(Insn::Stmt(RET_K, RET_ALLOW));
    if !x32.is_empty() {
        insns.push(Insn::X32Label);
        for rule in &x32 {
            push_rule(&mut insns, rule);
        }
        insns.push(Insn::Stmt(RET_K, RET_ALLOW));
    }
    let mut errnos: Vec<i32> = rules.iter().map(|r| r.errno).collect();
    errnos.sort_unstable();
    errnos.dedup();
    resolve(&insns, &errnos)
}

fn push_rule(insns: &mut Vec<Insn>, rule: &Rule) {
    let deny = Target::Errno(rule.errno);
    match rule.condition {
        Condition::Always => insns.push(Insn::Jump(JEQ_K, rule.number, deny, Target::Next)),
        Condition::UnlessUnixStream => {
            insns.push(Insn::Jump(
                JEQ_K,
                rule.number,
                Target::Next,
                Target::Skip(6),
            ));
            insns.push(Insn::Stmt(LD_W_ABS, ARG0_LOW_OFFSET));
            insns.push(Insn::Jump(JEQ_K, libc::AF_UNIX as u32, Target::Next, deny));
            insns.push(Insn::Stmt(LD_W_ABS, ARG1_LOW_OFFSET));
            insns.push(Insn::Stmt(AND_K, SOCK_TYPE_MASK));
            let stream = libc::SOCK_STREAM as u32;
            insns.push(Insn::Jump(JEQ_K, stream, Target::Allow, Target::Next));
            let seqpacket = libc::SOCK_SEQPACKET as u32;
            insns.push(Insn::Jump(JEQ_K, seqpacket, Target::Allow, deny));
        }
        Condition::UnlessInet => {
            insns.push(Insn::Jump(
                JEQ_K,
                rule.number,
                Target::Next,
                Target::Skip(3),
            ));
            insns.push(Insn::Stmt(LD_W_ABS, ARG0_LOW_OFFSET));
            insns.push(Insn::Jump(
                JEQ_K,
                libc::AF_INET as u32,
                Target::Allow,
                Target::Next,
            ));
            insns.push(Insn::Jump(
                JEQ_K,
                libc::AF_INET6 as u32,
                Target::Allow,
                deny,
            ));
        }
        Condition::NewUserNamespace => {
            let flag = libc::CLONE_NEWUSER as u32;
            insns.push(Insn::Jump(
                JEQ_K,
                rule.number,
                Target::Next,
                Target::Skip(3),
            ));
            insns.push(Insn::Stmt(LD_W_ABS, ARG0_LOW_OFFSET));
            insns.push(Insn::Stmt(AND_K, flag));
            insns.push(Insn::Jump(JEQ_K, flag, deny, Target::Allow));
        }
    }
}

/// Lays out `insns` followed by `allow` and one return per errno, and turns targets into
/// relative jumps (at most 255 instructions forward, as classic BPF allows).
fn resolve(insns: &[Insn], errnos: &[i32]) -> Result<BpfProgram, String> {
    // Positions of emitted instructions.
    let mut position = Vec::with_capacity(insns.len());
    let mut x32_at = None;
    let mut next = 0usize;
    for insn in insns {
        position.push(next);
        match insn {
            Insn::X32Label => x32_at = Some(next),
            _ => next += 1,
        }
    }
    let allow_at = next;
    let errno_at = |errno: i32| {
        errnos
            .iter()
            .position(|e| *e == errno)
            .map(|i| allow_at + 1 + i)
    };
    let offset = |from: usize, target: Target| -> Result<u8, String> {
        let to = match target {
            Target::Next => from + 1,
            Target::Skip(n) => from + 1 + usize::from(n),
            Target::X32 => x32_at.ok_or("no x32 chain")?,
            Target::Allow => allow_at,
            Target::Errno(errno) => errno_at(errno).ok_or("unknown errno")?,
        };
        u8::try_from(to - from - 1)
            .map_err(|_| "seccomp jump longer than 255 instructions".to_owned())
    };
    let mut program = BpfProgram::with_capacity(next + 1 + errnos.len());
    for (insn, at) in insns.iter().zip(position) {
        match *insn {
            Insn::Stmt(code, k) => program.push(sock_filter {
                code,
                jt: 0,
                jf: 0,
                k,
            }),
            Insn::Jump(code, k, jt, jf) => program.push(sock_filter {
                code,
                jt: offset(at, jt)?,
                jf: offset(at, jf)?,
                k,
            }),
            Insn::X32Label => {}
        }
    }
    program.push(sock_filter {
        code: RET_K,
        jt: 0,
        jf: 0,
        k: RET_ALLOW,
    });
    for errno in errnos {
        program.push(sock_filter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: ret_errno(*errno),
        });
    }
    Ok(program)
}

/// Runs `program` as the kernel would on one system call: the returned action. For tests.
#[cfg(test)]
pub(crate) fn run(program: &BpfProgram, arch: u32, nr: u32, arg0: u64) -> u32 {
    run_with(program, arch, nr, [arg0, 0])
}

/// [`run`] with the first two arguments.
#[cfg(test)]
pub(crate) fn run_with(program: &BpfProgram, arch: u32, nr: u32, args: [u64; 2]) -> u32 {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_ne_bytes());
    data[4..8].copy_from_slice(&arch.to_ne_bytes());
    data[16..24].copy_from_slice(&args[0].to_ne_bytes());
    data[24..32].copy_from_slice(&args[1].to_ne_bytes());
    let mut a: u32 = 0;
    let mut pc = 0usize;
    loop {
        let insn = &program[pc];
        match insn.code {
            LD_W_ABS => {
                let at = insn.k as usize;
                a = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                pc += 1;
            }
            AND_K => {
                a &= insn.k;
                pc += 1;
            }
            JEQ_K | JGE_K => {
                let taken = if insn.code == JEQ_K {
                    a == insn.k
                } else {
                    a >= insn.k
                };
                pc += 1 + usize::from(if taken { insn.jt } else { insn.jf });
            }
            RET_K => return insn.k,
            other => panic!("unexpected opcode {other:#x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARCH: u32 = 0xc000_003e;

    fn rules() -> Vec<Rule> {
        let rule = |number, condition| Rule {
            number,
            condition,
            errno: libc::EPERM,
        };
        vec![
            rule(101, Condition::Always),
            rule(41, Condition::UnlessUnixStream),
            rule(56, Condition::NewUserNamespace),
            Rule {
                number: 435,
                condition: Condition::Always,
                errno: libc::ENOSYS,
            },
            rule(X32_SYSCALL_BIT | 101, Condition::Always),
            rule(X32_SYSCALL_BIT | 41, Condition::UnlessUnixStream),
        ]
    }

    #[test]
    fn every_rule_decides_as_written() {
        let program = program(ARCH, &rules()).unwrap();
        let eperm = ret_errno(libc::EPERM);
        let x32 = X32_SYSCALL_BIT;
        assert_eq!(run(&program, ARCH, 101, 0), eperm);
        assert_eq!(run(&program, ARCH, 102, 0), RET_ALLOW);
        let unix = libc::AF_UNIX as u64;
        let stream = libc::SOCK_STREAM as u64;
        let seqpacket = libc::SOCK_SEQPACKET as u64;
        let dgram = libc::SOCK_DGRAM as u64;
        let flags = (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u64;
        assert_eq!(run_with(&program, ARCH, 41, [unix, stream]), RET_ALLOW);
        assert_eq!(
            run_with(&program, ARCH, 41, [unix, seqpacket | flags]),
            RET_ALLOW
        );
        assert_eq!(run_with(&program, ARCH, 41, [unix, dgram]), eperm);
        assert_eq!(run_with(&program, ARCH, 41, [unix, dgram | flags]), eperm);
        assert_eq!(
            run_with(&program, ARCH, 41, [unix, libc::SOCK_RAW as u64]),
            eperm
        );
        assert_eq!(
            run_with(&program, ARCH, 41, [libc::AF_INET as u64, stream]),
            eperm
        );
        // Only the low 32 bits of the domain and the type count.
        assert_eq!(
            run_with(&program, ARCH, 41, [(1 << 32) | 1, (1 << 32) | 1]),
            RET_ALLOW
        );
        let newuser = libc::CLONE_NEWUSER as u64;
        assert_eq!(run(&program, ARCH, 56, newuser | 17), eperm);
        assert_eq!(run(&program, ARCH, 56, 17), RET_ALLOW);
        assert_eq!(run(&program, ARCH, 435, 0), ret_errno(libc::ENOSYS));
        assert_eq!(run(&program, ARCH, x32 | 101, 0), eperm);
        assert_eq!(run(&program, ARCH, x32 | 102, 0), RET_ALLOW);
        assert_eq!(run_with(&program, ARCH, x32 | 41, [2, stream]), eperm);
        assert_eq!(run_with(&program, ARCH, x32 | 41, [1, stream]), RET_ALLOW);
        assert_eq!(run_with(&program, ARCH, x32 | 41, [1, dgram]), eperm);
        assert_eq!(run(&program, ARCH, x32 | 56, newuser), RET_ALLOW);
        assert_eq!(run(&program, 0x4000_0003, 101, 0), RET_KILL_PROCESS);
    }

    #[test]
    fn about_one_instruction_per_number() {
        let program = program(ARCH, &rules()).unwrap();
        // 4 head, 1 x32 branch, 1+7+4+1 native, 1 allow, 1+7 x32, 1 allow, 2 errnos.
        assert_eq!(program.len(), 31);
        let without_x32: Vec<Rule> = rules()
            .into_iter()
            .filter(|r| r.number & X32_SYSCALL_BIT == 0)
            .collect();
        assert_eq!(super::program(ARCH, &without_x32).unwrap().len(), 21);
    }

    #[test]
    fn jumps_too_long_for_classic_bpf_are_refused() {
        let many: Vec<Rule> = (0..300)
            .map(|number| Rule {
                number,
                condition: Condition::Always,
                errno: libc::EPERM,
            })
            .collect();
        assert!(program(ARCH, &many).is_err());
    }
}

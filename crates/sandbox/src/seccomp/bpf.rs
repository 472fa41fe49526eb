//! A small classic-BPF interpreter for the tests: it runs the compiled programs on a
//! `seccomp_data` made up of a call number, an architecture and six arguments, and stacks them by
//! the kernel's rules. Cheap and exhaustive; the kernel tests (`kernel_tests.rs`) confirm it.

use seccompiler::{sock_filter, BpfProgram};

#[cfg(target_arch = "x86_64")]
pub(super) const NATIVE_AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
pub(super) const NATIVE_AUDIT_ARCH: u32 = 0xc000_00b7;
pub(super) const AUDIT_ARCH_I386: u32 = 0x4000_0003;

pub(super) const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
pub(super) const KILL_PROCESS: u32 = libc::SECCOMP_RET_KILL_PROCESS;
pub(super) const fn errno_ret(errno: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | errno as u32
}

fn run_bpf(program: &[sock_filter], nr: i64, arch: u32, args: [u64; 6]) -> u32 {
    let word = |off: u32| -> u32 {
        match off {
            0 => nr as u32,
            4 => arch,
            8 | 12 => 0, // instruction pointer
            16..=63 => {
                let arg = args[((off - 16) / 8) as usize];
                // Little-endian: the low half comes first.
                if off.is_multiple_of(8) {
                    arg as u32
                } else {
                    (arg >> 32) as u32
                }
            }
            _ => panic!("load outside seccomp_data at {off}"),
        }
    };
    let (mut pc, mut acc) = (0usize, 0u32);
    loop {
        let ins = &program[pc];
        pc += 1;
        let cond = |taken: bool| {
            if taken {
                ins.jt as usize
            } else {
                ins.jf as usize
            }
        };
        match ins.code {
            0x20 => acc = word(ins.k),        // ld [k]
            0x54 => acc &= ins.k,             // and #k
            0x05 => pc += ins.k as usize,     // ja
            0x15 => pc += cond(acc == ins.k), // jeq #k
            0x25 => pc += cond(acc > ins.k),  // jgt #k
            0x35 => pc += cond(acc >= ins.k), // jge #k
            0x06 => return ins.k,             // ret #k
            code => panic!("unexpected BPF opcode {code:#x}"),
        }
    }
}

/// The kernel's `seccomp_run_filters`: newest filter first, keep the first strictly more
/// precedent action (`ACTION_ONLY` compared as signed).
pub(super) fn decide(programs: &[BpfProgram], nr: i64, arch: u32, args: [u64; 6]) -> u32 {
    let action = |ret: u32| (ret & libc::SECCOMP_RET_ACTION_FULL) as i32;
    let mut ret = ALLOW;
    for program in programs.iter().rev() {
        let cur = run_bpf(program, nr, arch, args);
        if action(cur) < action(ret) {
            ret = cur;
        }
    }
    ret
}

/// Instructions `run_bpf` executes for `nr` on the native architecture.
pub(super) fn steps_to_decide(program: &[sock_filter], nr: i64) -> usize {
    let (mut pc, mut acc, mut steps) = (0usize, 0u32, 0);
    loop {
        let ins = &program[pc];
        pc += 1;
        steps += 1;
        let jump = |taken: bool| if taken { ins.jt } else { ins.jf } as usize;
        match ins.code {
            0x20 => {
                acc = if ins.k == 4 {
                    NATIVE_AUDIT_ARCH
                } else if ins.k == 0 {
                    nr as u32
                } else {
                    0
                }
            }
            0x54 => acc &= ins.k,
            0x05 => pc += ins.k as usize,
            0x15 => pc += jump(acc == ins.k),
            0x25 => pc += jump(acc > ins.k),
            0x35 => pc += jump(acc >= ins.k),
            0x06 => return steps,
            code => panic!("unexpected BPF opcode {code:#x}"),
        }
    }
}

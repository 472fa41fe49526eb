//! The seccomp policy for the untrusted payload: an allow-list of system calls, kept as data.
//!
//! Every entry of [`allowed`] and [`denied`] carries a `reason` naming who needs the call (or why
//! it is refused), so the policy can be reviewed and tested as a table. [`build`] turns the tables
//! into BPF programs without side effects; [`install`] loads them on the calling thread as the
//! very last step before `execve` of the payload.
//!
//! # The filters
//!
//! 1. The allow-list. Anything not listed fails with `EPERM`, the answer a program gets for any
//!    other permission problem, so runtimes degrade instead of crashing. A few entries inspect
//!    their arguments ([`ArgRule`]).
//! 2. One filter per errno other than `EPERM` found in [`denied`], [`no_ops`] and the argument
//!    rules: `clone3` fails with `ENOSYS` so that glibc (pthread_create, posix_spawn, fork) falls
//!    back to `clone`, whose flags live in a register the filter can inspect (`clone3` takes
//!    them in memory); a socket of an allowed family and type but another protocol (MPTCP,
//!    UDP-Lite, SCTP, ICMP) fails with `EPROTONOSUPPORT`, as on a kernel without that protocol,
//!    which is what programs that try one first fall back on; and the [`no_ops`] (`sync`,
//!    `syncfs`) get "errno" 0: the caller sees success and the kernel never runs the call.
//!
//! When several filters are stacked the kernel runs all of them and keeps the action of highest
//! precedence (`KILL` > `TRAP` > `ERRNO` > ... > `ALLOW`); between equal actions the filter
//! installed last wins, errno included. So for `clone3` the allow-list says `ERRNO(EPERM)`, the
//! later filter says `ERRNO(ENOSYS)` and the caller sees `ENOSYS`; for everything else the later
//! filter says `ALLOW` and the allow-list decides. The tests check this ordering on the running
//! kernel. Loading the second filter is itself a `seccomp` call that has to pass the first, which
//! is why `seccomp` is on the allow-list (a filter can only ever add restrictions).
//!
//! # Other ABIs
//!
//! Each filter starts with seccompiler's architecture check: a call made through another ABI of
//! the same CPU (i386 via `int 0x80` on x86_64, whose numbers mean different calls) kills the
//! process with `SIGSYS`. The x32 ABI shares `AUDIT_ARCH_X86_64` but sets bit 30 of the number
//! (`nr | 0x4000_0000`); no listed number has that bit, so every x32 call fails with `EPERM`.
//!
//! # Architectures
//!
//! x86_64 is the target and the one tested. aarch64 compiles: calls that only exist on x86_64
//! (`open`, `stat`, `fork`, `arch_prctl`, ...) are in separate tables gated on the architecture.
//! Other architectures are refused at compile time.

mod compile;
mod error;
mod policy;

#[cfg(test)]
mod bpf;
#[cfg(test)]
mod kernel_tests;
#[cfg(test)]
mod tests;

pub use compile::{build, build_pid1};
pub use error::SeccompError;
pub use policy::{
    allowed, denied, no_ops, pid1_allowed, Allowed, ArgRule, Denied, NoOp, NAMESPACE_FLAGS,
    SOCKET_PROTOCOLS,
};

use seccompiler::BpfProgram;

/// Installs the filters on the calling thread.
///
/// The caller has already set `PR_SET_NO_NEW_PRIVS` (seccompiler sets it again, harmlessly) and
/// is a single-threaded process about to `execve` the payload: this must be the last step,
/// because from here on only allowed calls work. On error some filters may already be in force;
/// the caller must then exit instead of running the payload.
pub fn install() -> Result<(), SeccompError> {
    match PREBUILT.get() {
        Some(programs) => install_programs(programs),
        None => install_programs(&build()?),
    }
}

/// Programs compiled once, before the helper forks: pid 1 and the program then only load them,
/// instead of each compiling the same list on the sandbox's start-up path.
static PREBUILT: std::sync::OnceLock<Vec<BpfProgram>> = std::sync::OnceLock::new();

/// Installs pid 1's own filter ([`build_pid1`]) on the calling thread: pid 1's last step of
/// confinement, after which it only reaps, reads, reports and exits.
pub fn install_pid1() -> Result<(), SeccompError> {
    match PREBUILT_PID1.get() {
        Some(program) => install_programs(std::slice::from_ref(program)),
        None => install_programs(&[build_pid1()?]),
    }
}

static PREBUILT_PID1: std::sync::OnceLock<BpfProgram> = std::sync::OnceLock::new();

/// Compiles the filters for later [`install`] and [`install_pid1`] calls in this process and
/// its forks. A failure is left for the install to report.
pub(crate) fn prebuild() {
    if PREBUILT.get().is_none() {
        if let Ok(p) = build() {
            let _ = PREBUILT.set(p);
        }
    }
    if PREBUILT_PID1.get().is_none() {
        if let Ok(p) = build_pid1() {
            let _ = PREBUILT_PID1.set(p);
        }
    }
}

/// Loads already built programs in order (see [`build`]).
pub(crate) fn install_programs(programs: &[BpfProgram]) -> Result<(), SeccompError> {
    let count = programs.len();
    for (index, program) in programs.iter().enumerate() {
        seccompiler::apply_filter(program).map_err(|source| SeccompError::Install {
            index,
            count,
            source,
        })?;
    }
    Ok(())
}

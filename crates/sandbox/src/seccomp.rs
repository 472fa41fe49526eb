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

use std::collections::{BTreeMap, BTreeSet};

use seccompiler::{
    BackendError, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

#[cfg(target_arch = "x86_64")]
const TARGET_ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const TARGET_ARCH: TargetArch = TargetArch::aarch64;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the seccomp policy is written for x86_64 and aarch64 only");

/// One entry of the policy: data, with a reason naming who needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    /// The call's name without the `SYS_` prefix, as in `libc::SYS_<name>`.
    pub name: &'static str,
    /// The call's number on the build architecture.
    pub nr: i64,
    /// Which arguments are accepted.
    pub args: ArgRule,
    /// Who needs it.
    pub reason: &'static str,
}

/// Which arguments an allowed call accepts; other arguments get `EPERM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgRule {
    /// Any arguments.
    Any,
    /// `clone` without any `CLONE_NEW*` flag in arg0 (see [`NAMESPACE_FLAGS`]).
    CloneWithoutNamespaceFlags,
    /// `socket`/`socketpair`: `AF_UNIX` with any type and protocol 0, or `AF_INET`/`AF_INET6`
    /// with `SOCK_STREAM` and protocol 0 or `IPPROTO_TCP`, or `SOCK_DGRAM` and protocol 0 or
    /// `IPPROTO_UDP` (`SOCK_NONBLOCK`/`SOCK_CLOEXEC` allowed). No raw or packet sockets, no
    /// netlink, vsock, `AF_ALG` or any other family (`EPERM`); an allowed family and type with
    /// another protocol — MPTCP, UDP-Lite, SCTP, ICMP echo, each a protocol implementation of its
    /// own that no supported runtime needs — fails with `EPROTONOSUPPORT` ([`SOCKET_PROTOCOLS`]).
    SocketDomains,
    /// `ioctl` with any request except `TIOCSTI` (typing into a terminal another process reads)
    /// and `TIOCLINUX` (console tricks, same effect). The request is compared on its low 32 bits,
    /// as the kernel does (`unsigned int cmd`), so high bits can't smuggle a denied request past.
    IoctlNotTiocsti,
    /// `personality` with `0xffffffff` (query) or `PER_LINUX` (0) only: no `ADDR_NO_RANDOMIZE`,
    /// `READ_IMPLIES_EXEC` and the like.
    PersonalityQueryOrLinux,
}

/// A call answered with success (0) without the kernel running it, with the reason: calls a
/// program may make in passing, whose real effect reaches beyond the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoOp {
    /// The call's name without the `SYS_` prefix, as in `libc::SYS_<name>`.
    pub name: &'static str,
    /// The call's number on the build architecture.
    pub nr: i64,
    /// Why it must not run.
    pub reason: &'static str,
}

/// A call refused on purpose, listed with the reason and the errno the caller sees.
/// Documentation and tests: the allow-list already refuses them (with `EPERM`); entries with
/// another errno get a filter of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denied {
    /// The call's name without the `SYS_` prefix, as in `libc::SYS_<name>`.
    pub name: &'static str,
    /// The call's number on the build architecture.
    pub nr: i64,
    /// The errno the caller gets.
    pub errno: i32,
    /// Why it is refused.
    pub reason: &'static str,
}

/// Errors building or installing the filters.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The policy tables list a call twice.
    #[error("system call {name} is listed twice in the seccomp policy")]
    Duplicate {
        /// The call.
        name: &'static str,
    },
    /// The policy tables both allow and deny (or fake) a call.
    #[error("system call {name} is both allowed and denied in the seccomp policy")]
    AllowedAndDenied {
        /// The call.
        name: &'static str,
    },
    /// A denied entry has an errno the kernel can't return.
    #[error("system call {name} is denied with errno {errno}, outside 1..=4095")]
    BadErrno {
        /// The call.
        name: &'static str,
        /// The errno.
        errno: i32,
    },
    /// An argument condition was rejected by seccompiler.
    #[error("cannot build the argument rule for system call {name}")]
    Rule {
        /// The call.
        name: &'static str,
        /// seccompiler's error.
        #[source]
        source: BackendError,
    },
    /// seccompiler could not compile a filter.
    #[error("cannot compile the {filter} seccomp filter")]
    Compile {
        /// Which filter.
        filter: &'static str,
        /// seccompiler's error.
        #[source]
        source: BackendError,
    },
    /// The kernel refused a filter. Earlier filters may already be in force.
    #[error("cannot install seccomp filter {index} of {count}")]
    Install {
        /// Position of the filter in [`build`]'s output.
        index: usize,
        /// How many filters there are.
        count: usize,
        /// seccompiler's error, with the OS error inside.
        #[source]
        source: seccompiler::Error,
    },
}

/// The errno of everything not allowed.
const DEFAULT_ERRNO: i32 = libc::EPERM;

/// The `clone` flags that create namespaces. `CLONE_NEWTIME` (0x80) sits in the exit-signal byte
/// of `clone`'s flags (the kernel takes it from there only through `clone3`/`unshare`); masking
/// it only refuses exit signals >= 128, which are invalid anyway.
pub const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWTIME) as u64;

/// The kernel's `SOCK_TYPE_MASK`: the socket type without `SOCK_NONBLOCK`/`SOCK_CLOEXEC`.
const SOCK_TYPE_MASK: u64 = 0xf;

/// The socket families, types and protocols [`ArgRule::SocketDomains`] accepts: (family, type,
/// protocols). `None` for the type: any type (the kernel refuses unknown ones itself). Protocol 0
/// is the family's default for the type; the named ones are the same protocol spelt out.
pub const SOCKET_PROTOCOLS: &[(libc::c_int, Option<libc::c_int>, &[libc::c_int])] = &[
    (libc::AF_UNIX, None, &[0]),
    (
        libc::AF_INET,
        Some(libc::SOCK_STREAM),
        &[0, libc::IPPROTO_TCP],
    ),
    (
        libc::AF_INET,
        Some(libc::SOCK_DGRAM),
        &[0, libc::IPPROTO_UDP],
    ),
    (
        libc::AF_INET6,
        Some(libc::SOCK_STREAM),
        &[0, libc::IPPROTO_TCP],
    ),
    (
        libc::AF_INET6,
        Some(libc::SOCK_DGRAM),
        &[0, libc::IPPROTO_UDP],
    ),
];

/// The errno of an allowed socket family and type with a protocol not in [`SOCKET_PROTOCOLS`].
const SOCKET_PROTOCOL_ERRNO: i32 = libc::EPROTONOSUPPORT;

/// An ioctl request as the filter compares it. `libc::Ioctl` is `c_ulong` on glibc and `c_int`
/// on musl, hence a cast that is a no-op on some targets.
#[allow(clippy::unnecessary_cast)]
const fn ioctl_request(request: libc::Ioctl) -> u64 {
    request as u64
}

/// `personality(0xffffffff)` only reports the current persona.
const PERSONALITY_QUERY: u64 = 0xffff_ffff;
/// `PER_LINUX`, the default persona (libc has no constant for it).
const PER_LINUX: u64 = 0;

/// `"SYS_read"` -> `"read"`, at compile time.
const fn sys_name(sys: &'static str) -> &'static str {
    let bytes = sys.as_bytes();
    assert!(
        bytes.len() > 4
            && bytes[0] == b'S'
            && bytes[1] == b'Y'
            && bytes[2] == b'S'
            && bytes[3] == b'_',
        "policy entries name libc::SYS_* constants"
    );
    let (_, rest) = bytes.split_at(4);
    match std::str::from_utf8(rest) {
        Ok(name) => name,
        Err(_) => panic!("syscall names are ASCII"),
    }
}

/// Joins the common and the architecture-specific table into one array, at compile time.
const fn concat<T: Copy, const N: usize>(a: &[T], b: &[T]) -> [T; N] {
    assert!(a.len() + b.len() == N, "array length mismatch");
    let mut out = [a[0]; N];
    let mut i = 0;
    while i < a.len() {
        out[i] = a[i];
        i += 1;
    }
    let mut j = 0;
    while j < b.len() {
        out[a.len() + j] = b[j];
        j += 1;
    }
    out
}

macro_rules! arg_rule {
    () => {
        ArgRule::Any
    };
    ($rule:ident) => {
        ArgRule::$rule
    };
}

/// `allow! { "who: what" => [SYS_a, SYS_b(RuleVariant)]; ... }`
macro_rules! allow {
    ($($reason:literal => [$($sys:ident $(($rule:ident))?),+ $(,)?];)+) => {
        &[$($(
            Allowed {
                name: sys_name(stringify!($sys)),
                nr: libc::$sys,
                args: arg_rule!($($rule)?),
                reason: $reason,
            },
        )+)+]
    };
}

/// `deny! { "why" => ERRNO [SYS_a, SYS_b]; ... }`
macro_rules! deny {
    ($($reason:literal => $errno:ident [$($sys:ident),+ $(,)?];)+) => {
        &[$($(
            Denied {
                name: sys_name(stringify!($sys)),
                nr: libc::$sys,
                errno: libc::$errno,
                reason: $reason,
            },
        )+)+]
    };
}

/// Calls every supported architecture has.
const COMMON_ALLOWED: &[Allowed] = allow! {
    "all programs: reading and writing descriptors" => [
        SYS_read, SYS_write, SYS_readv, SYS_writev, SYS_pread64, SYS_pwrite64, SYS_preadv,
        SYS_pwritev, SYS_preadv2, SYS_pwritev2, SYS_lseek,
    ];
    "coreutils cp, CPython shutil, Node.js fs.copyFile: in-kernel copies" => [
        SYS_sendfile, SYS_copy_file_range, SYS_splice, SYS_tee, SYS_vmsplice,
    ];
    "all programs: opening, closing and duplicating descriptors" => [
        SYS_openat, SYS_openat2, SYS_close, SYS_close_range, SYS_dup, SYS_dup3, SYS_fcntl,
    ];
    "CPython fcntl.flock, pip, sqlite: advisory locks" => [SYS_flock];
    "coreutils ls/stat, CPython os.stat, Node.js fs.stat: file metadata" => [
        SYS_fstat, SYS_newfstatat, SYS_statx, SYS_statfs, SYS_fstatfs, SYS_faccessat,
        SYS_faccessat2, SYS_readlinkat, SYS_getdents64, SYS_getcwd,
    ];
    "coreutils mv/rm/mkdir/ln/touch, CPython os, Node.js fs: changing the file tree" => [
        SYS_mkdirat, SYS_unlinkat, SYS_renameat, SYS_renameat2, SYS_linkat, SYS_symlinkat,
        SYS_truncate, SYS_ftruncate, SYS_fallocate, SYS_utimensat,
    ];
    "coreutils chmod/chown, CPython os.chmod: modes and owners (no capabilities: own files only)" => [
        SYS_fchmod, SYS_fchmodat, SYS_fchown, SYS_fchownat, SYS_umask,
    ];
    "coreutils ls/cp -a, CPython os.*xattr: extended attributes and ACLs" => [
        SYS_getxattr, SYS_lgetxattr, SYS_fgetxattr, SYS_listxattr, SYS_llistxattr,
        SYS_flistxattr, SYS_setxattr, SYS_lsetxattr, SYS_fsetxattr, SYS_removexattr,
        SYS_lremovexattr, SYS_fremovexattr,
    ];
    "CPython os.fsync, sqlite: flushing the program's own files (sync/syncfs: see NO_OPS)" => [
        SYS_fsync, SYS_fdatasync, SYS_sync_file_range,
    ];
    "CPython os.posix_fadvise, coreutils: I/O hints" => [SYS_fadvise64, SYS_readahead];
    "bash cd, CPython os.chdir: working directory" => [SYS_chdir, SYS_fchdir];
    "glibc malloc and ld.so, CPython mmap, V8 and numpy: memory mappings" => [
        SYS_mmap, SYS_munmap, SYS_mprotect, SYS_mremap, SYS_madvise, SYS_brk, SYS_msync,
        SYS_mincore, SYS_mlock, SYS_munlock, SYS_mlock2, SYS_mlockall, SYS_munlockall,
    ];
    "V8 (Node.js), glibc: memory protection keys and sealing" => [
        SYS_pkey_mprotect, SYS_pkey_alloc, SYS_pkey_free, SYS_mseal,
    ];
    "V8 (Node.js), glibc: membarrier for JIT code and thread fences" => [SYS_membarrier];
    "numpy/OpenBLAS, V8 (Node.js): NUMA memory policy of the own process" => [
        SYS_mbind, SYS_set_mempolicy, SYS_get_mempolicy, SYS_set_mempolicy_home_node,
    ];
    "CPython os.memfd_create, Node.js, glibc: anonymous memory files" => [SYS_memfd_create];
    "all programs: starting a program" => [SYS_execve, SYS_execveat];
    "glibc: process and thread start-up and exit" => [
        SYS_exit, SYS_exit_group, SYS_set_tid_address, SYS_set_robust_list,
        SYS_get_robust_list, SYS_rseq, SYS_prctl,
    ];
    "glibc pthread_create, fork, posix_spawn: new tasks, never in new namespaces" => [
        SYS_clone(CloneWithoutNamespaceFlags),
    ];
    "bash, CPython subprocess, Node.js child_process: waiting for children" => [
        SYS_wait4, SYS_waitid,
    ];
    "glibc pthreads, CPython threading, V8: futexes" => [SYS_futex, SYS_futex_waitv];
    "all programs: signals (kill reaches only the sandbox's own PID namespace)" => [
        SYS_rt_sigaction, SYS_rt_sigprocmask, SYS_rt_sigreturn, SYS_rt_sigpending,
        SYS_rt_sigtimedwait, SYS_rt_sigqueueinfo, SYS_rt_tgsigqueueinfo, SYS_rt_sigsuspend,
        SYS_sigaltstack, SYS_kill, SYS_tkill, SYS_tgkill, SYS_restart_syscall,
    ];
    "CPython os.pidfd_open, systemd-style supervisors: pidfds for own children" => [
        SYS_pidfd_open, SYS_pidfd_send_signal,
    ];
    "bash job control, CPython os.setsid/start_new_session: sessions and process groups" => [
        SYS_setsid, SYS_setpgid, SYS_getpgid, SYS_getsid,
    ];
    "all programs: process and user identity" => [
        SYS_getpid, SYS_getppid, SYS_gettid, SYS_getuid, SYS_geteuid, SYS_getgid,
        SYS_getegid, SYS_getresuid, SYS_getresgid, SYS_getgroups,
    ];
    "CPython os.setuid etc., su-like tools: changing ids (no CAP_SETUID: only to own ids)" => [
        SYS_setuid, SYS_setgid, SYS_setreuid, SYS_setregid, SYS_setresuid, SYS_setresgid,
        SYS_setfsuid, SYS_setfsgid, SYS_setgroups,
    ];
    "glibc, CPython os (libcap users): capability sets (query and drop only)" => [
        SYS_capget, SYS_capset,
    ];
    "bash ulimit, CPython resource, Node.js process: limits and accounting" => [
        SYS_getrlimit, SYS_setrlimit, SYS_prlimit64, SYS_getrusage, SYS_times, SYS_sysinfo,
        SYS_uname,
    ];
    "all programs: clocks, sleeps and timers" => [
        SYS_clock_gettime, SYS_clock_getres, SYS_clock_nanosleep, SYS_nanosleep,
        SYS_gettimeofday, SYS_getitimer, SYS_setitimer, SYS_timer_create, SYS_timer_settime,
        SYS_timer_gettime, SYS_timer_getoverrun, SYS_timer_delete,
    ];
    "CPython os.sched_*, OpenBLAS, libuv (Node.js): scheduling and CPU affinity" => [
        SYS_sched_yield, SYS_sched_getaffinity, SYS_sched_setaffinity, SYS_sched_getparam,
        SYS_sched_setparam, SYS_sched_getscheduler, SYS_sched_setscheduler,
        SYS_sched_get_priority_max, SYS_sched_get_priority_min, SYS_sched_rr_get_interval,
        SYS_sched_getattr, SYS_sched_setattr, SYS_getpriority, SYS_setpriority, SYS_getcpu,
        SYS_ioprio_get, SYS_ioprio_set,
    ];
    "libuv (Node.js), CPython selectors/asyncio, bash: waiting on descriptors" => [
        SYS_ppoll, SYS_pselect6, SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_pwait,
        SYS_epoll_pwait2,
    ];
    "libuv (Node.js), CPython: eventfd, timerfd, signalfd and inotify" => [
        SYS_eventfd2, SYS_timerfd_create, SYS_timerfd_settime, SYS_timerfd_gettime,
        SYS_signalfd4, SYS_inotify_init1, SYS_inotify_add_watch, SYS_inotify_rm_watch,
    ];
    "bash pipelines, CPython subprocess, Node.js: pipes" => [SYS_pipe2];
    "CPython socket, Node.js net, multiprocessing: creating sockets (unix and TCP/UDP only)" => [
        SYS_socket(SocketDomains), SYS_socketpair(SocketDomains),
    ];
    "CPython socket, Node.js net, multiprocessing: using sockets" => [
        SYS_bind, SYS_listen, SYS_connect, SYS_accept, SYS_accept4, SYS_getsockname,
        SYS_getpeername, SYS_setsockopt, SYS_getsockopt, SYS_shutdown, SYS_sendto,
        SYS_recvfrom, SYS_sendmsg, SYS_recvmsg, SYS_sendmmsg, SYS_recvmmsg,
    ];
    "all programs: terminal and device control (isatty, FIONREAD, FIONBIO, ...)" => [
        SYS_ioctl(IoctlNotTiocsti),
    ];
    "glibc, CPython platform, setarch: querying the persona" => [
        SYS_personality(PersonalityQueryOrLinux),
    ];
    "glibc, CPython os.urandom, Node.js crypto: randomness" => [SYS_getrandom];
    "CPython sysv_ipc, PostgreSQL-style tools: SysV shared memory, semaphores and queues" => [
        SYS_shmget, SYS_shmat, SYS_shmdt, SYS_shmctl, SYS_semget, SYS_semop, SYS_semtimedop,
        SYS_semctl, SYS_msgget, SYS_msgsnd, SYS_msgrcv, SYS_msgctl,
    ];
    "glibc mq_*, CPython posix_ipc: POSIX message queues" => [
        SYS_mq_open, SYS_mq_unlink, SYS_mq_timedsend, SYS_mq_timedreceive, SYS_mq_notify,
        SYS_mq_getsetattr,
    ];
    "libaio users (databases, fio): Linux native AIO" => [
        SYS_io_setup, SYS_io_destroy, SYS_io_submit, SYS_io_cancel, SYS_io_getevents,
    ];
    "runcell install(): loads the clone3 filter after the allow-list; filters only restrict" => [
        SYS_seccomp,
    ];
    "sandboxing tools inside the payload: Landlock can only restrict the caller" => [
        SYS_landlock_create_ruleset, SYS_landlock_add_rule, SYS_landlock_restrict_self,
    ];
};

/// x86_64's older calls, which aarch64 never had (it has only the `*at` and `*2` forms).
#[cfg(target_arch = "x86_64")]
const ARCH_ALLOWED: &[Allowed] = allow! {
    "all programs (x86_64 legacy forms): opening and duplicating descriptors" => [
        SYS_open, SYS_creat, SYS_dup2,
    ];
    "coreutils, CPython os.stat, Node.js (x86_64 legacy forms): file metadata" => [
        SYS_stat, SYS_lstat, SYS_access, SYS_readlink, SYS_getdents,
    ];
    "coreutils, CPython os, Node.js (x86_64 legacy forms): changing the file tree" => [
        SYS_mkdir, SYS_rmdir, SYS_rename, SYS_link, SYS_unlink, SYS_symlink, SYS_utime,
        SYS_utimes, SYS_futimesat,
    ];
    "coreutils chmod/chown (x86_64 legacy forms): modes and owners" => [
        SYS_chmod, SYS_chown, SYS_lchown, SYS_fchmodat2,
    ];
    "glibc on x86_64: thread pointer (FS base) and CET setup" => [SYS_arch_prctl];
    "bash, CPython os.fork, Node.js child_process (x86_64 legacy forms): new processes" => [
        SYS_fork, SYS_vfork,
    ];
    "all programs (x86_64 legacy forms): signals, alarms and time" => [
        SYS_pause, SYS_alarm, SYS_time,
    ];
    "bash job control (x86_64 legacy form): process group" => [SYS_getpgrp];
    "libuv, CPython select, bash (x86_64 legacy forms): waiting on descriptors" => [
        SYS_poll, SYS_select, SYS_epoll_create, SYS_epoll_wait,
    ];
    "libuv, CPython (x86_64 legacy forms): eventfd, signalfd, inotify and pipes" => [
        SYS_eventfd, SYS_signalfd, SYS_inotify_init, SYS_pipe,
    ];
};
#[cfg(target_arch = "aarch64")]
const ARCH_ALLOWED: &[Allowed] = &[];

static ALLOWED: [Allowed; COMMON_ALLOWED.len() + ARCH_ALLOWED.len()] =
    concat(COMMON_ALLOWED, ARCH_ALLOWED);

/// `no_op! { "why" => [SYS_a, SYS_b]; ... }`
macro_rules! no_op {
    ($($reason:literal => [$($sys:ident),+ $(,)?];)+) => {
        &[$($(
            NoOp {
                name: sys_name(stringify!($sys)),
                nr: libc::$sys,
                reason: $reason,
            },
        )+)+]
    };
}

/// Calls answered with success without running (every supported architecture).
const NO_OPS: &[NoOp] = no_op! {
    "coreutils sync, apt/dpkg, some installers: sync() and syncfs() flush every dirty page of \
     the whole file system (sync: of every one on the host), so any sandbox could stall the \
     host's I/O at will; the workspace and /tmp are tmpfs, which has nothing to flush, and a \
     program's own files are flushed by fsync/fdatasync, which stay allowed" => [
        SYS_sync, SYS_syncfs,
    ];
};

/// Calls refused on purpose (every supported architecture).
const COMMON_DENIED: &[Denied] = deny! {
    "clone3 passes its flags in memory the filter can't read; ENOSYS makes glibc use clone" => ENOSYS [
        SYS_clone3,
    ];
    "mounting changes the sandbox's view of the file system" => EPERM [
        SYS_mount, SYS_umount2, SYS_pivot_root, SYS_move_mount, SYS_open_tree, SYS_fsopen,
        SYS_fsconfig, SYS_fsmount, SYS_fspick, SYS_mount_setattr, SYS_chroot,
    ];
    "new or joined namespaces would undo the sandbox's own (clone is checked by flags)" => EPERM [
        SYS_unshare, SYS_setns,
    ];
    "tracing and reaching into other processes' memory or descriptors" => EPERM [
        SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_process_madvise,
        SYS_kcmp, SYS_pidfd_getfd,
    ];
    "the kernel keyring is not namespaced: keys could leak between sandboxes" => EPERM [
        SYS_keyctl, SYS_add_key, SYS_request_key,
    ];
    "large kernel attack surface that none of the supported runtimes needs" => EPERM [
        SYS_bpf, SYS_perf_event_open, SYS_userfaultfd, SYS_io_uring_setup,
        SYS_io_uring_enter, SYS_io_uring_register, SYS_lookup_dcookie,
    ];
    "loading kernels and modules, rebooting" => EPERM [
        SYS_kexec_load, SYS_kexec_file_load, SYS_init_module, SYS_finit_module,
        SYS_delete_module, SYS_reboot,
    ];
    "host-wide settings: swap, clocks, accounting, quotas, kernel log, names, terminals" => EPERM [
        SYS_swapon, SYS_swapoff, SYS_settimeofday, SYS_clock_settime, SYS_clock_adjtime,
        SYS_adjtimex, SYS_acct, SYS_quotactl, SYS_quotactl_fd, SYS_syslog, SYS_sethostname,
        SYS_setdomainname, SYS_vhangup,
    ];
    "file handles bypass path lookup and so the sandbox's mounts (the 'shocker' escape)" => EPERM [
        SYS_open_by_handle_at, SYS_name_to_handle_at,
    ];
    "no device nodes in the sandbox (this also refuses FIFOs made with mknodat)" => EPERM [
        SYS_mknodat,
    ];
    "fanotify watches whole file systems and hands out descriptors to their files" => EPERM [
        SYS_fanotify_init,
    ];
    "moving other processes' pages between NUMA nodes" => EPERM [
        SYS_move_pages, SYS_migrate_pages,
    ];
};

/// x86_64-only calls refused on purpose.
#[cfg(target_arch = "x86_64")]
const ARCH_DENIED: &[Denied] = deny! {
    "no device nodes in the sandbox (x86_64 legacy form)" => EPERM [SYS_mknod];
    "x86 I/O port access and LDT changes: hardware access and old kernel attack surface" => EPERM [
        SYS_iopl, SYS_ioperm, SYS_modify_ldt,
    ];
    "obsolete: a.out libraries, the removed NFS server interface" => EPERM [
        SYS_uselib, SYS_nfsservctl,
    ];
};
#[cfg(target_arch = "aarch64")]
const ARCH_DENIED: &[Denied] = &[];

static DENIED: [Denied; COMMON_DENIED.len() + ARCH_DENIED.len()] =
    concat(COMMON_DENIED, ARCH_DENIED);

/// The allow-list.
pub fn allowed() -> &'static [Allowed] {
    &ALLOWED
}

/// Explicitly denied calls with reasons (none of them is in [`allowed`]).
pub fn denied() -> &'static [Denied] {
    &DENIED
}

/// Calls answered with success (0) without running, with reasons (in neither table above).
pub fn no_ops() -> &'static [NoOp] {
    NO_OPS
}

fn condition(
    name: &'static str,
    arg: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, SeccompError> {
    SeccompCondition::new(arg, len, op, value).map_err(|source| SeccompError::Rule { name, source })
}

fn rule(
    name: &'static str,
    conditions: Vec<SeccompCondition>,
) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conditions).map_err(|source| SeccompError::Rule { name, source })
}

/// The seccompiler rules for one allowed entry: any rule matching allows the call; an empty list
/// allows it unconditionally.
fn rules_for(entry: &Allowed) -> Result<Vec<SeccompRule>, SeccompError> {
    use SeccompCmpArgLen::{Dword, Qword};
    use SeccompCmpOp::{Eq, MaskedEq, Ne};
    let name = entry.name;
    match entry.args {
        ArgRule::Any => Ok(Vec::new()),
        ArgRule::CloneWithoutNamespaceFlags => Ok(vec![rule(
            name,
            vec![condition(name, 0, Qword, MaskedEq(NAMESPACE_FLAGS), 0)?],
        )?]),
        ArgRule::SocketDomains => {
            let mut rules = Vec::new();
            for &(domain, kind, protocols) in SOCKET_PROTOCOLS {
                for &protocol in protocols {
                    let mut conditions = socket_family_and_type(name, domain, kind)?;
                    conditions.push(condition(name, 2, Dword, Eq, protocol as u64)?);
                    rules.push(rule(name, conditions)?);
                }
            }
            Ok(rules)
        }
        ArgRule::IoctlNotTiocsti => Ok(vec![rule(
            name,
            vec![
                condition(name, 1, Dword, Ne, ioctl_request(libc::TIOCSTI))?,
                condition(name, 1, Dword, Ne, ioctl_request(libc::TIOCLINUX))?,
            ],
        )?]),
        ArgRule::PersonalityQueryOrLinux => Ok(vec![
            rule(
                name,
                vec![condition(name, 0, Dword, Eq, PERSONALITY_QUERY)?],
            )?,
            rule(name, vec![condition(name, 0, Dword, Eq, PER_LINUX)?])?,
        ]),
    }
}

/// Conditions matching one family (arg0) and, if given, one type (arg1, without the flags).
fn socket_family_and_type(
    name: &'static str,
    domain: libc::c_int,
    kind: Option<libc::c_int>,
) -> Result<Vec<SeccompCondition>, SeccompError> {
    use SeccompCmpArgLen::Dword;
    use SeccompCmpOp::{Eq, MaskedEq};
    let mut conditions = vec![condition(name, 0, Dword, Eq, domain as u64)?];
    if let Some(kind) = kind {
        conditions.push(condition(
            name,
            1,
            Dword,
            MaskedEq(SOCK_TYPE_MASK),
            kind as u64,
        )?);
    }
    Ok(conditions)
}

/// The argument patterns of an allowed entry that get an errno other than `EPERM`, as
/// (errno, rules): the allow-list refuses them with `EPERM`, and a later filter corrects that.
fn refusals_for(entry: &Allowed) -> Result<Vec<(i32, Vec<SeccompRule>)>, SeccompError> {
    use SeccompCmpArgLen::Dword;
    use SeccompCmpOp::Ne;
    let name = entry.name;
    match entry.args {
        ArgRule::SocketDomains => {
            let mut rules = Vec::new();
            for &(domain, kind, protocols) in SOCKET_PROTOCOLS {
                let mut conditions = socket_family_and_type(name, domain, kind)?;
                for &protocol in protocols {
                    conditions.push(condition(name, 2, Dword, Ne, protocol as u64)?);
                }
                rules.push(rule(name, conditions)?);
            }
            Ok(vec![(SOCKET_PROTOCOL_ERRNO, rules)])
        }
        ArgRule::Any
        | ArgRule::CloneWithoutNamespaceFlags
        | ArgRule::IoctlNotTiocsti
        | ArgRule::PersonalityQueryOrLinux => Ok(Vec::new()),
    }
}

fn compile(
    filter: &'static str,
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, SeccompError> {
    SeccompFilter::new(rules, mismatch, matched, TARGET_ARCH)
        .and_then(BpfProgram::try_from)
        .map_err(|source| SeccompError::Compile { filter, source })
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_NATIVE: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_NATIVE: u32 = 0xc000_00b7;

/// A binary search over the syscalls allowed whatever their arguments, put in front of
/// seccompiler's program. seccompiler emits one comparison chain in syscall-number order, so a
/// frequent call such as `openat` (257) ran through ~1000 instructions on every call; the
/// search answers those in ~20 and hands everything else (another architecture, the calls with
/// argument rules, the refused ones) to the unchanged program behind it, which starts over
/// with its own architecture check, and which then no longer lists them. The decisions are the
/// same as the full chain's (tested on every number).
fn fast_path(nrs: &[u32]) -> BpfProgram {
    use seccompiler::sock_filter;
    const LD_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const JA: u16 = 0x05; // BPF_JMP | BPF_JA
    const RET: u16 = 0x06; // BPF_RET | BPF_K
    let ins = |code, jt, jf, k| sock_filter { code, jt, jf, k };

    let mut sorted = nrs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    // Jumps to "the rest" are patched once the length is known: (index of the `ja`).
    let mut to_rest = Vec::new();
    let mut out = vec![
        ins(LD_ABS, 0, 0, 4), // seccomp_data.arch
        ins(JEQ, 1, 0, AUDIT_ARCH_NATIVE),
    ];
    to_rest.push(out.len());
    out.push(ins(JA, 0, 0, 0));
    out.push(ins(LD_ABS, 0, 0, 0)); // seccomp_data.nr
    fn tree(
        out: &mut Vec<sock_filter>,
        to_rest: &mut Vec<usize>,
        nrs: &[u32],
        ins: &dyn Fn(u16, u8, u8, u32) -> sock_filter,
    ) {
        if nrs.len() <= 4 {
            // Leaf: compare each; a hit jumps to the `ret ALLOW` after the `ja rest`.
            for (i, &nr) in nrs.iter().enumerate() {
                let to_allow = (nrs.len() - i) as u8; // the remaining jeqs, then the ja
                out.push(ins(JEQ, to_allow, 0, nr));
            }
            to_rest.push(out.len());
            out.push(ins(JA, 0, 0, 0));
            out.push(ins(RET, 0, 0, libc::SECCOMP_RET_ALLOW));
            return;
        }
        let mid = nrs.len() / 2;
        // nr >= nrs[mid] falls onto the `ja` to the right half (a long jump: offsets in jeq/jge
        // are 8 bits); otherwise it skips it into the left half, which follows.
        out.push(ins(JGE, 0, 1, nrs[mid]));
        let ja_right = out.len();
        out.push(ins(JA, 0, 0, 0));
        tree(out, to_rest, &nrs[..mid], ins);
        let right = out.len();
        out[ja_right].k = (right - ja_right - 1) as u32;
        tree(out, to_rest, &nrs[mid..], ins);
    }
    tree(&mut out, &mut to_rest, &sorted, &ins);
    let rest = out.len();
    for i in to_rest {
        out[i].k = (rest - i - 1) as u32;
    }
    out
}

/// Builds the BPF programs (no side effects): the allow-list first, then one filter per errno
/// other than `EPERM` (0 for the [`no_ops`]) in [`denied`], the argument rules and the no-ops,
/// in the order [`install`] loads them.
pub fn build() -> Result<Vec<BpfProgram>, SeccompError> {
    build_with(true)
}

/// A refusal's errno as the filter returns it: 1..=4095 (0 is reserved for the no-ops).
fn valid_errno(name: &'static str, errno: i32) -> Result<u32, SeccompError> {
    match u32::try_from(errno) {
        Ok(e @ 1..=4095) => Ok(e),
        _ => Err(SeccompError::BadErrno { name, errno }),
    }
}

fn build_with(fast: bool) -> Result<Vec<BpfProgram>, SeccompError> {
    let mut allow_rules = BTreeMap::new();
    let mut by_errno: BTreeMap<u32, BTreeMap<i64, Vec<SeccompRule>>> = BTreeMap::new();
    for entry in allowed() {
        if allow_rules.insert(entry.nr, rules_for(entry)?).is_some() {
            return Err(SeccompError::Duplicate { name: entry.name });
        }
        for (errno, rules) in refusals_for(entry)? {
            let errno = valid_errno(entry.name, errno)?;
            by_errno.entry(errno).or_default().insert(entry.nr, rules);
        }
    }

    let mut seen = BTreeSet::new();
    for entry in no_ops() {
        if allow_rules.contains_key(&entry.nr) {
            return Err(SeccompError::AllowedAndDenied { name: entry.name });
        }
        if !seen.insert(entry.nr) {
            return Err(SeccompError::Duplicate { name: entry.name });
        }
        // SECCOMP_RET_ERRNO with 0: the call "returns" 0 and the kernel never runs it.
        by_errno.entry(0).or_default().insert(entry.nr, Vec::new());
    }
    for entry in denied() {
        if allow_rules.contains_key(&entry.nr) {
            return Err(SeccompError::AllowedAndDenied { name: entry.name });
        }
        if !seen.insert(entry.nr) {
            return Err(SeccompError::Duplicate { name: entry.name });
        }
        let errno = valid_errno(entry.name, entry.errno)?;
        if entry.errno != DEFAULT_ERRNO {
            by_errno
                .entry(errno)
                .or_default()
                .insert(entry.nr, Vec::new());
        }
    }

    let unconditional: Vec<u32> = allowed()
        .iter()
        .filter(|e| matches!(e.args, ArgRule::Any))
        .map(|e| e.nr as u32)
        .collect();
    let mut programs = Vec::with_capacity(1 + by_errno.len());
    let mut allow_list = if fast {
        // The fast path allows these on the native architecture before the chain is reached,
        // and on any other the chain kills first: they need no place in it (a shorter program
        // is also quicker to JIT-compile, once per sandbox process).
        allow_rules.retain(|nr, _| !unconditional.contains(&(*nr as u32)));
        fast_path(&unconditional)
    } else {
        Vec::new()
    };
    allow_list.extend(compile(
        "allow-list",
        allow_rules,
        SeccompAction::Errno(DEFAULT_ERRNO.unsigned_abs()),
        SeccompAction::Allow,
    )?);
    programs.push(allow_list);
    for (errno, rules) in by_errno {
        programs.push(compile(
            "errno override",
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno),
        )?);
    }
    Ok(programs)
}

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

/// Compiles the filter for later [`install`] calls in this process and its forks. A failure is
/// left for `install` to report.
pub(crate) fn prebuild() {
    if PREBUILT.get().is_none() {
        if let Ok(p) = build() {
            let _ = PREBUILT.set(p);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::ffi::CString;
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::panic::AssertUnwindSafe;
    use std::time::{Duration, Instant};

    use libc::c_long;
    use seccompiler::sock_filter;

    // ---------------------------------------------------------------------------------------
    // The tables.

    #[test]
    fn tables_have_no_duplicates_and_are_disjoint() {
        let mut names = HashSet::new();
        let mut nrs = HashSet::new();
        for e in allowed() {
            assert!(names.insert(e.name), "{} allowed twice", e.name);
            assert!(
                nrs.insert(e.nr),
                "number {} ({}) allowed twice",
                e.nr,
                e.name
            );
        }
        for d in denied() {
            assert!(
                names.insert(d.name),
                "{} denied twice or also allowed",
                d.name
            );
            assert!(
                nrs.insert(d.nr),
                "number {} ({}) listed twice",
                d.nr,
                d.name
            );
        }
        for n in no_ops() {
            assert!(names.insert(n.name), "{} listed twice", n.name);
            assert!(
                nrs.insert(n.nr),
                "number {} ({}) listed twice",
                n.nr,
                n.name
            );
        }
    }

    #[test]
    fn sync_and_syncfs_are_no_ops_and_fsync_stays_allowed() {
        let names: Vec<&str> = no_ops().iter().map(|n| n.name).collect();
        assert_eq!(names, ["sync", "syncfs"]);
        for name in ["fsync", "fdatasync", "sync_file_range"] {
            assert!(allowed().iter().any(|e| e.name == name), "{name}");
        }
    }

    #[test]
    fn clone3_is_denied_with_enosys_and_not_allowed() {
        assert!(allowed()
            .iter()
            .all(|e| e.nr != libc::SYS_clone3 && e.name != "clone3"));
        let d = denied()
            .iter()
            .find(|d| d.name == "clone3")
            .expect("clone3 is in the deny list");
        assert_eq!((d.nr, d.errno), (libc::SYS_clone3, libc::ENOSYS));
        // Everything else the deny list names fails with EPERM, through the allow-list.
        assert!(denied()
            .iter()
            .all(|d| d.name == "clone3" || d.errno == libc::EPERM));
    }

    #[test]
    fn required_denials_are_listed() {
        let required = [
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
            "unshare",
            "setns",
            "chroot",
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "process_madvise",
            "kcmp",
            "pidfd_getfd",
            "keyctl",
            "add_key",
            "request_key",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "reboot",
            "swapon",
            "swapoff",
            "settimeofday",
            "clock_settime",
            "clock_adjtime",
            "adjtimex",
            "open_by_handle_at",
            "name_to_handle_at",
            "acct",
            "quotactl",
            "quotactl_fd",
            "syslog",
            "vhangup",
            "lookup_dcookie",
            "sethostname",
            "setdomainname",
            "mknodat",
            "fanotify_init",
            "move_pages",
            "migrate_pages",
            "clone3",
        ];
        for name in required {
            assert!(
                denied().iter().any(|d| d.name == name),
                "{name} is not denied"
            );
        }
        #[cfg(target_arch = "x86_64")]
        for name in [
            "iopl",
            "ioperm",
            "uselib",
            "mknod",
            "nfsservctl",
            "modify_ldt",
        ] {
            assert!(
                denied().iter().any(|d| d.name == name),
                "{name} is not denied"
            );
        }
        for name in [
            "mbind",
            "set_mempolicy",
            "get_mempolicy",
            "seccomp",
            "execve",
            "prctl",
        ] {
            assert!(
                allowed().iter().any(|e| e.name == name),
                "{name} is not allowed"
            );
        }
    }

    #[test]
    fn every_entry_says_who_or_why() {
        for e in allowed() {
            assert!(
                e.reason.contains(": ") && e.reason.len() > 15,
                "{}: {}",
                e.name,
                e.reason
            );
        }
        for d in denied() {
            assert!(d.reason.len() > 15, "{}: {}", d.name, d.reason);
        }
        for n in no_ops() {
            assert!(n.reason.len() > 15, "{}: {}", n.name, n.reason);
        }
    }

    /// The numbers come from `libc::SYS_<name>`; check them against a few well-known values and,
    /// where the kernel headers are installed, against `asm/unistd_64.h` (independent of libc).
    #[test]
    fn numbers_match_libc_and_kernel_headers() {
        let all = || {
            allowed()
                .iter()
                .map(|e| (e.name, e.nr))
                .chain(denied().iter().map(|d| (d.name, d.nr)))
        };
        for (name, nr) in all() {
            assert!(!name.is_empty() && !name.starts_with("SYS_"), "{name}");
            assert!((0..1024).contains(&nr), "{name} = {nr}");
        }
        let find = |n: &str| all().find(|(name, _)| *name == n).map(|(_, nr)| nr);
        assert_eq!(find("clone3"), Some(libc::SYS_clone3));
        assert_eq!(find("socket"), Some(libc::SYS_socket));
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(find("read"), Some(0));
            assert_eq!(find("clone"), Some(56));
            assert_eq!(find("ioctl"), Some(16));
            assert_eq!(find("clone3"), Some(435));
            let headers = [
                "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
                "/usr/include/asm/unistd_64.h",
            ];
            let Some(text) = headers.iter().find_map(|p| std::fs::read_to_string(p).ok()) else {
                eprintln!("kernel headers not installed: skipping the header cross-check");
                return;
            };
            let header: std::collections::HashMap<&str, i64> = text
                .lines()
                .filter_map(|l| {
                    let mut w = l.strip_prefix("#define __NR_")?.split_whitespace();
                    Some((w.next()?, w.next()?.parse().ok()?))
                })
                .collect();
            let mut checked = 0;
            for (name, nr) in all() {
                if let Some(&h) = header.get(name) {
                    assert_eq!(h, nr, "{name}: libc says {nr}, the kernel headers {h}");
                    checked += 1;
                }
            }
            // Only calls newer than the headers (e.g. mseal, fchmodat2) may be missing.
            assert!(
                checked + 5 >= all().count(),
                "only {checked} names found in the headers"
            );
        }
    }

    #[test]
    fn build_succeeds() {
        let programs = build().expect("build");
        assert_eq!(
            programs.len(),
            4,
            "allow-list + the no-ops (0), clone3 (ENOSYS) and socket protocol (EPROTONOSUPPORT) overrides"
        );
        for p in &programs {
            assert!(!p.is_empty() && p.len() < 4096, "{} instructions", p.len());
        }
    }

    #[test]
    fn errors_read_as_lowercase_sentences() {
        let e = SeccompError::AllowedAndDenied { name: "clone3" };
        let text = e.to_string();
        assert!(
            text.starts_with(char::is_lowercase) && !text.ends_with('.'),
            "{text}"
        );
    }

    // ---------------------------------------------------------------------------------------
    // The compiled programs, run by a small classic-BPF interpreter that follows the kernel's
    // rules for stacked filters. Cheap and exhaustive; the kernel tests below confirm it.

    #[cfg(target_arch = "x86_64")]
    const NATIVE_AUDIT_ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    const NATIVE_AUDIT_ARCH: u32 = 0xc000_00b7;
    const AUDIT_ARCH_I386: u32 = 0x4000_0003;

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const KILL_PROCESS: u32 = libc::SECCOMP_RET_KILL_PROCESS;
    const fn errno_ret(errno: i32) -> u32 {
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
    fn decide(programs: &[BpfProgram], nr: i64, arch: u32, args: [u64; 6]) -> u32 {
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

    #[test]
    fn the_fast_path_changes_no_decision_and_shortens_frequent_calls() {
        let fast = build_with(true).expect("build");
        let plain = build_with(false).expect("build");
        let arg_sets = [
            [0u64; 6],
            [libc::AF_UNIX as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0],
            [libc::AF_INET as u64, libc::SOCK_RAW as u64, 0, 0, 0, 0],
            [libc::AF_INET as u64, 1, libc::IPPROTO_MPTCP as u64, 0, 0, 0],
            [
                libc::AF_INET6 as u64,
                2,
                libc::IPPROTO_UDPLITE as u64,
                0,
                0,
                0,
            ],
            [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0],
            [0, libc::TIOCSTI, 0, 0, 0, 0],
            [u64::MAX; 6],
        ];
        for arch in [NATIVE_AUDIT_ARCH, AUDIT_ARCH_I386, 0] {
            for nr in (0..1100)
                .chain((0..1100).map(|n| n | 0x4000_0000))
                .chain([u32::MAX as i64])
            {
                for args in arg_sets {
                    assert_eq!(
                        decide(&fast, nr, arch, args),
                        decide(&plain, nr, arch, args),
                        "nr {nr} arch {arch:#x} args {args:?}"
                    );
                }
            }
        }
        // openat, read, newfstatat: a handful of instructions instead of a long chain.
        for nr in [libc::SYS_openat, libc::SYS_read, libc::SYS_newfstatat] {
            let steps = |p: &BpfProgram| steps_to_decide(p, nr);
            assert!(steps(&fast[0]) <= 25, "{nr}: {} steps", steps(&fast[0]));
            assert!(steps(&fast[0]) < steps(&plain[0]) || nr == libc::SYS_read);
        }
    }

    /// Instructions `run_bpf` executes for `nr` on the native architecture.
    fn steps_to_decide(program: &[sock_filter], nr: i64) -> usize {
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

    #[test]
    fn simulated_decisions_follow_the_policy() {
        let p = build().expect("build");
        let native = |nr: i64, args: [u64; 6]| decide(&p, nr, NATIVE_AUDIT_ARCH, args);
        let a = |a0: u64, a1: u64| [a0, a1, 0, 0, 0, 0];
        let eperm = errno_ret(libc::EPERM);

        for e in allowed() {
            let x32 = e.nr | 0x4000_0000;
            assert_eq!(native(x32, [0; 6]), eperm, "x32 {}", e.name);
            assert_eq!(
                decide(&p, e.nr, AUDIT_ARCH_I386, [0; 6]),
                KILL_PROCESS,
                "{}",
                e.name
            );
            if e.args == ArgRule::Any {
                assert_eq!(native(e.nr, [0; 6]), ALLOW, "{}", e.name);
                assert_eq!(native(e.nr, [u64::MAX; 6]), ALLOW, "{}", e.name);
            }
        }
        for n in no_ops() {
            // RET_ERRNO with 0: the caller sees success, the kernel never runs the call.
            assert_eq!(native(n.nr, [0; 6]), errno_ret(0), "{}", n.name);
            assert_eq!(native(n.nr, [u64::MAX; 6]), errno_ret(0), "{}", n.name);
        }
        for d in denied() {
            assert_eq!(native(d.nr, [0; 6]), errno_ret(d.errno), "{}", d.name);
            assert_eq!(
                native(d.nr, [u64::MAX; 6]),
                errno_ret(d.errno),
                "{}",
                d.name
            );
        }
        // Unlisted calls and numbers.
        assert_eq!(native(libc::SYS_memfd_secret, [0; 6]), eperm);
        assert_eq!(native(1000, [0; 6]), eperm);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            decide(&p, 39, 0xc000_00b7, [0; 6]),
            KILL_PROCESS,
            "aarch64 on x86_64"
        );

        // clone
        let sigchld = libc::SIGCHLD as u64;
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        let vfork = (libc::CLONE_VM | libc::CLONE_VFORK) as u64 | sigchld;
        for ok in [
            sigchld,
            thread,
            vfork,
            0,
            sigchld | (u64::from(u32::MAX) << 32),
        ] {
            assert_eq!(native(libc::SYS_clone, a(ok, 0)), ALLOW, "clone {ok:#x}");
        }
        for bit in 0..32 {
            let flag = 1u64 << bit;
            let want = if flag & NAMESPACE_FLAGS != 0 {
                eperm
            } else {
                ALLOW
            };
            assert_eq!(
                native(libc::SYS_clone, a(flag | sigchld, 0)),
                want,
                "clone {flag:#x}"
            );
        }
        assert_eq!(NAMESPACE_FLAGS.count_ones(), 8);

        // socket and socketpair
        let types = [
            libc::SOCK_STREAM,
            libc::SOCK_DGRAM,
            libc::SOCK_RAW,
            libc::SOCK_SEQPACKET,
            10, // SOCK_PACKET (deprecated in libc)
            libc::SOCK_RDM,
        ];
        let flags = [
            0,
            libc::SOCK_NONBLOCK,
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        ];
        let domains = [
            libc::AF_UNIX,
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
            libc::AF_PACKET,
            libc::AF_VSOCK,
            libc::AF_ALG,
            libc::AF_BLUETOOTH,
            libc::AF_KEY,
            libc::AF_UNSPEC,
        ];
        let protocols: [u64; 10] = [
            0,
            libc::IPPROTO_TCP as u64,
            libc::IPPROTO_UDP as u64,
            libc::IPPROTO_MPTCP as u64,
            libc::IPPROTO_UDPLITE as u64,
            libc::IPPROTO_SCTP as u64,
            libc::IPPROTO_ICMP as u64,
            libc::IPPROTO_ICMPV6 as u64,
            // The kernel reads an int: the high half of the register is ignored, by both.
            libc::IPPROTO_TCP as u64 | 1 << 32,
            u64::MAX,
        ];
        let eprotonosupport = errno_ret(libc::EPROTONOSUPPORT);
        for nr in [libc::SYS_socket, libc::SYS_socketpair] {
            for domain in domains {
                for ty in types {
                    for fl in flags {
                        for proto in protocols {
                            let inet = domain == libc::AF_INET || domain == libc::AF_INET6;
                            let low = proto as u32 as libc::c_int;
                            let want = if domain == libc::AF_UNIX {
                                if low == 0 {
                                    ALLOW
                                } else {
                                    eprotonosupport
                                }
                            } else if inet && ty == libc::SOCK_STREAM {
                                if low == 0 || low == libc::IPPROTO_TCP {
                                    ALLOW
                                } else {
                                    eprotonosupport
                                }
                            } else if inet && ty == libc::SOCK_DGRAM {
                                if low == 0 || low == libc::IPPROTO_UDP {
                                    ALLOW
                                } else {
                                    eprotonosupport
                                }
                            } else {
                                eperm
                            };
                            let args = [domain as u64, (ty | fl) as u64, proto, 0, 0, 0];
                            assert_eq!(
                                native(nr, args),
                                want,
                                "{nr} {domain} {ty} {fl:#x} {proto:#x}"
                            );
                        }
                    }
                }
            }
        }

        // ioctl: the request is an unsigned int, compared on its low 32 bits.
        let (sti, linux) = (ioctl_request(libc::TIOCSTI), ioctl_request(libc::TIOCLINUX));
        for denied_req in [sti, linux, sti | 1 << 32, linux | 0xffff_ffff << 32] {
            assert_eq!(
                native(libc::SYS_ioctl, a(0, denied_req)),
                eperm,
                "{denied_req:#x}"
            );
        }
        for ok in [
            libc::TCGETS,
            libc::TIOCGWINSZ,
            libc::FIONREAD,
            libc::FIONBIO,
            libc::TIOCGPTN,
        ] {
            assert_eq!(
                native(libc::SYS_ioctl, a(1, ioctl_request(ok))),
                ALLOW,
                "{ok:#x}"
            );
        }

        // personality
        for ok in [0xffff_ffff, 0, u64::MAX] {
            assert_eq!(native(libc::SYS_personality, a(ok, 0)), ALLOW, "{ok:#x}");
        }
        for bad in [
            libc::ADDR_NO_RANDOMIZE as u64,
            0x0008,
            0x0400_0000,
            0xffff_fffe,
        ] {
            assert_eq!(native(libc::SYS_personality, a(bad, 0)), eperm, "{bad:#x}");
        }
    }

    // ---------------------------------------------------------------------------------------
    // The filters in the kernel, in forked children. The test harness is multi-threaded, so a
    // child only makes raw system calls (or execs) and leaves through `_exit`.

    /// A probe's result: 0 for success, otherwise the errno.
    fn code(ret: c_long) -> i32 {
        if ret < 0 {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
        } else {
            0
        }
    }

    /// # Safety
    /// The arguments must be valid for the call: integers, or pointers to live memory of the
    /// size the call reads or writes (invalid addresses are fine: the kernel reports `EFAULT`).
    unsafe fn sys(nr: c_long, a: [u64; 6]) -> c_long {
        // SAFETY: forwarded to the caller.
        unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) }
    }

    const CHILD_PANICKED: i32 = 201;
    const NNP_FAILED: i32 = 202;
    const INSTALL_FAILED: i32 = 203;
    const EXEC_FAILED: i32 = 204;
    const WRITE_FAILED: i32 = 205;

    #[derive(Debug, PartialEq, Eq)]
    enum Outcome {
        Exited(i32),
        Signaled(i32),
    }

    /// Forks; the child runs `f` in its own process group and exits with its result. Waits at
    /// most `limit`, then kills the child's group.
    fn in_child(limit: Duration, f: impl FnOnce() -> i32) -> Outcome {
        // SAFETY: fork has no memory preconditions; the child only runs `f` and `_exit`s, never
        // returning into the harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: setpgid on ourselves, no pointers.
            unsafe { libc::setpgid(0, 0) };
            let result = std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or(CHILD_PANICKED);
            // SAFETY: ends the child without running the harness's destructors or atexit hooks.
            unsafe { libc::_exit(result) }
        }
        let deadline = Instant::now() + limit;
        loop {
            let mut status = 0;
            // SAFETY: `pid` is our child and `status` a valid out-pointer.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                if libc::WIFEXITED(status) {
                    return Outcome::Exited(libc::WEXITSTATUS(status));
                }
                if libc::WIFSIGNALED(status) {
                    return Outcome::Signaled(libc::WTERMSIG(status));
                }
                continue;
            }
            assert!(r == 0, "waitpid: {}", std::io::Error::last_os_error());
            if Instant::now() > deadline {
                // SAFETY: signals the process group the child created; no pointers.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
                // SAFETY: as above, reaping the killed child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                panic!("child timed out after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// What a child runs under.
    #[derive(Clone, Copy)]
    enum Filter<'a> {
        /// Nothing: the positive control.
        None,
        /// These programs, loaded in order.
        Programs(&'a [BpfProgram]),
    }

    fn enter(filter: Filter<'_>) -> Result<(), i32> {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(NNP_FAILED);
        }
        match filter {
            Filter::None => Ok(()),
            Filter::Programs(p) => install_programs(p).map_err(|_| INSTALL_FAILED),
        }
    }

    /// Runs each probe in one child under `filter`; returns each probe's [`code`].
    fn probe(filter: Filter<'_>, probes: &[&dyn Fn() -> c_long]) -> Vec<i32> {
        probe_after(|| 0, filter, probes)
    }

    /// [`probe`], with `before` run in the child ahead of the filter (non-zero: give up).
    fn probe_after(
        before: impl FnOnce() -> i32,
        filter: Filter<'_>,
        probes: &[&dyn Fn() -> c_long],
    ) -> Vec<i32> {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a two-element array for pipe2 to fill.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: pipe2 succeeded: both descriptors are open and owned by nobody else.
        let (rx, tx) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let outcome = in_child(Duration::from_secs(30), || {
            let early = before();
            if early != 0 {
                return early;
            }
            if let Err(e) = enter(filter) {
                return e;
            }
            for p in probes {
                let c = code(p());
                // SAFETY: writes 4 bytes from a live local to our pipe.
                let n = unsafe { libc::write(tx.as_raw_fd(), (&c as *const i32).cast(), 4) };
                if n != 4 {
                    return WRITE_FAILED;
                }
            }
            0
        });
        drop(tx);
        assert_eq!(outcome, Outcome::Exited(0), "probe child");
        let mut bytes = Vec::new();
        std::fs::File::from(rx)
            .read_to_end(&mut bytes)
            .expect("read probe results");
        let codes: Vec<i32> = bytes
            .chunks_exact(4)
            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(codes.len(), probes.len());
        codes
    }

    fn programs() -> Vec<BpfProgram> {
        build().expect("build")
    }

    const EPERM: i32 = libc::EPERM;

    #[test]
    fn last_installed_filter_wins_between_equal_actions() {
        let p = programs();
        // SAFETY: clone3 with a null argument struct and size 0 is rejected before any use.
        let clone3 = || unsafe { sys(libc::SYS_clone3, [0; 6]) };
        let reversed = [p[1].clone(), p[0].clone()];
        assert_eq!(probe(Filter::None, &[&clone3]), [libc::EINVAL], "control");
        assert_eq!(
            probe(Filter::Programs(&p[..1]), &[&clone3]),
            [EPERM],
            "allow-list only"
        );
        assert_eq!(
            probe(Filter::Programs(&p), &[&clone3]),
            [libc::ENOSYS],
            "as installed"
        );
        assert_eq!(
            probe(Filter::Programs(&reversed), &[&clone3]),
            [EPERM],
            "reversed order"
        );
    }

    #[test]
    fn unshare_and_setns_are_refused() {
        let p = programs();
        // SAFETY: integer arguments only; this runs in a throw-away child.
        let unshare = || unsafe {
            sys(
                libc::SYS_unshare,
                [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0],
            )
        };
        // SAFETY: integer arguments only (fd -1).
        let setns = || unsafe { sys(libc::SYS_setns, [u64::MAX, 0, 0, 0, 0, 0]) };
        assert_eq!(probe(Filter::None, &[&unshare, &setns]), [0, libc::EBADF]);
        assert_eq!(
            probe(Filter::Programs(&p), &[&unshare, &setns]),
            [EPERM, EPERM]
        );
    }

    /// MPTCP and UDP-Lite sockets (this kernel has both: the control creates them) fail with
    /// EPROTONOSUPPORT under the filter; TCP and UDP, by number or as protocol 0, still work.
    #[test]
    fn sockets_of_other_protocols_fail_with_eprotonosupport() {
        let p = programs();
        let sock = |domain: i32, ty: i32, proto: i32| {
            move || {
                // SAFETY: integer arguments only; the descriptor is closed at once.
                let fd = unsafe {
                    sys(
                        libc::SYS_socket,
                        [domain as u64, ty as u64, proto as u64, 0, 0, 0],
                    )
                };
                if fd >= 0 {
                    // SAFETY: closing the descriptor just created.
                    unsafe { libc::close(fd as i32) };
                    return 0;
                }
                fd
            }
        };
        let (inet, inet6) = (libc::AF_INET, libc::AF_INET6);
        let (stream, dgram) = (libc::SOCK_STREAM, libc::SOCK_DGRAM);
        let mptcp = sock(inet, stream, libc::IPPROTO_MPTCP);
        let mptcp6 = sock(inet6, stream | libc::SOCK_CLOEXEC, libc::IPPROTO_MPTCP);
        let udplite = sock(inet, dgram, libc::IPPROTO_UDPLITE);
        let udplite6 = sock(inet6, dgram, libc::IPPROTO_UDPLITE);
        let tcp = sock(inet, stream, libc::IPPROTO_TCP);
        let udp6 = sock(inet6, dgram, libc::IPPROTO_UDP);
        let default = sock(inet, stream, 0);
        let unix = sock(libc::AF_UNIX, stream, 0);
        let probes: [&dyn Fn() -> c_long; 8] = [
            &mptcp, &mptcp6, &udplite, &udplite6, &tcp, &udp6, &default, &unix,
        ];
        let control = probe(Filter::None, &probes);
        if control[..4] != [0; 4] {
            eprintln!("this kernel lacks MPTCP or UDP-Lite ({control:?}): skipping");
            return;
        }
        assert_eq!(control, [0; 8], "control");
        let e = libc::EPROTONOSUPPORT;
        assert_eq!(
            probe(Filter::Programs(&p), &probes),
            [e, e, e, e, 0, 0, 0, 0]
        );
    }

    /// sync() and syncfs() return 0 under the filter without running: syncfs(-1) would say
    /// EBADF if the kernel had looked at it, as the control shows.
    #[test]
    fn sync_and_syncfs_return_0_without_running() {
        let p = programs();
        // SAFETY: integer argument only (a descriptor that is never open).
        let syncfs_bad = || unsafe { sys(libc::SYS_syncfs, [u64::MAX, 0, 0, 0, 0, 0]) };
        // SAFETY: no arguments.
        let sync = || unsafe { sys(libc::SYS_sync, [0; 6]) };
        assert_eq!(
            probe(Filter::None, &[&syncfs_bad]),
            [libc::EBADF],
            "control"
        );
        assert_eq!(probe(Filter::Programs(&p), &[&syncfs_bad, &sync]), [0, 0]);
    }

    /// Raw `clone` with fork semantics; the new child exits at once and is reaped.
    fn raw_clone(flags: u64) -> c_long {
        // SAFETY: no stack or pointers: the child runs on a copy of our stack, like fork.
        let pid = unsafe { sys(libc::SYS_clone, [flags, 0, 0, 0, 0, 0]) };
        if pid == 0 {
            // SAFETY: leave the clone child immediately.
            unsafe { libc::_exit(0) }
        }
        if pid > 0 {
            let mut status = 0;
            // SAFETY: reaping our own child into a valid out-pointer.
            unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::__WALL) };
        }
        pid
    }

    #[test]
    fn clone_into_namespaces_is_refused_but_fork_and_threads_work() {
        let p = programs();
        let sigchld = libc::SIGCHLD as u64;
        let newuser = || raw_clone(libc::CLONE_NEWUSER as u64 | sigchld);
        assert_eq!(probe(Filter::None, &[&newuser]), [0], "control");
        let each_flag: Vec<Box<dyn Fn() -> c_long>> = (0..32)
            .map(|bit| 1u64 << bit)
            .filter(|f| f & NAMESPACE_FLAGS != 0)
            .map(|f| Box::new(move || raw_clone(f | sigchld)) as Box<dyn Fn() -> c_long>)
            .collect();
        let refs: Vec<&dyn Fn() -> c_long> = each_flag.iter().map(|b| b.as_ref()).collect();
        assert_eq!(probe(Filter::Programs(&p), &refs), vec![EPERM; 8]);

        let plain = || raw_clone(sigchld);
        let fork = || {
            // SAFETY: the child exits at once with `_exit`.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: leave the fork child.
                unsafe { libc::_exit(7) }
            }
            let mut status = 0;
            // SAFETY: reaping our own child into a valid out-pointer.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7 {
                0
            } else {
                -1
            }
        };
        // glibc's pthread_create tries clone3 first, gets ENOSYS and falls back to clone.
        let thread = || match std::thread::spawn(|| 5).join() {
            Ok(5) => 0,
            _ => -1,
        };
        assert_eq!(
            probe(Filter::Programs(&p), &[&plain, &fork, &thread]),
            [0, 0, 0]
        );
    }

    fn socket(domain: i32, ty: i32, proto: i32) -> c_long {
        let a = [domain as u64, ty as u64, proto as u64, 0, 0, 0];
        // SAFETY: integer arguments only.
        unsafe { sys(libc::SYS_socket, a) }
    }

    fn socketpair(domain: i32, ty: i32) -> c_long {
        let mut fds = [0i32; 2];
        let a = [domain as u64, ty as u64, 0, fds.as_mut_ptr() as u64, 0, 0];
        // SAFETY: `fds` is a live two-element array.
        unsafe { sys(libc::SYS_socketpair, a) }
    }

    #[test]
    fn only_unix_tcp_and_udp_sockets() {
        use libc::{AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_UNIX, SOCK_DGRAM, SOCK_RAW};
        let p = programs();
        let stream = libc::SOCK_STREAM;
        let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
        let probes: [&dyn Fn() -> c_long; 11] = [
            &|| socket(AF_UNIX, stream, 0),
            &|| socket(AF_UNIX, libc::SOCK_SEQPACKET | flags, 0),
            &|| socketpair(AF_UNIX, stream),
            &|| socket(AF_INET, stream | flags, 0),
            &|| socket(AF_INET6, SOCK_DGRAM, 0),
            &|| socket(AF_NETLINK, SOCK_RAW, libc::NETLINK_ROUTE),
            &|| socket(AF_INET, SOCK_RAW, libc::IPPROTO_ICMP),
            &|| socket(AF_INET6, SOCK_RAW | flags, libc::IPPROTO_ICMPV6),
            &|| socket(AF_PACKET, SOCK_RAW, 0),
            &|| socket(AF_INET, libc::SOCK_SEQPACKET, 0),
            &|| socketpair(AF_NETLINK, SOCK_RAW),
        ];
        let filtered = probe(Filter::Programs(&p), &probes);
        assert_eq!(
            filtered,
            [0, 0, 0, 0, 0, EPERM, EPERM, EPERM, EPERM, EPERM, EPERM]
        );
        // As root and without the filter, the raw, packet and netlink sockets open.
        let control = probe(Filter::None, &probes);
        assert_eq!(control[..9], [0; 9], "control");
        assert!(!control[9..].contains(&EPERM), "control {control:?}");

        let others: [&dyn Fn() -> c_long; 3] = [
            &|| socket(libc::AF_VSOCK, stream, 0),
            &|| socket(libc::AF_ALG, libc::SOCK_SEQPACKET, 0),
            &|| socket(libc::AF_KEY, SOCK_RAW, 2),
        ];
        assert_eq!(probe(Filter::Programs(&p), &others), [EPERM; 3]);
        let control = probe(Filter::None, &others);
        assert!(!control.contains(&EPERM), "control {control:?}");
    }

    fn open_ptmx() -> c_long {
        let path = c"/dev/ptmx";
        let flags = (libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) as u64;
        let a = [libc::AT_FDCWD as u64, path.as_ptr() as u64, flags, 0, 0, 0];
        // SAFETY: `path` is a live NUL-terminated string.
        unsafe { sys(libc::SYS_openat, a) }
    }

    fn ioctl_on_pty(request: u64) -> c_long {
        let fd = open_ptmx();
        if fd < 0 {
            return fd;
        }
        let mut arg = [b'x'; 64];
        // SAFETY: a 64-byte buffer covers what TIOCSTI (1 byte), TIOCGPTN (an int) and
        // TIOCLINUX (1 byte) read or write.
        unsafe {
            sys(
                libc::SYS_ioctl,
                [fd as u64, request, arg.as_mut_ptr() as u64, 0, 0, 0],
            )
        }
    }

    #[test]
    fn tiocsti_and_tioclinux_are_refused() {
        let p = programs();
        let sti = ioctl_request(libc::TIOCSTI);
        let on_stdin = || {
            let c = b'x';
            // SAFETY: TIOCSTI reads one byte from a live local.
            unsafe { sys(libc::SYS_ioctl, [0, sti, &c as *const u8 as u64, 0, 0, 0]) }
        };
        let probes: [&dyn Fn() -> c_long; 5] = [
            &|| ioctl_on_pty(sti),
            // The kernel truncates the request to 32 bits: this is TIOCSTI too.
            &|| ioctl_on_pty(sti | 1 << 32),
            &|| ioctl_on_pty(ioctl_request(libc::TIOCLINUX)),
            &|| ioctl_on_pty(ioctl_request(libc::TIOCGPTN)),
            &on_stdin,
        ];
        assert_eq!(
            probe(Filter::Programs(&p), &probes),
            [EPERM, EPERM, EPERM, 0, EPERM]
        );
        // Root may type into a terminal (CAP_SYS_ADMIN); TIOCLINUX is not for ptys at all.
        let control = probe(Filter::None, &probes[..4]);
        assert_eq!(control[..2], [0, 0], "control");
        assert!(
            control[2] != EPERM && control[2] != 0,
            "control {control:?}"
        );
    }

    #[test]
    fn personality_can_only_be_queried_or_reset() {
        let p = programs();
        // SAFETY: personality takes an integer.
        let query = || unsafe { sys(libc::SYS_personality, [0xffff_ffff, 0, 0, 0, 0, 0]) };
        // SAFETY: as above.
        let linux = || unsafe { sys(libc::SYS_personality, [0, 0, 0, 0, 0, 0]) };
        let no_aslr = libc::ADDR_NO_RANDOMIZE as u64;
        // SAFETY: as above.
        let no_random = || unsafe { sys(libc::SYS_personality, [no_aslr, 0, 0, 0, 0, 0]) };
        assert_eq!(
            probe(Filter::Programs(&p), &[&query, &linux, &no_random]),
            [0, 0, EPERM]
        );
        assert_eq!(probe(Filter::None, &[&no_random]), [0], "control");
    }

    #[test]
    fn tracing_and_kernel_attack_surface_are_refused() {
        let p = programs();
        // SAFETY: integer arguments only.
        let traceme = || unsafe {
            sys(
                libc::SYS_ptrace,
                [libc::PTRACE_TRACEME as u64, 0, 0, 0, 0, 0],
            )
        };
        // KEYCTL_GET_KEYRING_ID (0) of KEY_SPEC_USER_KEYRING (-4), without creating it.
        let user_keyring = (-4i64) as u64;
        // SAFETY: integer arguments only.
        let keyctl = || unsafe { sys(libc::SYS_keyctl, [0, user_keyring, 0, 0, 0, 0]) };
        // SAFETY: BPF_MAP_CREATE with a null attribute of size 0: the kernel reads nothing.
        let bpf = || unsafe { sys(libc::SYS_bpf, [0, 0, 0, 0, 0, 0]) };
        // SAFETY: a null attribute pointer: the kernel reports EFAULT, writes nothing.
        let perf = || unsafe { sys(libc::SYS_perf_event_open, [0, 0, u64::MAX, u64::MAX, 0, 0]) };
        // SAFETY: integer flags only.
        let uffd = || unsafe {
            sys(
                libc::SYS_userfaultfd,
                [libc::O_CLOEXEC as u64, 0, 0, 0, 0, 0],
            )
        };
        let uring = || {
            let mut params = [0u64; 16]; // struct io_uring_params is 120 bytes
                                         // SAFETY: `params` is a live, zeroed buffer larger than io_uring_params.
            unsafe {
                sys(
                    libc::SYS_io_uring_setup,
                    [1, params.as_mut_ptr() as u64, 0, 0, 0, 0],
                )
            }
        };
        let probes: [&dyn Fn() -> c_long; 6] = [&traceme, &keyctl, &bpf, &perf, &uffd, &uring];
        assert_eq!(probe(Filter::Programs(&p), &probes), [EPERM; 6]);
        // Without the filter none of them is refused with EPERM (so the filter is what refuses
        // them), and root may always trace itself and create a userfaultfd. On this kernel the
        // full answer is [0, 0, EINVAL, EFAULT, 0, 0]; keyrings and io_uring depend on its
        // configuration, so only "not EPERM" is required of them.
        let control = probe(Filter::None, &probes);
        assert!(!control.contains(&EPERM), "control {control:?}");
        assert_eq!((control[0], control[4]), (0, 0), "control {control:?}");
    }

    #[test]
    fn ordinary_calls_work() {
        let p = programs();
        // SAFETY: no arguments.
        let getpid = || unsafe { sys(libc::SYS_getpid, [0; 6]) };
        let write = || {
            let mut fds = [0i32; 2];
            // SAFETY: `fds` is a live two-element array.
            let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
            if r != 0 {
                return r.into();
            }
            // SAFETY: writes 3 bytes from a static string into our pipe.
            unsafe { libc::write(fds[1], b"abc".as_ptr().cast(), 3) as c_long }
        };
        let mut buf = [0u8; 16];
        let bufp = buf.as_mut_ptr() as u64;
        // SAFETY: getrandom writes 16 bytes into `buf`.
        let random = || unsafe { sys(libc::SYS_getrandom, [bufp, 16, 0, 0, 0, 0]) };
        let mmap = || {
            let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
            let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
            // SAFETY: a fresh anonymous mapping, not touching existing memory.
            unsafe { sys(libc::SYS_mmap, [0, 4096, prot, flags, u64::MAX, 0]) }
        };
        let probes: [&dyn Fn() -> c_long; 4] = [&getpid, &write, &random, &mmap];
        assert_eq!(probe(Filter::Programs(&p), &probes), [0; 4]);
    }

    #[test]
    fn x32_calls_are_refused() {
        let p = programs();
        // SAFETY: getpid takes no arguments, whatever ABI bit is set.
        let x32_getpid = || unsafe { sys(libc::SYS_getpid | 0x4000_0000, [0; 6]) };
        assert_eq!(probe(Filter::Programs(&p), &[&x32_getpid]), [EPERM]);
        // Without the filter: ENOSYS when the kernel lacks x32 (this one), success otherwise.
        assert_ne!(probe(Filter::None, &[&x32_getpid]), [EPERM], "control");
    }

    /// i386's getpid (20) through `int 0x80`: the architecture check kills the process.
    #[cfg(target_arch = "x86_64")]
    fn i386_getpid() -> i64 {
        let mut ret: i64 = 20;
        // SAFETY: the 32-bit getpid takes no arguments and touches no memory; the compat entry
        // returns in rax and at worst clears r8-r11, which are declared clobbered.
        unsafe {
            std::arch::asm!(
                "int 0x80",
                inout("rax") ret,
                out("r8") _, out("r9") _, out("r10") _, out("r11") _,
                options(nostack)
            );
        }
        ret
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn i386_calls_kill_the_process() {
        let p = programs();
        let same_pid = || {
            let ret = i386_getpid();
            // SAFETY: getpid has no preconditions.
            i32::from(ret != i64::from(unsafe { libc::getpid() }))
        };
        assert_eq!(
            in_child(Duration::from_secs(10), same_pid),
            Outcome::Exited(0),
            "control"
        );
        let filtered = in_child(Duration::from_secs(10), || {
            if let Err(e) = enter(Filter::Programs(&p)) {
                return e;
            }
            i386_getpid();
            100
        });
        assert_eq!(filtered, Outcome::Signaled(libc::SIGSYS));
    }

    /// Every denied call, with all-ones arguments (invalid pointers, out-of-range values), gets
    /// its errno. Belt and braces: the child first moves into new user, mount, UTS, IPC and
    /// network namespaces, so a broken filter could not touch the host either.
    #[test]
    fn every_denied_call_gets_its_errno() {
        let p = programs();
        let isolate = || {
            let ns = libc::CLONE_NEWUSER
                | libc::CLONE_NEWNS
                | libc::CLONE_NEWUTS
                | libc::CLONE_NEWIPC
                | libc::CLONE_NEWNET;
            // SAFETY: integer flags; the child is single-threaded.
            let r = unsafe { libc::unshare(ns) };
            if r == 0 {
                0
            } else {
                100
            }
        };
        let calls: Vec<_> = denied()
            .iter()
            .map(|d| {
                move || {
                    // SAFETY: all-ones pointers are addresses the kernel refuses with EFAULT;
                    // the other arguments are plain integers.
                    unsafe { sys(d.nr, [u64::MAX; 6]) }
                }
            })
            .collect();
        let refs: Vec<&dyn Fn() -> c_long> = calls.iter().map(|c| c as _).collect();
        let got = probe_after(isolate, Filter::Programs(&p), &refs);
        let got: Vec<(&str, i32)> = denied().iter().map(|d| d.name).zip(got).collect();
        let want: Vec<(&str, i32)> = denied().iter().map(|d| (d.name, d.errno)).collect();
        assert_eq!(got, want);
    }

    // ---------------------------------------------------------------------------------------
    // Real programs under the real `install()`.

    const ENV: &[&str] = &[
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "HOME=/tmp",
        "LANG=C.UTF-8",
    ];

    fn cstrings(v: &[&str]) -> Vec<CString> {
        v.iter()
            .map(|s| CString::new(*s).expect("no NUL"))
            .collect()
    }

    fn nul_terminated(v: &[CString]) -> Vec<*const libc::c_char> {
        v.iter()
            .map(|s| s.as_ptr())
            .chain([std::ptr::null()])
            .collect()
    }

    /// Execs `argv` in a child after `install()` (stdout to /dev/null); returns how it ended.
    fn run_filtered(argv: &[&str]) -> Outcome {
        let (args, env) = (cstrings(argv), cstrings(ENV));
        let (argp, envp) = (nul_terminated(&args), nul_terminated(&env));
        let devnull = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .expect("/dev/null");
        in_child(Duration::from_secs(180), || {
            // SAFETY: duplicates a descriptor we own onto stdout.
            if unsafe { libc::dup2(devnull.as_raw_fd(), 1) } != 1 {
                return EXEC_FAILED;
            }
            // SAFETY: prctl with integer arguments only.
            if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                return NNP_FAILED;
            }
            if install().is_err() {
                return INSTALL_FAILED;
            }
            // SAFETY: argp and envp are NUL-terminated arrays of live C strings.
            unsafe { libc::execve(argp[0], argp.as_ptr(), envp.as_ptr()) };
            EXEC_FAILED
        })
    }

    fn have(path: &str) -> bool {
        let found = std::path::Path::new(path).exists();
        if !found {
            eprintln!("{path} is not installed: skipping");
        }
        found
    }

    #[test]
    fn install_then_exec_in_a_grandchild() {
        let (args, env) = (cstrings(&["/bin/sh", "-c", "exit 7"]), cstrings(ENV));
        let (argp, envp) = (nul_terminated(&args), nul_terminated(&env));
        let outcome = in_child(Duration::from_secs(30), || {
            // SAFETY: prctl with integer arguments only.
            if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                return NNP_FAILED;
            }
            if install().is_err() {
                return INSTALL_FAILED;
            }
            // SAFETY: the grandchild only execs or `_exit`s.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: argp and envp are NUL-terminated arrays of live C strings.
                unsafe { libc::execve(argp[0], argp.as_ptr(), envp.as_ptr()) };
                // SAFETY: leave the grandchild if exec failed.
                unsafe { libc::_exit(EXEC_FAILED) }
            }
            let mut status = 0;
            // SAFETY: reaping our own child into a valid out-pointer.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                100
            }
        });
        assert_eq!(outcome, Outcome::Exited(7));
        assert_eq!(run_filtered(&["/bin/true"]), Outcome::Exited(0));
        assert_eq!(
            run_filtered(&["/bin/sh", "-c", "exit 7"]),
            Outcome::Exited(7)
        );
    }

    #[test]
    fn python_runs_under_the_filter() {
        let script = "import threading,subprocess,multiprocessing,socket,json; \
                      print(subprocess.run(['true']).returncode)";
        assert_eq!(
            run_filtered(&["/usr/bin/python3", "-c", script]),
            Outcome::Exited(0)
        );
    }

    const PYTHON_WORKLOAD: &str = r#"
import threading, subprocess, multiprocessing, socket, json, os, tempfile, time, select, signal
import mmap, shutil, asyncio, concurrent.futures
if __name__ == "__main__":
    t = threading.Thread(target=lambda: None); t.start(); t.join()
    assert subprocess.run(["true"]).returncode == 0
    assert subprocess.run("echo hi | cat", shell=True, stdout=subprocess.PIPE).stdout == b"hi\n"
    with multiprocessing.Pool(2) as p: assert p.map(abs, [-1, -2]) == [1, 2]
    for method in ("spawn", "forkserver"):
        with multiprocessing.get_context(method).Pool(1) as p: assert p.map(abs, [-3]) == [3]
    q = multiprocessing.Queue(); pr = multiprocessing.Process(target=q.put, args=(5,)); pr.start()
    assert q.get() == 5; pr.join()
    lock = multiprocessing.Lock(); lock.acquire(); lock.release()
    with concurrent.futures.ProcessPoolExecutor(2) as ex: assert list(ex.map(abs, [-2])) == [2]
    with concurrent.futures.ThreadPoolExecutor(4) as ex: assert list(ex.map(abs, [-2])) == [2]
    a, b = socket.socketpair(); a.send(b"x"); assert b.recv(1) == b"x"
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
    c = socket.create_connection(s.getsockname()); conn, _ = s.accept(); c.sendall(b"hey")
    assert conn.recv(3) == b"hey"
    u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); u.bind(("::1", 0))
    u.sendto(b"u", u.getsockname()); assert u.recv(1) == b"u"
    d = tempfile.mkdtemp(); f = os.path.join(d, "f")
    with open(f, "w") as fh: fh.write(json.dumps({"a": 1}))
    os.rename(f, f + "2"); os.link(f + "2", f + "3"); os.symlink(f + "2", f + "4")
    os.chmod(f + "2", 0o600); os.utime(f + "2"); os.stat(f + "4"); os.listdir(d)
    shutil.copy(f + "2", f + "5"); shutil.rmtree(d)
    with tempfile.TemporaryFile() as fh:
        fh.write(b"a" * 4096); fh.flush(); m = mmap.mmap(fh.fileno(), 4096); m.close()
        os.fsync(fh.fileno())
    r, w = os.pipe(); os.write(w, b"z"); select.select([r], [], [], 1); os.read(r, 1)
    signal.signal(signal.SIGUSR1, lambda *a: None); os.kill(os.getpid(), signal.SIGUSR1)
    asyncio.run(asyncio.sleep(0.01))
    os.urandom(16); time.sleep(0.01); os.sched_getaffinity(0); os.getloadavg(); os.times()
    # Refused by the policy, reported as ordinary errors:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.unshare(0x10000000) == -1 and ctypes.get_errno() == 1, "unshare(CLONE_NEWUSER)"
    try:
        os.mkfifo("/tmp/never"); raise SystemExit("mkfifo")
    except PermissionError:
        pass
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW); raise SystemExit("netlink")
    except PermissionError:
        pass
    print("ok")
"#;

    #[test]
    fn python_workload_runs_under_the_filter() {
        let argv = ["/usr/bin/python3", "-c", PYTHON_WORKLOAD];
        assert_eq!(run_filtered(&argv), Outcome::Exited(0));
    }

    /// numpy, pandas and matplotlib (OpenBLAS threads, NUMA calls). Uses the interpreter in
    /// `RUNCELL_TEST_SCI_PYTHON`, else /usr/bin/python3; skipped if it lacks the packages.
    #[test]
    fn scientific_python_runs_under_the_filter() {
        let python = std::env::var("RUNCELL_TEST_SCI_PYTHON")
            .unwrap_or_else(|_| "/usr/bin/python3".to_owned());
        let script = r#"
import numpy as np, pandas as pd, matplotlib, io
matplotlib.use("Agg")
import matplotlib.pyplot as plt
a = np.random.rand(300, 300); b = a @ a.T; np.linalg.eigvalsh(b[:50, :50])
df = pd.DataFrame({"x": range(1000), "y": np.arange(1000) % 7}); df.groupby("y").sum()
fig, ax = plt.subplots(); ax.plot([1, 2, 3]); buf = io.BytesIO(); fig.savefig(buf, format="png")
assert buf.getvalue()[:4] == b"\x89PNG"
"#;
        let control = std::process::Command::new(&python)
            .args(["-c", "import numpy, pandas, matplotlib"])
            .stderr(std::process::Stdio::null())
            .status();
        if !matches!(control, Ok(s) if s.success()) {
            eprintln!("{python} lacks numpy/pandas/matplotlib: skipping");
            return;
        }
        assert_eq!(run_filtered(&[&python, "-c", script]), Outcome::Exited(0));
    }

    #[test]
    fn bash_runs_under_the_filter() {
        let script = "for i in 1 2; do echo $i | cat; done; ls / >/dev/null";
        assert_eq!(
            run_filtered(&["/bin/bash", "-c", script]),
            Outcome::Exited(0)
        );
        let coreutils = "set -e; d=$(mktemp -d); cd $d; echo a > f; cp f g; mv g h; ln -s h l; \
                         chmod 600 f; touch -d @0 f; stat -c %s f; sort f | uniq | wc -l; \
                         tar cf t.tar f h; mkdir x; rmdir x; readlink l; id; date; sleep 0.01; \
                         find . -name f; grep -q a f; (sleep 0.01 &) ; wait; cd /; rm -rf $d";
        assert_eq!(
            run_filtered(&["/bin/bash", "-c", coreutils]),
            Outcome::Exited(0)
        );
    }

    #[test]
    fn node_runs_under_the_filter() {
        if !have("/usr/bin/node") {
            return;
        }
        let script = "require('fs').readdirSync('/'); setTimeout(()=>{},10)";
        assert_eq!(
            run_filtered(&["/usr/bin/node", "-e", script]),
            Outcome::Exited(0)
        );
        let workload = r#"
const fs = require('fs'), cp = require('child_process'), net = require('net');
const os = require('os'), path = require('path'), { Worker } = require('worker_threads');
const d = fs.mkdtempSync(path.join(os.tmpdir(), 'n-'));
fs.writeFileSync(path.join(d, 'a'), 'x'); fs.renameSync(path.join(d, 'a'), path.join(d, 'b'));
fs.rmSync(d, { recursive: true });
if (cp.execSync('echo hi').toString().trim() !== 'hi') process.exit(3);
if (cp.spawnSync('true').status !== 0) process.exit(4);
require('crypto').randomBytes(8); require('zlib').gzipSync('abc'); os.cpus();
fs.promises.readFile('/etc/passwd').then(() => {
  const w = new Worker('require("worker_threads").parentPort.postMessage(1)', { eval: true });
  w.on('message', () => {
    const srv = net.createServer(s => s.end('ok')).listen(0, '127.0.0.1', () => {
      const c = net.connect(srv.address().port, '127.0.0.1');
      c.on('data', () => { c.destroy(); srv.close(); setTimeout(() => {}, 10); });
    });
  });
});
"#;
        assert_eq!(
            run_filtered(&["/usr/bin/node", "-e", workload]),
            Outcome::Exited(0)
        );
    }
}

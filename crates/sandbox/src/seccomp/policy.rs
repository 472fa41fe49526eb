//! The policy as data: every allowed, denied and no-op system call with the reason naming who
//! needs it (or why it is refused), and the argument rules the allowed ones carry. Nothing here
//! builds or loads a filter ([`super::build`] and [`super::install`] do).

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

/// The errno of everything not allowed.
pub(super) const DEFAULT_ERRNO: i32 = libc::EPERM;

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
pub(super) const SOCK_TYPE_MASK: u64 = 0xf;

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
pub(super) const SOCKET_PROTOCOL_ERRNO: i32 = libc::EPROTONOSUPPORT;

/// An ioctl request as the filter compares it. `libc::Ioctl` is `c_ulong` on glibc and `c_int`
/// on musl, hence a cast that is a no-op on some targets.
#[allow(clippy::unnecessary_cast)]
pub(super) const fn ioctl_request(request: libc::Ioctl) -> u64 {
    request as u64
}

/// `personality(0xffffffff)` only reports the current persona.
pub(super) const PERSONALITY_QUERY: u64 = 0xffff_ffff;
/// `PER_LINUX`, the default persona (libc has no constant for it).
pub(super) const PER_LINUX: u64 = 0;

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

/// What pid 1 may still call once it has confined itself (`pid1::confine_pid1`): it runs no
/// user code, and from then on only waits for its children, reads the program's messages,
/// reports on its control socket and exits. A filter of its own, a few instructions long,
/// instead of the program's: pid 1 can do less than the program (no files, no sockets, no
/// new processes), and loading it costs a fraction of the program's filter, which every
/// sandbox's pid 1 loaded too (the cBPF check, the conversion, the JIT and the kernel's
/// per-number action cache scale with a filter's length: ~0.25 ms of a one-shot's CPU).
const COMMON_PID1_ALLOWED: &[Allowed] = allow! {
    "pid 1: the program's messages, the signalfd of its children's exits, the report" => [
        SYS_read, SYS_write, SYS_close,
    ];
    "pid 1: waiting for a child's exit or the supervisor's hang-up" => [SYS_ppoll];
    "pid 1: reaping, and stopping or killing what is left of the sandbox at its end" => [
        SYS_wait4, SYS_waitid, SYS_kill,
    ];
    "pid 1: the C library's allocator (the report line, the messages read)" => [
        SYS_brk, SYS_mmap, SYS_munmap, SYS_mremap, SYS_madvise,
    ];
    "pid 1: signals and system calls interrupted by them; leaving" => [
        SYS_rt_sigreturn, SYS_restart_syscall, SYS_exit, SYS_exit_group,
    ];
};

/// pid 1's x86_64 legacy forms (glibc's `poll` is `SYS_poll` there).
#[cfg(target_arch = "x86_64")]
const ARCH_PID1_ALLOWED: &[Allowed] = allow! {
    "pid 1 (x86_64 legacy form): waiting for a child's exit or the supervisor's hang-up" => [
        SYS_poll,
    ];
};
#[cfg(target_arch = "aarch64")]
const ARCH_PID1_ALLOWED: &[Allowed] = &[];

static PID1_ALLOWED: [Allowed; COMMON_PID1_ALLOWED.len() + ARCH_PID1_ALLOWED.len()] =
    concat(COMMON_PID1_ALLOWED, ARCH_PID1_ALLOWED);

/// pid 1's allow-list (see [`COMMON_PID1_ALLOWED`]); everything else fails with `EPERM`.
pub fn pid1_allowed() -> &'static [Allowed] {
    &PID1_ALLOWED
}

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

//! The filters in the kernel, in forked children: each refusal with its exact errno beside a
//! positive control, then real runtimes (Python, bash, Node.js) under the real [`super::install`].

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use libc::c_long;

use super::policy::ioctl_request;
use super::*;

// The test harness is multi-threaded, so a child only makes raw system calls (or execs) and
// leaves through `_exit`.

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
    // x32's write: a number pid 1's filter allows, with the ABI bit.
    // SAFETY: writing 0 bytes to stderr, whatever ABI bit is set.
    let x32_write = || unsafe { sys(libc::SYS_write | 0x4000_0000, [2, 0, 0, 0, 0, 0]) };
    let pid1 = [build_pid1().expect("build pid 1's filter")];
    assert_eq!(
        probe(Filter::Programs(&pid1), &[&x32_getpid, &x32_write]),
        [EPERM, EPERM],
        "pid 1's filter"
    );
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
    let pid1 = [build_pid1().expect("build pid 1's filter")];
    for programs in [&p[..], &pid1[..]] {
        let filtered = in_child(Duration::from_secs(10), || {
            if let Err(e) = enter(Filter::Programs(programs)) {
                return e;
            }
            i386_getpid();
            100
        });
        assert_eq!(filtered, Outcome::Signaled(libc::SIGSYS));
    }
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
    let python =
        std::env::var("RUNCELL_TEST_SCI_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".to_owned());
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

/// Pid 1's own filter: what its reap loop makes works (a write, a wait, a kill of nobody, an
/// allocation), and what a hijacked pid 1 would want is refused with EPERM — opening a file,
/// a socket, a new process, its pid — each beside the same call without the filter.
#[test]
fn pid1_filter_allows_its_reap_loop_and_refuses_the_rest() {
    let pid1 = [build_pid1().expect("build pid 1's filter")];
    let path = c"/proc/self/status";
    // SAFETY: a valid NUL-terminated path; the descriptor is closed at once.
    let open = || unsafe {
        let fd = sys(
            libc::SYS_openat,
            [
                libc::AT_FDCWD as u64,
                path.as_ptr() as u64,
                libc::O_RDONLY as u64,
                0,
                0,
                0,
            ],
        );
        if fd >= 0 {
            libc::close(fd as i32);
            return 0;
        }
        fd
    };
    // SAFETY: integer arguments only; the descriptor is closed at once.
    let socket = || unsafe {
        let fd = sys(
            libc::SYS_socket,
            [libc::AF_UNIX as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0],
        );
        if fd >= 0 {
            libc::close(fd as i32);
            return 0;
        }
        fd
    };
    // SAFETY: integer arguments only.
    let getpid = || unsafe { sys(libc::SYS_getpid, [0; 6]).min(0) };
    // A fork whose child leaves at once; the parent reaps it (wait4 is pid 1's own call).
    let fork = || {
        // SAFETY: raw clone with SIGCHLD only: a fork; the child only _exits.
        let pid = unsafe { sys(libc::SYS_clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]) };
        if pid == 0 {
            // SAFETY: leaving the forked child.
            unsafe { libc::_exit(0) }
        }
        if pid > 0 {
            // SAFETY: reaping our own child with a null status pointer.
            unsafe { sys(libc::SYS_wait4, [pid as u64, 0, 0, 0, 0, 0]) };
            return 0;
        }
        pid
    };
    // SAFETY: writing 0 bytes to stderr.
    let write = || unsafe { sys(libc::SYS_write, [2, 0, 0, 0, 0, 0]) };
    // SAFETY: a fresh anonymous mapping of our own, unmapped at once.
    let mmap = || unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return -1;
        }
        libc::munmap(p, 4096) as c_long
    };
    // kill(pid 0x7fffffff, 0): nobody has that pid: ESRCH, which the filter let through.
    // SAFETY: integer arguments only; signal 0 sends nothing.
    let kill = || unsafe { sys(libc::SYS_kill, [0x7fff_ffff, 0, 0, 0, 0, 0]) };
    let probes: [&dyn Fn() -> c_long; 7] = [&open, &socket, &getpid, &fork, &write, &mmap, &kill];
    assert_eq!(
        probe(Filter::None, &probes),
        [0, 0, 0, 0, 0, 0, libc::ESRCH],
        "control"
    );
    assert_eq!(
        probe(Filter::Programs(&pid1), &probes),
        [EPERM, EPERM, EPERM, EPERM, 0, 0, libc::ESRCH],
        "pid 1's filter"
    );
}

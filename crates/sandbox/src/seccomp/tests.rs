//! The policy tables and the programs built from them, checked without loading anything:
//! the tables' consistency, then every decision of the compiled programs, run by [`super::bpf`].

use std::collections::HashSet;

use super::bpf::{
    decide, errno_ret, steps_to_decide, ALLOW, AUDIT_ARCH_I386, KILL_PROCESS, NATIVE_AUDIT_ARCH,
};
use super::compile::build_with;
use super::policy::ioctl_request;
use super::*;

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
// The compiled programs, through the interpreter; the kernel tests confirm it.

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

/// Pid 1's program, for every number and ABI: its table allowed whatever the arguments,
/// everything else `EPERM` (x32 numbers included), another architecture killed; its table
/// says who needs each call, has no duplicates, and allows nothing the program's does not.
#[test]
fn pid1_program_allows_its_table_and_nothing_else() {
    let program = [build_pid1().expect("build pid 1's filter")];
    let table: HashSet<i64> = pid1_allowed().iter().map(|e| e.nr).collect();
    assert_eq!(table.len(), pid1_allowed().len(), "a call listed twice");
    for e in pid1_allowed() {
        assert!(
            e.reason.starts_with("pid 1") && e.reason.len() > 15,
            "{}",
            e.name
        );
        assert!(
            allowed().iter().any(|a| a.nr == e.nr),
            "{} is allowed to pid 1 but not to the program",
            e.name
        );
    }
    for nr in (0..1100)
        .chain((0..1100).map(|n| n | 0x4000_0000))
        .chain([u32::MAX as i64])
    {
        for args in [[0u64; 6], [u64::MAX; 6]] {
            let want = if table.contains(&nr) {
                ALLOW
            } else {
                errno_ret(libc::EPERM)
            };
            assert_eq!(
                decide(&program, nr, NATIVE_AUDIT_ARCH, args),
                want,
                "nr {nr}"
            );
            assert_eq!(
                decide(&program, nr, AUDIT_ARCH_I386, args),
                KILL_PROCESS,
                "i386 nr {nr}"
            );
        }
    }
}

//! What loading the seccomp filters costs (docs/benchmarks.md, "Issue 23, fourteenth
//! session"): the program's programs ([`runcell_sandbox::seccomp::build`]) against pid 1's own
//! ([`runcell_sandbox::seccomp::build_pid1`]), each loaded in a fresh forked child, which times
//! its own load and reports it on a pipe. A measurement, not a test: nothing is asserted.
//!
//!   cargo run --release -p runcell-sandbox --example seccomp_load [LOADS=200]

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use seccompiler::{sock_filter, BpfProgram};

/// Forks a child that sets `no_new_privs`, loads `programs` in order and writes the
/// nanoseconds that took; returns them.
fn one_load(programs: &[BpfProgram]) -> u64 {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a two-element array for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: pipe2 succeeded: both descriptors are open and owned by nobody else.
    let (rx, tx) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child only makes system calls on memory it owns and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let t = Instant::now();
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        for p in programs {
            if seccompiler::apply_filter(p).is_err() {
                // SAFETY: leaving the child.
                unsafe { libc::_exit(1) };
            }
        }
        let ns = t.elapsed().as_nanos() as u64;
        // SAFETY: writes 8 bytes from a live local to our pipe, then leaves.
        unsafe {
            libc::write(tx.as_raw_fd(), (&ns as *const u64).cast(), 8);
            libc::_exit(0)
        }
    }
    drop(tx);
    let mut buf = [0u8; 8];
    let mut rx = std::fs::File::from(rx);
    let ok = rx.read_exact(&mut buf).is_ok();
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(ok, "the child could not load the filter");
    u64::from_ne_bytes(buf)
}

fn main() {
    let loads: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let program = runcell_sandbox::seccomp::build().expect("the program's filter");
    let pid1 = vec![runcell_sandbox::seccomp::build_pid1().expect("pid 1's filter")];
    let ret_allow = vec![vec![sock_filter {
        code: 0x06, // BPF_RET | BPF_K
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ALLOW,
    }]];
    let lengths = |p: &[BpfProgram]| p.iter().map(Vec::len).collect::<Vec<_>>();
    let cases: [(&str, &[BpfProgram]); 4] = [
        ("nothing (no_new_privs only)", &[]),
        ("one instruction", &ret_allow),
        ("pid 1's filter", &pid1),
        ("the program's filters", &program),
    ];
    for (name, programs) in cases {
        let mut ns: Vec<u64> = (0..loads).map(|_| one_load(programs)).collect();
        ns.sort_unstable();
        println!(
            "{name:30} {:?} instructions: median {:>4} µs, p90 {:>4} µs ({loads} loads)",
            lengths(programs),
            ns[loads / 2] / 1000,
            ns[loads * 9 / 10] / 1000,
        );
    }
}

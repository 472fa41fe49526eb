//! The init helper: a freshly exec'd, single-threaded copy of the runcell binary that builds
//! one sandbox and runs the program in it. Namespace setup never happens inside the
//! (multi-threaded) supervisor: after `fork` only the forking thread exists, and any lock another
//! thread held stays locked forever in the child.
//!
//! Processes:
//! ```text
//! supervisor ──spawn──▶ helper (host root, host namespaces)
//!                        │ joins the cgroup, clone(CLONE_NEW*) ──▶ pid 1 (sandbox init)
//!                        │ writes the uid/gid maps                 │ steps 1-4, then fork ──▶ program
//!                        │ waits, reports on fd 3                  │ reaps; exits with it      steps 5-7, execve
//! ```
//! When pid 1 exits, the kernel kills every process left in the PID namespace, so a program that
//! double-forks and calls setsid still dies with the run.
//!
//! A single-threaded caller (the zygote, `runcell run`) plays the helper's part itself
//! ([`crate::direct`]); its pid 1 then runs [`crate::pid1::direct_pid1`]: the same steps,
//! reporting on the control socket itself. Pid 1's steps are in [`crate::pid1`].

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use crate::pid1::{
    describe_status, error_line, parse_messages, readable_unless_hung_up, redirect_stdio_to_null,
    sandbox_pid1, Step, StepError, CHANNEL_FD, CONTROL_FD, WORKSPACE_TREE_ARG, WORKSPACE_TREE_FD,
};
use crate::spec::{Spec, INIT_ARG};
use crate::sys::{close_fds_from, cvt, pipe_cloexec, write_all_fd};
use crate::{seccomp, user_ns};

/// Call first thing in `main` of any binary that can serve as the init helper: when the first
/// argument is [`INIT_ARG`] this never returns.
pub fn run_if_init() {
    match std::env::args_os().nth(1) {
        Some(a) if a == INIT_ARG => init_main(),
        Some(a) if a == crate::zygote::ZYGOTE_ARG => crate::zygote::zygote_main(),
        Some(a) if a == crate::spawn_ns::SPAWN_NS_ARG => {
            crate::spawn_ns::holder_main(std::env::args_os().skip(2).map(Into::into).collect())
        }
        _ => {}
    }
}

/// Entry point of the helper process.
pub fn init_main() -> ! {
    // Out of the caller's session and process group: a Ctrl-C at the caller's terminal is for
    // the caller (a REPL interrupts the cell), not a reason for the sandbox to die. If the
    // caller itself dies, the control socket tells us.
    // SAFETY: setsid has no arguments; failure (already a leader) is harmless.
    unsafe { libc::setsid() };
    // Nothing but stdio, the control socket, the program's channel and (when the supervisor
    // says so) the workspace's mount is meant for us.
    let tree = std::env::args_os()
        .nth(2)
        .is_some_and(|a| a == WORKSPACE_TREE_ARG);
    close_fds_from(
        CHANNEL_FD + 1,
        if tree { &[WORKSPACE_TREE_FD] } else { &[] },
    );
    // SAFETY: the supervisor put the workspace's mount there, ours alone.
    let tree = tree.then(|| unsafe { OwnedFd::from_raw_fd(WORKSPACE_TREE_FD) });
    let spec = read_spec().and_then(|b| Spec::from_bytes(&b).map_err(io::Error::other));
    if !spec.as_ref().is_ok_and(|s| s.channel) {
        // SAFETY: closing a descriptor nobody else in this process uses.
        unsafe { libc::close(CHANNEL_FD) };
    }
    let line = match spec {
        Err(e) => format!("error invalid sandbox spec: {e}\n"),
        Ok(spec) => match helper(&spec, tree) {
            Ok(status) => describe_status(status),
            Err(e) => error_line(&e),
        },
    };
    let _ = write_all_fd(CONTROL_FD, line.as_bytes());
    // SAFETY: exiting the helper; no destructors need to run.
    unsafe { libc::_exit(0) }
}

fn read_spec() -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        // SAFETY: reading into a valid buffer from the control socket.
        let n = unsafe { libc::read(CONTROL_FD, buf.as_mut_ptr().cast(), buf.len()) };
        match n {
            0 => return Ok(bytes),
            n if n > 0 => bytes.extend_from_slice(&buf[..n as usize]),
            _ => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
        if bytes.len() > 16 << 20 {
            return Err(io::Error::other("sandbox spec larger than 16 MiB"));
        }
    }
}

/// Host side: join the cgroup, create the namespaces, map the ids, wait for the sandbox.
/// Returns the program's raw wait status. `workspace_tree`: the workspace's mount, detached,
/// when this helper runs in a mount namespace without it (`crate::spawn_ns`); pid 1 attaches it.
fn helper(spec: &Spec, workspace_tree: Option<OwnedFd>) -> Result<libc::c_int, StepError> {
    // Supplementary groups survive clone and stay usable in the user namespace: host root's
    // group 0 would open group-readable root files to the sandbox. Drop them while still root.
    // SAFETY: an empty group list.
    cvt(unsafe { libc::setgroups(0, std::ptr::null()) })
        .map_err(StepError::at(Step::UserNamespace))?;

    // Step 4 starts here, before the namespaces: a process can only be placed in a cgroup from
    // outside, and joining first makes this cgroup the root of the sandbox's cgroup namespace
    // and counts every process the sandbox ever creates.
    for procs in &spec.cgroup_procs {
        join_cgroup(procs).map_err(StepError::at(Step::Limits))?;
    }

    seccomp::prebuild();
    let (sync_r, sync_w) = pipe_cloexec().map_err(StepError::at(Step::Namespaces))?;
    let (msg_r, msg_w) = pipe_cloexec().map_err(StepError::at(Step::Namespaces))?;
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP;
    // SAFETY: clone without CLONE_VM and with a null stack behaves like fork: the child gets a
    // copy of this single-threaded process and continues on its own copy of the stack.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(StepError::at(Step::Namespaces)(io::Error::last_os_error()));
    }
    if pid == 0 {
        drop(sync_w);
        drop(msg_r);
        sandbox_pid1(spec, sync_r, msg_w, workspace_tree);
    }
    drop(workspace_tree);
    let pid = pid as libc::pid_t;
    if spec.channel {
        // The channel belongs to the program alone: its end-of-file must mean the program is
        // gone. (Without a channel, fd 4 was closed at start and may now be one of our pipes.)
        // SAFETY: closing our copy; pid 1 has its own.
        unsafe { libc::close(CHANNEL_FD) };
    }
    drop(sync_r);
    drop(msg_w);

    if let Err(e) = user_ns::write_id_maps(pid, spec.host_uid) {
        kill_and_reap(pid);
        return Err(StepError::at(Step::UserNamespace)(e));
    }
    // Release pid 1. `sync_w` stays open until we exit: pid 1 treats its closing as our death.
    write_all_fd(sync_w.as_raw_fd(), b"1").map_err(StepError::at(Step::Namespaces))?;

    // Only the sandbox holds the caller's stdio pipes from now on, so end-of-file on them means
    // the sandbox is gone.
    redirect_stdio_to_null();

    let message = match wait_for_messages(msg_r) {
        Ok(m) => m,
        Err(e) => {
            // The supervisor went away: nobody is left to collect the output or enforce the
            // deadline, so the sandbox ends now.
            kill_and_reap(pid);
            return Err(StepError::at(Step::Exec)(e));
        }
    };
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    drop(sync_w);

    // pid 1 reports the program's status; if it died without a word (killed), report how it died.
    Ok(parse_messages(&message)?.unwrap_or(status))
}

/// Moves the (single-threaded) helper into one cgroup. On v1, writing "0" to `tasks` moves just
/// the calling thread, which lets the kernel skip its global threadgroup lock and the RCU grace
/// period that comes with it (~10 ms per run, measured); for a one-thread process the result is
/// the same as writing the pid to `cgroup.procs`, which v2 needs.
fn join_cgroup(procs: &Path) -> io::Result<()> {
    let tasks = procs.with_file_name("tasks");
    if tasks.exists() {
        fs::write(tasks, "0")
    } else {
        fs::write(procs, std::process::id().to_string())
    }
}

/// Reads pid 1's messages until it exits, watching the report descriptor: when the supervisor
/// closes its end (it died), give up.
fn wait_for_messages(msg_r: OwnedFd) -> io::Result<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if !readable_unless_hung_up(msg_r.as_raw_fd())? {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the supervisor closed the control socket",
            ));
        }
        // SAFETY: reading into a valid buffer from our own descriptor.
        let r = unsafe { libc::read(msg_r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match r {
            0 => break,
            r if r > 0 => out.extend_from_slice(&buf[..r as usize]),
            _ => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn kill_and_reap(pid: libc::pid_t) {
    // SAFETY: signalling and reaping our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}

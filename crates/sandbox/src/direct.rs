//! The cold helper's part played in-process by a single-threaded caller: the zygote (for every
//! session it starts) and a single-threaded supervisor (`runcell run`). Instead of forking a
//! helper that then clones pid 1, the caller joins the sandbox's cgroup, clones pid 1 into the new
//! namespaces, goes back to its own cgroup and writes pid 1's id maps. Pid 1 then runs
//! [`crate::pid1::direct_pid1`]: the same steps as a cold pid 1, reporting on the control socket
//! itself. One process (and, for the zygote, one copy of a large image) fewer per sandbox.
//!
//! Never from a multi-threaded process: the clone copies only the calling thread.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use crate::cgroup::{Cgroup, CgroupVersion};
use crate::pid1::Pid1Program;
use crate::sys::{pipe_cloexec, write_all_fd};

/// What the caller needs to start pid 1, besides the spec (which only pid 1 parses: the zygote
/// must not keep a session's environment in its heap, inherited by every later fork).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct ForkRequest {
    /// The host uid the sandbox user maps to.
    pub host_uid: u32,
    pub cgroup: CgroupEntry,
    /// What a zygote's fork runs once confined (a cold pid 1 execs the spec's argv instead).
    #[serde(default)]
    pub program: ForkedProgram,
    /// The request's sixth descriptor is the workspace's mount, detached (`open_tree`): the
    /// zygote's mount namespace is not the host's and does not have it (crate::zygote).
    #[serde(default)]
    pub workspace_tree: bool,
}

/// What the zygote's preloaded Python does in a sandbox it forked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub(crate) enum ForkedProgram {
    /// Serve a session's kernel protocol.
    #[default]
    Kernel,
    /// Run the spec's `argv[1]` as `__main__`, with `argv[1..]` as `sys.argv`: what
    /// `python3 FILE ARGS...` (`argv`) would do, for one-shot runs.
    Main,
    /// [`ForkedProgram::Main`] of a sandbox made before its run was asked for: once confined,
    /// the program waits on the channel (fd 3) for the run's argv (JSON, up to end of file),
    /// closes it and runs that as `Main` would (see `Sandbox::prepare_main`).
    MainWhenTold,
}

impl ForkRequest {
    pub(crate) fn new(cgroup: &Cgroup, host_uid: u32) -> ForkRequest {
        let dirs = cgroup.paths();
        let cgroup = match cgroup.version() {
            CgroupVersion::V2 => CgroupEntry::V2(dirs.into_iter().next().unwrap_or_default()),
            // v1 run cgroups are `<mount>/<own cgroup>/runcell/<name>`, and the caller (the
            // supervisor, or the zygote it started) lives in `<mount>/<own cgroup>`.
            CgroupVersion::V1 => CgroupEntry::V1(
                dirs.iter()
                    .map(|d| {
                        let home = d.parent().and_then(Path::parent).unwrap_or(d);
                        (d.join("tasks"), home.join("tasks"))
                    })
                    .collect(),
            ),
        };
        ForkRequest {
            host_uid,
            cgroup,
            program: ForkedProgram::Kernel,
            workspace_tree: false,
        }
    }
}

/// How pid 1 is born inside the sandbox's cgroup.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) enum CgroupEntry {
    /// v1: the caller moves itself (only its one thread: writing `0` to `tasks` avoids the
    /// kernel's threadgroup lock and an RCU grace period) into each `(join, home)` pair's
    /// `join` file, clones, then moves back through the `home` files.
    V1(Vec<(PathBuf, PathBuf)>),
    /// v2: `clone3(CLONE_INTO_CGROUP)` into this directory; pid 1 then makes its own cgroup
    /// namespace there (the clone's would be rooted at the caller's cgroup).
    V2(PathBuf),
}

/// Where [`start_pid1`] returns.
pub(crate) enum Started {
    /// In the caller: pid 1's pid and a pidfd of it.
    Caller(libc::pid_t, OwnedFd),
    /// In a [`Pid1Program::Continue`] program's process, confined: the spec's argv.
    Program(Vec<String>),
}

/// Why [`start_pid1`] failed.
#[derive(Debug)]
pub(crate) enum StartError {
    /// Nothing was started; the caller is as before.
    Failed(String),
    /// The caller could not go back to its own cgroup: it now counts in the sandbox's limits
    /// and is a target of its `kill_all`. A zygote should end (and be restarted).
    StuckInCgroup(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Failed(e) | StartError::StuckInCgroup(e) => f.write_str(e),
        }
    }
}

/// Work around the clone: the zygote's `PyOS_BeforeFork` / `PyOS_AfterFork_Parent`.
pub(crate) struct ForkHooks<'a> {
    pub before: &'a dyn Fn(),
    pub after_in_parent: &'a dyn Fn(),
}

/// The flags of the clone that makes pid 1 (DESIGN.md §3.2): every namespace at once.
const SANDBOX_NAMESPACES: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// Starts pid 1 of a sandbox for `spec`, with `fds` (stdin, stdout, stderr, control socket,
/// channel) as its 0-4. In the caller, returns pid 1's pid and a pidfd of it; pid 1 is the
/// caller's child. With [`Pid1Program::Continue`], returns [`Started::Program`] in the program's
/// process, confined; with [`Pid1Program::Exec`] only the caller returns.
pub(crate) fn start_pid1(
    request: &ForkRequest,
    spec: &[u8],
    fds: [RawFd; 5],
    workspace_tree: Option<RawFd>,
    program: Pid1Program<'_>,
    hooks: Option<ForkHooks<'_>>,
) -> Result<Started, StartError> {
    let failed = StartError::Failed;
    let (sync_r, sync_w) = pipe_cloexec().map_err(|e| failed(format!("pipe: {e}")))?;
    let v2_dir = match &request.cgroup {
        CgroupEntry::V2(dir) => Some(
            File::open(dir).map_err(|e| failed(format!("open cgroup {}: {e}", dir.display())))?,
        ),
        CgroupEntry::V1(pairs) => {
            for (join, _) in pairs {
                if let Err(e) = std::fs::write(join, "0") {
                    leave_cgroups(pairs).map_err(StartError::StuckInCgroup)?;
                    return Err(failed(format!("join cgroup {}: {e}", join.display())));
                }
            }
            None
        }
    };
    if let Some(h) = &hooks {
        (h.before)();
    }
    let pid = clone_pid1(v2_dir.as_ref());
    let clone_error = io::Error::last_os_error();
    if pid == 0 {
        let v2 = v2_dir.is_some();
        // Closed already (pid 1 closes everything above 4 but its copy of sync_r): dropping
        // them here would close whatever took their numbers since.
        std::mem::forget((sync_w, v2_dir));
        // A one-shot forked from a zygote ends by being stopped, its teardown after the answer
        // (crate::pid1, `reap_and_report`); a session's kernel and a cold program as before.
        let stop = matches!(
            request.program,
            ForkedProgram::Main | ForkedProgram::MainWhenTold
        ) && matches!(program, Pid1Program::Continue(_));
        return Ok(Started::Program(place_fds(
            fds,
            workspace_tree,
            spec,
            sync_r,
            v2,
            stop,
            program,
        )));
    }
    if let Some(h) = &hooks {
        (h.after_in_parent)();
    }
    let left = match &request.cgroup {
        CgroupEntry::V1(pairs) => leave_cgroups(pairs),
        CgroupEntry::V2(_) => Ok(()),
    };
    if pid < 0 {
        left.map_err(StartError::StuckInCgroup)?;
        return Err(failed(format!("clone: {clone_error}")));
    }
    let kill = |why: String| {
        // SAFETY: our own unreaped child: it must not live on without its maps or its caller.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        why
    };
    left.map_err(|e| StartError::StuckInCgroup(kill(e)))?;
    crate::user_ns::write_id_maps(pid, request.host_uid)
        .map_err(|e| failed(kill(format!("uid map: {e}"))))?;
    // SAFETY: pidfd_open of our own unreaped child.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        let e = io::Error::last_os_error();
        return Err(failed(kill(format!("pidfd_open: {e}"))));
    }
    // SAFETY: a fresh descriptor, ours alone.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    // Release pid 1; the closing tells it nobody else will write.
    write_all_fd(sync_w.as_raw_fd(), b"1").map_err(|e| failed(kill(format!("sync: {e}"))))?;
    Ok(Started::Caller(pid, pidfd))
}

/// Back into the caller's own cgroups. Failing that, the caller would count in the sandbox's
/// limits and be a target of its `kill_all`.
fn leave_cgroups(pairs: &[(PathBuf, PathBuf)]) -> Result<(), String> {
    for (_, home) in pairs {
        std::fs::write(home, "0").map_err(|e| {
            format!(
                "cannot leave the sandbox's cgroup for {}: {e}",
                home.display()
            )
        })?;
    }
    Ok(())
}

/// clone(CLONE_NEW*) like fork; on v2 straight into the cgroup `v2_dir` (clone3), leaving the
/// cgroup namespace to pid 1.
fn clone_pid1(v2_dir: Option<&File>) -> libc::pid_t {
    match v2_dir {
        None => {
            // SAFETY: clone without CLONE_VM and with a null stack behaves like fork: the child
            // gets a copy of this single-threaded process on its own copy of the stack.
            unsafe {
                libc::syscall(
                    libc::SYS_clone,
                    (SANDBOX_NAMESPACES | libc::CLONE_NEWCGROUP | libc::SIGCHLD) as libc::c_ulong,
                    0usize,
                    0usize,
                    0usize,
                    0usize,
                ) as libc::pid_t
            }
        }
        Some(dir) => {
            let args = CloneArgs {
                flags: SANDBOX_NAMESPACES as u64 | CLONE_INTO_CGROUP,
                exit_signal: libc::SIGCHLD as u64,
                cgroup: dir.as_raw_fd() as u64,
                ..CloneArgs::default()
            };
            // SAFETY: clone3 with a valid, fully initialised clone_args of the size passed; a
            // zero stack makes it behave like fork, as above.
            unsafe {
                libc::syscall(
                    libc::SYS_clone3,
                    &args as *const CloneArgs,
                    std::mem::size_of::<CloneArgs>(),
                ) as libc::pid_t
            }
        }
    }
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` of clone3(2), up to `cgroup` (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// In the fresh clone: `fds` onto 0-4, then pid 1. Returns only in a
/// [`Pid1Program::Continue`] program's process.
fn place_fds(
    fds: [RawFd; 5],
    workspace_tree: Option<RawFd>,
    spec: &[u8],
    sync_r: OwnedFd,
    v2: bool,
    stop: bool,
    program: Pid1Program<'_>,
) -> Vec<String> {
    let dup_high = |fd: RawFd| {
        // SAFETY: duplicating a descriptor we own.
        let h = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
        if h < 0 {
            // SAFETY: leaving; the caller sees pid 1 end without a report.
            unsafe { libc::_exit(126) };
        }
        h
    };
    // Move them, the sync pipe and the workspace's mount above 10 first: any may sit on a
    // target number.
    let high = [fds[0], fds[1], fds[2], fds[3], fds[4], sync_r.as_raw_fd()].map(dup_high);
    // SAFETY: a fresh duplicate, ours alone.
    let workspace_tree = workspace_tree.map(|fd| unsafe { OwnedFd::from_raw_fd(dup_high(fd)) });
    for (target, h) in high[..5].iter().enumerate() {
        // SAFETY: dup2 onto 0-4 (whatever sat there in the caller is replaced, as it must be).
        unsafe { libc::dup2(*h, target as RawFd) };
    }
    // The originals are closed by direct_pid1 with every other descriptor above 4.
    let _ = sync_r.into_raw_fd();
    // SAFETY: our duplicate.
    let sync_r = unsafe { OwnedFd::from_raw_fd(high[5]) };
    crate::pid1::direct_pid1(spec, sync_r, workspace_tree, v2, stop, program)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::testutil::{is_root, unique_name};

    /// `clone3(CLONE_INTO_CGROUP)` against a real cgroup2: this development host's unified
    /// mount has no controllers, but cgroups (and so the clone's placement) work there.
    #[test]
    fn v2_clone_lands_in_the_cgroup_and_v1_in_the_callers() {
        let unified = Path::new("/sys/fs/cgroup/unified");
        if !is_root() || !unified.join("cgroup.procs").exists() {
            eprintln!(
                "skipping: no root or no cgroup2 mount at {}",
                unified.display()
            );
            return;
        }
        let name = unique_name("clone3");
        let dir = unified.join(&name);
        std::fs::create_dir(&dir).expect("mkdir");
        let cgroup_of_child = |v2: Option<&File>| -> String {
            let (r, w) = pipe_cloexec().expect("pipe");
            let pid = clone_pid1(v2);
            if pid == 0 {
                // In the clone of a multi-threaded test process: raw syscalls only.
                let mut buf = [0u8; 4096];
                // SAFETY: a constant path, a stack buffer, our own descriptors; then _exit.
                unsafe {
                    let fd = libc::open(c"/proc/self/cgroup".as_ptr(), libc::O_RDONLY);
                    let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                    libc::write(w.as_raw_fd(), buf.as_ptr().cast(), n.max(0) as usize);
                    libc::_exit(0);
                }
            }
            assert!(pid > 0, "clone: {}", io::Error::last_os_error());
            drop(w);
            let mut out = String::new();
            io::Read::read_to_string(&mut File::from(r), &mut out).expect("read");
            // SAFETY: reaping our own child.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            out
        };
        let dir_fd = File::open(&dir).expect("open cgroup");
        let into = cgroup_of_child(Some(&dir_fd));
        let plain = cgroup_of_child(None);
        let _ = std::fs::remove_dir(&dir);
        // The v2 line ("0::path"): the child started inside the new cgroup...
        let v2_line = |text: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix("0::"))
                .unwrap_or_default()
                .to_owned()
        };
        assert!(v2_line(&into).ends_with(&name), "{into}");
        // ...while a plain clone (with its own cgroup namespace, rooted where the caller is)
        // sees itself at its namespace's root: the positive control.
        assert_eq!(v2_line(&plain), "/", "{plain}");
    }
}

//! Inside the sandbox: pid 1 and the program's process.
//!
//! Pid 1 takes steps 1-4 of DESIGN.md §3 (everything it forks inherits them), forks the program,
//! which takes steps 5-7 and execs (or, forked from the zygote, continues as the preloaded
//! Python), and reaps until the program exits. Whoever cloned pid 1 hears how it went: the
//! exec'd helper ([`crate::init`]) on the message pipe, an in-process creator
//! ([`crate::direct`]) on the control socket, which pid 1 then writes itself.

use std::ffi::CString;
use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::spec::{Spec, HOSTNAME, WORKSPACE};
use crate::sys::{close_fds_from, cvt, pipe_cloexec, write_all_fd};
use crate::{caps, landlock, mount, net, rlimit, seccomp, user_ns};

/// Where the helper receives the optional channel to the program (see [`Spec::channel`]); the
/// program finds it at fd 3.
pub(crate) const CHANNEL_FD: libc::c_int = 4;

/// Where an exec'd helper started with [`WORKSPACE_TREE_ARG`] finds the workspace's mount,
/// detached: it runs in a mount namespace without the workspaces (`crate::spawn_ns`).
pub(crate) const WORKSPACE_TREE_FD: libc::c_int = 5;

/// The helper's argument after [`crate::spec::INIT_ARG`] that says fd [`WORKSPACE_TREE_FD`] is
/// the workspace's mount.
pub(crate) const WORKSPACE_TREE_ARG: &str = "--workspace-tree";

/// The helper's control socket: it reads the spec from it (until the supervisor shuts down its
/// writing side) and writes the outcome to it. A hang-up on it means the supervisor died.
pub(crate) const CONTROL_FD: libc::c_int = 3;

/// The isolation steps of DESIGN.md §3, in order. `docs/sandbox.md` follows the same numbering.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    UserNamespace = 1,
    Namespaces = 2,
    Mounts = 3,
    Limits = 4,
    Privileges = 5,
    Landlock = 6,
    Seccomp = 7,
    Exec = 8,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Step::UserNamespace => "user namespace",
            Step::Namespaces => "namespaces",
            Step::Mounts => "mounts",
            Step::Limits => "limits",
            Step::Privileges => "privileges",
            Step::Landlock => "landlock",
            Step::Seccomp => "seccomp",
            Step::Exec => "exec",
        };
        write!(f, "step {} ({name})", *self as u8)
    }
}

/// A failed isolation step, with its whole cause chain flattened for the report line.
pub(crate) struct StepError {
    pub(crate) step: Step,
    pub(crate) message: String,
}

impl StepError {
    pub(crate) fn at<E: std::error::Error>(step: Step) -> impl FnOnce(E) -> StepError {
        move |e| {
            let mut message = e.to_string();
            let mut source = e.source();
            while let Some(s) = source {
                message.push_str(": ");
                message.push_str(&s.to_string());
                source = s.source();
            }
            StepError { step, message }
        }
    }
}

/// What pid 1 forks into the sandbox's program.
pub(crate) enum Pid1Program<'a> {
    /// `execve` of the spec's argv (every cold sandbox).
    Exec,
    /// This very process image (the zygote's preloaded Python), which continues once confined;
    /// the hook runs first thing in the program's process (Python's after-fork work).
    Continue(&'a dyn Fn()),
}

/// Pid 1 of a sandbox whose helper's part was played in-process by its creator (the zygote or a
/// single-threaded supervisor, see [`crate::direct`]), which joined the cgroup, cloned this
/// process, wrote the id maps and then releases `sync_r`. The same steps as a cold pid 1 follow;
/// pid 1 reports to the control socket itself. Descriptors 0-4 are in place as for the exec'd
/// helper. Returns only in a [`Pid1Program::Continue`] program's process, confined, with the
/// spec's argv (what the continuing program is to run). `workspace_tree` is the workspace's
/// mount, detached, when the creator's mount namespace does not have it (the zygote's).
pub(crate) fn direct_pid1(
    spec_bytes: &[u8],
    sync_r: OwnedFd,
    workspace_tree: Option<OwnedFd>,
    new_cgroup_ns: bool,
    stop_at_end: bool,
    program: Pid1Program<'_>,
) -> Vec<String> {
    // SAFETY: setsid has no arguments; it fails harmlessly if already a leader.
    unsafe { libc::setsid() };
    // A clone of the zygote or of `runcell run ...`: its command line names host paths.
    set_cmdline(&[PID1_NAME.as_bytes()]);
    set_comm(PID1_NAME);
    let keep = [
        sync_r.as_raw_fd(),
        workspace_tree.as_ref().map_or(-1, |t| t.as_raw_fd()),
    ];
    close_fds_from(CHANNEL_FD + 1, &keep);
    let spec = match Spec::from_bytes(spec_bytes) {
        Ok(s) => s,
        Err(e) => report_and_exit(&format!("error invalid sandbox spec: {e}\n")),
    };
    if !spec.channel {
        // SAFETY: closing a descriptor nobody else in this process uses.
        unsafe { libc::close(CHANNEL_FD) };
    }
    let (msg_r, msg_w) = match pipe_cloexec() {
        Ok(p) => p,
        Err(e) => report_and_exit(&error_line(&StepError::at(Step::Namespaces)(e))),
    };
    if let Err(e) = prepare(
        &spec,
        &sync_r,
        Parent::Direct { new_cgroup_ns },
        workspace_tree,
    ) {
        report_and_exit(&error_line(&e));
    }
    // SAFETY: pid 1 is single-threaded (a clone of its single-threaded creator).
    match unsafe { libc::fork() } {
        0 => {
            let Pid1Program::Continue(in_program) = program else {
                drop(msg_r);
                exec_program(&spec, msg_w.as_raw_fd())
            };
            in_program();
            // What `/proc/self/cmdline` and `comm` of a cold program say: its own argv.
            let argv: Vec<&[u8]> = spec.argv.iter().map(|a| a.as_bytes()).collect();
            set_cmdline(&argv);
            set_comm(spec.argv.first().map_or("", String::as_str));
            drop(msg_r);
            let msg_fd = msg_w.into_raw_fd();
            // confine() closes it with every other descriptor above the channel.
            let _ = sync_r.into_raw_fd();
            if let Err(e) = enter_program(&spec, msg_fd) {
                die(msg_fd, e, 127)
            }
            // SAFETY: pid 1's message pipe: the program must not keep it.
            unsafe { libc::close(msg_fd) };
            spec.argv
        }
        -1 => report_and_exit(&error_line(&StepError::at(Step::Exec)(
            io::Error::last_os_error(),
        ))),
        program => {
            drop((msg_w, sync_r));
            reap_and_report(program, msg_r, stop_at_end)
        }
    }
}

/// Writes the final report line to the control socket and exits (pid 1 without a helper to
/// report for it).
fn report_and_exit(line: &str) -> ! {
    let _ = write_all_fd(CONTROL_FD, line.as_bytes());
    // SAFETY: leaving; nothing needs unwinding (and the zygote's destructors must not run).
    unsafe { libc::_exit(0) }
}

pub(crate) fn error_line(e: &StepError) -> String {
    format!("error {}: {}\n", e.step, e.message.replace('\n', " "))
}

/// Who created pid 1, which decides how pid 1 notices that its creator is gone.
#[derive(Debug, Clone, Copy)]
enum Parent {
    /// The cold helper: pid 1 dies with it (parent-death signal).
    Helper,
    /// Its creator in-process ([`crate::direct`]). A zygote must be able to die without taking
    /// sessions along, so pid 1 watches the control socket instead (a hang-up: the supervisor
    /// is gone). On cgroup v2 pid 1 was cloned straight into the cgroup and makes its cgroup
    /// namespace itself (rooted there).
    Direct { new_cgroup_ns: bool },
}

pub(crate) fn describe_status(status: libc::c_int) -> String {
    if libc::WIFSIGNALED(status) {
        format!("signal {}\n", libc::WTERMSIG(status))
    } else {
        format!("exit {}\n", libc::WEXITSTATUS(status))
    }
}

/// Reads the lines pid 1 and the program write on their message pipe: `E<step>\t<message>` for
/// a failed step, `S<status>` for the program's wait status.
pub(crate) fn parse_messages(message: &str) -> Result<Option<libc::c_int>, StepError> {
    let mut final_status = None;
    for line in message.lines() {
        if let Some(err) = line.strip_prefix('E') {
            let (step, msg) = err.split_once('\t').unwrap_or(("8", err));
            return Err(StepError {
                step: step_from_number(step),
                message: msg.to_owned(),
            });
        }
        if let Some(s) = line.strip_prefix('S') {
            final_status = s.parse::<libc::c_int>().ok();
        }
    }
    Ok(final_status)
}

fn step_from_number(n: &str) -> Step {
    match n {
        "1" => Step::UserNamespace,
        "2" => Step::Namespaces,
        "3" => Step::Mounts,
        "4" => Step::Limits,
        "5" => Step::Privileges,
        "6" => Step::Landlock,
        "7" => Step::Seccomp,
        _ => Step::Exec,
    }
}

/// Blocks until `fd` is readable (`true`) or the control socket hangs up (`false`: the
/// supervisor is gone). Only a full hang-up counts: the supervisor shut down its writing side
/// long ago.
pub(crate) fn readable_unless_hung_up(fd: libc::c_int) -> io::Result<bool> {
    loop {
        let mut fds = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: CONTROL_FD,
                events: 0,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd structs.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if fds[1].revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            return Ok(false);
        }
        if fds[0].revents != 0 {
            return Ok(true);
        }
    }
}

pub(crate) fn redirect_stdio_to_null() {
    // SAFETY: opening a constant path; dup2 onto the standard descriptors we own.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            for fd in 0..=2 {
                libc::dup2(null, fd);
            }
            libc::close(null);
        }
    }
}

/// Pid 1 of a cold sandbox: steps 1-4, then the program's process (steps 5-7, execve). Never
/// returns.
pub(crate) fn sandbox_pid1(
    spec: &Spec,
    sync_r: OwnedFd,
    msg_w: OwnedFd,
    workspace_tree: Option<OwnedFd>,
) -> ! {
    // A clone of the helper, whose command line names the binary's host path.
    set_cmdline(&[PID1_NAME.as_bytes()]);
    set_comm(PID1_NAME);
    let pid = match prepare(spec, &sync_r, Parent::Helper, workspace_tree) {
        // SAFETY: pid 1 is single-threaded (a clone of the single-threaded helper).
        Ok(()) => match unsafe { libc::fork() } {
            0 => exec_program(spec, msg_w.as_raw_fd()),
            -1 => die(
                msg_w.as_raw_fd(),
                StepError::at(Step::Exec)(io::Error::last_os_error()),
                1,
            ),
            child => child,
        },
        Err(e) => die(msg_w.as_raw_fd(), e, 1),
    };
    reap(pid, msg_w.into_raw_fd())
}

/// What pid 1's `/proc/1/cmdline` says inside, instead of the command line of the process it was
/// cloned from (the helper's, the zygote's, or `runcell run ...`), which names host paths.
const PID1_NAME: &str = "runcell-init";

/// Rewrites this process's command line as `/proc/PID/cmdline` shows it: as many whole `args` as
/// fit in the original argument area, the rest NUL bytes. The kernel reads that area of the
/// process's memory (`mm->arg_start..arg_end`, the argv strings execve put on the stack, found in
/// `/proc/self/stat`); a final NUL keeps it from reading on into the environment. Best effort: a
/// process whose `/proc/self/stat` cannot be read keeps its command line.
fn set_cmdline(args: &[&[u8]]) {
    let Some((start, end)) = arg_area() else {
        return;
    };
    let mut area = vec![0u8; end - start];
    let mut at = 0;
    for a in args {
        // Room for the argument and its NUL (which may be the area's last byte).
        if a.contains(&0) || at + a.len() + 1 > area.len() {
            break;
        }
        area[at..at + a.len()].copy_from_slice(a);
        at += a.len() + 1;
    }
    if at == 0 {
        // Not even the first fits: as much of its last component as does.
        let first = args.first().copied().unwrap_or_default();
        let base = first.rsplit(|&b| b == b'/').next().unwrap_or(first);
        let n = base.len().min(area.len() - 1);
        if !base[..n].contains(&0) {
            area[..n].copy_from_slice(&base[..n]);
        }
    }
    // SAFETY: [start, end) is this process's own argument area, mapped read-write on its stack
    // since execve. Rust holds no reference into it (std copies the arguments when asked for
    // them) and this process is single-threaded, so nothing reads it while it changes.
    unsafe { std::ptr::copy_nonoverlapping(area.as_ptr(), start as *mut u8, area.len()) };
}

/// `arg_start` and `arg_end` from `/proc/self/stat` (fields 48 and 49; the command name before
/// them is in parentheses and may hold spaces).
fn arg_area() -> Option<(usize, usize)> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3.
    let start: usize = fields.get(48 - 3)?.parse().ok()?;
    let end: usize = fields.get(49 - 3)?.parse().ok()?;
    (start > 0 && end > start).then_some((start, end))
}

/// Sets `comm` (`/proc/self/comm`, `ps`) to the last component of `program`, as execve would.
fn set_comm(program: &str) {
    let name = program.rsplit('/').next().unwrap_or(program);
    let mut buf = [0u8; 16];
    let n = name.len().min(15);
    buf[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: a NUL-terminated buffer of 16 bytes, as PR_SET_NAME reads.
    unsafe { libc::prctl(libc::PR_SET_NAME, buf.as_ptr(), 0, 0, 0) };
}

/// Reports a failed step to the helper and exits.
fn die(msg_fd: libc::c_int, e: StepError, code: libc::c_int) -> ! {
    let line = format!("E{}\t{}\n", e.step as u8, e.message.replace('\n', " "));
    let _ = write_all_fd(msg_fd, line.as_bytes());
    // SAFETY: leaving the failed process; nothing needs unwinding.
    unsafe { libc::_exit(code) }
}

/// Steps 1 to 4, in pid 1 (they are inherited by everything forked afterwards).
fn prepare(
    spec: &Spec,
    sync_r: &OwnedFd,
    parent: Parent,
    workspace_tree: Option<OwnedFd>,
) -> Result<(), StepError> {
    // Wait until the helper has written our uid/gid maps.
    let mut byte = [0u8; 1];
    let mut sync = fs::File::from(
        sync_r
            .try_clone()
            .map_err(StepError::at(Step::UserNamespace))?,
    );
    if sync
        .read(&mut byte)
        .map_err(StepError::at(Step::UserNamespace))?
        != 1
    {
        // SAFETY: the helper died before releasing us; nothing to clean up.
        unsafe { libc::_exit(1) };
    }

    // Step 3 begins before step 1: bind sources are opened while pid 1 still has the helper's
    // host uid 0, the owner of root-only directories such as /root/.local/share/runcell. A
    // workspace that came as a detached mount goes where plan() looks for it first.
    if let Some(tree) = workspace_tree {
        mount::attach_tree(tree, &spec.workspace).map_err(StepError::at(Step::Mounts))?;
    }
    let plan = mount::plan(spec).map_err(StepError::at(Step::Mounts))?;

    // 1. User namespace: become the sandbox user (1000 -> the lease's host uid), keeping the
    //    namespace's capabilities for the steps below.
    user_ns::become_sandbox_user().map_err(StepError::at(Step::UserNamespace))?;
    match parent {
        Parent::Helper => {
            // Die with the helper. Set after the uid change, which clears the parent-death
            // signal, and then check the helper did not die in between (its end of the sync pipe
            // would be closed).
            // SAFETY: prctl with integer arguments.
            cvt(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) })
                .map_err(StepError::at(Step::UserNamespace))?;
            let mut pfd = libc::pollfd {
                fd: sync_r.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: a single valid pollfd, zero timeout.
            if unsafe { libc::poll(&mut pfd, 1, 0) } != 0 {
                // SAFETY: the helper is gone; so must we be.
                unsafe { libc::_exit(1) };
            }
        }
        // The zygote closed its end already; the control socket tells of the supervisor's death.
        Parent::Direct { new_cgroup_ns } => {
            if new_cgroup_ns {
                // SAFETY: a flag-only syscall in this single-threaded process.
                cvt(unsafe { libc::unshare(libc::CLONE_NEWCGROUP) })
                    .map_err(StepError::at(Step::Namespaces))?;
            }
        }
    }

    // 2. The other namespaces exist since clone; give UTS its hostname and the network
    //    namespace its loopback.
    // SAFETY: a valid buffer and its length.
    cvt(unsafe { libc::sethostname(HOSTNAME.as_ptr().cast(), HOSTNAME.len()) })
        .map_err(StepError::at(Step::Namespaces))?;
    net::loopback_up().map_err(StepError::at(Step::Namespaces))?;
    // With a network policy, the proxy's socket is listening before the program exists: it
    // cannot take the port first, and a connection it makes at once waits in the backlog until
    // the host takes the socket over (pid 1 keeps it at EGRESS_FD; the program never has it).
    if let Some(port) = spec.egress_port {
        net::egress_listen(port).map_err(StepError::at(Step::Namespaces))?;
    }

    // 3. Mounts: the new root, then pivot_root into it.
    mount::build_root(spec, &plan).map_err(StepError::at(Step::Mounts))?;
    drop(plan);

    // 4. Limits: the cgroup was joined by the helper; rlimits are the backstop.
    rlimit::apply(&spec.limits).map_err(StepError::at(Step::Limits))?;
    Ok(())
}

/// Steps 5 to 7 and execve, in the program's process. Never returns.
fn exec_program(spec: &Spec, msg_fd: libc::c_int) -> ! {
    let (path, argv, envp) = match exec_args(spec) {
        Ok(a) => a,
        Err(e) => die(msg_fd, e, 127),
    };
    if spec.channel {
        // SAFETY: dup2 onto fd 3 (the helper's control socket, which the program must not keep);
        // the copy is not close-on-exec, so the program inherits the channel there.
        unsafe { libc::dup2(CHANNEL_FD, 3) };
    }
    if let Err(e) = confine(spec, msg_fd) {
        die(msg_fd, e, 127)
    }
    let argv_ptrs: Vec<*const libc::c_char> = argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp_ptrs: Vec<*const libc::c_char> = envp
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    // SAFETY: NUL-terminated arrays of valid C strings that outlive the call.
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr()) };
    let err = io::Error::last_os_error();
    die(
        msg_fd,
        StepError {
            step: Step::Exec,
            message: format!("cannot execute {}: {err}", path.to_string_lossy()),
        },
        127,
    )
}

/// Steps 5-7 for a program that is this process image: what `execve` would have done with the
/// environment and the working directory is done here, then the same confinement.
fn enter_program(spec: &Spec, msg_fd: libc::c_int) -> Result<(), StepError> {
    let env = spec
        .env
        .iter()
        .map(|(k, v)| Ok((CString::new(k.as_bytes())?, CString::new(v.as_bytes())?)))
        .collect::<Result<Vec<_>, std::ffi::NulError>>()
        .map_err(StepError::at(Step::Exec))?;
    // SAFETY: single-threaded; nothing holds pointers into the environment across these calls.
    unsafe {
        libc::clearenv();
        for (k, v) in &env {
            libc::setenv(k.as_ptr(), v.as_ptr(), 1);
        }
    }
    // SAFETY: a constant valid path.
    cvt(unsafe { libc::chdir(c"/workspace".as_ptr()) }).map_err(StepError::at(Step::Exec))?;
    // The uid change left this process non-dumpable; execve would have made it dumpable again
    // (as every cold program is): its own /proc/self files readable by itself, ptrace-able by
    // its own children. pid 1 stays non-dumpable.
    // SAFETY: prctl with integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) })
        .map_err(StepError::at(Step::Exec))?;
    if spec.channel {
        // SAFETY: as in exec_program.
        unsafe { libc::dup2(CHANNEL_FD, 3) };
    }
    confine(spec, msg_fd)
}

/// Steps 5-7 for the calling process.
fn confine(spec: &Spec, keep_fd: libc::c_int) -> Result<(), StepError> {
    // 5. Privileges: a new session (no controlling terminal to inject into), no capabilities,
    //    no way to gain privileges through execve, no inherited descriptors. The environment is
    //    the spec's alone: execve gets it explicitly.
    // SAFETY: setsid has no arguments.
    unsafe { libc::setsid() };
    caps::drop_all().map_err(StepError::at(Step::Privileges))?;
    caps::set_no_new_privs().map_err(StepError::at(Step::Privileges))?;
    close_fds_from(if spec.channel { 4 } else { 3 }, &[keep_fd]);
    // 6. Landlock, before seccomp (which would refuse its syscalls).
    let extra: Vec<PathBuf> = spec.ro_binds.iter().map(|b| b.target.clone()).collect();
    landlock::restrict(&extra).map_err(StepError::at(Step::Landlock))?;
    // 7. seccomp, last: everything above needed syscalls the filter refuses.
    seccomp::install().map_err(StepError::at(Step::Seccomp))?;
    Ok(())
}

type ExecArgs = (CString, Vec<CString>, Vec<CString>);

fn exec_args(spec: &Spec) -> Result<ExecArgs, StepError> {
    let nul = |_| StepError {
        step: Step::Exec,
        message: "argument contains a NUL byte".into(),
    };
    let path_var = spec
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/local/bin:/usr/bin:/bin");
    let program = resolve(&spec.argv[0], path_var).ok_or_else(|| StepError {
        step: Step::Exec,
        message: format!("{}: command not found", spec.argv[0]),
    })?;
    let path = CString::new(program.into_os_string().into_encoded_bytes()).map_err(nul)?;
    let argv = spec
        .argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(nul)?;
    let envp = spec
        .env
        .iter()
        .map(|(k, v)| CString::new(format!("{k}={v}")))
        .collect::<Result<Vec<_>, _>>()
        .map_err(nul)?;
    // SAFETY: a constant valid path.
    cvt(unsafe { libc::chdir(c"/workspace".as_ptr()) }).map_err(StepError::at(Step::Exec))?;
    debug_assert_eq!(WORKSPACE, "/workspace");
    Ok((path, argv, envp))
}

/// `execvp`'s search, done before seccomp so the error message can be precise.
fn resolve(program: &str, path_var: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    path_var
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(program))
        .find(|p| {
            let Ok(c) = crate::sys::cstr(p) else {
                return false;
            };
            // SAFETY: a valid path.
            unsafe { libc::access(c.as_ptr(), libc::X_OK) == 0 }
        })
}

/// Pid 1 after the fork: confine itself like the program, then reap every orphan until the
/// program exits, report its status and exit, which ends the namespace.
fn reap(program: libc::pid_t, msg_fd: libc::c_int) -> ! {
    confine_pid1(&[msg_fd, net::EGRESS_FD]);
    loop {
        let mut status = 0;
        // SAFETY: waiting for any child with a valid status pointer.
        let r = unsafe { libc::waitpid(-1, &mut status, 0) };
        if r == program {
            signal_namespace(libc::SIGKILL);
            let _ = write_all_fd(msg_fd, format!("S{status}\n").as_bytes());
            // SAFETY: the program is done; exiting pid 1 kills what is left in the namespace.
            unsafe { libc::_exit(0) }
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // SAFETY: no children left (cannot happen before the program is reaped).
            unsafe { libc::_exit(1) }
        }
    }
}

/// Pid 1 of a direct sandbox after the fork: confined like a cold pid 1, it reaps every
/// orphan until the program exits, then reports on the control socket (the program's status, or
/// the step that failed in it) and exits, which ends the namespace. A hang-up on the control
/// socket means the supervisor is gone: pid 1 exits at once and takes the sandbox with it.
///
/// `stop_at_end` (a one-shot forked from a zygote, whose host reads the report line, drains
/// the pipes and then hangs up): the other processes are stopped rather than killed before
/// the report, and pid 1 waits for the hang-up to kill them and exit, so that the kernel's
/// teardown of a zygote-sized image comes after the answer. Otherwise (a session's kernel,
/// whose host drains the pipes to their end) they are killed, and pid 1 exits at once.
fn reap_and_report(program: libc::pid_t, msg_r: OwnedFd, stop_at_end: bool) -> ! {
    // Handlers inherited from the zygote's Python have no business in pid 1 (the program got
    // its copy of them with the fork).
    reset_signal_handlers();
    // Children's exits arrive on a signalfd, so that one poll also watches the control socket.
    // SAFETY: a zeroed sigset is valid storage for sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid sigset pointers; SIGCHLD is a valid signal.
    let sfd = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK)
    };
    if sfd < 0 {
        kill_program_and_report(program, "signalfd", io::Error::last_os_error());
    }
    confine_pid1(&[CONTROL_FD, msg_r.as_raw_fd(), sfd, net::EGRESS_FD]);
    loop {
        // Reap first: a child that exited before SIGCHLD was blocked left no signal behind.
        loop {
            let mut status = 0;
            // SAFETY: reaping any exited child with a valid status pointer.
            let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if r == program {
                let mut messages = Vec::new();
                let _ = fs::File::from(msg_r).read_to_end(&mut messages);
                let line = match parse_messages(&String::from_utf8_lossy(&messages)) {
                    Ok(_) => describe_status(status),
                    Err(e) => error_line(&e),
                };
                if !stop_at_end {
                    signal_namespace(libc::SIGKILL);
                    report_and_exit(&line);
                }
                // Stopped, not killed: the kernel's teardown of the processes (the program's
                // copy of the zygote's image, ~2-8 ms) waits for the host, which hangs up
                // once its answer is out; pid 1 then kills them and exits.
                signal_namespace(libc::SIGSTOP);
                let _ = write_all_fd(CONTROL_FD, line.as_bytes());
                wait_for_hang_up();
                signal_namespace(libc::SIGKILL);
                // SAFETY: leaving; exiting pid 1 ends the namespace.
                unsafe { libc::_exit(0) }
            }
            if r <= 0 {
                break;
            }
        }
        match readable_unless_hung_up(sfd) {
            Ok(true) => {}
            // SAFETY: the supervisor is gone; exiting pid 1 ends the sandbox.
            Ok(false) => unsafe { libc::_exit(1) },
            Err(_) => continue,
        }
        let mut info = [0u8; 128 * 8];
        // SAFETY: draining the signalfd into a buffer of whole signalfd_siginfo records.
        while unsafe { libc::read(sfd, info.as_mut_ptr().cast(), info.len()) } > 0 {}
    }
}

/// `sig` (SIGSTOP or SIGKILL) to every other process of the PID namespace. Sent before the
/// report: once the host has it, no process of the sandbox returns to user space (to write
/// to its workspace or its output, say).
fn signal_namespace(sig: libc::c_int) {
    // SAFETY: kill(-1) from pid 1 addresses every process of its own PID namespace but itself.
    unsafe { libc::kill(-1, sig) };
}

/// Blocks until the supervisor hangs up the control socket (it is done with the sandbox).
fn wait_for_hang_up() {
    loop {
        let mut pfd = libc::pollfd {
            fd: CONTROL_FD,
            events: 0,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, -1) };
        if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if r < 0 || pfd.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            return;
        }
    }
}

/// Kills the program and reports why pid 1 could not watch it.
fn kill_program_and_report(program: libc::pid_t, what: &str, e: io::Error) -> ! {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(program, libc::SIGKILL) };
    report_and_exit(&error_line(&StepError {
        step: Step::Exec,
        message: format!("{what}: {e}"),
    }))
}

/// Every caught signal back to its default action (ignored ones stay ignored).
fn reset_signal_handlers() {
    for sig in 1..32 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: querying and setting dispositions with valid sigaction structs.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN
            {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
    }
}

/// Pid 1 confines itself like the program (it runs no user code, but shares its namespaces):
/// no stdio, not dumpable, no capabilities, no new privileges, only `keep` open, and a seccomp
/// filter of its own, narrower than the program's (`seccomp::pid1_allowed`).
fn confine_pid1(keep: &[libc::c_int]) {
    redirect_stdio_to_null();
    // Not dumpable: the program (same uid) can neither ptrace pid 1 nor read its memory.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let _ = caps::drop_all();
    let _ = caps::set_no_new_privs();
    close_fds_from(3, keep);
    let _ = seccomp::install_pid1();
}

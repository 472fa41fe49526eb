//! The host side of a sandbox: create its cgroup, start the init helper, move bytes, enforce the
//! deadline and the output bound, kill the whole tree, account usage, leave nothing behind.
//!
//! Synchronous on purpose: callers in async code run it on a blocking thread.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::cgroup::{Cgroup, CgroupError, CgroupLimits, Hierarchy};
use crate::direct::{start_pid1, ForkRequest, ForkedProgram, Started};
use crate::output::CappedOutput;
use crate::pid1::Pid1Program;
use crate::pid1::{CHANNEL_FD, CONTROL_FD, WORKSPACE_TREE_ARG, WORKSPACE_TREE_FD};
use crate::spec::{Bind, InnerLimits, Spec, SpecError, INIT_ARG};
use crate::sys::{pipe_cloexec, socketpair_cloexec};
use crate::workspace::Workspace;

/// Per-sandbox limits. The cgroup enforces memory, pids and CPU; the init helper the rest
/// ([`InnerLimits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Memory, including the sandbox's tmpfs pages (bytes).
    pub memory_bytes: u64,
    /// Processes and threads.
    pub pids: u64,
    /// CPU quota in milli-CPUs (1000 = one CPU).
    pub cpu_millis: u64,
    /// Size of /tmp and of /dev/shm (bytes, each).
    pub tmp_bytes: u64,
    /// Open files per process.
    pub nofile: u64,
    /// Largest single file (bytes).
    pub fsize_bytes: u64,
}

/// A small sandbox, for direct users of this crate (its tests, a tool) that have no policy
/// of their own. These are not runcell's session defaults: the engine sets every field from
/// a session's limits (DESIGN.md §7, `runcell-engine`'s limits module) and never reads these.
impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: 256 << 20,
            pids: 64,
            cpu_millis: 1000,
            tmp_bytes: 64 << 20,
            nofile: 1024,
            // Above /tmp, so that a full tmpfs says ENOSPC rather than EFBIG.
            fsize_bytes: 256 << 20,
        }
    }
}

/// What to run in one sandbox.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workspace: &'a Workspace,
    pub ro_binds: Vec<Bind>,
    pub limits: Limits,
    /// Give the program a private channel at fd 3 ([`Running::channel`] is the other end).
    pub channel: bool,
    /// Have pid 1 listen on this loopback port for the host's egress proxy (see
    /// [`Running::egress_listener`]); `None` for a sandbox without a network policy.
    pub egress_port: Option<u16>,
}

/// Why runcell ended a run (or how it ended on its own, for `Signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// The wall-clock deadline passed.
    Timeout,
    /// The memory cgroup's OOM killer fired.
    Oom,
    /// The process limit was reached; the tree was killed.
    Pids,
    /// The program printed more than the hard output bound.
    Output,
    /// The program died of a signal runcell did not send (SIGSEGV, SIGABRT, ...).
    Signal,
}

impl KillReason {
    pub fn as_str(self) -> &'static str {
        match self {
            KillReason::Timeout => "timeout",
            KillReason::Oom => "oom",
            KillReason::Pids => "pids",
            KillReason::Output => "output",
            KillReason::Signal => "signal",
        }
    }
}

/// How the program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl ExitStatus {
    /// The shell convention: the code, or 128 + the signal.
    pub fn shell_code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        }
    }
}

/// Resources one run used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub wall: Duration,
    pub cpu: Duration,
    pub peak_memory_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cgroups are unavailable, so limits cannot be enforced")]
    NoCgroups(#[source] CgroupError),
    #[error("cannot create the sandbox's cgroup")]
    Cgroup(#[source] CgroupError),
    #[error("invalid sandbox spec")]
    Spec(#[from] SpecError),
    #[error("cannot start the sandbox helper {exe}")]
    Spawn {
        exe: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the sandbox could not be set up: {0}")]
    Setup(String),
    #[error("the zygote could not fork the sandbox: {0}")]
    Zygote(String),
    #[error("sandbox i/o failed")]
    Io(#[from] io::Error),
}

/// The sandbox factory: knows the init helper and the host's cgroup layout.
#[derive(Debug)]
pub struct Sandbox {
    init_exe: crate::exe::InitExe,
    cgroups: Hierarchy,
    spawn_ns: crate::spawn_ns::SpawnNamespace,
}

impl Sandbox {
    /// `init_exe` is a binary that calls [`crate::run_if_init`] first thing (the runcell binary,
    /// or `runcell-sandbox-init`). Fails when cgroups are missing: runcell never runs code it
    /// cannot bound.
    pub fn new(init_exe: PathBuf) -> Result<Sandbox, SandboxError> {
        let cgroups = Hierarchy::detect().map_err(SandboxError::NoCgroups)?;
        Ok(Sandbox::with_cgroups(init_exe, cgroups))
    }

    /// [`Sandbox::new`] with a hierarchy the caller detected already.
    pub fn with_cgroups(init_exe: PathBuf, cgroups: Hierarchy) -> Sandbox {
        Sandbox {
            init_exe: crate::exe::InitExe::new(&init_exe),
            cgroups,
            spawn_ns: crate::spawn_ns::SpawnNamespace::default(),
        }
    }

    /// Cold sandboxes started by exec'd helpers are then cloned from a private copy of the
    /// host's mount namespace without the mounts below `dirs` (the workspaces' directories):
    /// each sandbox's clone copies a fixed list of mounts however many workspaces are mounted,
    /// and takes its own workspace along (`crate::spawn_ns`). Made on the first such spawn;
    /// where it cannot be made (not root), helpers stay in the host's namespace.
    pub fn spawn_without_mounts_below(mut self, dirs: Vec<PathBuf>) -> Sandbox {
        self.spawn_ns = crate::spawn_ns::SpawnNamespace::new(dirs);
        self
    }

    /// Whether exec'd helpers run in the namespace of [`Sandbox::spawn_without_mounts_below`]
    /// (made now if it was not yet), or why not. `None`: none was asked for.
    pub fn spawn_namespace(&self) -> Option<Result<(), String>> {
        self.spawn_ns
            .get(&self.init_exe)
            .map(|made| made.map(|_| ()).map_err(str::to_owned))
    }

    pub fn cgroups(&self) -> &Hierarchy {
        &self.cgroups
    }

    /// Starts the program in a new sandbox. Its stdin, stdout and stderr are pipes.
    pub fn spawn(&self, launch: &Launch<'_>) -> Result<Running, SandboxError> {
        let (cgroup, spec_bytes) = self.prepare(launch)?;
        let (control, helper_end) = socketpair_cloexec()?;
        let (channel, program_end) = socketpair_cloexec()?;
        let (mut helper, stdio, control) = if is_single_threaded() {
            // No helper: this process plays its part (see crate::direct).
            let (in_r, in_w) = pipe_cloexec()?;
            let (out_r, out_w) = pipe_cloexec()?;
            let (err_r, err_w) = pipe_cloexec()?;
            let request = ForkRequest::new(&cgroup, launch.workspace.host_uid());
            let fds = [&in_r, &out_w, &err_w, &helper_end, &program_end].map(|f| f.as_raw_fd());
            let pid = match start_pid1(&request, &spec_bytes, fds, None, Pid1Program::Exec, None) {
                Ok(Started::Caller(pid, _pidfd)) => pid,
                // SAFETY: unreachable (an exec'd program never returns here); leave quietly.
                Ok(Started::Program(_)) => unsafe { libc::_exit(127) },
                Err(e) => return Err(SandboxError::Setup(e.to_string())),
            };
            let control = File::from(control);
            // The spec went with the clone; the socket only carries the report back.
            let helper = Helper::Forked { pid, reaped: false };
            (helper, [in_w, out_r, err_r], control)
        } else {
            let ends = [helper_end.as_raw_fd(), program_end.as_raw_fd()];
            let (mut helper, stdio) = self.exec_helper(ends, launch)?;
            let mut control = File::from(control);
            // The helper reads the spec to end-of-file; it then holds the socket open for its
            // report.
            if let Err(e) = control.write_all(&spec_bytes) {
                helper.kill();
                helper.wait();
                return Err(SandboxError::Io(e));
            }
            (helper, stdio, control)
        };
        drop((helper_end, program_end));
        if let Err(e) = shutdown_write(&control) {
            helper.kill();
            helper.wait();
            return Err(SandboxError::Io(e));
        }
        let [stdin, stdout, stderr] = stdio.map(File::from);
        Ok(Running {
            stdin: Some(stdin),
            stdout: Some(stdout),
            stderr: Some(stderr),
            channel: launch.channel.then(|| UnixStream::from(channel)),
            helper,
            report: Some(control),
            cgroup: Some(cgroup),
            started: Instant::now(),
            killed_by: None,
            egress_port: launch.egress_port,
            cpu_before: Duration::ZERO,
        })
    }

    /// Starts the sandbox from a fork of `zygote`: the same steps as [`Sandbox::spawn`], with
    /// the zygote's preloaded Python as the program (`launch.argv` is not executed). On
    /// [`SandboxError::Zygote`] nothing was started and a cold [`Sandbox::spawn`] can follow.
    pub fn spawn_in(
        &self,
        zygote: &crate::zygote::Zygote,
        launch: &Launch<'_>,
    ) -> Result<Running, SandboxError> {
        self.fork_from(zygote, launch, ForkedProgram::Kernel)
    }

    /// A fork of `zygote` for `launch`, which becomes `program` once confined.
    fn fork_from(
        &self,
        zygote: &crate::zygote::Zygote,
        launch: &Launch<'_>,
        program: ForkedProgram,
    ) -> Result<Running, SandboxError> {
        // The zygote's mount namespace has none of the workspaces mounted since it started:
        // the workspace goes along as a detached copy of its mount, which pid 1 attaches.
        let tree = crate::mount::clone_tree(launch.workspace.path()).map_err(|e| {
            SandboxError::Zygote(format!(
                "open_tree {}: {e}",
                launch.workspace.path().display()
            ))
        })?;
        let (cgroup, spec_bytes) = self.prepare(launch)?;
        let (control, helper_end) = socketpair_cloexec()?;
        let (channel, program_end) = socketpair_cloexec()?;
        let (in_r, in_w) = pipe_cloexec()?;
        let (out_r, out_w) = pipe_cloexec()?;
        let (err_r, err_w) = pipe_cloexec()?;
        let request = ForkRequest {
            program,
            workspace_tree: true,
            ..ForkRequest::new(&cgroup, launch.workspace.host_uid())
        };
        let pidfd = zygote
            .fork_sandbox(
                &request,
                &spec_bytes,
                &[
                    in_r.as_fd(),
                    out_w.as_fd(),
                    err_w.as_fd(),
                    helper_end.as_fd(),
                    program_end.as_fd(),
                    tree.as_fd(),
                ],
            )
            .map_err(|e| SandboxError::Zygote(e.to_string()))?;
        drop((helper_end, program_end, in_r, out_w, err_w, tree));
        let control = File::from(control);
        // The spec came with the request; the control socket only carries the report back.
        shutdown_write(&control)?;
        Ok(Running {
            stdin: Some(File::from(in_w)),
            stdout: Some(File::from(out_r)),
            stderr: Some(File::from(err_r)),
            channel: launch.channel.then(|| UnixStream::from(channel)),
            helper: Helper::Pidfd {
                fd: std::sync::Arc::new(pidfd),
                exited: false,
            },
            report: Some(control),
            cgroup: Some(cgroup),
            started: Instant::now(),
            killed_by: None,
            egress_port: launch.egress_port,
            cpu_before: Duration::ZERO,
        })
    }

    /// The sandbox's cgroup and its encoded spec.
    fn prepare(&self, launch: &Launch<'_>) -> Result<(Cgroup, Vec<u8>), SandboxError> {
        let l = &launch.limits;
        let name = format!("rc-{}-{:08x}", launch.workspace.host_uid(), random_u32());
        let cgroup = self
            .cgroups
            .create(
                &name,
                &CgroupLimits {
                    memory_bytes: l.memory_bytes,
                    pids: l.pids,
                    cpu_millis: l.cpu_millis,
                },
            )
            .map_err(SandboxError::Cgroup)?;
        let spec = Spec {
            argv: launch.argv.clone(),
            env: launch.env.clone(),
            workspace: launch.workspace.path().to_owned(),
            ro_binds: launch.ro_binds.clone(),
            host_uid: launch.workspace.host_uid(),
            cgroup_procs: cgroup.procs_files(),
            limits: InnerLimits {
                tmp_bytes: l.tmp_bytes,
                nofile: l.nofile,
                fsize_bytes: l.fsize_bytes,
                // A backstop above the cgroup's bound, so that a fork bomb meets pids.max first
                // (and is reported as one): both count pid 1 and every sandbox process.
                nproc: l.pids.saturating_add(1),
            },
            channel: launch.channel,
            egress_port: launch.egress_port,
        };
        let spec_bytes = spec.to_bytes()?;
        Ok((cgroup, spec_bytes))
    }

    /// Starts the helper as a fresh `runcell __sandbox-init` process: required when the caller
    /// has other threads (the server), since only `execve` gives the helper a clean process.
    fn exec_helper(
        &self,
        ends: [RawFd; 2],
        launch: &Launch<'_>,
    ) -> Result<(Helper, [OwnedFd; 3]), SandboxError> {
        // Through a detached clone of its directory: no sandbox sees the binary's host path.
        let mut cmd = self.init_exe.command();
        cmd.arg(INIT_ARG)
            // No server secret may reach a sandbox, not even the helper's environment.
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // In the namespace without the workspaces (when there is one), with the workspace's
        // mount along: the helper's namespace has it no more than the zygote's has.
        let joined = match self.spawn_ns.get(&self.init_exe) {
            Some(Ok(ns)) => {
                let tree = crate::mount::clone_tree(launch.workspace.path()).map_err(|e| {
                    SandboxError::Setup(format!(
                        "open_tree {}: {e}",
                        launch.workspace.path().display()
                    ))
                })?;
                cmd.arg(WORKSPACE_TREE_ARG);
                Some((ns.as_raw_fd(), tree))
            }
            Some(Err(_)) | None => None,
        };
        let join = joined.as_ref().map(|(ns, tree)| (*ns, tree.as_raw_fd()));
        // SAFETY: the closure runs between fork and exec and only calls setns, dup2 and fcntl,
        // which are async-signal-safe; it allocates nothing and takes no locks.
        unsafe {
            cmd.pre_exec(move || {
                if let Some((ns, _)) = join {
                    // First: placing the descriptors may overwrite the namespace's.
                    crate::spawn_ns::join(ns)?;
                }
                place_helper_fds(ends, join.map(|(_, tree)| tree))
            })
        };
        let spawned = cmd.spawn();
        // The helper has its own copy of the tree now (or none was made).
        drop(joined);
        let mut child = spawned.map_err(|source| SandboxError::Spawn {
            exe: self.init_exe.path().to_owned(),
            source,
        })?;
        let (Some(i), Some(o), Some(e)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SandboxError::Io(io::Error::other("helper stdio missing")));
        };
        Ok((Helper::Exec(child), [i.into(), o.into(), e.into()]))
    }

    /// Runs the program to completion: feeds `stdin`, streams output to `on_output` (up to the
    /// head of each capped stream), enforces the deadline, the pids bound and the output bound.
    pub fn run(
        &self,
        launch: &Launch<'_>,
        opts: &RunOptions,
        on_output: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<RunOutcome, SandboxError> {
        self.run_with(launch, opts, on_output, &mut |_| Ok(()))
    }

    /// [`Sandbox::run`], calling `on_start` once the sandbox exists (before any output is
    /// read): the engine takes its egress socket there. An error from it kills the sandbox.
    pub fn run_with(
        &self,
        launch: &Launch<'_>,
        opts: &RunOptions,
        on_output: &mut dyn FnMut(Stream, &[u8]),
        on_start: &mut dyn FnMut(&Running) -> Result<(), SandboxError>,
    ) -> Result<RunOutcome, SandboxError> {
        let running = self.spawn(launch)?;
        Self::run_to_end(running, opts, on_output, on_start)
    }

    /// [`Sandbox::run`] of a Python program (`launch.argv` is `[python, FILE, ARGS...]`) in a
    /// fork of `zygote`: the same sandbox, the program run as `__main__` by the preloaded
    /// interpreter instead of a fresh one. On [`SandboxError::Zygote`] nothing was started and
    /// a cold [`Sandbox::run`] can follow.
    pub fn run_in(
        &self,
        zygote: &crate::zygote::Zygote,
        launch: &Launch<'_>,
        opts: &RunOptions,
        on_output: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<RunOutcome, SandboxError> {
        let running = self.fork_from(zygote, launch, ForkedProgram::Main)?;
        Self::run_to_end(running, opts, on_output, &mut |_| Ok(()))
    }

    /// A sandbox for a Python one-shot made ahead of its run: forked from `zygote`, confined,
    /// its program waiting for [`Running::tell`] (`launch.channel` must be set: the run's argv
    /// comes over it). The sandbox is exactly a [`Sandbox::run_in`]'s, made earlier; it serves
    /// one run and is destroyed after it ([`Sandbox::run_prepared`]).
    pub fn prepare_main(
        &self,
        zygote: &crate::zygote::Zygote,
        launch: &Launch<'_>,
    ) -> Result<Running, SandboxError> {
        if !launch.channel {
            return Err(SandboxError::Setup(
                "a prepared one-shot needs a channel for its argv".into(),
            ));
        }
        self.fork_from(zygote, launch, ForkedProgram::MainWhenTold)
    }

    /// Runs a sandbox from [`Sandbox::prepare_main`] to its end: sends `argv` (`[python, FILE,
    /// ARGS...]`), then as [`Sandbox::run`], the time limit and the wall time counted from now.
    pub fn run_prepared(
        mut running: Running,
        argv: &[String],
        opts: &RunOptions,
        on_output: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<RunOutcome, SandboxError> {
        let Some(mut channel) = running.channel.take() else {
            return Err(SandboxError::Setup("not a prepared one-shot".into()));
        };
        // Measured while its program still waits for the argv.
        running.cpu_before = running.cpu_now();
        running.reset_peak();
        let told = serde_json::to_vec(argv)
            .map_err(|e| SandboxError::Setup(e.to_string()))
            .and_then(|json| {
                channel.write_all(&json)?;
                Ok(channel.shutdown(std::net::Shutdown::Write)?)
            });
        if let Err(e) = told {
            // Its program is gone (or was never there): the report says why, if anything did.
            running.kill(KillReason::Signal);
            let _ = running.finish();
            return Err(e);
        }
        drop(channel);
        running.started = Instant::now();
        Self::run_to_end(running, opts, on_output, &mut |_| Ok(()))
    }

    fn run_to_end(
        mut running: Running,
        opts: &RunOptions,
        on_output: &mut dyn FnMut(Stream, &[u8]),
        on_start: &mut dyn FnMut(&Running) -> Result<(), SandboxError>,
    ) -> Result<RunOutcome, SandboxError> {
        if let Err(e) = on_start(&running) {
            running.kill(KillReason::Signal);
            let _ = running.finish();
            return Err(e);
        }
        let deadline = running.started + opts.timeout;
        let mut stdout = CappedOutput::new(opts.output_cap);
        let mut stderr = CappedOutput::new(opts.output_cap);
        let mut pump = Pump::new(&mut running, &opts.stdin)?;
        let mut drain_until: Option<Instant> = None;
        let mut buf = vec![0u8; 64 << 10];
        while pump.open() {
            let now = Instant::now();
            if running.killed_by.is_none() {
                if now >= deadline {
                    running.kill(KillReason::Timeout);
                } else if running.pids_limit_hit() {
                    running.kill(KillReason::Pids);
                } else if stdout.total() + stderr.total() > opts.output_kill_bytes {
                    running.kill(KillReason::Output);
                } else if opts
                    .cancel
                    .as_ref()
                    .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
                {
                    running.kill(KillReason::Signal);
                }
                if running.killed_by.is_some() {
                    drain_until = Some(now + Duration::from_secs(2));
                }
            }
            if drain_until.is_some_and(|d| now >= d) {
                break;
            }
            let wake = drain_until.unwrap_or(deadline).min(now + PIDS_POLL);
            // Once pid 1 has reported, every other process of the sandbox is gone or stopped:
            // what the pipes hold is all the output there is, and a stopped process holding
            // one would keep it from ever reaching its end.
            let reported = !pump.report_open;
            let timeout = match reported {
                true => Duration::ZERO,
                false => wake
                    .saturating_duration_since(now)
                    .max(Duration::from_millis(1)),
            };
            let got = pump.poll(timeout, &mut buf)?;
            let idle = got.is_empty();
            for (stream, data) in got {
                let sink = match stream {
                    Stream::Stdout => &mut stdout,
                    Stream::Stderr => &mut stderr,
                };
                let live = sink.push(data);
                if !live.is_empty() {
                    on_output(stream, live);
                }
            }
            if reported && idle {
                break;
            }
        }
        drop(pump);
        let (finished, remains) = running.finish_leaving()?;
        Ok(RunOutcome {
            exit: finished.exit,
            killed_by: finished.killed_by,
            stdout,
            stderr,
            usage: finished.usage,
            remains,
        })
    }
}

/// How often the pids bound is checked while a run is in progress.
const PIDS_POLL: Duration = Duration::from_millis(100);

/// Options of [`Sandbox::run`].
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub stdin: Vec<u8>,
    pub timeout: Duration,
    /// Bytes kept per stream (head and tail halves).
    pub output_cap: usize,
    /// Past this many bytes of output in total the run is killed (`KillReason::Output`).
    pub output_kill_bytes: u64,
    /// Set from elsewhere (a signal handler) to end the run early; checked every 100 ms.
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            stdin: Vec::new(),
            timeout: Duration::from_secs(60),
            output_cap: 1 << 20,
            output_kill_bytes: 2 << 30,
            cancel: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// The result of [`Sandbox::run`].
#[derive(Debug)]
pub struct RunOutcome {
    pub exit: ExitStatus,
    pub killed_by: Option<KillReason>,
    pub stdout: CappedOutput,
    pub stderr: CappedOutput,
    pub usage: Usage,
    /// The sandbox's cgroup, removed when this is dropped: a caller that answers first can
    /// hold it until after its reply.
    pub remains: Remains,
}

/// What is left of a sandbox whose pid 1 has reported: its cgroup and pid 1 itself, with the
/// namespace's other processes stopped or killed before the report (a zygote's pid 1 stops
/// them and waits for the hang-up of its control socket, so that the kernel's teardown of
/// their memory, ~2-8 ms for a fork of the zygote, comes after the answer). Nothing of the
/// sandbox runs user code any more, so the removal can wait; dropping this does it (the
/// control socket closed, everything left in the cgroup killed, pid 1 waited for, then the
/// cgroup removed).
#[derive(Debug, Default)]
pub struct Remains {
    cgroup: Option<Cgroup>,
    helper: Option<Helper>,
    /// The control socket: closing it tells a zygote's pid 1, which stopped the sandbox's
    /// processes before it reported, to kill them and exit.
    report: Option<File>,
}

impl Drop for Remains {
    fn drop(&mut self) {
        // A zygote's pid 1 kills what it stopped and exits once its control socket closes,
        // and its exit empties the namespace; waiting for that on the pidfd (not the cgroup's
        // polling, 10 ms a round) lets a reaper keep up with hundreds of runs a second.
        self.report.take();
        if let Some(h) = &self.helper {
            h.wait_exit(REMAINS_SETTLE);
        }
        let cgroup = self.cgroup.take();
        if let Some(cg) = &cgroup {
            let _ = cg.kill_all();
        }
        if let Some(h) = &mut self.helper {
            h.wait();
        }
        if let Some(cg) = cgroup {
            let _ = cg.remove();
        }
    }
}

/// How a sandbox ended.
#[derive(Debug, Clone, Copy)]
pub struct Finished {
    pub exit: ExitStatus,
    pub killed_by: Option<KillReason>,
    pub usage: Usage,
}

/// A started sandbox. Dropping it kills the whole tree and removes the cgroup.
#[derive(Debug)]
pub struct Running {
    pub stdin: Option<File>,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
    /// The supervisor's end of the program's channel, when [`Launch::channel`] asked for one.
    pub channel: Option<UnixStream>,
    helper: Helper,
    report: Option<File>,
    cgroup: Option<Cgroup>,
    started: Instant,
    killed_by: Option<KillReason>,
    egress_port: Option<u16>,
    /// The cgroup's CPU time when the run began, not counted in its usage: a prepared
    /// sandbox's making (pid 1's mounts, the program's fork) is not the run's.
    cpu_before: Duration,
}

impl Running {
    /// Kills every process of the sandbox: the helper (pid 1 inside dies with it, and the kernel
    /// then kills the whole PID namespace) and, for certainty, everything in the cgroup.
    pub fn kill(&mut self, reason: KillReason) {
        if self.killed_by.is_none() {
            self.killed_by = Some(reason);
        }
        self.helper.kill();
        // Pid 1's exit comes after the kernel has killed and reaped everything else in its PID
        // namespace: waiting for it (briefly; SIGKILL acts at once) usually leaves `kill_all`
        // nothing to do, instead of a 10 ms round of freeze, kill, thaw and poll.
        self.helper.wait_exit(KILL_SETTLE);
        if let Some(cg) = &self.cgroup {
            let _ = cg.kill_all();
        }
    }

    /// A handle other threads can use to interrupt the program or kill the sandbox while this
    /// `Running` is busy elsewhere (a session's worker reading its output).
    pub fn handle(&self) -> io::Result<RunningHandle> {
        let helper = match &self.helper {
            Helper::Exec(c) => pidfd_open(c.id() as libc::pid_t)?,
            Helper::Forked { pid, .. } => pidfd_open(*pid)?,
            Helper::Pidfd { fd, .. } => fd.clone(),
        };
        Ok(RunningHandle {
            helper,
            program: self.program_host_pid().map(pidfd_open).transpose()?,
        })
    }

    /// The egress proxy's listening socket: pid 1 made it inside the sandbox's network namespace
    /// (127.0.0.1:[`Launch::egress_port`]) before the program started, and keeps it; this takes
    /// a copy (`pidfd_getfd`), waiting up to `timeout` for pid 1 to get that far. Only for a
    /// launch that asked for it.
    pub fn egress_listener(&self, timeout: Duration) -> io::Result<std::net::TcpListener> {
        let Some(port) = self.egress_port else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "this sandbox has no egress socket",
            ));
        };
        let deadline = Instant::now() + timeout;
        let mut pid1 = None;
        // Pid 1 usually opens it within a millisecond or two: look every 200 µs for 10 ms. A
        // sandbox starved by its own bounds may take seconds, and the wait may be a whole
        // run's: back off to every 10 ms after that.
        let started = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            if pid1.is_none() {
                pid1 = match &self.helper {
                    Helper::Pidfd { fd, .. } => Some(fd.clone()),
                    Helper::Forked { pid, .. } => Some(pidfd_open(*pid)?),
                    // The helper's child, in the sandbox's cgroup once it exists.
                    Helper::Exec(_) => self.sandbox_pid(1).map(pidfd_open).transpose()?,
                };
            }
            if let Some(fd) = &pid1 {
                match pidfd_getfd(fd, crate::net::EGRESS_FD) {
                    Ok(sock) => {
                        let listener = std::net::TcpListener::from(sock);
                        let addr = listener.local_addr()?;
                        if !addr.ip().is_loopback() || addr.port() != port {
                            return Err(io::Error::other(format!(
                                "pid 1's egress descriptor is bound to {addr}, not the loopback port {port}"
                            )));
                        }
                        return Ok(listener);
                    }
                    Err(e) if e.raw_os_error() != Some(libc::EBADF) => return Err(e),
                    Err(_) => {}
                }
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "pid 1 did not open the egress socket in time",
                ));
            }
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            if started.elapsed() > Duration::from_millis(10) {
                pause = (pause * 2).min(Duration::from_millis(10));
            }
        }
    }

    /// The host pid of the sandbox process that is `pid` in its own PID namespace.
    fn sandbox_pid(&self, pid: u32) -> Option<libc::pid_t> {
        let want = pid.to_string();
        self.pids().into_iter().find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status")).is_ok_and(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .is_some_and(|v| {
                        let ids: Vec<&str> = v.split_whitespace().collect();
                        ids.len() > 1 && ids.last() == Some(&want.as_str())
                    })
            })
        })
    }

    /// The host pid of the program (pid 2 in the sandbox's PID namespace: pid 1 forks it first).
    fn program_host_pid(&self) -> Option<libc::pid_t> {
        self.pids().into_iter().find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .and_then(|v| v.split_whitespace().last())
                    == Some("2")
            })
        })
    }

    /// CPU time and peak memory so far; see [`Running::reset_peak`].
    pub fn usage_now(&self) -> (Duration, u64) {
        let (cpu_ns, peak) = self
            .cgroup
            .as_ref()
            .map(Cgroup::cpu_and_peak)
            .unwrap_or_default();
        (Duration::from_nanos(cpu_ns), peak)
    }

    /// The CPU time used so far, alone (one read fewer than [`Running::usage_now`]).
    pub fn cpu_now(&self) -> Duration {
        Duration::from_nanos(self.cgroup.as_ref().map(Cgroup::cpu_ns).unwrap_or_default())
    }

    /// Whether the memory cgroup's OOM killer has fired since the start.
    pub fn oom_killed(&self) -> bool {
        self.cgroup
            .as_ref()
            .is_some_and(|c| c.usage().oom_kills > 0)
    }

    /// Starts a new peak-memory window (best effort).
    pub fn reset_peak(&self) {
        if let Some(c) = &self.cgroup {
            c.reset_peak();
        }
    }

    /// Whether the pids limit has been hit since the start.
    pub fn pids_limit_hit(&self) -> bool {
        self.cgroup
            .as_ref()
            .is_some_and(|c| c.pids_limit_hits() > 0)
    }

    /// The host pids of the sandbox's processes (helper excluded), for signalling.
    pub fn pids(&self) -> Vec<i32> {
        self.cgroup.as_ref().map(Cgroup::pids).unwrap_or_default()
    }

    pub fn killed_by(&self) -> Option<KillReason> {
        self.killed_by
    }

    /// Waits for the end, collects usage and removes the cgroup.
    pub fn finish(self) -> Result<Finished, SandboxError> {
        self.finish_leaving()
            .map(|(finished, _removed_on_drop)| finished)
    }

    /// [`Running::finish`], leaving the cgroup's removal to the [`Remains`].
    pub fn finish_leaving(mut self) -> Result<(Finished, Remains), SandboxError> {
        self.stdin = None;
        let mut line = String::new();
        let report = self.report.take();
        if let Some(mut r) = report.as_ref() {
            match read_report(&mut r, &mut line) {
                Ok(()) => {}
                // A helper killed before it had read all of its spec closes the socket with
                // data unread, which resets it: no report, as for any helper killed early
                // (a time limit shorter than the start-up).
                Err(e)
                    if self.killed_by.is_some() && e.kind() == io::ErrorKind::ConnectionReset =>
                {
                    line.clear();
                }
                Err(e) => return Err(e.into()),
            }
        }
        let wall = self.started.elapsed();
        let cgroup = self.cgroup.take();
        let cg_usage = cgroup.as_ref().map(Cgroup::usage).unwrap_or_default();
        // Pid 1 reported and is on its way out; waiting for its exit (the kernel freeing its
        // copy of the image, ~2-8 ms for a zygote's) is the Remains' to do, after the answer.
        let placeholder = Helper::Forked {
            pid: 0,
            reaped: true,
        };
        let helper = std::mem::replace(&mut self.helper, placeholder);
        let remains = Remains {
            cgroup,
            helper: Some(helper),
            report,
        };
        let line = line.trim();
        let exit = if let Some(code) = line.strip_prefix("exit ") {
            ExitStatus::Code(code.parse().unwrap_or(-1))
        } else if let Some(sig) = line.strip_prefix("signal ") {
            ExitStatus::Signal(sig.parse().unwrap_or(libc::SIGKILL))
        } else if let Some(msg) = line.strip_prefix("error ") {
            if self.killed_by.is_none() {
                return Err(SandboxError::Setup(msg.to_owned()));
            }
            ExitStatus::Signal(libc::SIGKILL)
        } else {
            // The helper was killed before it could report: that was us.
            ExitStatus::Signal(libc::SIGKILL)
        };
        let killed_by = self.killed_by.or(match exit {
            _ if cg_usage.oom_kills > 0 && exit != ExitStatus::Code(0) => Some(KillReason::Oom),
            ExitStatus::Signal(_) => Some(KillReason::Signal),
            ExitStatus::Code(_) => None,
        });
        let finished = Finished {
            exit,
            killed_by,
            usage: Usage {
                wall,
                cpu: Duration::from_nanos(cg_usage.cpu_ns).saturating_sub(self.cpu_before),
                peak_memory_bytes: cg_usage.peak_memory_bytes,
            },
        };
        Ok((finished, remains))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.cgroup.is_some() {
            self.kill(KillReason::Signal);
            self.helper.wait();
            if let Some(cg) = self.cgroup.take() {
                let _ = cg.remove();
            }
        }
    }
}

/// Signals a running sandbox from any thread. Holds pidfds, so a signal can never reach a
/// recycled pid.
#[derive(Debug, Clone)]
pub struct RunningHandle {
    helper: std::sync::Arc<OwnedFd>,
    program: Option<std::sync::Arc<OwnedFd>>,
}

impl RunningHandle {
    /// SIGINT to the program (Python raises KeyboardInterrupt). False if it is gone.
    pub fn interrupt(&self) -> bool {
        self.program
            .as_ref()
            .is_some_and(|p| pidfd_send_signal(p, libc::SIGINT))
    }

    /// Kills the whole sandbox: the helper's death takes pid 1 and the PID namespace with it.
    pub fn kill(&self) {
        pidfd_send_signal(&self.helper, libc::SIGKILL);
    }
}

fn pidfd_open(pid: libc::pid_t) -> io::Result<std::sync::Arc<OwnedFd>> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a fresh descriptor that nothing else owns.
    Ok(std::sync::Arc::new(unsafe {
        OwnedFd::from_raw_fd(fd as RawFd)
    }))
}

/// Waits up to `timeout` for a pidfd to report its process's exit.
fn poll_exit(fd: &OwnedFd, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid pollfd; a pidfd polls readable once the process exits.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}

/// A copy of descriptor `target` of the process behind `pidfd` (close-on-exec).
fn pidfd_getfd(pidfd: &OwnedFd, target: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes a pidfd, a descriptor number and flags (0) and returns a new
    // descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd) })
}

fn pidfd_send_signal(fd: &OwnedFd, sig: libc::c_int) -> bool {
    // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

/// Pid 1's report: one line, written just before it exits. Read up to its newline rather than
/// to end-of-file, which comes only once pid 1's exit has freed its memory; a report cut short
/// (pid 1 killed) is read to end-of-file as it is.
fn read_report(r: &mut &File, line: &mut String) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(64);
    let mut buf = [0u8; 256];
    loop {
        let n = match r.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        bytes.extend_from_slice(&buf[..n]);
        if n == 0 || bytes.contains(&b'\n') || bytes.len() > 64 << 10 {
            break;
        }
    }
    line.push_str(&String::from_utf8_lossy(&bytes));
    Ok(())
}

/// Moves bytes between the caller and a running sandbox with poll(2).
struct Pump<'a> {
    stdin: Option<File>,
    stdin_data: &'a [u8],
    stdout: Option<File>,
    stderr: Option<File>,
    report_fd: libc::c_int,
    report_open: bool,
}

impl<'a> Pump<'a> {
    fn new(running: &mut Running, stdin_data: &'a [u8]) -> io::Result<Pump<'a>> {
        let mut stdin = running.stdin.take();
        if stdin_data.is_empty() {
            stdin = None; // closing it gives the program end-of-file at once
        } else if let Some(s) = &stdin {
            set_nonblocking(s.as_raw_fd())?;
        }
        Ok(Pump {
            stdin,
            stdin_data,
            stdout: running.stdout.take(),
            stderr: running.stderr.take(),
            report_fd: running.report.as_ref().map_or(-1, |r| r.as_raw_fd()),
            report_open: running.report.is_some(),
        })
    }

    /// Whether anything is still connected to the sandbox.
    fn open(&self) -> bool {
        self.stdout.is_some() || self.stderr.is_some() || self.report_open
    }

    fn poll<'b>(
        &mut self,
        timeout: Duration,
        buf: &'b mut [u8],
    ) -> io::Result<Vec<(Stream, &'b [u8])>> {
        let fd = |o: Option<i32>| o.unwrap_or(-1);
        let mut fds = [
            pollfd(
                fd(self.stdout.as_ref().map(|s| s.as_raw_fd())),
                libc::POLLIN,
            ),
            pollfd(
                fd(self.stderr.as_ref().map(|s| s.as_raw_fd())),
                libc::POLLIN,
            ),
            pollfd(
                if self.report_open { self.report_fd } else { -1 },
                libc::POLLIN,
            ),
            pollfd(
                fd(self.stdin.as_ref().map(|s| s.as_raw_fd())),
                libc::POLLOUT,
            ),
        ];
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a valid array; negative descriptors are ignored by poll.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let err = io::Error::last_os_error();
            return if err.kind() == io::ErrorKind::Interrupted {
                Ok(Vec::new())
            } else {
                Err(err)
            };
        }
        if fds[3].revents != 0 {
            self.feed_stdin();
        }
        if fds[2].revents != 0 {
            // The helper writes its report once, right before it exits; the supervisor reads it
            // in `finish`. Here only stop polling it once it has something or hung up.
            self.report_open = false;
        }
        // Split the buffer so both streams can be read in one round.
        let (a, b) = buf.split_at_mut(buf.len() / 2);
        let mut out = Vec::new();
        if fds[0].revents != 0 {
            if let Some(n) = read_or_close(&mut self.stdout, a)? {
                out.push((Stream::Stdout, &a[..n]));
            }
        }
        if fds[1].revents != 0 {
            if let Some(n) = read_or_close(&mut self.stderr, b)? {
                out.push((Stream::Stderr, &b[..n]));
            }
        }
        Ok(out)
    }

    fn feed_stdin(&mut self) {
        let Some(s) = &mut self.stdin else { return };
        match s.write(self.stdin_data) {
            Ok(n) => {
                self.stdin_data = &self.stdin_data[n..];
                if self.stdin_data.is_empty() {
                    self.stdin = None;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            // The program closed its stdin (or exited): stop feeding it.
            Err(_) => self.stdin = None,
        }
    }
}

fn read_or_close<R: Read>(stream: &mut Option<R>, buf: &mut [u8]) -> io::Result<Option<usize>> {
    let Some(s) = stream else { return Ok(None) };
    match s.read(buf) {
        Ok(0) => {
            *stream = None;
            Ok(None)
        }
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
        Err(e) => Err(e),
    }
}

fn pollfd(fd: libc::c_int, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// The init helper process, however it was started.
#[derive(Debug)]
enum Helper {
    Exec(Child),
    Forked {
        pid: libc::pid_t,
        reaped: bool,
    },
    /// A zygote's child: not ours to reap (the zygote does), watched through its pidfd.
    Pidfd {
        fd: std::sync::Arc<OwnedFd>,
        exited: bool,
    },
}

/// How long dropping [`Remains`] waits for pid 1 to end by itself before killing the cgroup.
const REMAINS_SETTLE: Duration = Duration::from_secs(2);

/// How long [`Running::kill`] waits for the killed helper (or pid 1) to be gone.
const KILL_SETTLE: Duration = Duration::from_millis(100);

impl Helper {
    /// Waits up to `timeout` for the process to exit, without reaping it.
    fn wait_exit(&self, timeout: Duration) {
        let pid = match self {
            Helper::Exec(c) => c.id() as libc::pid_t,
            Helper::Forked { pid, reaped: false } => *pid,
            Helper::Pidfd { fd, exited: false } => return poll_exit(fd, timeout),
            _ => return,
        };
        // An unreaped child of ours: its pid cannot have been reused.
        if let Ok(fd) = pidfd_open(pid) {
            poll_exit(&fd, timeout);
        }
    }

    fn kill(&mut self) {
        match self {
            Helper::Exec(c) => {
                let _ = c.kill();
            }
            Helper::Forked { pid, reaped: false } => {
                // SAFETY: signalling our own unreaped child: its pid cannot have been reused.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            Helper::Forked { .. } => {}
            Helper::Pidfd { fd, exited: false } => {
                pidfd_send_signal(fd, libc::SIGKILL);
            }
            Helper::Pidfd { .. } => {}
        }
    }

    fn wait(&mut self) {
        match self {
            Helper::Exec(c) => {
                let _ = c.wait();
            }
            Helper::Forked { pid, reaped } => {
                while !*reaped {
                    // SAFETY: waiting for our own child.
                    let r = unsafe { libc::waitpid(*pid, std::ptr::null_mut(), 0) };
                    if r == *pid || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted
                    {
                        *reaped = true;
                    }
                }
            }
            Helper::Pidfd { fd, exited } => {
                while !*exited {
                    let mut pfd = libc::pollfd {
                        fd: fd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd; a pidfd polls readable once the process exits.
                    let r = unsafe { libc::poll(&mut pfd, 1, -1) };
                    if r > 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                        *exited = true;
                    }
                }
            }
        }
    }
}

/// Puts the control socket at fd 3, the program's channel at fd 4 and the workspace's mount
/// (when given) at fd 5 of the helper, none close-on-exec. Runs between fork and exec: only
/// async-signal-safe calls, no allocation.
fn place_helper_fds(ends: [RawFd; 2], tree: Option<RawFd>) -> io::Result<()> {
    // Move them out of the way first: any may already sit on 3, 4 or 5.
    let fds = [ends[0], ends[1], tree.unwrap_or(-1)];
    let count = if tree.is_some() { 3 } else { 2 };
    let mut high = [0; 3];
    for (h, fd) in high.iter_mut().zip(fds).take(count) {
        // SAFETY: duplicating a descriptor we own.
        *h = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
        if *h < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let targets = [CONTROL_FD, CHANNEL_FD, WORKSPACE_TREE_FD];
    for (h, target) in high.into_iter().zip(targets).take(count) {
        // SAFETY: dup2 onto the helper's well-known descriptors; the copies drop close-on-exec.
        if unsafe { libc::dup2(h, target) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether this process has exactly one thread (then a plain `fork` gives the helper a
/// consistent copy of it, and the `execve` of a new runcell can be skipped).
fn is_single_threaded() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .is_some_and(|n| n.trim() == "1")
    })
}

fn shutdown_write(f: &File) -> io::Result<()> {
    // SAFETY: shutdown on a socket we own.
    if unsafe { libc::shutdown(f.as_raw_fd(), libc::SHUT_WR) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_nonblocking(fd: libc::c_int) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom writes at most 4 bytes into `b`.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, libc::GRND_NONBLOCK) };
    u32::from_ne_bytes(b)
}

/// Where the init helper lives when the caller is not the runcell binary itself: next to the
/// current executable, or one directory up (test binaries live in `target/<profile>/deps`).
pub fn find_init_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    for d in [dir, dir.parent().unwrap_or(dir)] {
        for name in ["runcell-sandbox-init", "runcell"] {
            let p = d.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

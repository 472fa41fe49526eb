//! One-shot executions: a fresh sandbox and workspace per run, destroyed afterwards
//! (`runcell run`, `POST /v1/execute`).

use std::time::Duration;

use runcell_sandbox::{
    CappedOutput, ExitStatus, KillReason, RunOptions, Sandbox, SandboxError, Stream, UidLease,
    Workspace,
};

use crate::engine::Engine;
use crate::error::Invalid;
use crate::execution::{Began, Produced};
use crate::launch::{program_file, Program};
use crate::limits::{LimitsRequest, SessionLimits, ONE_SHOT_TIMEOUT, OUTPUT_CAP_BYTES};
use crate::model::{new_ordered_id, ErrorInfo, Execution, ExecutionStatus, Language};
use crate::oneshot_pool::{Kind, Leftovers, OneShotPool, OneShotSource, Prepared, ProgramDir};
use crate::{EngineError, Start};

/// A file placed in /workspace before the program starts.
#[derive(Debug, Clone)]
pub struct InputFile {
    pub path: String,
    pub content: Vec<u8>,
}

/// A one-shot execution request.
#[derive(Debug, Clone)]
pub struct OneShot {
    /// Who runs it (recorded with the execution).
    pub owner: String,
    pub language: Language,
    pub code: String,
    pub files: Vec<InputFile>,
    pub stdin: Vec<u8>,
    /// Arguments after the program file (`sys.argv[1:]`, `$1...`, `process.argv.slice(2)`).
    pub args: Vec<String>,
    /// Python only: fork the preloaded zygote (the default, when it is ready) or start a fresh
    /// interpreter (its own hash secret and address-space layout).
    pub start: Start,
    pub timeout: Duration,
    pub limits: LimitsRequest,
    /// Bytes kept per stream.
    pub output_cap: usize,
    /// Past this much output (both streams) the run is killed (`killed_by: output`).
    pub output_kill_bytes: u64,
    /// Set to end the run early (the caller got SIGINT, say).
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Disabled by default; an allowlist must stay within the server's bound.
    pub network: crate::network::NetworkPolicy,
}

impl OneShot {
    pub fn new(language: Language, code: impl Into<String>) -> Self {
        Self {
            owner: String::new(),
            language,
            code: code.into(),
            files: Vec::new(),
            stdin: Vec::new(),
            args: Vec::new(),
            start: Start::Zygote,
            timeout: ONE_SHOT_TIMEOUT,
            limits: LimitsRequest::default(),
            output_cap: OUTPUT_CAP_BYTES,
            output_kill_bytes: RunOptions::default().output_kill_bytes,
            cancel: None,
            network: Default::default(),
        }
    }
}

/// Arguments one run may pass after its program file, and the characters of each.
pub const MAX_ARGS: usize = 64;
pub const MAX_ARG_CHARS: usize = 4096;

/// Checks the arguments of a run (or of one of its tests): bounded, and each one something
/// `execve` can pass.
pub(crate) fn check_args(args: &[String]) -> Result<(), EngineError> {
    let invalid = |m: String| Err(EngineError::InvalidRequest(Invalid::Run(m)));
    if args.len() > MAX_ARGS {
        return invalid(format!("{} arguments; at most {MAX_ARGS}", args.len()));
    }
    for a in args {
        if a.chars().count() > MAX_ARG_CHARS {
            return invalid(format!("an argument is over {MAX_ARG_CHARS} characters"));
        }
        if a.contains('\0') {
            return invalid(
                "an argument contains a NUL byte, which no program argument can hold".into(),
            );
        }
    }
    Ok(())
}

impl Engine {
    /// Everything about `req` that can be refused before it runs (code size, limits, time
    /// limit, file paths, arguments), so that a batch is refused whole rather than run in part.
    pub fn check_one_shot(&self, req: &OneShot) -> Result<(), EngineError> {
        crate::bounds::check_code(&req.code)?;
        let policy = &self.core.config.limits;
        policy.resolve(&req.limits)?;
        policy.check_timeout(req.timeout)?;
        for f in &req.files {
            // A name over the filesystem's 255 bytes is a session's 409 (its workspace cannot
            // hold it); a one-shot has no workspace yet, so it is a bad request, as it was.
            runcell_sandbox::validate_relative(&f.path).map_err(|e| match e {
                runcell_sandbox::WorkspaceError::Io { .. } => {
                    EngineError::InvalidRequest(Invalid::Path {
                        path: f.path.chars().take(200).collect(),
                        reason: "a name is longer than the filesystem's 255 bytes",
                    })
                }
                e => crate::files::map_err(crate::files::Op::Write)(e),
            })?;
        }
        check_args(&req.args)
    }

    /// Runs `req` in a fresh sandbox. Output is streamed to `on_output` as it is produced (the
    /// head of each stream; the Execution holds head and tail).
    pub fn run_once(
        &self,
        req: &OneShot,
        on_output: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<OneShotOutcome, EngineError> {
        crate::bounds::check_code(&req.code)?;
        check_args(&req.args)?;
        let egress = self.core.network.session(&req.network)?;
        let policy = &self.core.config.limits;
        let limits = policy.resolve(&req.limits)?;
        policy.check_timeout(req.timeout)?;
        // Held until the run is answered (its sandbox is stopped by then; see the end).
        let reserved = self.core.ledger.reserve(
            limits.memory_mb,
            policy.committed_memory_mb,
            crate::limits::Admit::Checked,
        )?;
        let id = new_ordered_id("ex");
        let opts = RunOptions {
            stdin: req.stdin.clone(),
            timeout: req.timeout,
            output_cap: req.output_cap,
            output_kill_bytes: req.output_kill_bytes,
            cancel: req.cancel.clone(),
        };
        // As for sessions (core.rs, `start_kernel`): the zygote's BLAS runs one thread, so a
        // run granted more CPU starts cold, and so does one that asks to. A run with network
        // egress starts cold too: its proxy is served from the sandbox's start (`run_with`).
        let forkable = req.language.forks_from_zygote()
            && req.start == Start::Zygote
            && egress.is_none()
            && limits.sandbox_limits().cpu_millis <= 1000;
        let kind = match crate::oneshot_pool::needs_preload(&req.code, self.core.third_party()) {
            true => Kind::Full,
            false => Kind::Light,
        };
        // Counted as a running cell: the audit writer waits a moment for runs about to end,
        // so that a batch's runs share commits.
        let counted = CountedRun::start(&self.core.cells_running);
        let prepared = forkable
            .then(|| self.core.one_shots.take(kind, &limits))
            .flatten();
        let ran = match prepared {
            Some(p) => self.run_prepared(req, &id, p, &opts, on_output)?,
            None => None,
        };
        let (outcome, ended, workspace, input) = match ran {
            Some(done) => done,
            None => {
                let zygote = forkable
                    .then(|| match kind {
                        // The light zygote while it is there, else the full one (still a fork).
                        Kind::Light => self.core.light_zygote().or_else(|| self.core.zygote()),
                        Kind::Full => self.core.zygote(),
                    })
                    .flatten();
                self.run_fresh(req, &id, &limits, zygote, egress.as_ref(), &opts, on_output)?
            }
        };
        let (status, error) = classify(
            req,
            &limits,
            outcome.exit,
            outcome.killed_by,
            &outcome.stderr,
        );
        let mut execution = ended.execution(Produced {
            language: req.language,
            execution_count: 1,
            status,
            error,
            stdout: &outcome.stdout,
            stderr: &outcome.stderr,
            results: Vec::new(),
            results_dropped: false,
            usage: outcome.usage,
            killed_by: outcome.killed_by,
        });
        if let Some(e) = &egress {
            execution.network = crate::network::connections(e.take_records());
        }
        drop(counted);
        let left = Leftovers {
            remains: outcome.remains,
            workspace,
            input,
        };
        // With the pool running, the sandbox is torn down after the answer, off this thread
        // (and handed over once the execution is recorded: on a small host the teardown's
        // CPU, the kernel freeing the processes' memory included, would otherwise compete
        // with the recording).
        // Without the pool, `then_some` drops it here, before the recording.
        let left = self.core.one_shots.active().then_some(left);
        let recorded = self.core.audit_shared(&req.owner, execution, &req.code);
        if let Some(left) = left {
            self.core.one_shots.reap(left);
        }
        // The run's memory reservation ends with its answer, not its teardown: what a reaper
        // still holds of it is stopped or exiting (it cannot grow), and at most a queue's
        // worth of them (oneshot_pool's REAP_QUEUE + REAPERS); held until then, a flood of
        // back-to-back runs had the budget taken by teardowns and was answered 503.
        drop(reserved);
        let execution = recorded?;
        Ok(OneShotOutcome {
            execution,
            exit_code: outcome.exit.shell_code(),
        })
    }

    /// A run in a sandbox made ahead of it. `None`: the prepared sandbox was gone before the
    /// run could begin in it (nothing ran), and the caller makes a fresh one.
    fn run_prepared(
        &self,
        req: &OneShot,
        id: &str,
        p: Prepared,
        opts: &RunOptions,
        on_output: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<Option<Ran>, EngineError> {
        write_inputs(&p.workspace, &req.files)?;
        p.input.write(program_file(req.language), &req.code)?;
        let began = Began::now(id.to_owned(), None, &p.workspace);
        let argv: Vec<String> = p.argv.iter().chain(&req.args).cloned().collect();
        match Sandbox::run_prepared(p.running, &argv, opts, on_output) {
            Ok(outcome) => {
                let ended = began.end(&p.workspace);
                Ok(Some((outcome, ended, p.workspace, p.input)))
            }
            Err(e) => {
                tracing::warn!(error = %crate::chain(&e), "a prepared one-shot sandbox was gone; making a fresh one");
                Ok(None)
            }
        }
    }

    /// A run in a sandbox made for it now: forked from `zygote`, or cold.
    #[allow(clippy::too_many_arguments)]
    fn run_fresh(
        &self,
        req: &OneShot,
        id: &str,
        limits: &SessionLimits,
        zygote: Option<std::sync::Arc<runcell_sandbox::Zygote>>,
        egress: Option<&runcell_egress::SessionEgress>,
        opts: &RunOptions,
        on_output: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<Ran, EngineError> {
        let lease = UidLease::acquire(&self.core.config.run_dir.join("uids"))
            .map_err(EngineError::unavailable)?;
        let ws_path = self.core.config.workspace_path(id);
        let workspace = Workspace::create(&ws_path, limits.disk_bytes(), lease)
            .map_err(crate::core::workspace_error)?;
        write_inputs(&workspace, &req.files)?;
        let input = ProgramDir::empty(&self.core.config.data_dir.join("tmp"))?;
        input.write(program_file(req.language), &req.code)?;
        let program = Program::OneShot {
            language: req.language,
            dir: &input.path,
            args: &req.args,
        };
        let launch = self
            .core
            .launch(program, &workspace, limits, &[], egress.is_some())?;
        let began = Began::now(id.to_owned(), None, &workspace);
        // The proxy serves the sandbox's egress socket from its start to the end of the run.
        let mut serving = None;
        let mut on_start = |running: &runcell_sandbox::Running| {
            if let Some(e) = egress {
                serving = crate::network::serve_egress(running, e, opts.timeout)?;
            }
            Ok(())
        };
        let sandbox = &self.core.sandbox;
        let outcome = match zygote {
            Some(z) => match sandbox.run_in(&z, &launch, opts, on_output) {
                // Nothing started: slower, never broken; the zygote is restarted.
                Err(SandboxError::Zygote(e)) => {
                    if Some(z.pid()) == self.core.light_zygote_pid() {
                        self.core.light_zygote.failed(e);
                    } else {
                        self.core.zygote_failed(e);
                    }
                    sandbox.run_with(&launch, opts, on_output, &mut on_start)
                }
                other => other,
            },
            None => sandbox.run_with(&launch, opts, on_output, &mut on_start),
        }
        .map_err(EngineError::sandbox)?;
        drop(serving);
        let ended = began.end(&workspace);
        Ok((outcome, ended, workspace, input))
    }

    /// Starts keeping `n` Python one-shot sandboxes of each zygote ready, the light zygote and
    /// the reaper (`serve --warm-one-shots`); 0 keeps one-shots as they were: made on demand,
    /// from the full zygote, torn down before the answer.
    pub fn start_one_shot_pool(&self, n: usize) {
        let source: std::sync::Arc<dyn OneShotSource> = self.core.clone();
        self.core
            .one_shots
            .start(n, std::sync::Arc::downgrade(&source));
        // Preloading takes a moment: begin now.
        let _ = self.core.light_zygote();
    }

    /// Prepared one-shots ready now: (light, full).
    pub fn one_shots_ready(&self) -> (usize, usize) {
        self.core.one_shots.ready()
    }

    /// Waits up to `timeout` for the pool to hold its target of both kinds; false at once when
    /// no pool runs. For tests and benchmarks.
    pub fn wait_for_one_shots(&self, timeout: Duration) -> bool {
        let end = std::time::Instant::now() + timeout;
        let target = self.core.one_shots.target();
        if target == 0 {
            return false;
        }
        loop {
            if self.core.one_shots.ready() == (target, target) {
                return true;
            }
            if std::time::Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// What a run leaves for its Execution and its teardown.
type Ran = (
    runcell_sandbox::RunOutcome,
    crate::execution::Ended,
    Workspace,
    ProgramDir,
);

/// The request's files, placed in the workspace before the program starts.
fn write_inputs(workspace: &Workspace, files: &[InputFile]) -> Result<(), EngineError> {
    for f in files {
        workspace
            .write_file(&f.path, &f.content)
            // One file of the request can stand where another needs a directory
            // (`a`, then `a/b`): the same conflict as in a session's workspace.
            .map_err(crate::files::map_err(crate::files::Op::Write))?;
    }
    Ok(())
}

impl OneShotSource for crate::core::Core {
    fn one_shot_pool(&self) -> &OneShotPool {
        &self.one_shots
    }

    fn zygote_ready(&self, kind: Kind) -> bool {
        let slot = match kind {
            Kind::Light => &self.light_zygote,
            Kind::Full => &self.zygote,
        };
        matches!(slot.status(), crate::zygote::ZygoteStatus::Ready { .. })
    }

    fn prepare(&self, kind: Kind) -> Result<Prepared, EngineError> {
        let zygote = match kind {
            Kind::Light => self.light_zygote.live(),
            Kind::Full => self.zygote.live(),
        }
        .ok_or_else(|| EngineError::unavailable(SandboxError::Zygote("not ready".into())))?;
        let limits = self.config.limits.resolve(&LimitsRequest::default())?;
        let lease = UidLease::acquire(&self.config.run_dir.join("uids"))
            .map_err(EngineError::unavailable)?;
        let ws_path = self.config.workspace_path(&new_ordered_id("ex"));
        let workspace = Workspace::create(&ws_path, limits.disk_bytes(), lease)
            .map_err(crate::core::workspace_error)?;
        let input = ProgramDir::empty(&self.config.data_dir.join("tmp"))?;
        let program = Program::OneShot {
            language: Language::Python,
            dir: &input.path,
            args: &[],
        };
        let mut launch = self.launch(program, &workspace, &limits, &[], false)?;
        // The run's argv comes over it (`Sandbox::prepare_main`).
        launch.channel = true;
        let argv = launch.argv.clone();
        let running = self
            .sandbox
            .prepare_main(&zygote, &launch)
            .map_err(EngineError::sandbox)?;
        drop(launch);
        Ok(Prepared {
            running,
            argv,
            limits,
            input,
            workspace,
            busy: None,
        })
    }
}

/// A finished one-shot run: the Execution and the program's exit code (128 + signal when it
/// died of one), which the Execution itself does not carry.
#[derive(Debug, Clone)]
pub struct OneShotOutcome {
    pub execution: Execution,
    pub exit_code: i32,
}

/// One run counted in `Core::cells_running` until dropped.
struct CountedRun<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> CountedRun<'a> {
    fn start(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        CountedRun(count)
    }
}

impl Drop for CountedRun<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

fn classify(
    req: &OneShot,
    limits: &SessionLimits,
    exit: ExitStatus,
    killed_by: Option<KillReason>,
    stderr: &CappedOutput,
) -> (ExecutionStatus, Option<ErrorInfo>) {
    let err = |name: &str, value: String| {
        Some(ErrorInfo {
            name: name.into(),
            value,
            traceback: String::new(),
        })
    };
    match killed_by {
        Some(KillReason::Timeout) => (
            ExecutionStatus::Timeout,
            err(
                "TimeoutError",
                format!(
                    "the execution exceeded its {} s time limit",
                    req.timeout.as_secs_f64()
                ),
            ),
        ),
        Some(KillReason::Oom) => (
            ExecutionStatus::Killed,
            err(
                "MemoryError",
                format!(
                    "killed: the memory limit of {} MiB was exceeded",
                    limits.memory_mb
                ),
            ),
        ),
        Some(KillReason::Pids) => (
            ExecutionStatus::Killed,
            err(
                "ProcessLimitError",
                format!("killed: the limit of {} processes was reached", limits.pids),
            ),
        ),
        Some(KillReason::Output) => (
            ExecutionStatus::Killed,
            err(
                "OutputLimitError",
                "killed: the program printed too much output".into(),
            ),
        ),
        Some(KillReason::Signal) => {
            let sig = match exit {
                ExitStatus::Signal(s) => s,
                ExitStatus::Code(c) => c,
            };
            (
                ExecutionStatus::Killed,
                err("Signal", format!("the program was killed by signal {sig}")),
            )
        }
        None => match exit {
            ExitStatus::Code(0) => (ExecutionStatus::Ok, None),
            ExitStatus::Code(code) => (
                ExecutionStatus::Error,
                Some(
                    (req.language == Language::Python)
                        .then(|| python_error(&stderr.render()))
                        .flatten()
                        .unwrap_or(ErrorInfo {
                            name: "ExitCode".into(),
                            value: code.to_string(),
                            traceback: String::new(),
                        }),
                ),
            ),
            ExitStatus::Signal(s) => (
                ExecutionStatus::Killed,
                err("Signal", format!("the program was killed by signal {s}")),
            ),
        },
    }
}

/// The last Python traceback in stderr, as name / value / traceback.
fn python_error(stderr: &str) -> Option<ErrorInfo> {
    let start = stderr.rfind("Traceback (most recent call last):")?;
    let tb = stderr[start..].trim_end();
    let last = tb.lines().last()?;
    let (name, value) = match last.split_once(": ") {
        Some((n, v)) => (n, v),
        None => (last, ""),
    };
    if name.is_empty() || name.contains(' ') {
        return None;
    }
    Some(ErrorInfo {
        name: name.rsplit('.').next().unwrap_or(name).to_owned(),
        value: value.to_owned(),
        traceback: tb.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_tracebacks_become_name_value_traceback() {
        let stderr = "noise\nTraceback (most recent call last):\n  File \"/opt/runcell/input/main.py\", line 1, in <module>\n    1/0\nZeroDivisionError: division by zero\n";
        let e = python_error(stderr).expect("error");
        assert_eq!(e.name, "ZeroDivisionError");
        assert_eq!(e.value, "division by zero");
        assert!(e.traceback.starts_with("Traceback") && e.traceback.ends_with("by zero"));
        let e = python_error("Traceback (most recent call last):\nKeyboardInterrupt\n").expect("e");
        assert_eq!(
            (e.name.as_str(), e.value.as_str()),
            ("KeyboardInterrupt", "")
        );
        assert!(python_error("plain failure").is_none());
    }
}

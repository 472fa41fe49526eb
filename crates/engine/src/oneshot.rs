//! One-shot executions: a fresh sandbox and workspace per run, destroyed afterwards
//! (`runcell run`, `POST /v1/execute`).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use runcell_sandbox::{
    Bind, ExitStatus, FileStat, KillReason, Launch, Limits, RunOptions, Stream, UidLease, Workspace,
};

use crate::core::{base_env, Engine};
use crate::limits::LimitsRequest;
use crate::model::{
    new_ordered_id, ErrorInfo, Execution, ExecutionStatus, FileChange, FileChangeKind, Language,
    Truncated, UsageInfo,
};
use crate::EngineError;

/// Where the program file is bound, read-only, inside the sandbox.
const INPUT_DIR: &str = "/opt/runcell/input";

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
    pub timeout: Duration,
    pub limits: LimitsRequest,
    /// Bytes kept per stream.
    pub output_cap: usize,
    /// Set to end the run early (the caller got SIGINT, say).
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl OneShot {
    pub fn new(language: Language, code: impl Into<String>) -> Self {
        Self {
            owner: String::new(),
            language,
            code: code.into(),
            files: Vec::new(),
            stdin: Vec::new(),
            timeout: Duration::from_secs(60),
            limits: LimitsRequest::default(),
            output_cap: 1 << 20,
            cancel: None,
        }
    }
}

impl Engine {
    /// Runs `req` in a fresh sandbox. Output is streamed to `on_output` as it is produced (the
    /// head of each stream; the Execution holds head and tail).
    pub fn run_once(
        &self,
        req: &OneShot,
        on_output: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<OneShotOutcome, EngineError> {
        crate::bounds::check_code(&req.code)?;
        let policy = &self.core.config.limits;
        let (limits, disk_mb) = policy.resolve_one_shot(&req.limits)?;
        policy.check_timeout(req.timeout)?;
        // Held until the sandbox is gone (the end of this function).
        let _reserved = self.core.ledger.reserve(
            limits.memory_bytes >> 20,
            policy.committed_memory_mb,
            crate::limits::Admit::Checked,
        )?;
        let disk_bytes = disk_mb << 20;
        let id = new_ordered_id("ex");
        let lease = UidLease::acquire(&self.core.config.run_dir.join("uids"))
            .map_err(|e| EngineError::Unavailable(crate::chain(&e)))?;
        let ws_path = self.core.config.data_dir.join("workspaces").join(&id);
        let workspace = Workspace::create(&ws_path, disk_bytes, lease)
            .map_err(|e| EngineError::Unavailable(crate::chain(&e)))?;
        for f in &req.files {
            workspace
                .write_file(&f.path, &f.content)
                .map_err(|e| match e {
                    runcell_sandbox::WorkspaceError::InvalidPath { .. } => {
                        EngineError::InvalidRequest(e.to_string())
                    }
                    other => EngineError::InvalidRequest(crate::chain(&other)),
                })?;
        }
        let before = workspace.snapshot().unwrap_or_default();

        let input = ProgramDir::create(
            &self.core.config.data_dir.join("tmp"),
            req.language,
            &req.code,
        )?;
        let (python, mut ro_binds) = self.core.python();
        ro_binds.push(Bind {
            source: input.path.clone(),
            target: INPUT_DIR.into(),
        });
        let launch = Launch {
            argv: interpreter(req.language, python),
            env: base_env(
                req.language,
                limits.cpu_millis,
                self.core.config.python_runtime.is_some(),
            ),
            workspace: &workspace,
            ro_binds,
            limits,
            channel: false,
        };
        let started_at = Utc::now();
        let outcome = self
            .core
            .sandbox
            .run(
                &launch,
                &RunOptions {
                    stdin: req.stdin.clone(),
                    timeout: req.timeout,
                    output_cap: req.output_cap,
                    cancel: req.cancel.clone(),
                    ..RunOptions::default()
                },
                on_output,
            )
            .map_err(|e| EngineError::Sandbox(crate::chain(&e)))?;
        let finished_at = Utc::now();
        let after = workspace.snapshot().unwrap_or_default();
        drop(input);
        drop(workspace);

        let stderr = outcome.stderr.render();
        let (status, error) = classify(req, &limits, outcome.exit, outcome.killed_by, &stderr);
        let execution = Execution {
            id,
            session_id: None,
            language: req.language,
            execution_count: 1,
            status,
            stdout: outcome.stdout.render(),
            stderr,
            truncated: Truncated {
                stdout: outcome.stdout.truncated(),
                stderr: outcome.stderr.truncated(),
                results: false,
            },
            results: Vec::new(),
            error,
            files: diff_files(&before, &after),
            usage: UsageInfo {
                wall_ms: outcome.usage.wall.as_millis() as u64,
                cpu_ms: outcome.usage.cpu.as_millis() as u64,
                peak_memory_bytes: outcome.usage.peak_memory_bytes,
                killed_by: outcome.killed_by.map(Into::into),
            },
            started_at,
            finished_at,
        };
        self.core.audit(&req.owner, &execution, &req.code)?;
        Ok(OneShotOutcome {
            execution,
            exit_code: outcome.exit.shell_code(),
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

fn interpreter(language: Language, python: String) -> Vec<String> {
    let program = format!("{INPUT_DIR}/{}", program_file(language));
    match language {
        Language::Python => vec![python, program],
        Language::Bash => vec!["/bin/bash".into(), program],
        Language::Javascript => vec!["/usr/bin/node".into(), program],
    }
}

fn program_file(language: Language) -> &'static str {
    match language {
        Language::Python => "main.py",
        Language::Bash => "main.sh",
        Language::Javascript => "main.js",
    }
}

/// The program file on the host, bound read-only into the sandbox; removed on drop.
struct ProgramDir {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl ProgramDir {
    fn create(tmp: &Path, language: Language, code: &str) -> Result<ProgramDir, EngineError> {
        let io = crate::core::io_error;
        let dir = tempfile::Builder::new()
            .prefix("program-")
            .tempdir_in(tmp)
            .map_err(io("create", tmp))?;
        let path = dir.path().to_owned();
        // The sandbox user is not the owner: it reads through the "other" bits.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .map_err(io("chmod", &path))?;
        let file = path.join(program_file(language));
        fs::write(&file, code).map_err(io("write", &file))?;
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644))
            .map_err(io("chmod", &file))?;
        Ok(ProgramDir { path, _dir: dir })
    }
}

fn classify(
    req: &OneShot,
    limits: &Limits,
    exit: ExitStatus,
    killed_by: Option<KillReason>,
    stderr: &str,
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
                    limits.memory_bytes >> 20
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
                        .then(|| python_error(stderr))
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

/// The files a run created, modified or deleted.
pub(crate) fn diff_files(
    before: &BTreeMap<String, FileStat>,
    after: &BTreeMap<String, FileStat>,
) -> Vec<FileChange> {
    let mut out = Vec::new();
    for (path, stat) in after {
        let change = match before.get(path) {
            None => FileChangeKind::Created,
            Some(old) if old != stat => FileChangeKind::Modified,
            Some(_) => continue,
        };
        out.push(FileChange {
            path: path.clone(),
            size: stat.size,
            mime: crate::mime_of(path),
            change,
        });
    }
    for path in before.keys().filter(|p| !after.contains_key(*p)) {
        out.push(FileChange {
            path: path.clone(),
            size: 0,
            mime: crate::mime_of(path),
            change: FileChangeKind::Deleted,
        });
    }
    out
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

    #[test]
    fn file_diff_reports_created_modified_deleted() {
        let t0 = std::time::SystemTime::UNIX_EPOCH;
        let t1 = t0 + Duration::from_secs(1);
        let st = |size, modified| FileStat { size, modified };
        let before = BTreeMap::from([("a.txt".into(), st(1, t0)), ("b.csv".into(), st(2, t0))]);
        let after = BTreeMap::from([("a.txt".into(), st(1, t1)), ("c.png".into(), st(3, t1))]);
        let d = diff_files(&before, &after);
        let got: Vec<_> = d
            .iter()
            .map(|f| (f.path.as_str(), f.change, f.mime.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a.txt", FileChangeKind::Modified, "text/plain"),
                ("c.png", FileChangeKind::Created, "image/png"),
                ("b.csv", FileChangeKind::Deleted, "text/csv"),
            ]
        );
    }
}

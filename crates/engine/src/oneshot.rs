//! One-shot executions: a fresh sandbox and workspace per run, destroyed afterwards
//! (`runcell run`, `POST /v1/execute`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use runcell_sandbox::{
    Bind, ExitStatus, KillReason, Launch, Limits, RunOptions, Snapshot, Stream, UidLease, Workspace,
};

use crate::bounds::MAX_FILE_CHANGES;
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
            .map_err(EngineError::unavailable)?;
        let ws_path = self.core.config.data_dir.join("workspaces").join(&id);
        let workspace =
            Workspace::create(&ws_path, disk_bytes, lease).map_err(crate::core::workspace_error)?;
        for f in &req.files {
            workspace
                .write_file(&f.path, &f.content)
                // One file of the request can stand where another needs a directory
                // (`a`, then `a/b`): the same conflict as in a session's workspace.
                .map_err(crate::files::map_err(crate::files::Op::Write))?;
        }
        let before = workspace.snapshot().ok();

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
            .map_err(EngineError::sandbox)?;
        let finished_at = Utc::now();
        let after = workspace.snapshot().ok();
        let diff = diff_files(before.as_ref(), after.as_ref());
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
                files: diff.truncated,
            },
            results: Vec::new(),
            error,
            files: diff.files,
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
pub(crate) fn diff_files(before: Option<&Snapshot>, after: Option<&Snapshot>) -> FileDiff {
    let (Some(before), Some(after)) = (before, after) else {
        // Without both pictures nothing can be said; an empty one would make every file
        // look created or deleted.
        return FileDiff {
            files: Vec::new(),
            truncated: true,
        };
    };
    let mut out = Vec::new();
    let mut truncated = false;
    for (path, stat) in &after.files {
        let change = match before.files.get(path) {
            None if before.complete => FileChangeKind::Created,
            // Perhaps there all along, where the first walk did not reach.
            None => {
                truncated = true;
                continue;
            }
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
    if after.complete {
        for path in before
            .files
            .keys()
            .filter(|p| !after.files.contains_key(*p))
        {
            out.push(FileChange {
                path: path.clone(),
                size: 0,
                mime: crate::mime_of(path),
                change: FileChangeKind::Deleted,
            });
        }
    } else if before.files.keys().any(|p| !after.files.contains_key(p)) {
        // Never a false deletion: a file the second walk did not reach may well exist.
        truncated = true;
    }
    if out.len() > MAX_FILE_CHANGES {
        out.truncate(MAX_FILE_CHANGES);
        truncated = true;
    }
    FileDiff {
        files: out,
        truncated,
    }
}

/// What changed in a workspace between two snapshots.
#[derive(Debug, Default)]
pub(crate) struct FileDiff {
    /// Created and modified files by path, then deleted ones, at most [`MAX_FILE_CHANGES`].
    pub(crate) files: Vec<FileChange>,
    /// More changed than `files` says (see [`Truncated::files`]).
    pub(crate) truncated: bool,
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

    use runcell_sandbox::FileStat;
    use std::collections::BTreeMap;

    fn snapshot(files: &[(&str, u64, std::time::SystemTime)], complete: bool) -> Snapshot {
        Snapshot {
            files: files
                .iter()
                .map(|&(p, size, modified)| (p.to_owned(), FileStat { size, modified }))
                .collect::<BTreeMap<_, _>>(),
            complete,
        }
    }

    #[test]
    fn file_diff_reports_created_modified_deleted() {
        let t0 = std::time::SystemTime::UNIX_EPOCH;
        let t1 = t0 + Duration::from_secs(1);
        let before = snapshot(&[("a.txt", 1, t0), ("b.csv", 2, t0)], true);
        let after = snapshot(&[("a.txt", 1, t1), ("c.png", 3, t1)], true);
        let d = diff_files(Some(&before), Some(&after));
        let got: Vec<_> = d
            .files
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
        assert!(!d.truncated);
    }

    /// A walk that did not see everything never turns an unseen file into a deletion (or an
    /// old file into a new one); the diff says it is partial instead.
    #[test]
    fn an_incomplete_snapshot_reports_no_false_change() {
        let t0 = std::time::SystemTime::UNIX_EPOCH;
        let t1 = t0 + Duration::from_secs(1);
        let full = snapshot(&[("a", 1, t0), ("b", 1, t0), ("c", 1, t0)], true);
        let part = snapshot(&[("a", 2, t1)], false);
        let d = diff_files(Some(&full), Some(&part));
        let got: Vec<_> = d
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.change))
            .collect();
        assert_eq!(got, vec![("a", FileChangeKind::Modified)]);
        assert!(d.truncated);
        let d = diff_files(Some(&part), Some(&full));
        assert!(
            d.files.iter().all(|f| f.change != FileChangeKind::Created),
            "{:?}",
            d.files
        );
        assert!(d.truncated);
        let d = diff_files(Some(&full), None);
        assert!(d.files.is_empty() && d.truncated);
    }

    #[test]
    fn file_changes_past_the_bound_are_summarised() {
        let t0 = std::time::SystemTime::UNIX_EPOCH;
        let names: Vec<String> = (0..MAX_FILE_CHANGES + 5)
            .map(|i| format!("f{i:05}"))
            .collect();
        let files: Vec<_> = names.iter().map(|n| (n.as_str(), 1, t0)).collect();
        let d = diff_files(Some(&snapshot(&[], true)), Some(&snapshot(&files, true)));
        assert_eq!(d.files.len(), MAX_FILE_CHANGES);
        assert!(d.truncated);
        assert_eq!(d.files[0].path, "f00000");
    }
}
